"""grpo.Callback: the hooks dispatched in order, a failing callback stopping the run by name, and the run
state a checkpoint carries (the hooks' order on a real run: tests/test_trainer.py)."""
import time

import pytest

import grpo
from grpo.algo.config import ConfigError
from grpo.driver.callbacks import CallbackError, CallbackList
from grpo.driver.state import RunState


class Recorder(grpo.Callback):
    def __init__(self, name, calls):
        self.name, self.calls = name, calls

    def on_step_end(self, trainer, record):
        self.calls.append((self.name, "on_step_end", record["step"]))
        record[self.name] = True

    def on_phase_end(self, trainer, phase, seconds):
        self.calls.append((self.name, phase, seconds))


class Broken(grpo.Callback):
    def on_train_begin(self, trainer):
        raise KeyError("no such metric")


def test_hooks_run_in_the_order_given_and_may_add_to_the_record():
    calls = []
    callbacks = CallbackList([Recorder("a", calls), Recorder("b", calls)])
    record = {"step": 3}
    callbacks.call("on_step_end", None, record)
    callbacks.call("on_eval", None, "after", {})  # a hook neither overrides: the base class's no-op
    assert calls == [("a", "on_step_end", 3), ("b", "on_step_end", 3)]
    assert record == {"step": 3, "a": True, "b": True}


def test_a_phase_is_timed_and_reported_only_when_it_completed():
    calls = []
    callbacks = CallbackList([Recorder("a", calls)])
    with callbacks.phase(None, "train"):
        time.sleep(0.02)
    (name, phase, seconds), = calls
    assert (name, phase) == ("a", "train") and 0.02 <= seconds < 1
    with pytest.raises(ZeroDivisionError):
        with callbacks.phase(None, "rollout"):
            calls.append(1 / 0)
    assert len(calls) == 1


def test_a_failing_callback_is_named_and_anything_else_is_refused():
    with pytest.raises(CallbackError, match=r"callback Broken\.on_train_begin raised KeyError: 'no such metric'"):
        CallbackList([Broken()]).call("on_train_begin", None)
    with pytest.raises(TypeError, match="grpo.Callback"):
        CallbackList([print])


class StopAt(grpo.Callback):
    def __init__(self, step):
        self.step = step

    def on_step_end(self, trainer, record):
        if record["step"] >= self.step:
            return grpo.Stop(f"reached step {self.step}")


def test_a_returned_stop_is_kept_first_come_and_every_callback_still_runs():
    calls = []
    callbacks = CallbackList([StopAt(2), Recorder("a", calls), StopAt(1)])
    callbacks.call("on_step_end", None, {"step": 1})
    assert callbacks.stop == "StopAt.on_step_end: reached step 1" and calls == [("a", "on_step_end", 1)]
    callbacks.call("on_step_end", None, {"step": 2})  # the first Stop returned stays the reason
    assert callbacks.stop == "StopAt.on_step_end: reached step 1" and len(calls) == 2


def test_a_hook_returning_anything_but_none_or_stop_is_refused():
    class Truthy(grpo.Callback):
        def on_step_end(self, trainer, record):
            return True  # TRL's control flags are no return values here

    with pytest.raises(CallbackError, match=r"Truthy\.on_step_end returned True: a hook returns None, or "
                                            r"grpo\.Stop\(reason\)"):
        CallbackList([Truthy()]).call("on_step_end", None, {"step": 1})
    with pytest.raises(ConfigError, match=r"Stop\.reason=''"):
        grpo.Stop("")


def test_a_failing_callback_stops_the_run_before_ray_starts_and_frees_the_folder(tmp_path, tiny_vl):
    import ray

    cfg = grpo.RunConfig(model=str(tiny_vl), output_dir=str(tmp_path / "run"), steps=1, algorithm={"group_size": 2})
    with pytest.raises(CallbackError, match=r"Broken\.on_train_begin"):
        grpo.Trainer(cfg, callbacks=[Broken()]).fit()
    assert not ray.is_initialized()
    # The run lock went with it: the next run on the folder is not refused (it fails in the same callback).
    with pytest.raises(CallbackError):
        grpo.Trainer(cfg, callbacks=[Broken()]).fit()


def test_run_state_round_trips_and_reads_a_checkpoint_written_as_a_plain_dict():
    state = RunState(step=4, cursor=8, evals={"2": {"success_rate": 0.5}}, wall_s=12.5, version=5,
                     eval_before={"success_rate": 0.25}, test_before={"success_rate": 0.2}, started=1000.0,
                     rollout_rng=[{"torch": None}], best={"step": 2, "version": 3, "success_rate": 0.5})
    assert RunState.from_dict(state.to_dict()) == state
    assert list(state.to_dict()) == ["step", "cursor", "evals", "wall_s", "version", "eval_before", "test_before",
                                     "started", "rollout_rng", "best"]
    # A checkpoint saved before the rollout workers' random state was, and before the eval before training ran
    # (one that still records the injected faults that fired: they are in the run folder now).
    old = RunState.from_dict({"step": 2, "cursor": 4, "evals": {}, "wall_s": 3.0, "version": 3, "faults_fired": []})
    assert (old.step, old.cursor, old.eval_before, old.test_before, old.rollout_rng, old.best) == (2, 4, None, None,
                                                                                                   None, None)

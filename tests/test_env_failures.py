"""Environments that fail: the contract's checks and messages, group re-runs with fresh envs in the real
rollout worker (tiny text model, in-process vLLM), the run-wide episode cap, a broken reset caught before
Ray starts, and a non-finite loss refused before the optimizer applies it."""
import math
import pickle
import threading
from collections import Counter

import numpy as np
import pytest

import envs
from envs import ContractError, EnvError, Observation, StepResult, check_observation, check_step_result
from rollout.worker import RolloutConfig, Task

# Attempts per (tag, seed): reset counts them, so an env can misbehave on its first instances only.
_ATTEMPTS: Counter = Counter()
_LOCK = threading.Lock()


class Scripted(envs.Env):
    """A text env of `turns` steps (reward 1 on the last) that misbehaves as told: `fault` at turn `at`
    (0 is reset) on seed `bad_seed`, on that seed's first `bad_attempts` instances (None: always);
    fault "init" cannot be built at all."""

    keep_images = False

    def __init__(self, tag: str = "scripted", fault: str = "none", at: int = 1, bad_seed: int = 7,
                 bad_attempts: int | None = None, turns: int = 2, never_done: bool = False):
        self.tag, self.fault, self.at, self.bad_seed = tag, fault, at, bad_seed
        self.bad_attempts, self.turns, self.never_done = bad_attempts, turns, never_done
        self.turn = 0
        if fault == "init":
            raise OSError("no simulator licence")

    def _bad(self) -> bool:
        return (self.fault != "none" and self.seed == self.bad_seed and self.turn == self.at
                and (self.bad_attempts is None or self.attempt <= self.bad_attempts))

    def reset(self, seed: int):
        self.seed, self.turn = seed, 0
        with _LOCK:
            _ATTEMPTS[self.tag, seed] += 1
            self.attempt = _ATTEMPTS[self.tag, seed]
        if self._bad():
            if self.fault == "raise":
                raise ConnectionError("sandbox went away")
            if self.fault == "str":
                return "a plain string"
        return Observation(text=f"task {seed}: say anything")

    def step(self, action_text: str):
        self.turn += 1
        done = self.turn >= self.turns and not self.never_done
        result = StepResult(Observation(text=f"turn {self.turn} seen"), float(done), done,
                            {"attempt": self.attempt})
        if self._bad():
            if self.fault == "raise":
                raise KeyError("board_state")
            if self.fault == "nan":
                result.reward = float("nan")
            if self.fault == "tuple":
                return (result.observation, result.reward, result.done, result.info)
        return result


envs.register("scripted", Scripted, overwrite=True)


# ------------------------------------------------------------------------------------ the contract
def test_reset_results_are_named_precisely():
    with pytest.raises(ContractError, match=r"^reset must return envs.Observation, got str 'hi' \(wrap the text"):
        check_observation("hi", "reset")
    with pytest.raises(ContractError, match=r"Observation.text of type bytes b'hi': it must be a str"):
        check_observation(Observation(text=b"hi"), "reset")
    with pytest.raises(ContractError, match=r"Observation.images\[0\] of type ndarray .*PIL.Image.Image"):
        check_observation(Observation(text="hi", images=[np.zeros((2, 2))]), "reset")
    with pytest.raises(ContractError, match=r"^step returned StepResult.observation of type NoneType None: it must"):
        check_observation(None, "step")
    with pytest.raises(ContractError, match=r"^step returned StepResult.observation.text of type int 3: it must"):
        check_observation(Observation(text=3), "step")


@pytest.mark.parametrize("result,message", [
    ((Observation("x"), 1.0, False, {}), r"^step must return envs.StepResult, got tuple .*gym-style"),
    (StepResult(Observation("x"), float("nan"), False), r"StepResult.reward=nan: it must be a finite number"),
    (StepResult(Observation("x"), float("-inf"), True), r"StepResult.reward=-inf"),
    (StepResult(Observation("x"), "1", True), r"StepResult.reward of type str '1': it must be a finite number"),
    (StepResult(Observation("x"), None, True), r"StepResult.reward of type NoneType None"),
    (StepResult(Observation("x"), 1.0, 1), r"StepResult.done of type int 1: it must be True or False"),
    (StepResult(Observation("x"), 1.0, True, ["ok"]), r"StepResult.info of type list \['ok'\]: it must be a dict"),
    (StepResult("next", 0.0, False), r"StepResult.observation of type str 'next': it must be an envs.Observation "
                                     r"\(wrap the text"),
])
def test_bad_step_results_name_the_field_type_and_value(result, message):
    with pytest.raises(ContractError, match=message):
        check_step_result(result)


def test_good_results_pass_numpy_included():
    ok = StepResult(Observation("x"), np.float32(0.5), np.bool_(False), None)
    assert check_step_result(ok) is ok
    # A finished episode's observation is never shown, so it is not checked.
    assert check_step_result(StepResult(None, 1, True)).done


def test_env_error_names_everything_and_survives_pickling():
    e = EnvError("scripted", 1_000_003, 2, "step", "KeyError: 'board_state'", "Traceback (most recent call last):\n"
                 '  File "env.py", line 9, in step\nKeyError: \'board_state\'', "ran 3 times")
    text = str(e)
    assert text.startswith("environment 'scripted', seed 1000003, turn 2 (step): KeyError: 'board_state'\nran 3 times")
    assert 'File "env.py", line 9, in step' in text
    back = pickle.loads(pickle.dumps(e))
    assert str(back) == text and (back.env, back.seed, back.turn, back.method) == ("scripted", 1_000_003, 2, "step")


def test_check_env_builds_and_resets_one_seed():
    env, obs = envs.check_env("scripted", {"tag": "check-ok"}, 3)
    assert isinstance(env, Scripted) and obs.text.startswith("task 3")
    with pytest.raises(EnvError, match=r"seed 7, turn 0 \(reset\): reset must return envs.Observation, got str") as e:
        envs.check_env("scripted", {"tag": "check-str", "fault": "str", "at": 0}, 7)
    assert e.value.traceback_text == ""  # a broken rule is its own message
    with pytest.raises(EnvError, match=r"seed 7, turn 0 \(reset\): ConnectionError: sandbox went away") as e:
        envs.check_env("scripted", {"tag": "check-raise", "fault": "raise", "at": 0}, 7)
    assert "in reset" in e.value.traceback_text and "raise ConnectionError" in str(e.value)
    with pytest.raises(EnvError, match=r"seed 3, turn 0 \(make\): OSError: no simulator licence"):
        envs.check_env("scripted", {"fault": "init"}, 3)
    with pytest.raises(envs.RegistryError, match="does not accept option"):
        envs.check_env("scripted", {"colour": "red"}, 3)


# ---------------------------------------------------------------------------- the rollout worker
def _config(**kw) -> RolloutConfig:
    return RolloutConfig(max_tokens_per_turn=4, **{"env_retries": 1, **kw})


def _tasks(tag: str, **options) -> list[Task]:
    return [Task("scripted", seed, {"tag": tag, **options}) for seed in (5, 7)]


@pytest.mark.slow
@pytest.mark.parametrize("fault,at,method,problem", [
    ("raise", 2, "step", "KeyError: 'board_state'"),
    ("raise", 0, "reset", "ConnectionError: sandbox went away"),
    ("nan", 1, "step", "step returned StepResult.reward=nan: it must be a finite number"),
    ("tuple", 1, "step", "step must return envs.StepResult, got tuple"),
    ("str", 0, "reset", "reset must return envs.Observation, got str 'a plain string'"),
])
def test_env_that_keeps_failing_stops_the_rollout_naming_env_seed_and_turn(worker, fault, at, method, problem):
    name = f"always-{fault}-{at}"
    with pytest.raises(EnvError) as e:
        worker.rollout(_tasks(name, fault=fault, at=at), 2, _config(env_retries=1))
    err = e.value
    assert (err.env, err.seed, err.turn, err.method) == ("scripted", 7, at, method)
    text = str(err)
    assert text.startswith(f"environment 'scripted', seed 7, turn {at} ({method}): {problem}")
    assert "ran 2 time(s), each with fresh env instances, and failed each time (env_retries=1)" in text
    if fault == "raise":
        assert f"in {method}" in err.traceback_text and "the environment's traceback:" in text
    # Both episodes of the group ran twice (fresh instances); the good group was never re-run.
    assert _ATTEMPTS[name, 7] == 4 and _ATTEMPTS[name, 5] == 2
    assert pickle.loads(pickle.dumps(err)).args == err.args


@pytest.mark.slow
@pytest.mark.parametrize("fault,at,schedule", [("raise", 2, "lockstep"), ("nan", 1, "lockstep"), ("str", 0, "lockstep"),
                                               ("raise", 2, "continuous"), ("nan", 1, "continuous")])
def test_a_group_that_fails_once_is_rerun_whole_with_fresh_envs(worker, fault, at, schedule):
    name = f"once-{fault}-{at}-{schedule}"
    trajs, stats = worker.rollout(_tasks(name, fault=fault, at=at, bad_attempts=2), 2, _config(schedule=schedule))
    assert stats.env_retries == 1 and stats.episodes == 4
    assert [(t.seed, t.group_id) for t in trajs] == [(5, 0), (5, 0), (7, 1), (7, 1)]
    # Every episode kept ran to the end on one env instance: the failed group's on its re-run (attempts 3, 4).
    assert all(t.num_turns == 2 and t.stop_reason == "done" and t.reward == 1.0 for t in trajs)
    assert sorted(t.info["attempt"] for t in trajs if t.seed == 7) == [3, 4]
    assert all(math.isfinite(r) for t in trajs for r in t.turn_rewards)


@pytest.mark.slow
def test_no_retries_stops_at_the_first_failure(worker):
    with pytest.raises(EnvError, match=r"(?s)seed 7, turn 1 \(step\).*ran 1 time\(s\)"):
        worker.rollout(_tasks("no-retry", fault="raise", at=1, bad_attempts=1), 2, _config(env_retries=0))


@pytest.mark.slow
def test_max_turns_ends_an_env_that_never_says_done(worker):
    trajs, stats = worker.rollout(_tasks("endless", never_done=True), 2, _config(max_turns=3))
    assert stats.stop_reasons == {"max_turns": 4} and stats.engine_calls == 3
    assert all(t.num_turns == 3 and len(t.segments) == 3 and t.num_generated > 0 for t in trajs)
    # The env's own limit still applies below the cap.
    trajs, stats = worker.rollout(_tasks("short"), 2, _config(max_turns=3))
    assert stats.stop_reasons == {"done": 4} and all(t.num_turns == 2 for t in trajs)


# ------------------------------------------------------------------------- before anything starts
@pytest.mark.slow
def test_broken_reset_fails_in_the_driver_before_ray_starts(tiny_text, tmp_path):
    import ray

    from grpo import RunConfig
    from grpo.driver.trainer import Trainer

    config = RunConfig(model=str(tiny_text), output_dir=str(tmp_path / "run"), steps=1,
                       env={"name": "scripted", "options": {"tag": "driver", "fault": "str", "at": 0,
                                                            "bad_seed": 1_000_000}})
    with pytest.raises(EnvError, match=r"^environment 'scripted', seed 1000000, turn 0 \(reset\): reset must "
                                       r"return envs.Observation, got str"):
        Trainer(config)
    assert not ray.is_initialized() and not (tmp_path / "run").exists()


def test_non_finite_loss_is_refused_before_the_optimizer_and_nothing_is_published(tiny_vl, tmp_path):
    from _fixtures_train import max_abs_diff, trajectories

    from grpo.learner import forward
    from grpo.learner.config import TrainConfig
    from grpo.learner.worker import TrainWorker
    from sync import AdapterStore

    model = str(tiny_vl)
    worker = TrainWorker(model, train=TrainConfig(lr=1e-2))
    store = AdapterStore(tmp_path / "store")
    version = worker.publish(str(store.root))
    before = worker.gather_adapter()
    batch = trajectories(forward.load_processor(model), 4)
    for bad in (float("nan"), float("inf")):
        with pytest.raises(FloatingPointError, match=rf"train step \d: loss .* the update was not applied and "
                                                     rf"nothing was published, so the last published adapter "
                                                     rf"\(v{version}\)"):
            worker.train_step(batch, [1.0, -1.0, bad, 0.5])
        assert max_abs_diff(before, worker.gather_adapter()) == 0.0
        assert not worker.optimizer.state  # Adam never stepped
    assert store.latest_verified().version == version
    # The same worker still trains on a finite batch.
    metrics = worker.train_step(batch, [1.0, -1.0, 0.3, 0.5])
    assert math.isfinite(metrics["loss"]) and max_abs_diff(before, worker.gather_adapter()) > 0

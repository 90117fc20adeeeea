"""The live episodes' env calls run at once on `env_workers` threads, each env instance on one thread, in the
real rollout worker (tiny text model, in-process vLLM). Concurrency is shown by a barrier that only opens
when every episode's call is in flight together, not by timing."""
import subprocess
import sys
import threading
from collections import Counter, defaultdict

import pytest

import envs
from envs import Observation, StepResult
from rollout.worker import RolloutConfig, Task

_LOCK = threading.Lock()
_IN_FLIGHT: Counter = Counter()
_MOST: Counter = Counter()
_THREADS: dict = defaultdict(set)  # (tag, instance) -> thread idents its calls ran on
_BARRIERS: dict = {}


class Gate(envs.Env):
    """Two steps, then done. Records each call's thread and how many calls of its tag are in flight; with
    `together` > 0 every call waits until that many calls are in flight at once (a barrier)."""

    keep_images = False

    def __init__(self, tag: str, together: int = 0):
        self.tag, self.together, self.turn = tag, together, 0
        with _LOCK:
            self.instance = sum(1 for key in _THREADS if key[0] == tag)
            _THREADS[tag, self.instance] = set()
            if together and tag not in _BARRIERS:
                _BARRIERS[tag] = threading.Barrier(together, timeout=30)

    def _call(self) -> None:
        with _LOCK:
            _THREADS[self.tag, self.instance].add(threading.get_native_id())  # kernel ids: not reused at once
            _IN_FLIGHT[self.tag] += 1
            _MOST[self.tag] = max(_MOST[self.tag], _IN_FLIGHT[self.tag])
        try:
            if self.together:
                _BARRIERS[self.tag].wait()
        finally:
            with _LOCK:
                _IN_FLIGHT[self.tag] -= 1

    def reset(self, seed: int):
        self._call()
        return Observation(text=f"task {seed}: say anything")

    def step(self, action_text: str):
        self._call()
        self.turn += 1
        return StepResult(Observation(text=f"turn {self.turn}: {len(action_text)} characters"), 0.5, self.turn >= 2)


envs.register("gate", Gate, overwrite=True)


def _rollout(worker, tag: str, env_workers: int, together: int = 0, greedy: bool = False):
    tasks = [Task("gate", seed, {"tag": tag, "together": together}) for seed in range(4)]
    return worker.rollout(tasks, 2, RolloutConfig(max_tokens_per_turn=4, env_workers=env_workers, env_retries=0),
                          greedy=greedy)


def _threads_of(tag: str) -> list[set]:
    return [threads for (t, _), threads in sorted(_THREADS.items()) if t == tag]


@pytest.mark.slow
def test_every_episodes_env_call_is_in_flight_at_once(worker):
    # Each reset and step waits for all 8 episodes' calls: one at a time, the first call would wait forever.
    trajs, stats = _rollout(worker, "all", env_workers=64, together=8)
    assert _MOST["all"] == 8 and stats.episodes == 8 and stats.env_retries == 0
    assert all(t.num_turns == 2 and t.stop_reason == "done" for t in trajs)
    assert stats.env_s > 0


@pytest.mark.slow
def test_fewer_threads_than_episodes_pin_each_env_to_one_thread(worker):
    _rollout(worker, "three", env_workers=3)
    per_env = _threads_of("three")
    assert len(per_env) == 8 and all(len(threads) == 1 for threads in per_env)
    assert len(set.union(*per_env)) == 3 and _MOST["three"] <= 3
    _rollout(worker, "one", env_workers=1)
    assert _MOST["one"] == 1 and len(set.union(*_threads_of("one"))) == 1


@pytest.mark.slow
def test_concurrency_changes_no_trajectory(worker):
    serial, _ = _rollout(worker, "serial", env_workers=1, greedy=True)
    pooled, _ = _rollout(worker, "pooled", env_workers=8, greedy=True)
    assert _summary(serial) == _summary(pooled)


class Broken(Gate):
    def step(self, action_text: str):
        raise RuntimeError("the simulator went away")


envs.register("gate_broken", Broken, overwrite=True)


@pytest.mark.slow
def test_the_threads_outlive_a_rollout_but_not_a_failed_one(worker):
    _rollout(worker, "first", env_workers=4)
    _rollout(worker, "second", env_workers=4)
    first, second = set.union(*_threads_of("first")), set.union(*_threads_of("second"))
    assert len(first) == 4 and second == first  # the same 4 threads, not 4 new ones
    tasks = [Task("gate_broken", seed, {"tag": "broken"}) for seed in range(4)]
    with pytest.raises(envs.EnvError, match="simulator went away"):
        worker.rollout(tasks, 2, RolloutConfig(max_tokens_per_turn=4, env_workers=4, env_retries=0))
    _rollout(worker, "after", env_workers=4)
    # A failed rollout's threads may be stuck in an env call: the next rollout runs on fresh ones.
    assert set.union(*_threads_of("after")).isdisjoint(first)


class Computing(Gate):
    """Gate's steps, declared to only compute: they run inline on the rollout loop's thread."""

    blocking = False


class ComputingBroken(Computing):
    def step(self, action_text: str):
        raise RuntimeError("the board is inconsistent")


envs.register("gate_computing", Computing, overwrite=True)
envs.register("gate_computing_broken", ComputingBroken, overwrite=True)


@pytest.mark.slow
def test_an_env_that_only_computes_steps_on_the_loops_thread(worker):
    threaded, _ = _rollout(worker, "threaded", env_workers=4, greedy=True)
    tasks = [Task("gate_computing", seed, {"tag": "inline"}) for seed in range(4)]
    inline, _ = worker.rollout(tasks, 2, RolloutConfig(max_tokens_per_turn=4, env_workers=4, env_retries=0),
                               greedy=True)
    # reset on a pool thread, then both steps on this (the loop's) thread; the same episodes as with threads
    assert all(len(threads) == 2 and threading.get_native_id() in threads for threads in _threads_of("inline"))
    assert _summary(inline) == _summary(threaded)
    tasks = [Task("gate_computing_broken", seed, {"tag": "inline_broken"}) for seed in range(4)]
    with pytest.raises(envs.EnvError, match="board is inconsistent"):
        worker.rollout(tasks, 2, RolloutConfig(max_tokens_per_turn=4, env_workers=4, env_retries=1))


def _summary(trajs) -> list:
    return [(t.seed, t.group_id, t.actions, t.turn_rewards, [s.token_ids for s in t.segments]) for t in trajs]


def test_rollout_alone_does_not_import_grpo():
    # docs/design.md, "Import rules": rollout/ imports only envs/ and sync/, so a user building on rollout alone
    # gets no trainer.
    code = ("import sys, rollout.worker, rollout.engine, rollout.conversation, rollout.models; "
            "print(sorted(m for m in sys.modules if m == 'grpo' or m.startswith('grpo.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


_RELEASE: dict = {}  # tag -> Event the fast episodes set once they finished every turn
_TIMED_OUT: Counter = Counter()


class Waiting(envs.Env):
    """Seed 0's first step waits until the episodes of seed 1 have taken all their 3 turns (or 10 s): only a
    schedule that lets an episode move on while another's env call is out can open it without the timeout."""

    keep_images = False

    def __init__(self, tag: str):
        self.tag, self.turn = tag, 0

    def reset(self, seed: int):
        self.seed, self.turn = seed, 0
        return Observation(text=f"task {seed}: say anything")

    def step(self, action_text: str):
        self.turn += 1
        if self.seed == 0 and self.turn == 1 and not _RELEASE[self.tag].wait(timeout=10):
            with _LOCK:
                _TIMED_OUT[self.tag] += 1
        if self.seed == 1 and self.turn == 3:
            with _LOCK:
                _IN_FLIGHT[self.tag] += 1
                if _IN_FLIGHT[self.tag] == 2:  # both fast episodes are through
                    _RELEASE[self.tag].set()
        return StepResult(Observation(text=f"turn {self.turn}"), float(self.turn == 3), self.turn >= 3)


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["continuous", "lockstep"])
def test_continuous_episodes_move_on_while_another_env_call_is_out(worker, schedule):
    envs.register("waiting", Waiting, overwrite=True)
    tag = f"waiting-{schedule}"
    _RELEASE[tag] = threading.Event()
    tasks = [Task("waiting", seed, {"tag": tag}) for seed in (0, 1)]
    trajs, stats = worker.rollout(tasks, 2, RolloutConfig(max_tokens_per_turn=4, schedule=schedule))
    assert [t.num_turns for t in trajs] == [3, 3, 3, 3] and all(t.stop_reason == "done" for t in trajs)
    if schedule == "continuous":
        # The fast episodes took their 3 turns while both slow ones were inside their first env call.
        assert _TIMED_OUT[tag] == 0 and stats.engine_calls > 3
    else:
        # Lockstep waits for every env call of a turn: the fast episodes could not take turn 2 meanwhile.
        assert _TIMED_OUT[tag] == 2 and stats.engine_calls == 3


@pytest.mark.slow
def test_each_reply_records_its_length_and_whether_vllm_cut_it_at_the_limit(worker):
    # Issue 37's plumbing (algorithm.mask_truncated, overlong_buffer, rollout/truncated), on this module's engine.
    trajs, _ = worker.rollout([Task("gate", 0, {"tag": "cut"})], 2, RolloutConfig(max_tokens_per_turn=4))
    for t in trajs:
        runs = [end - start for spans in t.turn_spans() for start, end in spans]
        assert t.reply_tokens == runs and len(t.truncated) == t.num_turns == 2
        # vLLM's finish_reason "length": the reply ran to the limit without its stop token.
        assert all(cut == (n == 4) for cut, n in zip(t.truncated, t.reply_tokens)) and any(t.truncated)

"""grpo.Trainer as users run it, with clocks around its parts: start-up marks and each step's breakdown.

Nothing in the loop changes: the driver-side handles (rollout pool, train group) and the trainer's own
pieces are wrapped with timers, and each step's record gains a "parts" entry before it is logged.
"""
from __future__ import annotations

import time

import grpo

# What a step's seconds are split into (driver clock, except engine/worker which the rollout worker reports).
PARTS = ("rollout_s", "worker_s", "engine_s", "advantages_s", "sleep_s", "train_s", "publish_s", "wake_s",
         "hotload_s", "checkpoint_s")


def breakdown(t: dict, rollout: dict) -> dict:
    """One step's record split into the parts a reader acts on. `t` holds the driver's timers for the step,
    `rollout` the worker's own stats. Ray's share is what the driver waited beyond the worker's own time."""
    worker, engine = rollout["wall_s"], rollout["engine_s"]
    out = {
        "rollout_engine_s": engine,
        "rollout_env_and_bookkeeping_s": worker - engine,
        "rollout_ray_s": t["rollout_call_s"] - worker,
        "advantages_s": t["advantages_s"],
        "train_s": t["train_s"],
        "publish_s": t["publish_s"],
        "hotload_s": t["hotload_s"],
        "sleep_wake_s": t["sleep_s"] + t["wake_s"],
        "checkpoint_s": t.get("checkpoint_s", 0.0),
    }
    out["rest_s"] = t["step_s"] + out["checkpoint_s"] - sum(out.values())
    return out


class TimedTrainer(grpo.Trainer):
    """`on_ready(marks)` runs once the eval before training is done, `on_step(record)` after each step's
    record is logged (record["parts"]: breakdown(); record["time"]: the trainer's own timing)."""

    def __init__(self, config, on_ready=None, on_step=None, t0: float | None = None):
        super().__init__(config)
        self.t0 = time.perf_counter() if t0 is None else t0
        self.marks: dict = {}
        self._on_ready, self._on_step = on_ready, on_step
        self._clock: dict = {}

    def _mark(self, name: str) -> None:
        self.marks[name] = time.perf_counter() - self.t0

    def _timed(self, fn, key: str):
        def wrapper(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self._clock[key] = self._clock.get(key, 0.0) + time.perf_counter() - t
        return wrapper

    def _start(self, *args, **kwargs):
        self._mark("start_called_s")
        out = super()._start(*args, **kwargs)
        self._mark("ray_ready_s")
        log = self.sink.log

        def logged(record):
            if "rollout" in record and "time" in record:
                clock, self._clock = self._clock, {}
                clock["step_s"] = record["time"]["step_s"]
                record["parts"] = breakdown(clock, record["rollout"])
            log(record)
            if self._on_step is not None and "parts" in record:
                self._on_step(record)

        self.sink.log = logged
        return out

    def _start_actors(self, *args, **kwargs):
        out = super()._start_actors(*args, **kwargs)
        self._mark("actors_ready_s")
        pool, group = self.pool, self.group
        pool.rollout = self._timed(pool.rollout, "rollout_call_s")
        pool.sleep = self._timed(pool.sleep, "sleep_s")
        pool.wake_up = self._timed(pool.wake_up, "wake_s")
        pool.sync_adapter = self._timed(pool.sync_adapter, "hotload_s")
        group.train_step = self._timed(group.train_step, "train_s")
        group.publish = self._timed(group.publish, "publish_s")
        return out

    def _advantages(self, *args, **kwargs):
        return self._timed(super()._advantages, "advantages_s")(*args, **kwargs)

    def _save(self, *args, **kwargs):
        t = time.perf_counter()
        out = super()._save(*args, **kwargs)
        # The save follows the step's log: it lands in the next step's clock, as its own part.
        self._clock["checkpoint_s"] = time.perf_counter() - t
        return out

    def evaluate(self, *args, **kwargs):
        first = "eval_before_start_s" not in self.marks
        if first:
            self._mark("eval_before_start_s")
            # The start-up's publish and hot-load of the first version ran just before: not a step's.
            self._clock = {}
        out = super().evaluate(*args, **kwargs)
        if first:
            self._mark("eval_before_end_s")
            self._clock = {}
            if self._on_ready is not None:
                self._on_ready(dict(self.marks))
        return out

"""grpo.Trainer as users run it, with clocks around its parts: start-up marks and each step's breakdown.

Nothing in the loop changes: a grpo.Callback collects the trainer's phase timings (on_phase_end), and each
step's record gains a "parts" entry before it is logged.
"""
from __future__ import annotations

import time

import grpo

# The trainer's phases (grpo.Callback.on_phase_end) -> the clock keys breakdown() reads.
_CLOCK_KEYS = {"rollout": "rollout_call_s", "advantages": "advantages_s", "sleep": "sleep_s", "train": "train_s",
               "publish": "publish_s", "wake_up": "wake_s", "hotload": "hotload_s", "checkpoint": "checkpoint_s"}


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


class StepClock(grpo.Callback):
    """Start-up marks (seconds since `t0`) and each step's parts. `on_ready(marks)` runs once the eval before
    training is done, `on_step(record)` once each step's record holds its parts."""

    def __init__(self, on_ready=None, on_step=None, t0: float | None = None):
        self.t0 = time.perf_counter() if t0 is None else t0
        self.marks: dict = {}
        self._on_ready, self._on_step = on_ready, on_step
        self._clock: dict = {}
        self._eval_s = 0.0

    def _mark(self, name: str) -> None:
        self.marks[name] = time.perf_counter() - self.t0

    def on_train_begin(self, trainer) -> None:
        self._mark("start_called_s")

    def on_phase_end(self, trainer, phase: str, seconds: float) -> None:
        if phase == "start":
            self._mark("ray_ready_s")
        elif phase == "actors_start":
            self._mark("actors_ready_s")
        elif phase == "eval":
            self._eval_s = seconds
        elif phase in _CLOCK_KEYS:
            # A checkpoint is saved after its step's record: it lands in the next step's clock, as its own part.
            key = _CLOCK_KEYS[phase]
            self._clock[key] = self._clock.get(key, 0.0) + seconds

    def on_eval(self, trainer, label: str, result: dict) -> None:
        if label == "before":
            end = time.perf_counter() - self.t0
            self.marks["eval_before_start_s"] = end - self._eval_s
            self.marks["eval_before_end_s"] = end
            if self._on_ready is not None:
                self._on_ready(dict(self.marks))

    def on_step_end(self, trainer, record: dict) -> None:
        clock, self._clock = self._clock, {}
        clock["step_s"] = record["time"]["step_s"]
        record["parts"] = breakdown(clock, record["rollout"])
        if self._on_step is not None:
            self._on_step(record)


class TimedTrainer(grpo.Trainer):
    """grpo.Trainer with a StepClock; `marks` are its start-up marks."""

    def __init__(self, config, on_ready=None, on_step=None, t0: float | None = None):
        clock = StepClock(on_ready, on_step, t0)
        super().__init__(config, callbacks=[clock])
        self.marks = clock.marks

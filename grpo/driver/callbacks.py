"""Hooks into grpo.Trainer's loop, for users' own logging, timing or early stopping (docs/callbacks.md).

    class PrintReward(grpo.Callback):
        def on_step_end(self, trainer, record):
            print(record["step"], record["rollout"]["mean_reward"])

    grpo.Trainer(config, callbacks=[PrintReward()]).fit()

To end the run early (TRL's `control.should_training_stop`), a hook returns `grpo.Stop(reason)`: the step
running finishes, a checkpoint is saved, the evaluations after training run and summary.json says why it
stopped. A callback that raises stops the run (cleanly: actors, Ray and the run lock are released) with a
CallbackError naming the callback and the hook.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass

from grpo.algo.config import require


@dataclass(frozen=True)
class Stop:
    """Returned by a hook: end the run after the step running now (its record logged, a checkpoint saved),
    then evaluate and write the summary as at the last step. `reason` goes into summary.json's `stopped`."""
    reason: str

    def __post_init__(self):
        require(self, "reason", isinstance(self.reason, str) and bool(self.reason),
                "a non-empty string saying why, e.g. 'reward plateaued'")


class Callback:
    """Override the hooks you need; each is a no-op here. `trainer` is the running grpo.Trainer:
    `trainer.state` (grpo.driver.state.RunState) holds the step, the served adapter version and the evals.
    A hook returns None, or grpo.Stop(reason) to end the run after the step running now."""

    def on_train_begin(self, trainer) -> None:
        """fit() began: before Ray and the actors start."""

    def on_phase_end(self, trainer, phase: str, seconds: float) -> None:
        """A timed part of the run ended, `seconds` after it began (driver clock). Start-up: "start" (Ray
        started or joined, the metrics sink open), "actors_start" (rollout workers and train ranks ready; again
        after a restart). Each step, in order: "rollout", "advantages", "sleep" (the engines free their
        memory), "train", "publish", "wake_up", "hotload" (the workers load the new adapter); after the step's
        on_step_end, "checkpoint" when it saves one. "eval" for every evaluation, just before its on_eval."""

    def on_eval(self, trainer, label: str, result: dict) -> None:
        """An evaluation finished: label "before", "test before", "step N", "after" or "test"; `result` as in
        summary.json."""

    def on_step_end(self, trainer, record: dict) -> None:
        """A step finished; `record` is its metrics.jsonl line, not yet written: keys added here are logged."""

    def on_train_end(self, trainer, summary: dict) -> None:
        """The run finished and wrote summary.json; `summary` is its content."""


class CallbackError(RuntimeError):
    """A callback raised: the run stopped. The message names the callback and the hook."""


class CallbackList:
    """The trainer's callbacks, called in the order given. `stop` is the first Stop a hook returned, as
    "<callback>.<hook>: <reason>" (None: none yet); every callback still sees the hook that returned it."""

    def __init__(self, callbacks=()):
        self.callbacks = list(callbacks)
        self.stop: str | None = None
        for cb in self.callbacks:
            if not isinstance(cb, Callback):
                raise TypeError(f"callbacks takes grpo.Callback instances, got {type(cb).__name__}: subclass "
                                "grpo.Callback and override the hooks you need")

    def call(self, hook: str, *args) -> None:
        for cb in self.callbacks:
            name = f"{type(cb).__name__}.{hook}"
            try:
                returned = getattr(cb, hook)(*args)
            except Exception as e:
                raise CallbackError(f"callback {name} raised {type(e).__name__}: {e}; "
                                    "the run stopped (the last checkpoint stays: run the same command to resume)"
                                    ) from e
            if isinstance(returned, Stop):
                self.stop = self.stop or f"{name}: {returned.reason}"
            elif returned is not None:
                raise CallbackError(f"callback {name} returned {returned!r}: a hook returns None, or "
                                    "grpo.Stop(reason) to end the run after this step")

    @contextmanager
    def phase(self, trainer, name: str):
        """Time the block and report it to on_phase_end (only when it completed)."""
        t0 = time.perf_counter()
        yield
        self.call("on_phase_end", trainer, name, time.perf_counter() - t0)

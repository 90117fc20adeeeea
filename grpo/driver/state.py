"""What a run carries from step to step, saved in every checkpoint and restored on resume."""
from __future__ import annotations

from dataclasses import dataclass, field

from rollout.worker import Task


@dataclass
class RunState:
    """The checkpoint's `state`: `to_dict` writes it, `from_dict` reads it back (also from a checkpoint
    written before this class existed, which held the same keys as a plain dict)."""
    step: int = 0                   # steps completed
    cursor: int = 0                 # training tasks taken (TaskSampler.cursor)
    evals: dict = field(default_factory=dict)   # str(step) -> the periodic eval at that step
    wall_s: float = 0.0             # the run's seconds up to the checkpoint, over all its processes
    version: int | None = None      # the adapter version the rollout workers serve
    eval_before: dict | None = None  # the eval before training (None until measured)
    started: float | None = None    # time.time() at which this process counts the run as begun
    # Each rollout worker's random state (the engine samples from it): a step replayed after a fault samples
    # the episodes it sampled the first time. None: not saved (a checkpoint from before it was).
    rollout_rng: list | None = None

    def to_dict(self) -> dict:
        return {"step": self.step, "cursor": self.cursor, "evals": self.evals, "wall_s": self.wall_s,
                "version": self.version, "eval_before": self.eval_before, "started": self.started,
                "rollout_rng": self.rollout_rng}

    @classmethod
    def from_dict(cls, data: dict) -> RunState:
        return cls(step=data["step"], cursor=data["cursor"], evals=dict(data["evals"]), wall_s=data["wall_s"],
                   version=data.get("version"), eval_before=data.get("eval_before"), started=data.get("started"),
                   rollout_rng=data.get("rollout_rng"))


class TaskSampler:
    """Training tasks: seeds counted up from `offset`, so every maze is new and a cursor resumes exactly."""

    def __init__(self, env: str, options: dict, offset: int, cursor: int = 0):
        self.env, self.options, self.offset, self.cursor = env, dict(options), offset, cursor

    def take(self, n: int) -> list[Task]:
        tasks = [Task(self.env, self.offset + self.cursor + i, self.options) for i in range(n)]
        self.cursor += n
        return tasks

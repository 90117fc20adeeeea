"""What a run carries from step to step, saved in every checkpoint and restored on resume."""
from __future__ import annotations

from dataclasses import dataclass, field

from rollout.worker import Task


@dataclass
class RunState:
    """The checkpoint's `state`: `to_dict` writes it, `from_dict` reads it back (also from a checkpoint
    written before this class existed, which held the same keys as a plain dict)."""
    step: int = 0                   # steps completed
    cursor: int = 0                 # training seeds tried, skipped ones included (TaskSampler.cursor)
    evals: dict = field(default_factory=dict)   # str(step) -> the periodic eval at that step
    wall_s: float = 0.0             # the run's seconds up to the checkpoint, over all its processes
    version: int | None = None      # the adapter version the rollout workers serve
    eval_before: dict | None = None  # the eval before training (None until measured)
    test_before: dict | None = None  # the test set before training (None until measured, or no test set)
    started: float | None = None    # time.time() at which this process counts the run as begun
    # Each rollout worker's random state (the engine samples from it): a step replayed after a fault samples
    # the episodes it sampled the first time. None: not saved (a checkpoint from before it was).
    rollout_rng: list | None = None

    def to_dict(self) -> dict:
        return {"step": self.step, "cursor": self.cursor, "evals": self.evals, "wall_s": self.wall_s,
                "version": self.version, "eval_before": self.eval_before,
                "test_before": self.test_before, "started": self.started,
                "rollout_rng": self.rollout_rng}

    @classmethod
    def from_dict(cls, data: dict) -> RunState:
        return cls(step=data["step"], cursor=data["cursor"], evals=dict(data["evals"]), wall_s=data["wall_s"],
                   version=data.get("version"), eval_before=data.get("eval_before"),
                   test_before=data.get("test_before"), started=data.get("started"),
                   rollout_rng=data.get("rollout_rng"))


class TaskSampler:
    """Training tasks: seeds counted up from `offset`, skipping every seed whose task an evaluation scores
    (`held_out`: the eval and test seeds; envs.split), so a cursor resumes exactly."""

    def __init__(self, env: str, options: dict, offset: int, cursor: int = 0, held_out=()):
        import envs
        from envs.split import held_out as split_held_out

        self.env, self.options, self.offset, self.cursor = env, dict(options), offset, cursor
        self._keyed = envs.make(env, **self.options)
        self.skip = split_held_out(self._keyed, held_out)

    def take(self, n: int) -> list[Task]:
        from envs.split import training_seeds

        seeds, after = training_seeds(self._keyed, self.offset + self.cursor, n, self.skip)
        self.cursor = after - self.offset
        return [Task(self.env, s, self.options) for s in seeds]

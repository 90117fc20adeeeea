"""What a run carries from step to step, saved in every checkpoint and restored on resume; and what a resumed
run may change of its config."""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from grpo.config import SECTIONS
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
    # eval.select "best": the adapter with the highest validation success so far, {"step", "version",
    # "success_rate"} (step 0: the starting adapter), its version leased in the store so that it is kept
    best: dict | None = None

    def to_dict(self) -> dict:
        return {"step": self.step, "cursor": self.cursor, "evals": self.evals, "wall_s": self.wall_s,
                "version": self.version, "eval_before": self.eval_before,
                "test_before": self.test_before, "started": self.started,
                "rollout_rng": self.rollout_rng, "best": self.best}

    @classmethod
    def from_dict(cls, data: dict) -> RunState:
        return cls(step=data["step"], cursor=data["cursor"], evals=dict(data["evals"]), wall_s=data["wall_s"],
                   version=data.get("version"), eval_before=data.get("eval_before"),
                   test_before=data.get("test_before"), started=data.get("started"),
                   rollout_rng=data.get("rollout_rng"), best=data.get("best"))


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


# The fields a resumed run may change: each says how long to train, where to log, when to save or evaluate,
# how to survive faults, where to place the actors, or how a batch is cut into passes that give the same update
# (train.micro_batch_size "does not change the update"). None of them changes what a step trains on or how.
# `steps` keeps the steps already run; a cosine schedule (train.schedule) runs over the new count from the
# step resumed. A section's name with ".*" allows each of its fields.
MAY_CHANGE = ("steps", "output_dir", "eval.every", "eval.target_success", "eval.select", "checkpoint.*",
              "metrics.*", "fault.*", "cluster.*", "train.micro_batch_size", "train.tokens_per_micro_batch",
              "train.activation_checkpointing", "train.share_prompts", "engine.kv_cache_memory_bytes",
              "engine.gpu_memory_utilization", "engine.max_num_seqs")


class ResumeConfigError(ValueError):
    """A run folder holds a run whose config differs from this one in a field that changes the training."""


def config_changes(old: dict, new: dict) -> list[tuple[str, object, object]]:
    """(field, old value, new value) for each field the two configs (RunConfig.to_dict, as config.yaml holds
    it) both have and set apart; a field only one has (one added or removed by an upgrade) is not compared."""
    out = []
    for key in old.keys() & new.keys():
        if key in SECTIONS and isinstance(old[key], dict) and isinstance(new[key], dict):
            out += [(f"{key}.{name}", old[key][name], new[key][name])
                    for name in old[key].keys() & new[key].keys() if old[key][name] != new[key][name]]
        elif old[key] != new[key]:
            out.append((key, old[key], new[key]))
    return sorted(out, key=lambda change: change[0])


def may_change(field: str) -> bool:
    return field in MAY_CHANGE or f"{field.split('.')[0]}.*" in MAY_CHANGE


def check_resume(run_dir, config) -> list[tuple[str, object, object]]:
    """Before a run resumes in `run_dir`: the changes from the config.yaml of the run it resumes, all of them
    fields that MAY_CHANGE; any other change raises ResumeConfigError with the diff. A folder without a
    checkpoint has nothing to resume: no changes."""
    from grpo.learner import checkpoint

    run_dir = Path(run_dir)
    saved = run_dir / "config.yaml"
    if not (saved.is_file() and (run_dir / "checkpoints" / checkpoint.MARKER).is_file()):
        return []
    changes = config_changes(yaml.safe_load(saved.read_text()) or {}, yaml.safe_load(config.to_yaml()))
    refused = [c for c in changes if not may_change(c[0])]
    if refused:
        diff = "\n".join(f"  {name}: {old!r} -> {new!r}" for name, old, new in refused)
        raise ResumeConfigError(
            f"{run_dir} holds a run with another config (its config.yaml); resuming it would train on with "
            f"settings it did not start with:\n{diff}\nGive a new output_dir to start a new run, or set "
            f"{'these fields' if len(refused) > 1 else 'the field'} back to resume this one. Fields a resumed run "
            "may change: " + ", ".join(MAY_CHANGE) + " (docs/troubleshooting.md, \"Resuming with a changed config\")")
    return changes


def log_changes(sink, changes: list[tuple[str, object, object]]) -> None:
    """A resume's allowed config changes: one config_change event in metrics.jsonl, and a line on stderr."""
    if changes:
        sink.log({"event": "config_change", "changes": [{"field": f, "old": old, "new": new}
                                                        for f, old, new in changes]})
        print("[grpo] resuming with a changed config: " + ", ".join(f"{f} {old!r} -> {new!r}"
                                                                   for f, old, new in changes), file=sys.stderr)

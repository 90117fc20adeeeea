"""What summary.json adds to show how a run learned, not only where it ended.

GRPO's group-relative advantage is zero in a group whose episodes all got the same reward, so the share of
such groups and the sampled success say whether the task reward could teach at all; how the greedy
evaluation's failures ended says what there was to learn (running out of turns, ending the episode unsolved,
replies that did not parse). Generic: it reads stop reasons and parse errors, which every env produces.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path

from grpo.report.metrics import read_metrics


def episode_outcomes(trajs) -> dict:
    """How episodes ended: failures by stop reason ("max_turns": the turn limit, "done": the env ended the
    episode unsolved, e.g. the maze's stop off the target, "context": the context filled up), the share of
    turns whose reply did not parse (all episodes, and the failed ones alone), and the failed episodes in
    which most replies did not parse."""
    failed = [t for t in trajs if not t.success]
    turns = sum(t.num_turns for t in trajs)
    failed_turns = sum(t.num_turns for t in failed)
    return {
        "episodes": len(trajs),
        "failed": len(failed),
        "failed_by_stop_reason": dict(sorted(Counter(t.stop_reason for t in failed).items())),
        "unparseable_turn_share": _share(sum(t.parse_errors for t in trajs), turns),
        "unparseable_turn_share_failed": _share(sum(t.parse_errors for t in failed), failed_turns),
        "failed_mostly_unparseable": sum(2 * t.parse_errors > t.num_turns for t in failed),
    }


def step_records(metrics_path: str | Path) -> dict[int, dict]:
    """The step records of metrics.jsonl by step (events skipped; a step logged again after a restart
    counts once, as last logged)."""
    records: dict[int, dict] = {}
    for record in read_metrics(metrics_path):
        if "event" not in record and "step" in record:
            records[int(record["step"])] = record
    return records


def mechanism(metrics_path: str | Path, tasks_per_step: int, eval_before: dict, eval_after: dict) -> dict:
    """The sampled success and the share of zero-signal groups at the first and the last step, and how the
    greedy evaluation failed before and after training (`outcomes` from `episode_outcomes`; None for an
    evaluation logged without them)."""
    records = step_records(metrics_path)
    out: dict = {}
    for name, step in (("first_step", min(records, default=None)), ("last_step", max(records, default=None))):
        record = records.get(step, {})
        zero, rollout = record.get("zero_signal_groups"), record.get("rollout", {})
        # Dynamic sampling draws more groups than tasks_per_step: the share is of the groups drawn.
        drawn = rollout.get("groups_drawn", tasks_per_step)
        out[f"{name}_rollout_success"] = rollout.get("success_rate")
        out[f"zero_signal_share_{name}"] = None if zero is None else round(zero / drawn, 4)
    out["eval_before_outcomes"] = eval_before.get("outcomes")
    out["eval_after_outcomes"] = eval_after.get("outcomes")
    return out


def _share(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None

"""What a run tells its user in words: the before/after table a finished run prints, and the warnings its
progress line raises when a step could not teach anything."""
from __future__ import annotations

from pathlib import Path


def summary_rows(summary: dict, run_dir: str | Path | None = None) -> list[tuple[str, str]]:
    """The rows of the table a finished run prints (fit() and `make maze`)."""
    after = summary.get("eval_after_detail") or {}
    n = after.get("episodes")
    seeds = f"{n} validation seeds" if n else "validation seeds"
    rows = [(f"greedy success, {seeds}, before training", _pct(summary.get("eval_before"))),
            (f"greedy success, {seeds}, after training", _pct(summary.get("eval_after")))]
    test = summary.get("test_after_detail")
    if test:
        rows += [(f"greedy success, {test['episodes']} test seeds, before training", _pct(summary.get("test_before"))),
                 (f"greedy success, {test['episodes']} test seeds, after training", _pct(test["success_rate"]))]
    if after.get("mean_reward") is not None:
        rows.append(("mean reward after training (eval)", f"{after['mean_reward']:.3f}"))
    if after.get("stop_reasons"):
        rows.append(("eval episodes ended by", ", ".join(f"{k} {v}" for k, v in sorted(after["stop_reasons"].items()))))
    rows.append(("GRPO steps", str(summary.get("steps"))))
    if summary.get("grpo_wall_s") is not None:
        rows.append(("GRPO wall time", f"{summary['grpo_wall_s']:.0f} s"))
    if summary.get("adapter_path"):
        selected = summary.get("selected") or {}
        if "last_step" in selected:  # eval.select best picked an earlier adapter than the last step's
            rows.append(("adapter (eval.select best)", f"step {selected['step']}'s, validated above step "
                         f"{selected['last_step']}'s {_pct(selected['last_step_validation'])}"))
        rows.append(("adapter", str(summary["adapter_path"])))
    if run_dir is not None:
        rows.append(("run folder (summary.json, samples.jsonl, curves.png)", str(Path(run_dir).resolve())))
    return rows


def table(rows: list[tuple[str, str]]) -> str:
    width = max((len(k) for k, _ in rows), default=0)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def step_warnings(record: dict, group_size: int, max_model_len: int | None = None) -> list[str]:
    """Plain-words warnings about one step record: every group with equal rewards and no step-level
    advantage either (nothing to learn), and episodes cut at the context limit."""
    r = record.get("rollout", {})
    out = []
    episodes = int(r.get("episodes", 0))
    groups = episodes // group_size if group_size else 0
    if groups and record.get("zero_signal_groups") == groups and not record.get("step_adv_abs_mean"):
        why = ""
        turns, bad = int(r.get("turns", 0)), int(r.get("parse_errors", 0))
        if bad:
            why = f"; {bad} of {turns} replies did not parse"
        out.append(f"step {record['step']}: all {groups} groups had equal rewards (mean {r.get('mean_reward', 0):.3g})"
                   f"{why}: nothing to learn from this step; samples.jsonl shows the episodes")
    cut = int((r.get("stop_reasons") or {}).get("context", 0))
    if cut:
        limit = f" (engine.max_model_len={max_model_len})" if max_model_len else ""
        out.append(f"step {record['step']}: {cut} of {episodes} episodes ended at the context limit{limit}: raise "
                   "it, shorten the history (rollout.history) or cap the turns")
    return out


def _pct(value) -> str:
    return "-" if value is None else f"{value:.1%}"

"""The progress bar on stderr: one tick a step with its headline figures, and the step's warnings."""
from __future__ import annotations

import sys

from grpo.report.table import step_warnings


def progress(start: int, total: int, group_size: int, max_model_len: int):
    """`update(record)` after each step; `update.close()` when the loop ends early."""
    from tqdm import tqdm

    bar = tqdm(total=total, initial=start, desc="grpo", unit="step", file=sys.stderr, dynamic_ncols=True)

    def update(record: dict) -> None:
        bar.set_postfix(postfix(record), refresh=False)
        bar.update(1)
        for warning in step_warnings(record, group_size, max_model_len):
            bar.write(f"[grpo] warning: {warning}", file=sys.stderr)
        if record["step"] >= total:
            bar.close()

    update.close = bar.close
    return update


def postfix(record: dict) -> dict[str, str]:
    """A step's headline figures as the bar shows them. A step that trained nothing (every group's rewards
    equal and dropped) has no trainer-vs-vLLM reading: "none", never a perfect-looking 0."""
    r, t = record["rollout"], record["train"]
    mismatch = t.get("sampler_abs_diff")
    shown = {"reward": f"{r['mean_reward']:.2f}", "success": f"{r['success_rate']:.0%}",
             "turns": f"{r['mean_turns']:.1f}", "mismatch": "none" if mismatch is None else f"{mismatch:.1e}",
             "step_s": f"{record['time']['step_s']:.1f}"}
    if r.get("draw_rounds", 1) > 1:  # dynamic sampling drew more: the groups trained of those drawn
        shown["groups"] = f"{r['groups_trained']}/{r['groups_drawn']}"
    if "eval" in record:
        shown["eval"] = f"{record['eval']['success_rate']:.0%}"
    return shown

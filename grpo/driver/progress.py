"""The progress bar on stderr: one tick a step with its headline figures, and the step's warnings."""
from __future__ import annotations

import sys

from grpo.report.table import step_warnings


def progress(start: int, total: int, group_size: int, max_model_len: int):
    """`update(record)` after each step; `update.close()` when the loop ends early."""
    from tqdm import tqdm

    bar = tqdm(total=total, initial=start, desc="grpo", unit="step", file=sys.stderr, dynamic_ncols=True)

    def update(record: dict) -> None:
        r, t = record["rollout"], record["train"]
        shown = {"reward": f"{r['mean_reward']:.2f}", "success": f"{r['success_rate']:.0%}",
                 "turns": f"{r['mean_turns']:.1f}", "mismatch": f"{t.get('sampler_abs_diff', 0):.1e}",
                 "step_s": f"{record['time']['step_s']:.1f}"}
        if "eval" in record:
            shown["eval"] = f"{record['eval']['success_rate']:.0%}"
        bar.set_postfix(shown, refresh=False)
        bar.update(1)
        for warning in step_warnings(record, group_size, max_model_len):
            bar.write(f"[grpo] warning: {warning}", file=sys.stderr)
        if record["step"] >= total:
            bar.close()

    update.close = bar.close
    return update

"""`make maze`: the seed's result in miniature, on the CPU.

Warm start (examples/maze/warmstart, made by sft.py if missing) -> greedy eval on the 64 fixed mazes ->
GRPO until 95% on the 64 validation mazes or the step budget -> eval on them and on the 64 test mazes -> a table, and
runs/maze/summary.json. Extra arguments override the config: `python -m examples.maze.run --steps 10`.
`--pipelined` runs the recipe with rollouts one step ahead of the trainer (maze_config.PIPELINED) in
runs/maze_pipelined.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# The last line's figures: where the run ended, and how it learned (the sampled success and the groups whose
# equal rewards gave no signal, at the first and the last step).
SHOWN = ("eval_before", "eval_after", "test_before", "test_after", "steps", "grpo_wall_s", "first_step_rollout_success",
         "last_step_rollout_success", "zero_signal_share_first_step", "zero_signal_share_last_step")


def overrides_of(argv: list[str]) -> list[str]:
    """The command line's overrides of cpu.yaml, `--pipelined` spelled out."""
    from examples.maze import maze_config as mc

    argv = list(argv)
    if "--pipelined" not in argv:
        return argv
    argv.remove("--pipelined")
    return mc.PIPELINED + ["--output_dir", "runs/maze_pipelined"] + argv


def main(argv: list[str] | None = None) -> dict:
    import grpo

    overrides = overrides_of(sys.argv[1:] if argv is None else argv)
    t0 = time.time()
    from examples.maze.sft import ensure_warmstart

    warmstart = ensure_warmstart()
    config = grpo.RunConfig.from_yaml(HERE / "cpu.yaml", ["--model", str(warmstart)] + overrides)
    summary = grpo.Trainer(config).fit()
    # fit() printed the before/after table (grpo.report.table); the example adds its own wall time.
    print(f"make maze wall time (after install): {time.time() - t0:.0f} s")
    print(json.dumps({k: summary.get(k) for k in SHOWN}))
    return summary


if __name__ == "__main__":
    main()

"""What each credit-assignment term adds to the maze run: three GRPO runs from the same warm start, the same
training mazes and the same seed, then one PNG of their greedy-eval curves and a table.

    python -m examples.maze.ablate              # runs/maze_ablation/{outcome,shaping,step_level}/, ablation.png
    python -m examples.maze.ablate --steps 4    # shorter; extra `--section.field VALUE` go to every run

1. outcome:    the sparse task reward (1 for stopping on the target) and episode-level group-relative
               advantages: `make maze`'s recipe, the seed's.
2. shaping:    + 0.1 reward per move that shortens the way to the target (potential-based progress shaping).
3. step_level: + step-level advantages (GiGPO anchor states, step_weight 1.0) on top of the shaping.
Every run goes the whole step budget (no early stop at 95%) and evaluates every two steps, so the curves share
their x axis. A run folder that exists resumes; delete runs/maze_ablation for fresh runs.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from examples.maze import maze_config as mc

HERE = Path(__file__).resolve().parent
VARIANTS = {
    "outcome": [],
    "shaping": ["--env.options.progress_reward", str(mc.PROGRESS_REWARD)],
    "step_level": ["--env.options.progress_reward", str(mc.PROGRESS_REWARD), "--algorithm.step_weight", "1.0"],
}


def eval_curve(summary: dict) -> list[tuple[int, float]]:
    """(step, greedy success on the fixed mazes) from a run's summary: the eval before training at step 0,
    then every periodic eval, then the final eval at the last step."""
    points = {0: summary["eval_before"]}
    points.update({int(step): e["success_rate"] for step, e in summary.get("evals", {}).items()})
    points[int(summary["steps"])] = summary["eval_after"]
    return sorted(points.items())


def table(results: dict[str, dict]) -> str:
    """The markdown table (examples/maze/README.md) of the measured figures, one row per run."""
    rows = ["| run | greedy before | greedy after | test after | sampled success, first -> last step "
            "| zero-signal groups, first -> last step | GRPO wall |", "|---|---|---|---|---|---|---|"]
    for name, s in results.items():
        rows.append(
            f"| {name} | {s['eval_before']:.1%} | {s['eval_after']:.1%} | {_pct(s.get('test_after'))} "
            f"| {_pct(s.get('first_step_rollout_success'))} -> {_pct(s.get('last_step_rollout_success'))} "
            f"| {_pct(s.get('zero_signal_share_first_step'))} -> {_pct(s.get('zero_signal_share_last_step'))} "
            f"| {s['grpo_wall_s']:.0f} s |")
    return "\n".join(rows)


def plot(curves: dict[str, list[tuple[int, float]]], out_png: Path, target: float | None = None) -> Path:
    """Greedy-eval curves, one line per label (a run, a seed), with the target as a dashed line if given."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.6))
    for label, curve in curves.items():
        xs, ys = zip(*curve)
        ax.plot(xs, ys, marker="o", markersize=3, label=label)
    if target is not None:
        ax.axhline(target, color="grey", linestyle="--", linewidth=1)
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("greedy success, 64 fixed mazes")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_png, dpi=100)
    plt.close(fig)
    return out_png


def main(argv: list[str] | None = None) -> dict:
    import grpo

    ap = argparse.ArgumentParser(prog="python -m examples.maze.ablate", description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=8, help="GRPO steps of every run (default 8)")
    ap.add_argument("--out", default="runs/maze_ablation", help="the folder of the three runs and the PNG")
    ap.add_argument("--only", choices=sorted(VARIANTS), action="append", help="run only these (repeatable)")
    args, extra = ap.parse_known_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {}
    for name, flags in VARIANTS.items():
        if args.only and name not in args.only:
            continue
        t0 = time.time()
        overrides = ["--model", str(mc.WARMSTART), "--output_dir", str(out / name), "--steps", str(args.steps),
                     "--eval.every", "2", "--eval.target_success", "null", *flags, *extra]
        config = grpo.RunConfig.from_yaml(HERE / "cpu.yaml", overrides)
        results[name] = grpo.Trainer(config).fit()
        print(f"[ablate] {name}: {results[name]['eval_before']:.1%} -> {results[name]['eval_after']:.1%} "
              f"({time.time() - t0:.0f} s)", flush=True)
    png = plot({name: eval_curve(s) for name, s in results.items()}, out / "ablation.png")
    text = table(results)
    (out / "ablation.md").write_text(text + "\n")
    (out / "ablation.json").write_text(json.dumps({k: {key: v.get(key) for key in _KEPT} for k, v in results.items()},
                                                  indent=1) + "\n")
    print(text)
    print(f"[ablate] {png}")
    return results


_KEPT = ("eval_before", "eval_after", "test_before", "test_after", "steps", "grpo_wall_s", "first_step_rollout_success",
         "last_step_rollout_success", "zero_signal_share_first_step", "zero_signal_share_last_step", "evals")


def _pct(value) -> str:
    return "-" if value is None else f"{value:.1%}"


if __name__ == "__main__":
    main()

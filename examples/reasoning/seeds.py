"""The reasoning example over training seeds 0-2: each seed's run (examples/reasoning/run.py, one run folder a
seed, reused when finished), then results/grpo.json and the README's table generated from it.

    python -m examples.reasoning.seeds            # runs the seeds whose folder has no result yet
    python -m examples.reasoning.seeds --table    # the README's table alone, from results/grpo.json

The training seed sets both the sampling seed (seed) and the trainer's (train.seed): the task draws, the
samples and the adapter's initialisation all change with it.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from examples.maze.baselines import _cpu, spread
from examples.maze.seeds import write_block

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "grpo.json"
README = HERE / "README.md"
BEGIN, END = "<!-- reasoning-seeds -->", "<!-- /reasoning-seeds -->"
TOP_README = HERE.parents[1] / "README.md"
HEADLINE = "<!-- reasoning-headline -->", "<!-- /reasoning-headline -->"
SEEDS = (0, 1, 2)


def run_dir(seed: int) -> Path:
    return Path("runs") / f"reasoning-{seed}"


def run_seed(seed: int) -> dict:
    from examples.reasoning import run

    folder = run_dir(seed)
    if not (folder / "result.json").is_file():
        run.main(["--seed", str(seed), "--train.seed", str(seed), "--output_dir", str(folder)])
    result = json.loads((folder / "result.json").read_text())
    return {"seed": seed, **{k: result[k] for k in ("test_before", "test_after", "eval_after", "steps", "wall_s")},
            "gain": round(result["test_after"] - result["test_before"], 4)}


def table(res: dict) -> str:
    rows = res["seeds"]
    lines = ["| seed | test before | test after | gain | validation after | steps | wall s |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['seed']} | {100 * r['test_before']:.1f}% | {100 * r['test_after']:.1f}% "
                     f"| +{100 * r['gain']:.1f} | {100 * r['eval_after']:.1f}% | {r['steps']} | {r['wall_s']:.0f} |")
    lines.append(f"| mean (range) | {spread([r['test_before'] for r in rows])} "
                 f"| {spread([r['test_after'] for r in rows])} "
                 f"| {_points([r['gain'] for r in rows])} "
                 f"| {spread([r['eval_after'] for r in rows])} | | |")
    return "\n".join(lines) + (f"\n\nMeasured {res['date']} on a 2-core {res['machine']}, test rows 64-191 "
                               "(128 questions).")


def headline(res: dict) -> str:
    """The project README's sentence, from results/grpo.json."""
    rows = res["seeds"]
    return (f"greedy accuracy on 128 held-out test questions goes from {spread([r['test_before'] for r in rows])} "
            f"to {spread([r['test_after'] for r in rows])} in 20 GRPO steps, over training seeds "
            f"{','.join(str(r['seed']) for r in rows)}, each run within {max(r['wall_s'] for r in rows):.0f} s. "
            f"Measured {res['date']} on a 2-core {res['machine']}.")


def _points(gains: list[float]) -> str:
    """The gains' mean and range in percentage points."""
    points = [100 * g for g in gains]
    return f"+{sum(points) / len(points):.1f} ({min(points):+.1f} to {max(points):+.1f})"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table", action="store_true", help="only write the README's table from results/grpo.json")
    args = ap.parse_args(argv)
    if not args.table:
        rows = [run_seed(seed) for seed in SEEDS]
        RESULTS.parent.mkdir(exist_ok=True)
        RESULTS.write_text(json.dumps({"seeds": rows, "date": time.strftime("%Y-%m-%d"), "machine": _cpu()},
                                      indent=1) + "\n")
    res = json.loads(RESULTS.read_text())
    write_block(README, BEGIN, END, table(res))
    write_block(TOP_README, *HEADLINE, headline(res))
    print(table(res))


if __name__ == "__main__":
    main()

"""The maze recipe over several training seeds: does `make maze`'s result hold, or did one seed get lucky?

    python -m examples.maze.seeds                  # seeds 0-4: runs/maze_seeds/seed{0..4}/, seeds.png, seeds.md
    python -m examples.maze.seeds --seeds 1,2      # some; extra `--section.field VALUE` go to every run
    python -m examples.maze.seeds --docs           # also writes the table and the PNG into the maze docs
    python -m examples.maze.seeds --pipelined      # the recipe with rollouts a step ahead (maze_config.PIPELINED)

Seed S changes all three sources of chance: the engine's sampling (`--seed S`), the training mazes
(`--train_seed_offset (S + 1) x 1e6`, envs.maze.overlap.training_offset; seed 0 draws what `make maze`
draws, past every validation and test layout) and the adapter's initialisation
(`--train.seed S`). Each run is `make maze`'s (examples/maze/cpu.yaml): it stops at the 95% target. A seed
whose folder holds a summary.json is not run again (delete the folder to rerun it).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from envs.maze.overlap import training_offset
from envs.seeds import parse_seeds
from examples.maze import maze_config as mc
from examples.maze.ablate import _pct, eval_curve, plot

HERE = Path(__file__).resolve().parent
README = HERE / "README.md"
PNG = HERE / "seeds.png"
RESULTS = HERE / "results"
BEGIN, END = "<!-- maze-seeds -->", "<!-- /maze-seeds -->"


def seed_flags(seed: int) -> list[str]:
    return ["--seed", str(seed), "--train_seed_offset", str(training_offset(seed)), "--train.seed", str(seed)]


def groups(metrics: list[dict]) -> tuple[int, int]:
    """The groups drawn and trained over these step records."""
    return (sum(r["rollout"].get("groups_drawn", 0) for r in metrics),
            sum(r["rollout"].get("groups_trained", 0) for r in metrics))


def reached(metrics: list[dict], target: float) -> dict:
    """The first periodic eval at or above `target`: its step, the run's wall time then, and the groups drawn
    and trained up to then (None when no eval reached it)."""
    for record in metrics:
        if record.get("eval", {}).get("success_rate", 0) >= target:
            drawn, trained = groups([r for r in metrics if r["step"] <= record["step"]])
            return {"step": record["step"], "wall_s": record.get("wall_s"), "groups_drawn": drawn,
                    "groups_trained": trained}
    return {"step": None, "wall_s": None, "groups_drawn": None, "groups_trained": None}


def step_lines(run_dir: Path) -> list[dict]:
    """The run's step records, the last line of each step (a step run again after a restart logs twice)."""
    from grpo.report.summary import step_records

    return [r for _, r in sorted(step_records(run_dir / "metrics.jsonl").items())]


def row(seed: int, summary: dict, metrics: list[dict], target: float, group_size: int) -> dict:
    hit = reached(metrics, target)
    drawn, trained = groups(metrics)
    return {"seed": seed, "curve": eval_curve(summary), "eval_after": summary["eval_after"],
            "test_before": summary.get("test_before"), "test_after": summary.get("test_after"),
            "test_failed_stopped_early": stopped_early(summary.get("test_after_detail")), "steps": summary["steps"],
            "grpo_wall_s": summary["grpo_wall_s"], "reached_step": hit["step"], "reached_wall_s": hit["wall_s"],
            # The sample cost of the target: the episodes of the groups trained on up to that eval.
            "reached_episodes_trained": None if hit["step"] is None else hit["groups_trained"] * group_size,
            "groups_drawn": drawn, "groups_trained": trained,
            "draws_per_kept_group": round(drawn / trained, 2) if trained else None}


def stopped_early(detail: dict | None) -> float | None:
    """The share of an eval's failed episodes that ended by a stop off the target (the rest ran out of turns)."""
    if not detail or not detail["outcomes"]["failed"]:
        return None
    outcomes = detail["outcomes"]
    return round(outcomes["failed_by_stop_reason"].get("done", 0) / outcomes["failed"], 4)


def table(rows: list[dict], tasks_per_step: int) -> str:
    """One line per seed, then the mean and spread of each column over the seeds."""
    lines = ["| seed | greedy success at each eval (step: %) | steps to 95% | episodes trained to 95% | wall to 95% "
             "| validation after | test after | groups drawn / trained (draws per trained group) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        curve = ", ".join(f"{step}: {value:.1%}" for step, value in r["curve"])
        lines.append(f"| {r['seed']} | {curve} | {r['reached_step'] or 'not reached'} "
                     f"| {r['reached_episodes_trained'] or '-'} | {_secs(r['reached_wall_s'])} "
                     f"| {r['eval_after']:.1%} | {_pct(r['test_after'])} | {r['groups_drawn']} / "
                     f"{r['groups_trained']} ({r['draws_per_kept_group']}) |")
    hits = [r for r in rows if r["reached_step"] is not None]
    lines.append(f"| {len(hits)} of {len(rows)} reached 95% | | {_spread([r['reached_step'] for r in hits], '')} "
                 f"| {_spread([r['reached_episodes_trained'] for r in hits], '')} "
                 f"| {_spread([r['reached_wall_s'] for r in hits], ' s')} "
                 f"| {_spread([100 * r['eval_after'] for r in rows], '%')} "
                 f"| {_spread([100 * r['test_after'] for r in rows if r['test_after'] is not None], '%')} "
                 f"| {sum(r['groups_drawn'] for r in rows)} drawn for {sum(r['groups_trained'] for r in rows)} "
                 f"trained ({tasks_per_step} a step without dynamic sampling) |")
    return "\n".join(lines)


def _secs(value) -> str:
    return "-" if value is None else f"{value:.0f} s"


def _spread(values: list[float], unit: str) -> str:
    """Median, mean and range: with 5 seeds a median and the extremes say more than a standard deviation."""
    if not values:
        return "-"
    return (f"median {statistics.median(values):.1f}{unit}, mean {statistics.mean(values):.1f}{unit}, "
            f"{min(values):.1f}-{max(values):.1f}{unit}")


def write_block(path: Path, begin: str, end: str, text: str) -> None:
    """`text` between the markers `begin` and `end` of the doc at `path`, in place of what stood there."""
    doc = path.read_text()
    if begin not in doc or end not in doc:
        raise ValueError(f"{path} has no {begin} ... {end} block to write into")
    head, rest = doc.split(begin, 1)
    path.write_text(f"{head}{begin}\n{text}\n{end}{rest.split(end, 1)[1]}")


def write_docs(text: str, readme: Path = README) -> None:
    """The table between the maze README's markers (the PNG sits beside it as seeds.png)."""
    write_block(readme, BEGIN, END, text)


def main(argv: list[str] | None = None) -> list[dict]:
    import grpo

    ap = argparse.ArgumentParser(prog="python -m examples.maze.seeds", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="0-4", help="training seeds, e.g. 0-4 or 1,3 (default 0-4)")
    ap.add_argument("--out", default="runs/maze_seeds", help="the folder of the runs, the PNG and the table")
    ap.add_argument("--docs", action="store_true", help="also write the table and PNG into examples/maze/")
    ap.add_argument("--pipelined", action="store_true", help="rollouts one step ahead (maze_config.PIPELINED)")
    args, extra = ap.parse_known_args(argv)
    if args.pipelined and args.docs:
        ap.error("--docs writes the table of cpu.yaml's recipe into examples/maze/README.md; drop it with --pipelined")
    extra = (mc.PIPELINED if args.pipelined else []) + extra
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows, config = [], None
    for seed in parse_seeds(args.seeds):
        run_dir = out / f"seed{seed}"
        config = grpo.RunConfig.from_yaml(HERE / "cpu.yaml", ["--model", str(mc.WARMSTART), "--output_dir",
                                                              str(run_dir), *seed_flags(seed), *extra])
        if not (run_dir / "summary.json").exists():
            t0 = time.time()
            grpo.Trainer(config).fit()
            print(f"[seeds] seed {seed}: {time.time() - t0:.0f} s", flush=True)
        summary = json.loads((run_dir / "summary.json").read_text())
        rows.append(row(seed, summary, step_lines(run_dir), config.eval.target_success, config.algorithm.group_size))
    text = table(rows, config.tasks_per_step)
    png = plot({f"seed {r['seed']}": r["curve"] for r in rows}, out / "seeds.png", config.eval.target_success)
    (out / "seeds.md").write_text(text + "\n")
    (out / "seeds.json").write_text(json.dumps(rows, indent=1) + "\n")
    if args.docs:
        write_docs(text)
        PNG.write_bytes(png.read_bytes())
        RESULTS.mkdir(exist_ok=True)  # what the table is made of, which tests/test_maze_example.py reads back
        (RESULTS / "seeds.json").write_text(json.dumps({"tasks_per_step": config.tasks_per_step, "rows": rows},
                                                       indent=1) + "\n")
    print(text)
    print(json.dumps({"seeds": [r["seed"] for r in rows], "reached": [r["reached_step"] for r in rows],
                      "test_after": [r["test_after"] for r in rows]}))
    return rows


if __name__ == "__main__":
    main()

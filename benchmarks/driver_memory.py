"""The driver's memory against the episodes of a step: one maze step of 128 and one of 1024 episodes.

    python -m benchmarks.driver_memory [--sizes 16,128] [--run-dir runs/bench-driver-memory]

Each size (tasks a step, 8 episodes each) is one GRPO step of the maze warm start (`make maze`'s config, one
update pass over the batch so the large step stays minutes, not tens of minutes), run in a fresh process so
that its peak resident memory (ru_maxrss) is its own. The episodes go from the rollout workers to the train
ranks through Ray's object store; the driver holds their headers (rewards, turns) and one reference a group,
so its peak should stay flat as the episodes grow.
The last line printed is one JSON object, also written to benchmarks/results/driver_memory.json:
`rss_ratio` is the peak at the largest size over the peak at the smallest.
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

from benchmarks._machine import ROOT, fresh_run_dir, write_result


def one(tasks: int, run_dir: str) -> dict:
    import grpo
    from examples.maze import maze_config
    from examples.maze.run import HERE

    out = fresh_run_dir(run_dir)
    config = grpo.RunConfig.from_yaml(HERE / "cpu.yaml", [
        "--model", str(maze_config.WARMSTART), "--output_dir", str(out), "--steps", "1",
        "--tasks_per_step", str(tasks), "--train.updates_per_batch", "1", "--train.schedule", "constant",
        "--train.warmup_steps", "0", "--eval.seeds", "0-3",
        "--metrics.plots", "false", "--metrics.tensorboard", "false"])
    t0 = time.perf_counter()
    summary = grpo.Trainer(config).fit()
    record = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    return {"tasks": tasks, "episodes": record["rollout"]["episodes"], "turns": record["rollout"]["turns"],
            "driver_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "step_s": round(record["time"]["step_s"], 1), "wall_s": round(time.perf_counter() - t0, 1),
            "steps": summary["steps"]}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.driver_memory", description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="16,128", help="tasks a step, comma-separated (8 episodes each)")
    ap.add_argument("--run-dir", default=str(ROOT / "runs" / "bench-driver-memory"))
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)  # the child: one size, its figures as JSON
    args = ap.parse_args(argv)
    if args.one is not None:
        print(json.dumps(one(args.one, args.run_dir)))
        return {}
    rows = []
    for tasks in (int(x) for x in args.sizes.split(",")):
        done = subprocess.run([sys.executable, "-m", "benchmarks.driver_memory", "--one", str(tasks), "--run-dir",
                               f"{args.run_dir}/tasks{tasks}"], cwd=ROOT, capture_output=True, text=True, check=True)
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    # Only the default sizes are the full protocol.
    result = {"quick": args.sizes != ap.get_default("sizes"), "sizes": rows,
              "rss_ratio": round(rows[-1]["driver_peak_rss_mb"] / rows[0]["driver_peak_rss_mb"], 3),
              "episodes_ratio": rows[-1]["episodes"] / rows[0]["episodes"]}
    write_result("driver_memory", result)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()

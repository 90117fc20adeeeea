"""Which objective wins where: each `algorithm.loss_type`, and the importance-sampling families with rollouts one
step ahead (`pipeline.max_staleness: 1`), on the two bundled examples (the real SmolLM2-135M-Instruct on the
reasoning task, the tiny Qwen3-VL warm start on the maze), 3 training seeds each; test accuracy and wall time.

    python -m benchmarks.objectives                       # every arm, task and seed not kept yet
    python -m benchmarks.objectives --arms cispo --tasks maze   # one cell: its 3 seeds not kept yet
    python -m benchmarks.objectives --table               # objectives.json from the kept runs alone
    python -m benchmarks.objectives --arms grpo,cispo --tasks reasoning --seeds 0 --steps 2   # a smoke run

Each run is the example's own command (`python -m examples.reasoning.run`, `python -m examples.maze.run`) with
the arm's fields and the seed's flags, in a fresh folder under runs/objectives/, one after another. A run of the
full protocol is kept in benchmarks/results/objectives-runs/ with its protocol and machine as soon as it ends:
the ablation is 45 runs of 5 to 15 minutes on 2 cores, so it spans sessions. A kept run is not run again, one
kept under another protocol (the arm's fields, the example's config) is refused, and one that did not end
cleanly is not kept. A subset of arms, tasks or seeds runs each of its runs at the full protocol, so those are
kept too (a cell at a time completes sooner than the seed-major plan); only --steps makes a smoke run, kept
nowhere. An arm the example's config refuses (the sequence-level ones on the maze, whose turns are segments of
their own) is not run: its cell gives the reason.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks._machine import RESULTS, ROOT, fresh_run_dir, keep_run, kept_run, machine_info, write_result

RUNS_DIR = RESULTS / "objectives-runs"
SEEDS = (0, 1, 2)
# Rollouts one step ahead need the rollout engine on devices of its own (grpo/config.py refuses it colocated).
STALE = ["--pipeline.max_staleness=1", "--cluster.colocate=false"]
# The arm's fields over the example's config. Each loss_type as a user picks it by name, its preset's fields
# taking over (loss_agg is unset first: both configs set token_mean, which dr_grpo's and gspo's presets
# replace). dapo is not an arm: its preset (token_mean, group scaling) is what both configs already train with,
# so its runs would be the grpo arm's. The importance-sampling arms compare with `stale`, the same pipeline with
# the sampler's logprobs as the old policy; they take the trainer's and weight by the sampler's.
ARMS = {
    "grpo": [],
    "dr_grpo": ["--algorithm.loss_type=dr_grpo", "--algorithm.loss_agg=null"],
    "gspo": ["--algorithm.loss_type=gspo", "--algorithm.loss_agg=null"],
    "cispo": ["--algorithm.loss_type=cispo"],
    "sapo": ["--algorithm.loss_type=sapo"],
    "stale": STALE,
    "is_token_truncate": [*STALE, "--algorithm.old_logprobs=trainer", "--algorithm.importance_sampling=token_truncate",
                          "--algorithm.tis_cap=2.0"],
    "is_sequence_mask": [*STALE, "--algorithm.old_logprobs=trainer", "--algorithm.importance_sampling=sequence_mask",
                         "--algorithm.tis_floor=0.5", "--algorithm.tis_cap=2.0"],
    # verl's typical band for the geometric mean (docs/algorithms.md); tis_floor unset is 1/tis_cap.
    "is_geometric_mask": [*STALE, "--algorithm.old_logprobs=trainer",
                          "--algorithm.importance_sampling=geometric_mask", "--algorithm.tis_cap=1.001"],
}
TASKS = {"reasoning": "examples/reasoning/cpu.yaml", "maze": "examples/maze/cpu.yaml"}


def seed_flags(task: str, seed: int) -> list[str]:
    """The flags the example's own seeds script gives training seed `seed`."""
    if task == "maze":
        from examples.maze.seeds import seed_flags as maze_seed_flags

        return maze_seed_flags(seed)
    return ["--seed", str(seed), "--train.seed", str(seed)]


def refusal(task: str, arm: str) -> str | None:
    """Why the example's config refuses the arm (grpo/config.py's message), None when it takes it: the maze's
    turns are segments of their own (rollout.history none), which the sequence-level settings cannot read."""
    from grpo.config import RunConfig
    from grpo.driver.preflight import check_run

    try:
        check_run(RunConfig.from_yaml(ROOT / TASKS[task], ARMS[arm]), files=False)
    except (ValueError, TypeError) as e:
        return str(e)
    return None


def run_name(task: str, arm: str, seed: int) -> str:
    return f"{task}-{arm}-seed{seed}"


def protocol(task: str, arm: str, seed: int) -> dict:
    """What a run ran under: a kept run pools with the others only while this is the same."""
    config = (ROOT / TASKS[task]).read_bytes()
    return {"task": task, "arm": arm, "seed": seed, "overrides": ARMS[arm] + seed_flags(task, seed),
            "config": TASKS[task], "config_sha256": hashlib.sha256(config).hexdigest()}


def kept(folder: Path, name: str, wanted: dict) -> dict | None:
    """The run kept as folder/NAME.json under `wanted` (protocol, machine, run); None when there is none. One of
    another protocol is refused."""
    return kept_run(folder / f"{name}.json", wanted, "delete it to run it again under this one")


def last_json(text: str) -> dict | None:
    """The last line of the example's output that is a JSON object (its result line)."""
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                return None
    return None


def run_one(task: str, arm: str, seed: int, steps: int | None, work: Path) -> dict:
    """One run of the example in a fresh folder: its result line's figures, exit code and wall time (launch to
    exit); the example's output stays in the folder's run.log."""
    folder = fresh_run_dir(work / run_name(task, arm, seed))
    argv = [sys.executable, "-m", f"examples.{task}.run", *ARMS[arm], *seed_flags(task, seed),
            "--output_dir", str(folder / "run")]
    if steps is not None:
        argv += ["--steps", str(steps)]
    t0 = time.perf_counter()
    with open(folder / "run.log", "w") as log:
        code = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT).returncode
    wall_s = round(time.perf_counter() - t0, 1)
    line = last_json((folder / "run.log").read_text()) or {}
    return {"task": task, "arm": arm, "seed": seed, "exit_code": code, "wall_s": wall_s,
            **{k: line.get(k) for k in ("test_before", "test_after", "eval_after", "steps")},
            "log": str(folder / "run.log"), "load_average_after": round(os.getloadavg()[0], 2)}


def clean(run: dict) -> bool:
    """Whether a run ended cleanly with both test figures (what keeping it needs)."""
    return run["exit_code"] == 0 and run.get("test_before") is not None and run.get("test_after") is not None


def summarize(runs: list[dict], refused: dict[str, str], seeds=SEEDS) -> dict:
    """Per task and arm ("task/arm"): the reason when the config refuses it, else the seeds run, then (once
    every seed has) the mean and range of the test accuracy after, of its gain over before, and the mean wall
    time."""
    cells = {}
    for task in TASKS:
        for arm in ARMS:
            if f"{task}/{arm}" in refused:
                cells[f"{task}/{arm}"] = {"refused": refused[f"{task}/{arm}"]}
                continue
            mine = sorted((r for r in runs if r["task"] == task and r["arm"] == arm), key=lambda r: r["seed"])
            cell = {"seeds": [r["seed"] for r in mine], "complete": [r["seed"] for r in mine] == list(seeds)}
            if cell["complete"]:
                after = [r["test_after"] for r in mine]
                gain = [r["test_after"] - r["test_before"] for r in mine]
                cell.update(test_before=[r["test_before"] for r in mine], test_after=after,
                            test_after_mean=round(statistics.mean(after), 4), test_after_range=[min(after), max(after)],
                            gain_mean=round(statistics.mean(gain), 4),
                            gain_range=[round(min(gain), 4), round(max(gain), 4)],
                            wall_s_mean=round(statistics.mean(r["wall_s"] for r in mine), 1))
            cells[f"{task}/{arm}"] = cell
    return cells


def baseline_of(arm: str) -> str | None:
    """The arm another is read against: an importance-sampling arm against `stale` (its pipeline without the
    correction), `stale` and the loss types against `grpo`."""
    return None if arm == "grpo" else "stale" if arm.startswith("is_") else "grpo"


def verdicts(cells: dict, runs: list[dict]) -> dict[str, str]:
    """Per task, the arms that win or lose against their baseline as far as 3 seeds can show it: every seed's
    test accuracy after training above (or below) every seed's of the baseline. Overlapping ranges name no one.
    Then every kept run that ended below its own test accuracy before training."""
    out = {}
    for task in TASKS:
        worse = "".join(f" {r['arm']} seed {r['seed']} ended below its start ({r['test_before']:.1%} -> "
                        f"{r['test_after']:.1%})." for r in runs
                        if r["task"] == task and r["test_after"] < r["test_before"])
        done = {arm: cells[f"{task}/{arm}"] for arm in ARMS if cells[f"{task}/{arm}"].get("complete")}
        runnable = [arm for arm in ARMS if "refused" not in cells[f"{task}/{arm}"]]
        compared, apart = [], []
        for arm, cell in done.items():
            base_arm = baseline_of(arm)
            if base_arm not in done:
                continue
            compared.append(arm)
            low, high = cell["test_after_range"]
            base_low, base_high = done[base_arm]["test_after_range"]
            if low > base_high:
                apart.append(f"{arm} above {base_arm}")
            elif high < base_low:
                apart.append(f"{arm} below {base_arm}")
        line = f"{task}: {len(done)} of {len(runnable)} arms complete"
        if not compared:
            out[task] = f"{line}, none beside its baseline yet.{worse}"
            continue
        top = max(cell["test_after_mean"] for cell in done.values())
        # Every arm at the highest mean (3 seeds of 64 or 128 items tie often; 1e-9 absorbs the float sums).
        best = " and ".join(arm for arm, cell in done.items() if cell["test_after_mean"] > top - 1e-9)
        verdict = (", ".join(apart) + " at every seed" if apart else
                   "no arm is above or below its baseline at every seed (the ranges overlap): no winner")
        beside = "beside its baseline" if len(compared) == 1 else "beside their baselines"
        out[task] = (f"{line} ({', '.join(compared)} {beside}): {verdict}; highest mean test "
                     f"accuracy after, {best} ({top:.1%}).{worse}")
    return out


def keep(folder: Path, run: dict, wanted: dict) -> Path:
    return keep_run(folder / f"{run_name(run['task'], run['arm'], run['seed'])}.json", wanted, run)


def kept_runs(folder: Path) -> list[dict]:
    """Every run kept in `folder` under today's protocol for it (one of another protocol is refused)."""
    out = []
    for path in sorted(folder.glob("*.json")):
        p = json.loads(path.read_text())["protocol"]
        if p["task"] in TASKS and p["arm"] in ARMS:
            mine = kept(folder, path.stem, protocol(p["task"], p["arm"], p["seed"]))
            out.append({**mine["run"], "cpu": mine["machine"]["cpu"]["model"], "date": mine["machine"]["date"]})
    return out


def refusals() -> dict[str, str]:
    """Every "task/arm" the example's config refuses, with the reason (refusal's)."""
    return {f"{t}/{a}": why for t in TASKS for a in ARMS if (why := refusal(t, a))}


def write(runs: list[dict], refused: dict[str, str], quick: bool, started: float) -> Path:
    cells = summarize(runs, refused)
    result = {"benchmark": "objectives", "quick": quick, "seeds": list(SEEDS), "arms": ARMS, "tasks": TASKS,
              "cells": cells, "verdicts": verdicts(cells, runs), "runs": runs,
              "wall_s": round(time.perf_counter() - started, 1)}
    return write_result("objectives", result, machine=machine_info(peak=False))


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arms", default=",".join(ARMS), help=f"some of {', '.join(ARMS)}")
    ap.add_argument("--tasks", default=",".join(TASKS), help=f"some of {', '.join(TASKS)}")
    ap.add_argument("--seeds", default=",".join(map(str, SEEDS)))
    ap.add_argument("--steps", type=int, default=None, help="steps a run (default: the example's)")
    ap.add_argument("--table", action="store_true", help="write objectives.json from the kept runs; run nothing")
    ap.add_argument("--work", default=str(ROOT / "runs" / "objectives"))
    a = ap.parse_args(argv)
    arms, tasks = a.arms.split(","), a.tasks.split(",")
    seeds = [int(s) for s in a.seeds.split(",")]
    for name, given, known in (("--arms", arms, ARMS), ("--tasks", tasks, TASKS)):
        if not set(given) <= set(known):
            ap.error(f"{name} {','.join(sorted(set(given) - set(known)))}: choose from {', '.join(known)}")
    if not set(seeds) <= set(SEEDS):
        ap.error(f"--seeds {a.seeds}: the protocol's seeds are {','.join(map(str, SEEDS))}")
    quick = a.steps is not None
    started, refused = time.perf_counter(), refusals()
    if a.table:
        path = write(kept_runs(RUNS_DIR), refused, False, started)
        print(path)
        return json.loads(path.read_text())
    plan = [(task, arm, seed) for seed in seeds for task in tasks for arm in arms if f"{task}/{arm}" not in refused]
    runs = []
    for k, (task, arm, seed) in enumerate(plan, 1):
        wanted = protocol(task, arm, seed)
        if not quick and kept(RUNS_DIR, run_name(task, arm, seed), wanted):
            print(f"[objectives] {k} of {len(plan)}: {run_name(task, arm, seed)} kept from an earlier run",
                  file=sys.stderr, flush=True)
            continue
        print(f"[objectives] {k} of {len(plan)}: {run_name(task, arm, seed)}", file=sys.stderr, flush=True)
        run = run_one(task, arm, seed, a.steps, Path(a.work))
        print(f"[objectives] {run_name(task, arm, seed)}: exit {run['exit_code']}, test {run['test_before']} -> "
              f"{run['test_after']}, {run['wall_s']} s; log {run['log']}", file=sys.stderr, flush=True)
        if not quick and clean(run):
            keep(RUNS_DIR, run, wanted)
        runs.append(run)
    path = write(runs if quick else kept_runs(RUNS_DIR), refused, quick, started)
    print(path)
    return json.loads(path.read_text())


if __name__ == "__main__":
    main()

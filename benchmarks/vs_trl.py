"""The whole GRPO step against TRL's `GRPOTrainer`, on the same work, taking turns in one run.

    python -m benchmarks.vs_trl [--quick] [--repeats N] [--steps N] [--sizes tiny,bench] [--sides engine,trl-hf,...]

Both sides: the same tiny Qwen3 text model folder (grpo.tools.tiny_models), the same 8 prompts x G=8 of the
single-turn digits task (benchmarks/_single_turn.py: one reply of up to 32 tokens, reward = share of
digits), LoRA rank 16 / alpha 32 on the same projections, lr 1e-4, one AdamW update per batch (one
micro-batch of 64 completions), no KL,
temperature 1, float32, gradient norm clipped at 1. This engine runs through grpo.Trainer.fit() (Ray, a
vLLM rollout worker, one FSDP train rank that runs each prompt once for its 8 completions with
train.share_prompts, adapter publish and hot-load); TRL runs in its own venv
(benchmarks/_trl_venv.py), generating with HF `generate` and, where it starts, its colocated vLLM mode.
Each side is a child process paused between steps: A, B, C, A, B, C, ... so the machine's load falls
on all alike. Seconds a step are medians over steps 3..N; a run's ratio = engine / TRL's faster side.
Sizes: "tiny" (0.3M-parameter text preset) and "bench" (16M parameters, compute-bound).

One run's ratio moves with the machine's load, so the whole comparison runs `--repeats` times (3 in full mode,
1 with --quick), every size once a repeat: `ratio_vs_trl` (tiny) and `ratio_vs_trl_large` (bench) are the
median of the repeats' ratios, with `..._runs` (every repeat's, in order) and `..._range` ([min, max]) beside
them; each repeat's sides and steps are under sizes[SIZE]["runs"]. Fewer steps, repeats, sizes or sides than
the full mode's make a quick run. The last line printed is one JSON object, also written to
benchmarks/results/vs_trl.json (vs_trl-quick.json for a quick run).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from benchmarks._machine import ROOT, fresh_run_dir, write_result
from benchmarks._turns import Contender, step_each

SIDES = ("engine", "trl-hf", "trl-vllm")
SIZES = ("tiny", "bench")
FULL = {"steps": 10, "repeats": 3}
QUICK = {"steps": 6, "repeats": 1}
WORK = dict(prompts=8, group_size=8, max_tokens=32, lora_rank=16, lora_alpha=32.0, lr=1e-4, micro_batch_size=64)


def side_argv(side: str, model: Path, work: Path, steps: int, trl_python: Path | None) -> list[str]:
    common = [f"--{k.replace('_', '-')}={v}" for k, v in WORK.items()] + [f"--model={model}", f"--steps={steps}"]
    if side == "engine":
        return [sys.executable, "-m", "benchmarks._engine_side", f"--run-dir={work / 'engine'}", *common]
    mode = side.split("-", 1)[1]
    return [str(trl_python), "-m", "benchmarks._trl_side", f"--out={work / side}", f"--generate={mode}", *common]


def child_env(work: Path) -> dict:
    from rollout import runtime

    env = dict(os.environ)
    cache = runtime.shared_cache_dir(work / "run") if hasattr(runtime, "shared_cache_dir") else work / ".cache"
    env.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", RAY_AUTH_MODE="disabled", OMP_WAIT_POLICY="PASSIVE",
               TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               TORCHDYNAMO_DISABLE="1", OMP_NUM_THREADS=str(os.cpu_count() or 1),
               HF_HOME=str(cache / "hf"), VLLM_CACHE_ROOT=str(cache / "vllm"), XDG_CACHE_HOME=str(cache),
               VLLM_NO_USAGE_STATS="1", VLLM_DO_NOT_TRACK="1")
    return env


def median_from(values: list[float], first: int = 3) -> float | None:
    """Median over steps `first`..N (1-based): the first steps carry one-off warm-up costs."""
    kept = values[first - 1:]
    return statistics.median(kept) if kept else None


def run_size(size: str, sides: list[str], steps: int, work: Path, trl_python: Path | None) -> dict:
    from grpo.tools import tiny_models

    model = tiny_models.build("text", work / "models" / f"text-{size}", seed=0, preset=size)
    work = work / size
    work.mkdir(parents=True, exist_ok=True)
    env = child_env(work)
    started: dict[str, Contender] = {}
    result: dict = {"model_preset": size, "sides": {}}
    failed: dict[str, str] = {}
    try:
        # One at a time, so that each start-up is timed on an otherwise idle set of contenders.
        for side in sides:
            fresh_run_dir(work / side)
            c = Contender(side, side_argv(side, model, work, steps, trl_python), work / f"{side}.log", env)
            try:
                ready = c.event("ready")
            except (RuntimeError, TimeoutError) as e:
                c.close(60)
                failed[side] = f"{e}: {tail(work / f'{side}.log')}"
                print(f"[vs_trl] {size}: {side} did not start: {failed[side]}", file=sys.stderr, flush=True)
                continue
            started[side] = c
            result["sides"][side] = {"ready_s": round(ready["at_s"], 2), "marks": ready.get("marks", {}),
                                     "steps": []}
        for k in range(steps):
            records, exits = step_each(started, k, failed, lambda side: tail(work / f"{side}.log"), f"[vs_trl] {size}:")
            for side, code in exits.items():
                result["sides"][side]["exit_code"] = code
            for side, rec in records.items():
                rec.pop("event", None)
                result["sides"][side]["steps"].append(rec)
                if k == 0 and side in started:
                    # From launch to the first step's end, less the time it sat ready while the others started.
                    result["sides"][side]["first_step_done_s"] = round(rec["at_s"] - started[side].held_s, 2)
                    result["sides"][side]["held_before_first_step_s"] = round(started[side].held_s, 2)
            print(f"[vs_trl] {size} step {k + 1}, load {os.getloadavg()[0]:.1f}: " + ", ".join(
                f"{s} {result['sides'][s]['steps'][-1]['step_s']:.2f} s" for s in started), file=sys.stderr, flush=True)
    finally:
        for side, c in started.items():
            result["sides"][side]["exit_code"] = c.close()
    for r in result["sides"].values():
        secs = [s["step_s"] for s in r["steps"]]
        gen = [s.get("engine_s") for s in r["steps"]]
        toks = [s.get("generated_tokens", 0) for s in r["steps"]]
        r["step_s_median"] = median_from(secs)
        r["generate_s_median"] = median_from([g for g in gen if g is not None])
        r["completion_tokens_per_s"] = round(sum(toks[2:]) / sum(secs[2:]), 1) if secs[2:] else None
        if len(secs) < steps:
            r["step_s_median"] = None  # a side that stopped early is not compared
        r["reward_curve"] = [round(s.get("mean_reward", 0.0), 4) for s in r["steps"]]
    result["failed"] = failed
    trl = {s: r["step_s_median"] for s, r in result["sides"].items() if s.startswith("trl") and r["step_s_median"]}
    eng = result["sides"].get("engine", {}).get("step_s_median")
    if trl and eng:
        best = min(trl, key=trl.get)
        result["trl_faster_side"] = best
        result["ratio_vs_trl"] = round(eng / trl[best], 3)
    return result


def spread(values: list[float]) -> dict:
    """The median of the repeats' figures, every one in order, and their [min, max]."""
    return {"median": round(statistics.median(values), 3), "runs": list(values), "range": [min(values), max(values)]}


def summarize(runs: list[dict]) -> dict:
    """One size's repeats (run_size's results) in one: per side the median over repeats of each repeat's
    figures (a side counts where it ran all its steps), and the ratio's median, runs and range."""
    sides = {}
    for side in dict.fromkeys(s for run in runs for s in run["sides"]):
        done = [run["sides"][side] for run in runs if (run["sides"].get(side) or {}).get("step_s_median")]
        if done:
            sides[side] = {k: round(statistics.median(d[k] for d in done), 4) for k in
                           ("ready_s", "step_s_median", "generate_s_median", "completion_tokens_per_s")
                           if all(d.get(k) is not None for d in done)}
            steps = [round(d["step_s_median"], 4) for d in done]
            sides[side]["step_s_range"] = [min(steps), max(steps)]
            sides[side]["repeats"] = len(done)
    out = {"model_preset": runs[0]["model_preset"], "sides": sides, "runs": runs,
           "trl_faster_sides": [run.get("trl_faster_side") for run in runs]}
    ratios = [run["ratio_vs_trl"] for run in runs if run.get("ratio_vs_trl") is not None]
    if ratios:
        r = spread(ratios)
        out.update(ratio_vs_trl=r["median"], ratio_vs_trl_runs=r["runs"], ratio_vs_trl_range=r["range"])
    return out


def headline(sizes: dict) -> list[dict]:
    """One row a size: the engine's step against the faster TRL side's (medians over repeats), the ratio's
    median over repeats with its range."""
    rows = []
    for size in sizes.values():
        if size.get("ratio_vs_trl") is None:
            continue
        trl = [s for s in dict.fromkeys(size["trl_faster_sides"]) if s]
        # Each repeat's faster TRL side's step, median over repeats (the ratio is the median of each repeat's own).
        steps = [min(run["sides"][s]["step_s_median"] for s in trl if run["sides"].get(s, {}).get("step_s_median"))
                 for run in size["runs"] if run.get("ratio_vs_trl") is not None]
        rows.append({"figure": f"single-turn GRPO step time, {size['model_preset']} model, against TRL GRPOTrainer "
                               f"(median of {len(size['ratio_vs_trl_runs'])} runs, ratio's range in brackets)",
                     "value": size["sides"]["engine"]["step_s_median"], "unit": "s",
                     "baseline": round(statistics.median(steps), 4), "baseline_name": " or ".join(trl),
                     "ratio": size["ratio_vs_trl"], "ratio_range": size["ratio_vs_trl_range"]})
    return rows


def tail(path: Path, n: int = 600) -> str:
    try:
        return path.read_text()[-n:].replace("\n", " | ")
    except OSError:
        return ""


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="6 steps a side and size, one repeat (about 3 minutes)")
    ap.add_argument("--steps", type=int, default=None, help=f"steps a side (default {FULL['steps']}, --quick "
                                                            f"{QUICK['steps']})")
    ap.add_argument("--repeats", type=int, default=None, help=f"runs of the whole comparison (default "
                                                              f"{FULL['repeats']}, --quick {QUICK['repeats']})")
    ap.add_argument("--sizes", default=",".join(SIZES))
    ap.add_argument("--sides", default=",".join(SIDES))
    ap.add_argument("--work", default=str(ROOT / "runs" / "vs_trl"))
    a = ap.parse_args(argv)
    mode = QUICK if a.quick else FULL
    steps, repeats = a.steps or mode["steps"], a.repeats or mode["repeats"]
    if steps < 3:
        ap.error("--steps must be at least 3: the medians are over steps 3..N")
    sides = [s for s in a.sides.split(",") if s]
    size_names = [s for s in a.sizes.split(",") if s]
    quick = (a.quick or steps < FULL["steps"] or repeats < FULL["repeats"] or set(size_names) != set(SIZES)
             or set(sides) != set(SIDES))
    unknown = set(sides) - set(SIDES)
    if unknown:
        ap.error(f"unknown sides {sorted(unknown)}: choose from {', '.join(SIDES)}")
    work = Path(a.work).resolve()
    trl_python = None
    if any(s.startswith("trl") for s in sides):
        from benchmarks._trl_venv import PACKAGES, ensure

        trl_python = ensure()
    t0 = time.perf_counter()
    loads = [os.getloadavg()[0]]
    runs: dict[str, list[dict]] = {size: [] for size in size_names}
    for k in range(repeats):
        for size in size_names:
            print(f"[vs_trl] repeat {k + 1} of {repeats}, {size}", file=sys.stderr, flush=True)
            runs[size].append(run_size(size, sides, steps, work, trl_python))
            loads.append(os.getloadavg()[0])
    sizes = {size: summarize(r) for size, r in runs.items()}
    result = {"benchmark": "vs_trl", "quick": quick, "repeats": repeats, "steps_per_side": steps,
              "median_over_steps": f"3..{steps}", "work": WORK, "sizes": sizes,
              "trl_packages": list(PACKAGES) if trl_python else None,
              "load_average_during": [round(x, 2) for x in loads], "wall_s": round(time.perf_counter() - t0, 1)}
    for key, size in (("ratio_vs_trl", "tiny"), ("ratio_vs_trl_large", "bench")):
        got = sizes.get(size, {})
        result.update({key: got.get("ratio_vs_trl"), f"{key}_runs": got.get("ratio_vs_trl_runs"),
                       f"{key}_range": got.get("ratio_vs_trl_range")})
    result["headline"] = headline(sizes)
    write_result("vs_trl", result)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()

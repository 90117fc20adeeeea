"""The whole GRPO step against TRL's `GRPOTrainer`, on the same work, taking turns in one run.

    python -m benchmarks.vs_trl [--quick] [--steps N] [--sizes tiny,bench] [--sides engine,trl-hf,trl-vllm]

Both sides: the same tiny Qwen3 text model folder (grpo.tools.tiny_models), the same 8 prompts x G=8 of the
single-turn digits task (benchmarks/_single_turn.py: one reply of up to 32 tokens, reward = share of
digits), LoRA rank 16 / alpha 32 on the same projections, lr 1e-4, one AdamW update per batch (one
micro-batch of 64 completions), no KL,
temperature 1, float32, gradient norm clipped at 1. This engine runs through grpo.Trainer.fit() (Ray, a
vLLM rollout worker, one FSDP train rank that runs each prompt once for its 8 completions with
train.share_prompts, adapter publish and hot-load); TRL runs in its own venv
(benchmarks/_trl_venv.py), generating with HF `generate` and, where it starts, its colocated vLLM mode.
Each side is a child process paused between steps: A, B, C, A, B, C, ... so the machine's load falls
on all alike. Seconds a step are medians over steps 3..N; `ratio_vs_trl` = engine / TRL's faster side.
Sizes: "tiny" (0.3M-parameter text preset) and "bench" (16M parameters, compute-bound).

The last line printed is one JSON object, also written to benchmarks/results/vs_trl.json.
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
from benchmarks._turns import Contender

SIDES = ("engine", "trl-hf", "trl-vllm")
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
            for side, c in list(started.items()):
                try:
                    rec = c.step()
                except (RuntimeError, TimeoutError) as e:
                    failed[side] = f"failed at step {k + 1}: {e}: {tail(work / f'{side}.log')}"
                    print(f"[vs_trl] {size}: {side} {failed[side]}", file=sys.stderr, flush=True)
                    result["sides"][side]["exit_code"] = started.pop(side).close(60)
                    continue
                rec.pop("event", None)
                result["sides"][side]["steps"].append(rec)
                if k == 0:
                    # From launch to the first step's end, less the time it sat ready while the others started.
                    result["sides"][side]["first_step_done_s"] = round(rec["at_s"] - c.held_s, 2)
                    result["sides"][side]["held_before_first_step_s"] = round(c.held_s, 2)
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


def tail(path: Path, n: int = 600) -> str:
    try:
        return path.read_text()[-n:].replace("\n", " | ")
    except OSError:
        return ""


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="6 steps a side and size (under 15 minutes here)")
    ap.add_argument("--steps", type=int, default=None, help="steps a side (default 10, --quick 6)")
    ap.add_argument("--sizes", default="tiny,bench")
    ap.add_argument("--sides", default=",".join(SIDES))
    ap.add_argument("--work", default=str(ROOT / "runs" / "vs_trl"))
    a = ap.parse_args(argv)
    steps = a.steps or (6 if a.quick else 10)
    if steps < 3:
        ap.error("--steps must be at least 3: the medians are over steps 3..N")
    sides = [s for s in a.sides.split(",") if s]
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
    sizes = {}
    for size in [s for s in a.sizes.split(",") if s]:
        sizes[size] = run_size(size, sides, steps, work, trl_python)
        loads.append(os.getloadavg()[0])
    result = {"benchmark": "vs_trl", "quick": a.quick, "steps_per_side": steps, "median_over_steps": f"3..{steps}",
              "work": WORK, "sizes": sizes, "ratio_vs_trl": sizes.get("tiny", {}).get("ratio_vs_trl"),
              "ratio_vs_trl_large": sizes.get("bench", {}).get("ratio_vs_trl"),
              "trl_packages": list(PACKAGES) if trl_python else None,
              "load_average_during": [round(x, 2) for x in loads], "wall_s": round(time.perf_counter() - t0, 1)}
    write_result("vs_trl", result)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()

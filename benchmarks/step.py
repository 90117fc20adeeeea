"""One whole GRPO step through grpo.Trainer.fit(), broken down, for two workloads; and the start-up's parts.

    python -m benchmarks.step [--quick] [--workloads single_turn,maze] [--steps N]

Workloads:
- single_turn: 8 prompts x G=8 of the digits task (benchmarks/_single_turn.py), one reply of up to 32 tokens,
  on the tiny Qwen3 text model; LoRA rank 16, one train rank (the work benchmarks/vs_trl.py compares).
- maze: the maze example's step (examples/maze/cpu.yaml: 8 mazes x G=8, up to 30 turns, 4 updates).
Each step's seconds are split into: vLLM's generate calls, the rollout worker's env and bookkeeping, Ray's
transfer and scheduling of the rollout call, advantages, the train step (the trainer's logprob recompute
and update; a separate scoring pass only with updates_per_batch > 1), the adapter's publish, hot-load,
the engine's sleep/wake, the checkpoint (every step here), and the rest. Start-up: Ray, the actors (the
vLLM worker and the train ranks start together), and the greedy eval before training (its first generate
call). Medians over steps 2..N. The last line printed is one JSON object, also written to
benchmarks/results/step.json.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

T0 = time.perf_counter()

from benchmarks._machine import ROOT, fresh_run_dir, write_result  # noqa: E402
from rollout import runtime  # noqa: E402

# The maze recipe's cosine schedule needs more steps than its 2 warm-up steps: 3 at least.
MODES = {"quick": {"single_turn": 4, "maze": 3}, "full": {"single_turn": 8, "maze": 4}}


def single_turn_config(work: Path, steps: int):
    from benchmarks._engine_side import parser, run_config
    from grpo.tools import tiny_models

    model = tiny_models.build("text", work / "models" / "text-tiny", seed=0, preset="tiny")
    a = parser().parse_args([f"--model={model}", f"--run-dir={work / 'single_turn'}", f"--steps={steps}"])
    return run_config(a, checkpoint_every=1)


def maze_config(work: Path, steps: int):
    import grpo

    return grpo.RunConfig.from_yaml(ROOT / "examples" / "maze" / "cpu.yaml", overrides=[
        "--model", str(ROOT / "examples" / "maze" / "warmstart"), "--output_dir", str(work / "maze"),
        "--steps", str(steps), "--eval.seeds", "0-7", "--eval.every", "0",
        "--eval.target_success", "null", "--checkpoint.every", "1", "--metrics.tensorboard", "false",
        "--metrics.plots", "false"])


WORKLOADS = {"single_turn": single_turn_config, "maze": maze_config}


def summarize(records: list[dict], first: int = 2) -> dict:
    """Medians of each part and of the step over steps `first`..N, and tokens/s over the same steps."""
    kept = records[first - 1:] or records
    parts = {k: round(statistics.median(r["parts"][k] for r in kept), 4) for k in kept[0]["parts"]}
    step = statistics.median(r["time"]["step_s"] for r in kept)
    tokens = sum(r["rollout"]["generated_tokens"] for r in kept)
    return {"step_s": round(step, 4), "parts_s": parts,
            "parts_share": {k: round(v / step, 3) for k, v in parts.items()},
            "generated_tokens_per_step": tokens / len(kept),
            "generated_tokens_per_s": round(tokens / sum(r["time"]["step_s"] for r in kept), 1),
            "median_over_steps": f"{first}..{len(records)}"}


def run_workload(name: str, work: Path, steps: int) -> dict:
    import envs
    from benchmarks._single_turn import DigitsEnv
    from benchmarks._timed_trainer import TimedTrainer

    envs.register("digits", DigitsEnv, overwrite=True)
    t0 = time.perf_counter()
    records: list[dict] = []
    trainer = TimedTrainer(WORKLOADS[name](work, steps), on_step=records.append, t0=t0)
    trainer.fit()
    first_step = trainer.marks["eval_before_end_s"] + records[0]["time"]["step_s"]
    marks = trainer.marks
    startup = {"ray_s": marks["ray_ready_s"] - marks["start_called_s"],
               "actors_s": marks["actors_ready_s"] - marks["ray_ready_s"],
               "publish_and_hotload_first_s": marks["eval_before_start_s"] - marks["actors_ready_s"],
               "eval_before_s": marks["eval_before_end_s"] - marks["eval_before_start_s"],
               "to_first_step_done_s": first_step}
    return {"steps": len(records), **summarize(records),
            "startup_s": {k: round(v, 2) for k, v in startup.items()},
            "per_step": [{"step": r["step"], "step_s": round(r["time"]["step_s"], 3),
                          "parts": {k: round(v, 4) for k, v in r["parts"].items()},
                          "mean_reward": r["rollout"]["mean_reward"],
                          "logprob_gap_max": r["train"].get("sampler_abs_diff_max")} for r in records]}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--workloads", default="single_turn,maze")
    ap.add_argument("--steps", type=int, default=None, help="steps of every workload (default: by mode)")
    ap.add_argument("--work", default=str(ROOT / "runs" / "step"))
    ap.add_argument("--no-write", action="store_true", help="print only; leave benchmarks/results alone")
    a = ap.parse_args(argv)
    names = [w for w in a.workloads.split(",") if w]
    unknown = set(names) - set(WORKLOADS)
    if unknown:
        ap.error(f"unknown workloads {sorted(unknown)}: choose from {', '.join(WORKLOADS)}")
    work = Path(a.work).resolve()
    runtime.configure(work / "run", runtime.shared_cache_dir(work / "run"))
    mode = MODES["quick" if a.quick else "full"]
    loads = [os.getloadavg()[0]]
    # Fewer steps or workloads than the mode's are not the full protocol either.
    full = not a.quick and set(names) == set(WORKLOADS) and (a.steps is None or a.steps >= max(mode.values()))
    result = {"benchmark": "step", "quick": not full, "workloads": {}}
    for name in names:
        fresh_run_dir(work / name)
        result["workloads"][name] = run_workload(name, work, a.steps or mode[name])
        loads.append(os.getloadavg()[0])
    result["load_average_during"] = [round(x, 2) for x in loads]
    result["wall_s"] = round(time.perf_counter() - T0, 1)
    if not a.no_write:
        write_result("step", result)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()

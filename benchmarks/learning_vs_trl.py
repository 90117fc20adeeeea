"""Learning against TRL's `GRPOTrainer`: greedy test accuracy against each side's own wall time, on the same real
model, task and settings, taking turns step by step.

    python -m benchmarks.learning_vs_trl [--quick] [--seeds N] [--steps N] [--eval-every K] [--sides engine,trl]
                                         [--trl-generate vllm|hf] [--config examples/reasoning/cpu.yaml]

The work is the reasoning example's run config, read when the benchmark starts (examples/reasoning/cpu.yaml:
its model, SmolLM2-135M-Instruct pulled by rollout.pretrained; the dataset env on examples/reasoning/data.jsonl
scored by examples.reasoning.tasks:correct; validation rows eval.seeds, test rows eval.test_seeds, training on
the rest). Both sides take from it the same LoRA rank, alpha and targets, group size, prompts a step, learning
rate and its schedule (warmup and cosine as grpo.learner.config.TrainConfig.lr_at gives them, one rate a step),
AdamW's settings, gradient clipping, updates a batch and micro-batch, clip range, KL weight, loss aggregation,
reward scaling, temperature, reply length, context length and the number of steps; `--steps` and `--seed`
override the config on both sides alike. The engine trains with grpo.Trainer (benchmarks/_learning_engine.py:
the config file and overrides, as `grpo train` takes them); TRL in its own venv (benchmarks/_learning_trl.py,
the venv of benchmarks/_trl_venv.py) with the config mapped onto GRPOConfig (`grpo_config_kwargs` there; a
setting TRL has no counterpart for is refused, except the one difference listed in the result's
`differences`). Each side is a child process paused between steps (benchmarks/_turns.py): engine step 1, TRL
step 1, engine step 2, ..., so the machine's load falls on both alike; a seed's two sides run together, the
seeds one after another (`--seeds`, 3 in full mode, seeds 0, 1, 2, each side's own seed set to it).

How each side scores test accuracy: greedy (temperature 0), the config's reply limit (rollout.max_tokens_per_turn),
on every test row (eval.test_seeds), the prompt built by the model's chat template through the engine's
rollout.conversation.ChatFormat, the reply text decoded from the generated ids less the end-of-turn token, and
scored by the same dataset env (its reward functions, `success` at success_threshold), before training and
after every `--eval-every` steps and the last. The engine: its own evaluation (grpo.Trainer.evaluate on the
test seeds: the rollout worker's vLLM serving the step's adapter, merged into the weights on the CPU). TRL:
with `--trl-generate vllm` (the default) its colocated vLLM engine after pushing the policy's weights (the
LoRA merged, TRL's own sync), run in the engine's dtype; with `hf`, HF `generate` on its peft model.

Wall time: each side's own clock. From launch to ready (start-up and the evaluation before training, less the
seconds it waited on evaluating), then the sum of its own steps' seconds; the time a side waits while the other
steps, and every evaluation, are left out. A point of a curve is (that clock after the step, test accuracy).
The engine's evaluations before training run while its train rank starts, as in every run, so what they cost
the shared cores stays partly in its start-up (only the driver's wait on them is taken off): that counts
against the engine.

`time_to_trl_final_ratio`, per seed: the engine's clock when its test accuracy first reaches TRL's final test
accuracy, over TRL's clock at its last step; null with a reason where the engine never reaches it. The
headline is the median over seeds, a seed that never reaches counting as larger than every ratio (null, with
the reason, when that leaves the median there). `test_before_*`, `test_after_*`: medians over seeds of each
side's first and last test accuracy. Writes benchmarks/results/learning_vs_trl.json and .png (test accuracy
against wall time, every seed, both sides); a quick run (--quick: 1 seed, 3 steps; or anything short of the
full protocol) writes learning_vs_trl-quick.json and .png. The last line printed is the result.

A full run takes about an hour a seed on 2 cores, so each finished seed of a full run is kept in
benchmarks/results/learning_vs_trl-seeds/seedN.json, with the protocol it ran under (the config, steps,
evaluation, TRL's packages) and its machine; `--resume` takes the seeds found there under the same protocol and
runs only the others (a seed file of another protocol is refused, naming what differs). Without `--resume` a
full run starts that folder afresh. Each seed's ratio is measured side by side within that seed, on one machine;
the result lists each seed's machine and date (`seed_machines`).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

from benchmarks._machine import RESULTS, ROOT, fresh_run_dir, result_name, write_result
from benchmarks._trl_venv import PACKAGES

CONFIG = ROOT / "examples" / "reasoning" / "cpu.yaml"
SIDES = ("engine", "trl")
LABELS = {"engine": "this engine (grpo.Trainer)", "trl": "TRL GRPOTrainer"}
FULL = {"seeds": 3, "eval_every": 2}  # and the config's steps
QUICK = {"seeds": 1, "steps": 3, "eval_every": 2}
SEEDS_DIR = RESULTS / "learning_vs_trl-seeds"
TRL_GENERATE = "vllm"
# The engine drops groups whose rewards are all equal (their advantage is 0 either way); TRL keeps them in its
# loss's token count, so the same gradient is divided by more tokens there.
DROP_ZERO_SIGNAL = ("TRL has no such setting: groups with equal rewards stay in its batch with advantage 0, "
                    "counted in its token mean")
STEP_KEYS = ("step", "step_s", "mean_reward", "test_accuracy", "eval_s", "generated_tokens", "logprob_gap_max")


# ------------------------------------------------------------------------------------------ the figures
def curve(ready: dict, steps: list[dict]) -> list[dict]:
    """A side's test accuracy against its own clock: the ready event (at_s since launch, eval_s spent
    evaluating, test_accuracy before training), then each step's seconds added; a point where it evaluated."""
    clock = ready["at_s"] - ready.get("eval_s", 0.0)
    points = [{"step": 0, "wall_s": round(clock, 2), "test_accuracy": ready["test_accuracy"]}]
    for record in steps:
        clock += record["step_s"]
        if record.get("test_accuracy") is not None:
            points.append({"step": record["step"], "wall_s": round(clock, 2), "test_accuracy": record["test_accuracy"]})
    return points


def time_to_reach(points: list[dict], target: float) -> float | None:
    """The clock of the first point at or above `target`; None when none is."""
    return next((p["wall_s"] for p in points if p["test_accuracy"] >= target), None)


def seed_ratio(engine: list[dict], trl: list[dict]) -> dict:
    """One seed's time_to_trl_final_ratio from the two curves, with the figures it is made of."""
    final = trl[-1]
    reach = time_to_reach(engine, final["test_accuracy"])
    out = {"trl_final_test": final["test_accuracy"], "trl_wall_s": final["wall_s"], "engine_reach_s": reach}
    if reach is None:
        best = max(p["test_accuracy"] for p in engine)
        return {**out, "ratio": None, "reason": f"the engine's test accuracy never reached TRL's final "
                                                f"{final['test_accuracy']:.4f} (its best: {best:.4f})"}
    return {**out, "ratio": round(reach / final["wall_s"], 3), "reason": None}


def median_ratio(per_seed: list[dict]) -> dict:
    """The median of the seeds' ratios (seed_ratio's), a seed that never reached counting as larger than every
    ratio; value None with the reason when no seed compared or the median falls on the ones that never reached."""
    if not per_seed:
        return {"value": None, "reason": "no seed ran both sides to the end"}
    m = statistics.median(math.inf if r["ratio"] is None else r["ratio"] for r in per_seed)
    if math.isinf(m):
        missed = sum(r["ratio"] is None for r in per_seed)
        return {"value": None, "reason": f"the engine never reached TRL's final test accuracy in {missed} of "
                                         f"{len(per_seed)} seeds"}
    return {"value": round(m, 3), "reason": None}


def median_over_seeds(values: list[float | None]) -> float | None:
    """The median of the seeds' figures that exist; None when none does."""
    kept = [v for v in values if v is not None]
    return round(statistics.median(kept), 4) if kept else None


# ------------------------------------------------------------------------------------------ the run
def protocol(config, steps: int, eval_every: int, trl_generate: str) -> dict:
    """What a seed ran under: seeds pool into one result only when this is the same for each (as JSON reads it)."""
    return json.loads(json.dumps({"config": config.to_dict(), "steps": steps, "eval_every": eval_every,
                                  "trl_generate": trl_generate, "trl_packages": list(PACKAGES)}))


def steps_in_one_attempt(side: dict) -> int:
    """How many of a side's step records (run_seed's result[side]["steps"]) run 1, 2, ... before a number repeats
    or skips: a run its supervisor restarted after a fault reports its steps again from its last checkpoint (from
    step 1 when it had none)."""
    numbers = [s.get("step") for s in side.get("steps", [])]
    return next((k for k, n in enumerate(numbers) if n != k + 1), len(numbers))


def side_complete(side: dict, steps: int) -> bool:
    """Whether one side's run trained steps 1..steps in one attempt and exited cleanly (a restarted run's curve
    would join two runs)."""
    return side.get("exit_code") == 0 and len(side["steps"]) == steps == steps_in_one_attempt(side)


def finished(run: dict) -> bool:
    """Whether both sides of a seed's run (run_seed's result) trained every step."""
    return all((run.get(side) or {}).get("complete") for side in SIDES)


def saved_seed(folder: Path, seed: int, wanted: dict) -> dict | None:
    """The run of `seed` kept in `folder` under the protocol `wanted`; None when there is none, or when a side
    of it failed or restarted (it runs again). A seed kept under another protocol is refused."""
    from benchmarks._machine import kept_run

    path = folder / f"seed{seed}.json"
    kept = kept_run(path, wanted, f"delete {folder} to start afresh, or run without --resume")
    if kept is None:
        return None
    run = kept["run"]
    if not all(side_complete(run.get(side) or {"steps": []}, wanted["steps"]) for side in SIDES):
        print(f"[learning_vs_trl] --resume: {path} has a side that failed or restarted: seed {seed} runs again",
              file=sys.stderr, flush=True)
        return None
    return run


def keep_seed(folder: Path, run: dict, wanted: dict) -> Path:
    from benchmarks._machine import keep_run

    return keep_run(folder / f"seed{run['seed']}.json", wanted, run)


def run_config(path: Path, overrides: list[str]):
    import grpo

    return grpo.RunConfig.from_yaml(path, overrides)


def side_overrides(model: Path, steps: int, seed: int, run_dir: Path) -> list[str]:
    """What both sides change in the config: the resolved model, the steps, the seed; and for the engine alone,
    nothing that trains: no validation evals (the test is scored here), no checkpoint mid-run, no plots."""
    return [f"--model={model}", f"--steps={steps}", f"--seed={seed}", f"--train.seed={seed}",
            f"--output_dir={run_dir}", "--eval.every=0", f"--checkpoint.every={10 ** 6}",
            "--metrics.tensorboard=false", "--metrics.plots=false"]


def trl_settings(config, steps: int, eval_every: int, generate: str) -> dict:
    from rollout import runtime

    engine_dtype = config.engine.dtype if config.engine.dtype != "auto" else runtime.default_dtype()
    return {"config": config.to_dict(), "steps": steps, "eval_every": eval_every, "generate": generate,
            "dtype": engine_dtype, "train_dtype": config.train.dtype if config.train.dtype != "auto" else engine_dtype,
            "test_seeds": config.test_seeds, "held_out": config.held_out_seeds}


def run_seed(seed: int, sides: list[str], config_path: Path, model: Path, steps: int, eval_every: int,
             generate: str, work: Path, trl_python: Path | None) -> dict:
    from benchmarks._turns import Contender, step_each
    from benchmarks.vs_trl import child_env, tail

    work = work / f"seed{seed}"
    work.mkdir(parents=True, exist_ok=True)
    env = child_env(work)
    argv = {}
    for side in sides:
        overrides = side_overrides(model, steps, seed, work / side)
        if side == "engine":
            argv[side] = [sys.executable, "-m", "benchmarks._learning_engine", f"--config={config_path}",
                          f"--eval-every={eval_every}", *overrides]
        else:
            settings = work / "trl-settings.json"
            settings.write_text(json.dumps(trl_settings(run_config(config_path, overrides), steps, eval_every,
                                                        generate)))
            argv[side] = [str(trl_python), "-m", "benchmarks._learning_trl", f"--settings={settings}",
                          f"--out={work / side}"]
    started, result, failed = {}, {"seed": seed}, {}
    try:
        # One at a time, so that each start-up is timed with the other side idle.
        for side in sides:
            fresh_run_dir(work / side)
            c = Contender(side, argv[side], work / f"{side}.log", env)
            try:
                ready = c.event("ready")
            except (RuntimeError, TimeoutError) as e:
                c.close(60)
                failed[side] = f"{e}: {tail(work / f'{side}.log')}"
                print(f"[learning_vs_trl] seed {seed}: {side} did not start: {failed[side]}", file=sys.stderr,
                      flush=True)
                continue
            started[side] = c
            result[side] = {"ready": {k: ready[k] for k in ("at_s", "eval_s", "test_accuracy")}, "steps": []}
        for k in range(steps):
            records, exits = step_each(started, k, failed, lambda side: tail(work / f"{side}.log"),
                                       f"[learning_vs_trl] seed {seed}:")
            for side, code in exits.items():
                result[side]["exit_code"] = code
            for side, record in records.items():
                result[side]["steps"].append({key: record[key] for key in STEP_KEYS if key in record})
                if record.get("step") != k + 1:
                    failed[side] = (f"reported step {record.get('step')} where step {k + 1} was due (a fault "
                                    f"restarted it): {tail(work / f'{side}.log')}")
                    print(f"[learning_vs_trl] seed {seed}: {side} {failed[side]}", file=sys.stderr, flush=True)
                    result[side]["exit_code"] = started.pop(side).close(60)
            print(f"[learning_vs_trl] seed {seed} step {k + 1}, load {os.getloadavg()[0]:.1f}: " + ", ".join(
                f"{s} {result[s]['steps'][-1]['step_s']:.1f} s, test "
                f"{result[s]['steps'][-1].get('test_accuracy', float('nan')):.3f}" for s in started),
                file=sys.stderr, flush=True)
    finally:
        for side, c in started.items():
            result[side]["exit_code"] = c.close()
    for side in sides:
        if side in result:
            result[side]["curve"] = curve(result[side]["ready"], result[side]["steps"])
            result[side]["complete"] = side not in failed and side_complete(result[side], steps)
    result["failed"] = failed
    if finished(result):
        result["ratio"] = seed_ratio(result["engine"]["curve"], result["trl"]["curve"])
    return result


def summarize(runs: list[dict]) -> dict:
    """The headline figures over the seeds' runs (run_seed's results)."""
    done = [r for r in runs if "ratio" in r]
    ratio = median_ratio([r["ratio"] for r in done])
    out = {"time_to_trl_final_ratio": ratio["value"], "time_to_trl_final_ratio_reason": ratio["reason"],
           "time_to_trl_final_ratio_runs": [r["ratio"]["ratio"] for r in done]}
    out["seeds_finished"] = [r["seed"] for r in runs if finished(r)]
    for side in SIDES:
        # Both sides' medians over the same seeds: a seed one side did not finish says nothing of the other's.
        curves = [r[side]["curve"] for r in runs if finished(r)]
        out[f"test_before_{side}"] = median_over_seeds([c[0]["test_accuracy"] for c in curves])
        out[f"test_after_{side}"] = median_over_seeds([c[-1]["test_accuracy"] for c in curves])
        out[f"wall_s_{side}"] = median_over_seeds([c[-1]["wall_s"] for c in curves])
    return out


def plot(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for side, color in (("engine", "tab:blue"), ("trl", "tab:orange")):
        labelled = False
        for run in runs:
            points = (run.get(side) or {}).get("curve")
            if points:
                ax.plot([p["wall_s"] for p in points], [p["test_accuracy"] for p in points], marker="o",
                        color=color, alpha=0.8, label=None if labelled else LABELS[side])
                labelled = True
    ax.set_xlabel("the side's own seconds (start-up and its steps; evaluations and turns waited left out)")
    ax.set_ylabel("greedy test accuracy")
    ax.set_title(f"Learning: test accuracy against wall time, {len(runs)} seed(s) a side")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help=f"{QUICK['seeds']} seed, {QUICK['steps']} steps, test every {QUICK['eval_every']}")
    ap.add_argument("--seeds", type=int, default=None, help=f"seeds 0..N-1 (default {FULL['seeds']})")
    ap.add_argument("--steps", type=int, default=None, help="steps a side (default: the config's)")
    ap.add_argument("--eval-every", type=int, default=None, help=f"steps between test evaluations (default "
                                                                 f"{FULL['eval_every']})")
    ap.add_argument("--sides", default=",".join(SIDES))
    ap.add_argument("--trl-generate", choices=("vllm", "hf"), default=TRL_GENERATE,
                    help="how TRL generates, in training and for its test accuracy")
    ap.add_argument("--config", default=str(CONFIG))
    ap.add_argument("--work", default=str(ROOT / "runs" / "learning_vs_trl"))
    ap.add_argument("--resume", action="store_true",
                    help=f"a full run: take the seeds kept in {SEEDS_DIR.relative_to(ROOT)} under the same protocol")
    ap.add_argument("--seeds-dir", default=str(SEEDS_DIR), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    sides = [s for s in a.sides.split(",") if s]
    if set(sides) - set(SIDES) or not sides:
        ap.error(f"--sides {a.sides!r}: choose from {', '.join(SIDES)}")
    from rollout import pretrained

    config_path = Path(a.config).resolve()
    config = run_config(config_path, [])
    model = (pretrained.resolve(config.model, progress=lambda line: print(line, file=sys.stderr))
             if pretrained.is_pretrained_spec(config.model) else Path(config.model).resolve())
    mode = QUICK if a.quick else FULL
    steps = a.steps or mode.get("steps", config.steps)
    seeds, eval_every = a.seeds or mode["seeds"], a.eval_every or mode["eval_every"]
    quick = (a.quick or seeds < FULL["seeds"] or steps != config.steps or eval_every != FULL["eval_every"]
             or set(sides) != set(SIDES) or a.trl_generate != TRL_GENERATE or config_path != CONFIG)
    shared = run_config(config_path, side_overrides(model, steps, 0, Path(a.work) / "check"))  # refuses bad steps
    trl_python = None
    if "trl" in sides:
        from benchmarks._learning_trl import grpo_config_kwargs
        from benchmarks._trl_venv import ensure

        grpo_config_kwargs(shared.to_dict(), steps, a.trl_generate == "vllm", "check")  # refuses before starting
        trl_python = ensure()
    if a.resume and quick:
        ap.error("--resume takes the seeds of full runs only: drop --resume, or run the full protocol")
    wanted, seeds_dir = protocol(config, steps, eval_every, a.trl_generate), Path(a.seeds_dir)
    if not quick and not a.resume:
        shutil.rmtree(seeds_dir, ignore_errors=True)
    t0 = time.perf_counter()
    loads = [os.getloadavg()[0]]
    runs, seed_machines = [], {}
    for seed in range(seeds):
        kept = saved_seed(seeds_dir, seed, wanted) if a.resume else None
        print(f"[learning_vs_trl] seed {seed + 1} of {seeds}{' (kept from an earlier run)' if kept else ''}",
              file=sys.stderr, flush=True)
        run = kept or run_seed(seed, sides, config_path, model, steps, eval_every, a.trl_generate,
                               Path(a.work).resolve(), trl_python)
        if not quick and not kept and finished(run):  # a failed seed is not kept: --resume runs it again
            keep_seed(seeds_dir, run, wanted)
        if not quick and (seeds_dir / f"seed{seed}.json").exists():
            machine = json.loads((seeds_dir / f"seed{seed}.json").read_text())["machine"]
            seed_machines[seed] = {"cpu": machine["cpu"]["model"], "cores": machine["cpu"]["cores"],
                                   "date": machine["date"]}
        runs.append(run)
        loads.append(os.getloadavg()[0])
    s = shared
    result = {"benchmark": "learning_vs_trl", "quick": quick, "config": str(config_path), "model": str(model),
              "seeds": list(range(seeds)), "steps": steps, "eval_every": eval_every, "trl_generate": a.trl_generate,
              "settings": {"tasks_per_step": s.tasks_per_step, "group_size": s.group_size, "lr": s.train.lr,
                           "schedule": s.train.schedule, "warmup_steps": s.train.warmup_steps,
                           "lora_rank": s.lora.rank, "lora_alpha": s.lora.alpha, "temperature": s.rollout.temperature,
                           "max_tokens": s.rollout.max_tokens_per_turn, "updates_per_batch": s.train.updates_per_batch,
                           "micro_batch_size": s.train.micro_batch_size, "loss_agg": s.algorithm.loss_agg,
                           "test_rows": len(s.test_seeds)},
              "differences": ({"algorithm.drop_zero_signal_groups": DROP_ZERO_SIGNAL}
                              if s.algorithm.drop_zero_signal_groups else {}),
              "trl_packages": list(PACKAGES) if trl_python else None, **summarize(runs), "runs": runs,
              "load_average_during": [round(x, 2) for x in loads], "seed_machines": seed_machines,
              "wall_s": round(time.perf_counter() - t0, 1)}
    png = RESULTS / f"{result_name('learning_vs_trl', quick)}.png"
    result["png"] = str(png)
    write_result("learning_vs_trl", result)
    plot(runs, png)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()

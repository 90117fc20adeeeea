"""Rollout step time against environment latency: env calls on a thread pool vs one after another.

    python -m benchmarks.env_latency [--latencies 0,0.1,0.5] [--model PATH]

A fixed small rollout (4 tasks x 4 episodes, 3 turns each, tiny text model, in-process vLLM) on an env
whose `reset` and `step` sleep for the given latency, as a sandbox or simulator call would. Each latency
runs with `env_workers=64` (every live episode's call at once) and `env_workers=1` (one call after another,
the worker's behaviour before the pool). One-at-a-time, a step waits episodes x (turns + 1) x latency; with
the pool about (turns + 1) x latency. The last line printed is one JSON object; it is also written to
benchmarks/results/env_latency.json, with a plot in env_latency.png.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

from benchmarks._machine import RESULTS, ROOT

TASKS, GROUP, TURNS = 4, 4, 3


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--latencies", default="0,0.1,0.5", help="seconds each reset and step sleeps, comma-separated")
    ap.add_argument("--model", help="a text model folder (default: the tiny text model, built here)")
    ap.add_argument("--run-dir", default=str(ROOT / "runs" / "bench-env-latency"))
    a = ap.parse_args(argv)
    latencies = [float(x) for x in a.latencies.split(",")]

    from rollout import runtime

    run_dir = Path(a.run_dir).resolve()
    runtime.configure(run_dir)

    import envs
    from grpo.tools import tiny_models
    from rollout.engine import EngineConfig
    from rollout.worker import RolloutConfig, RolloutWorker, Task

    class Sleepy(envs.Env):
        """TURNS steps, each `reset` and `step` sleeping `latency` seconds (the GIL is free meanwhile)."""

        keep_images = False

        def __init__(self, latency: float = 0.0):
            self.latency, self.turn = latency, 0

        def reset(self, seed: int):
            time.sleep(self.latency)
            self.turn = 0
            return envs.Observation(text=f"task {seed}: reply with one word")

        def step(self, action_text: str):
            time.sleep(self.latency)
            self.turn += 1
            return envs.StepResult(envs.Observation(text=f"turn {self.turn} done"), 0.0, self.turn >= TURNS)

    envs.register("sleepy", Sleepy, overwrite=True)
    model = a.model or str(tiny_models.build("text", run_dir / "models" / "tiny-text", seed=0))
    worker = RolloutWorker(EngineConfig(model=model, enable_lora=False, max_model_len=512), worker_id="bench")

    def step(latency: float, env_workers: int) -> dict:
        tasks = [Task("sleepy", 3_000_000 + i, {"latency": latency}) for i in range(TASKS)]
        config = RolloutConfig(max_tokens_per_turn=8, env_workers=env_workers)
        trajs, stats = worker.rollout(tasks, GROUP, config)
        assert all(t.num_turns == TURNS for t in trajs)
        return {"step_s": stats.wall_s, "env_s": stats.env_s, "engine_s": stats.engine_s}

    step(0.0, 64)  # warm-up: vLLM's first calls are several times slower
    rows = []
    for latency in latencies:
        # With a free env the two differ only by engine noise: best of 3 there, one run where sleeps dominate.
        repeats = 3 if latency == 0 else 1
        row = {"latency_s": latency}
        for name, env_workers in (("pool", 64), ("one", 1)):
            runs = [step(latency, env_workers) for _ in range(repeats)]
            best = min(runs, key=lambda r: r["step_s"])
            row.update({f"{name}_{k}": round(v, 3) for k, v in best.items()})
        row["speedup"] = round(row["one_step_s"] / row["pool_step_s"], 2)
        rows.append(row)
        print(json.dumps(row), file=sys.stderr)
    worker.shutdown()

    episodes, calls = TASKS * GROUP, TURNS + 1
    top = rows[-1]
    result = {
        "benchmark": "env_latency", "model": a.model or "tiny-text", "episodes": episodes,
        "env_calls_per_episode": calls, "env_workers": {"pool": 64, "one": 1},
        "rows": rows,
        "headline": [{"figure": f"rollout step with a {top['latency_s']:g} s env ({episodes} episodes x {calls} env "
                                "calls), env calls on a thread pool", "value": top["pool_step_s"], "unit": "s",
                      "baseline": top["one_step_s"], "baseline_name": "one env call after another",
                      "ratio": top["speedup"]}],
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "cpu": _cpu_model(),
                    "load_average": round(os.getloadavg()[0], 2), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                                          time.gmtime())},
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "env_latency.json").write_text(json.dumps(result, indent=1) + "\n")
    _plot(rows, RESULTS / "env_latency.png", episodes, calls)
    print(json.dumps(result))
    return result


def _cpu_model() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "")


def _plot(rows: list[dict], path: Path, episodes: int, calls: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [r["latency_s"] for r in rows]
    fig, ax = plt.subplots(figsize=(5, 3.2), dpi=100)
    ax.plot(x, [r["one_step_s"] for r in rows], "o-", label="one env call after another")
    ax.plot(x, [r["pool_step_s"] for r in rows], "o-", label="env calls on a thread pool")
    ax.set_xlabel("env latency per reset/step (s)")
    ax.set_ylabel("rollout step (s)")
    ax.set_title(f"{episodes} episodes x {calls} env calls", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


if __name__ == "__main__":
    main()

"""Rollout step time against environment latency: the worker's env calls on a thread pool against a plain loop.

    python -m benchmarks.env_latency [--quick] [--latencies 0,0.1,0.5] [--model PATH]

A fixed small rollout (4 tasks x 4 episodes, 3 turns each, tiny text model, in-process vLLM) on an env
whose `reset` and `step` sleep for the given latency, as a sandbox or simulator call would. Each latency
runs two ways on the same vLLM engine:
- pool: the rollout worker with `env_workers=64` (every live episode's call at once);
- plain: what a user writes without this engine, the loop a single-turn trainer's rollout grows into: each
  turn one `LLM.generate` over the live episodes' chat prompts, then each episode's env call, one after
  another (the env called synchronously per episode, resets too).
The plain loop waits episodes x (turns + 1) x latency on its env; the pool about (turns + 1) x latency. At
latency 0 the two differ by the worker's bookkeeping against the bare loop's. The last line printed is one
JSON object; it is also written to benchmarks/results/env_latency.json (env_latency-quick.json with --quick or
other latencies), with a plot beside it.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from benchmarks._machine import ROOT, machine_info, write_result

TASKS, GROUP, TURNS, MAX_TOKENS = 4, 4, 3, 8
LATENCIES = "0,0.1,0.5"


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help=f"latencies 0 and 0.1 only (the full run: {LATENCIES})")
    ap.add_argument("--latencies", default=None, help=f"seconds each reset and step sleeps, comma-separated "
                                                      f"(default {LATENCIES})")
    ap.add_argument("--model", help="a text model folder (default: the tiny text model, built here)")
    ap.add_argument("--run-dir", default=str(ROOT / "runs" / "bench-env-latency"))
    a = ap.parse_args(argv)
    chosen = a.latencies or ("0,0.1" if a.quick else LATENCIES)
    latencies = [float(x) for x in chosen.split(",")]

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
    machine = machine_info(peak=False)  # before vLLM, which binds this process's OpenMP threads for itself
    worker = RolloutWorker(EngineConfig(model=model, enable_lora=False, max_model_len=512), worker_id="bench")
    seeds = [3_000_000 + i for i in range(TASKS)]

    def pool(latency: float) -> dict:
        tasks = [Task("sleepy", seed, {"latency": latency}) for seed in seeds]
        config = RolloutConfig(max_tokens_per_turn=MAX_TOKENS, env_workers=64)
        trajs, stats = worker.rollout(tasks, GROUP, config)
        assert all(t.num_turns == TURNS for t in trajs)
        return {"step_s": stats.wall_s, "env_s": stats.env_s, "engine_s": stats.engine_s}

    def plain(latency: float) -> dict:
        from vllm import SamplingParams

        llm, params = worker.engine.llm, SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0)
        tokenizer = llm.get_tokenizer()
        t0, env_s, engine_s = time.perf_counter(), 0.0, 0.0
        live = []
        for seed in seeds:
            for _ in range(GROUP):
                env, t = Sleepy(latency), time.perf_counter()
                obs = env.reset(seed)
                env_s += time.perf_counter() - t
                live.append((env, [{"role": "user", "content": obs.text}]))
        turns = 0
        while live:
            prompts = [tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
                       for _, chat in live]
            t = time.perf_counter()
            outs = llm.generate(prompts, params, use_tqdm=False)
            engine_s += time.perf_counter() - t
            turns += len(live)
            going = []
            for (env, chat), out in zip(live, outs):
                reply, t = out.outputs[0].text, time.perf_counter()
                result = env.step(reply)
                env_s += time.perf_counter() - t
                if not result.done:
                    going.append((env, chat + [{"role": "assistant", "content": reply},
                                               {"role": "user", "content": result.observation.text}]))
            live = going
        assert turns == TASKS * GROUP * TURNS
        return {"step_s": time.perf_counter() - t0, "env_s": env_s, "engine_s": engine_s}

    pool(0.0)  # warm-up: vLLM's first calls are several times slower
    plain(0.0)
    rows = []
    for latency in latencies:
        # With a free env the two differ only by engine noise: best of 3 there, one run where sleeps dominate.
        repeats = 3 if latency == 0 else 1
        row = {"latency_s": latency}
        for name, way in (("pool", pool), ("plain", plain)):
            best = min((way(latency) for _ in range(repeats)), key=lambda r: r["step_s"])
            row.update({f"{name}_{k}": round(v, 3) for k, v in best.items()})
        row["speedup"] = round(row["plain_step_s"] / row["pool_step_s"], 2)
        rows.append(row)
        print(json.dumps(row), file=sys.stderr)
    worker.shutdown()

    episodes, calls = TASKS * GROUP, TURNS + 1
    top = rows[-1]
    result = {
        "benchmark": "env_latency", "quick": chosen != LATENCIES, "model": a.model or "tiny-text",
        "episodes": episodes, "env_calls_per_episode": calls, "env_workers_pool": 64, "rows": rows,
        "headline": [{"figure": f"rollout step with a {top['latency_s']:g} s env ({episodes} episodes x {calls} env "
                                "calls), the worker's env calls on a thread pool", "value": top["pool_step_s"],
                      "unit": "s", "baseline": top["plain_step_s"],
                      "baseline_name": "plain loop: LLM.generate a turn, env calls one after another",
                      "ratio": top["speedup"]}],
    }
    path = write_result("env_latency", result, machine)
    _plot(rows, path.with_suffix(".png"), episodes, calls)
    print(json.dumps(result))
    return result


def _plot(rows: list[dict], path: Path, episodes: int, calls: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [r["latency_s"] for r in rows]
    fig, ax = plt.subplots(figsize=(5, 3.2), dpi=100)
    ax.plot(x, [r["plain_step_s"] for r in rows], "o-", label="plain loop, env calls one after another")
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

"""Scaling curves: rollout tokens/s against episodes per engine call and turns per episode; update tokens/s
against sequence length and LoRA rank.

    python -m benchmarks.scaling [--quick] [--parts rollout,update] [--out-dir benchmarks/results]

- rollout: the multi-turn RolloutWorker on maze episodes (tiny Qwen3-VL, LoRA r8, in-process vLLM), all
  live episodes in one engine call per turn; one engine serves every point, best of `repeats` each;
- update: TrainWorker (one process, the project's update step) on the bench Qwen3-VL (16M params) with
  synthetic multi-turn batches (benchmarks/update.py's make_batch), best of the timed steps (the machine
  is shared: the best step is the least disturbed one).
Writes scaling.json (scaling-quick.json with --quick: the tiny model, two points a curve) and a PNG of
the four curves beside it; the last line printed is the JSON object.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from benchmarks._machine import RESULTS, ROOT, machine_info, write_result

MODES = {
    "full": dict(
        episodes=[2, 8, 32, 128], episodes_turns=4, turns=[1, 2, 4, 8], turns_episodes=32, repeats=2,
        preset="bench", lengths=[128, 256, 512, 1024], length_rank=32, ranks=[4, 16, 64, 128], rank_length=512,
        sequences=8, steps=3),
    "quick": dict(
        episodes=[2, 8], episodes_turns=2, turns=[1, 2], turns_episodes=4, repeats=1,
        preset="tiny", lengths=[64, 128], length_rank=8, ranks=[4, 16], rank_length=64, sequences=4, steps=1),
}
GROUP = 2  # episodes per task: tasks = episodes / GROUP


def rollout_curves(run_dir: Path, cfg: dict) -> dict:
    from grpo.learner import forward, lora
    from grpo.tools import tiny_models
    from rollout.engine import EngineConfig
    from rollout.worker import RolloutConfig, RolloutWorker, Task
    from sync import AdapterStore

    model_path = str(tiny_models.build("vl", run_dir / "models" / "tiny-vl", seed=0))
    store = AdapterStore(run_dir / "store", keep_last=1)
    peft_model = lora.apply_lora(forward.load_model(model_path), lora.LoraConfig(rank=8, alpha=16.0))
    lora.randomize_adapter(peft_model, seed=5)
    version = store.publish(lora.adapter_tensors(peft_model), lora.adapter_config(peft_model))
    del peft_model
    worker = RolloutWorker(EngineConfig(model=model_path, max_lora_rank=8, max_model_len=2048),
                           store_root=str(store.root), worker_id="scaling")
    try:
        worker.sync_adapter(version)
        rollout_cfg = RolloutConfig(temperature=1.0, max_tokens_per_turn=12, history="none")

        def point(episodes: int, turns: int) -> dict:
            options = {"size": 9, "max_turns": turns}
            tasks = [Task("maze", 4_000_000 + i, options) for i in range(max(1, episodes // GROUP))]
            best = None
            for _ in range(cfg["repeats"]):
                worker.engine.llm.reset_prefix_cache()
                _, stats = worker.rollout(tasks, min(GROUP, episodes), rollout_cfg)
                tps = stats.generated_tokens / stats.wall_s
                if best is None or tps > best["tokens_per_s"]:
                    best = {"episodes": stats.episodes, "turns_per_episode": round(stats.turns / stats.episodes, 2),
                            "engine_calls": stats.engine_calls, "generated_tokens": stats.generated_tokens,
                            "wall_s": round(stats.wall_s, 3), "tokens_per_s": round(tps, 1)}
            return best

        point(4, 2)  # warm-up: vLLM's first calls are several times slower
        by_episodes = [point(e, cfg["episodes_turns"]) for e in cfg["episodes"]]
        by_turns = [point(cfg["turns_episodes"], t) for t in cfg["turns"]]
    finally:
        worker.shutdown()
    return {"model": "tiny Qwen3-VL, LoRA r8", "max_tokens_per_turn": 12,
            "by_episodes_per_call": by_episodes, "by_turns_per_episode": by_turns}


def update_curves(run_dir: Path, cfg: dict) -> dict:
    import torch

    from benchmarks.update import make_batch
    from grpo.learner.config import TrainConfig
    from grpo.learner.lora import LoraConfig
    from grpo.learner.worker import TrainWorker
    from grpo.tools import tiny_models

    model_path = str(tiny_models.build("vl", run_dir / "models" / f"vl-{cfg['preset']}", preset=cfg["preset"]))

    def point(length: int, rank: int) -> dict:
        worker = TrainWorker(model_path, lora=LoraConfig(rank=rank, alpha=2.0 * rank),
                             train=TrainConfig(micro_batch_size=cfg["sequences"]))
        try:
            batch, advantages = make_batch(worker.processor, cfg["sequences"], length)
            worker.train_step(batch, advantages)  # warm-up
            times = []
            for _ in range(cfg["steps"]):
                t = time.perf_counter()
                worker.train_step(batch, advantages)
                times.append(time.perf_counter() - t)
        finally:
            worker.close()
        step_s = min(times)
        tokens = cfg["sequences"] * length
        return {"tokens_per_sequence": length, "lora_rank": rank, "tokens": tokens, "step_s": round(step_s, 4),
                "tokens_per_s": round(tokens / step_s, 1)}

    by_length = [point(n, cfg["length_rank"]) for n in cfg["lengths"]]
    by_rank = [point(cfg["rank_length"], r) for r in cfg["ranks"]]
    return {"model": f"Qwen3-VL preset {cfg['preset']}", "sequences": cfg["sequences"],
            "torch_threads": torch.get_num_threads(), "by_sequence_length": by_length, "by_lora_rank": by_rank}


CURVES = (  # (part, series, x key, x label, log x axis)
    ("rollout", "by_episodes_per_call", "episodes", "episodes per engine call", True),
    ("rollout", "by_turns_per_episode", "turns_per_episode", "turns per episode", False),
    ("update", "by_sequence_length", "tokens_per_sequence", "tokens per sequence", True),
    ("update", "by_lora_rank", "lora_rank", "LoRA rank", True),
)


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    for ax, (part, series, x, label, logx) in zip(axes.flat, CURVES):
        points = (result.get(part) or {}).get(series)
        ax.set_xlabel(label)
        ax.set_ylabel(f"{part} tokens/s")
        if not points:
            ax.set_title(f"{part}: not measured")
            continue
        ax.plot([p[x] for p in points], [p["tokens_per_s"] for p in points], marker="o")
        if logx:
            ax.set_xscale("log", base=2)
        ax.set_ylim(bottom=0)
        ax.set_title(f"{part}: {result[part]['model']}", fontsize=9)
        ax.grid(True, alpha=0.3)
    machine = result.get("machine", {})
    fig.suptitle(f"grpo scaling, {machine.get('cpu', {}).get('model', '?')}, {machine.get('date', '')[:10]}",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def headline(result: dict) -> list[dict]:
    rows = []
    for part, series, x, label, _ in CURVES:
        points = (result.get(part) or {}).get(series)
        if points:
            lo, hi = points[0], points[-1]
            rows.append({"figure": f"{part} tokens/s at {label} {hi[x]}", "value": hi["tokens_per_s"],
                         "unit": "tokens/s", "baseline": lo["tokens_per_s"], "baseline_name": f"at {lo[x]}",
                         "ratio": round(hi["tokens_per_s"] / lo["tokens_per_s"], 3)})
    return rows


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="the tiny model, two points a curve (a smoke test)")
    ap.add_argument("--parts", default="rollout,update", help="comma-separated: rollout, update")
    ap.add_argument("--run-dir", default=str(ROOT / "runs" / "bench-scaling"))
    ap.add_argument("--out-dir", default=str(RESULTS))
    a = ap.parse_args(argv)
    parts = [p for p in a.parts.split(",") if p]
    unknown = set(parts) - {"rollout", "update"}
    if unknown or not parts:
        ap.error(f"--parts takes rollout and/or update, got {a.parts!r}")

    from rollout import runtime

    run_dir = Path(a.run_dir).resolve()
    runtime.configure(run_dir)
    mode = "quick" if a.quick else "full"
    cfg = MODES[mode]
    # Before vLLM starts: in-process, it binds this process's OpenMP threads for itself.
    machine = machine_info(peak=not a.quick)
    result = {"benchmark": "scaling", "quick": a.quick or set(parts) != {"rollout", "update"}}
    if "update" in parts:
        result["update"] = update_curves(run_dir, cfg)
    if "rollout" in parts:
        result["rollout"] = rollout_curves(run_dir, cfg)
    result["headline"] = headline(result)
    path = write_result("scaling", result, machine, Path(a.out_dir))
    plot(result, path.with_suffix(".png"))
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()

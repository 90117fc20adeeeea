"""Adapter sync cost: publish to the store and hot-load into vLLM, against the bare minimum, and stale reads.

    python -m benchmarks.adapter_sync [--quick] [--model smollm2-135m-instruct|PATH] [--run-dir runs/bench-sync]

Per version, in one process with one in-process vLLM engine (rank-32 LoRA on the language model):
- publish_and_hotload: sync.AdapterStore.publish (serialise, sha256, fsync, rename, manifest, GC) plus
  RolloutWorker.sync_adapter (verify the sha256, add the new LoRA under a new name and id, drop the old);
- raw: safetensors.torch.save_file plus the config file, vLLM's add_lora and remove_lora of the same
  tensors, nothing else;
- stale read check: after each hot-load, greedy tokens on a prompt longer than one KV block (so the prefix
  cache holds blocks of the previous version) whose vLLM logprobs must match transformers + peft with the
  new adapter (within 1e-3) and be farther from the previous adapter's.
Times are medians over the versions, both paths alternating.

Then the same two paths at the seed's adapter size: rank 32 on q/k/v/o/gate/up/down of Qwen3-VL-8B's 36
decoder layers (333 MB of fp32 tensors, random). Publishing needs no model. An 8B model does not fit this
machine, so the hot-load side runs on a 2-layer text model with the 8B widths (hidden 4096, 32/8 heads of
128, intermediate 12288): vLLM still reads and converts the whole 36-layer file (it loads every tensor the
file holds), and copies the 2 layers the model has into its LoRA slots.
On another model (--model) the run is the first part, on that model's adapter; the 8B shapes, which need no
model, are the bench run's. The last line printed is one JSON object, also written to
benchmarks/results/sync.json (sync-quick.json with --quick; sync-MODEL.json with --model) with the machine.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import time
from pathlib import Path

from benchmarks._machine import RESULTS, ROOT, bench_model, machine_info, result_stem, write_result

RANK = 32
TOLERANCE = 1e-3


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="8 versions (about 2 minutes)")
    ap.add_argument("--model", help="a name rollout.pretrained knows (smollm2-135m-instruct), a Hub id or a "
                                    "vision-language or text model folder (default: tiny Qwen3-VL, preset bench)")
    ap.add_argument("--run-dir", default=str(ROOT / "runs" / "bench-sync"))
    ap.add_argument("--out", help="the result file (default: benchmarks/results/sync.json; NAME-quick.json for a "
                                  "quick run)")
    ap.add_argument("--skip-8b-shapes", action="store_true", help="only the bench model's adapter (a quick run)")
    a = ap.parse_args(argv)

    from rollout import runtime

    run_dir = Path(a.run_dir).resolve()
    runtime.configure(run_dir)
    # Before vLLM starts: in-process, it binds this process's OpenMP threads for itself.
    machine = machine_info()
    import tempfile

    # vLLM leaves a rendezvous file (vllm_dist_*) in the temp folder at every start: keep it in the run.
    tempfile.tempdir = str(run_dir / "tmp")
    Path(tempfile.tempdir).mkdir(parents=True, exist_ok=True)

    import torch
    from peft import set_peft_model_state_dict

    from envs.base import Observation
    from grpo.learner import forward, lora
    from grpo.tools import tiny_models
    from rollout.conversation import ChatFormat
    from rollout.engine import EngineConfig, Request, Sampling
    from rollout.worker import RolloutWorker
    from sync import AdapterStore

    versions = 8 if a.quick else 12
    model = bench_model(a.model) if a.model else None
    model_path = model.path if model else str(tiny_models.build("vl", run_dir / "models" / "vl-bench", preset="bench"))
    for stale in ("store", "raw"):
        shutil.rmtree(run_dir / stale, ignore_errors=True)
    store = AdapterStore(run_dir / "store", keep_last=2)

    # The versions' tensors, made up front: only the sync itself is timed.
    peft_model = lora.apply_lora(forward.load_model(model_path), lora.LoraConfig(rank=RANK, alpha=2.0 * RANK))
    peft_model.eval()
    config = lora.adapter_config(peft_model)
    adapters = []
    for v in range(versions + 1):
        lora.randomize_adapter(peft_model, seed=v, scale=0.05)
        adapters.append({k: t.clone() for k, t in lora.adapter_tensors(peft_model).items()})
    adapter_mb = sum(t.numel() * t.element_size() for t in adapters[0].values()) / 2**20

    processor = forward.load_processor(model_path)
    # vLLM's LoRA path (the GPU default), which the bare add_lora baseline takes too; on the CPU the engine
    # merges adapters into its weights by default (rollout/merged.py).
    worker = RolloutWorker(EngineConfig(model=model_path, max_lora_rank=RANK, max_model_len=2048, merge_adapter=False),
                           store_root=str(store.root), worker_id="bench-sync")
    engine = worker.engine.llm.llm_engine

    chat = ChatFormat(processor)
    text = "Describe every wall of this maze, row by row, then find the path. " * (worker.engine.block_size // 8 + 4)
    prompt = chat.prompt_ids(Observation(text=text))
    block_size = worker.engine.block_size
    greedy = Sampling.greedy(max_tokens=8)

    def hf_logprobs(tensors, gen_ids) -> torch.Tensor:
        set_peft_model_state_dict(peft_model, tensors)
        ids = prompt + gen_ids
        mask = torch.tensor([0] * len(prompt) + [1] * len(gen_ids))
        batch = forward.collate(processor, [forward.expand(processor, ids, [], [mask])],
                                forward.tokenizer_of(processor).pad_token_id)
        with torch.no_grad():
            lp = forward.token_logprobs(peft_model, batch, batch.per_token[0])
        return lp[0][mask.bool()]

    hot_ms, publish_ms, raw_ms = [], [], []
    stale_reads, diff_new_max, diff_old_min = 0, 0.0, float("inf")
    try:
        for v in range(versions + 1):  # version 0 is the warm-up, untimed and unchecked
            pub_s, hot_s, raw_s = taking_turns(
                v, lambda v=v: publish_and_hotload(store, worker, adapters[v], config),
                lambda v=v: save_and_add_lora(engine, store, adapters[v], run_dir / "raw" / f"r{v}", v))
            if v == 0:
                continue
            publish_ms.append(pub_s * 1e3)
            hot_ms.append(hot_s * 1e3)
            raw_ms.append(raw_s * 1e3)

            gen = worker.engine.generate([Request(prompt)], greedy)[0]
            served = torch.tensor(gen.logprobs)
            diff_new = float((served - hf_logprobs(adapters[v], gen.token_ids)).abs().max())
            diff_old = float((served - hf_logprobs(adapters[v - 1], gen.token_ids)).abs().max())
            stale_reads += int(diff_new > TOLERANCE or diff_old <= diff_new)
            diff_new_max, diff_old_min = max(diff_new_max, diff_new), min(diff_old_min, diff_old)
    finally:
        worker.shutdown()

    hot, rawm = statistics.median(hot_ms), statistics.median(raw_ms)
    load_after_bench = round(os.getloadavg()[0], 2)
    seed_size = None if a.skip_8b_shapes or model else seed_size_sync(run_dir, versions=2 if a.quick else 4)
    result = {
        # Without the 8B shapes the bench run is not the full protocol: it is written as a quick one.
        "benchmark": "sync", "quick": a.quick or a.skip_8b_shapes, "model": model.record() if model else model_path,
        "lora_rank": RANK, "adapter_mb": round(adapter_mb, 3), "versions": versions,
        "publish_and_hotload_ms": round(hot, 2),
        "publish_ms": round(statistics.median(publish_ms), 2),
        "raw_ms": round(rawm, 2),
        "ratio": round(hot / rawm, 3),
        "stale_reads": stale_reads,
        "logprob_max_abs_diff_new_adapter": diff_new_max,
        "logprob_min_abs_diff_previous_adapter": diff_old_min,
        "prompt_tokens": len(prompt), "kv_block_size": block_size,
        # Other processes on the machine (1-minute load average; 2 cores here).
        "load_average": load_after_bench,
        "seed_size": seed_size,
    }
    result["headline"] = [
        {"figure": f"publish + hot-load, rank-32 adapter of {model.label if model else 'the bench model'} "
                   f"({result['adapter_mb']} MB)",
         "value": result["publish_and_hotload_ms"], "unit": "ms", "baseline": result["raw_ms"],
         "baseline_name": "save_file + add_lora", "ratio": result["ratio"]},
    ]
    if seed_size:
        result["headline"].append(
            {"figure": f"publish + hot-load, rank-32 adapter at Qwen3-VL-8B shapes ({seed_size['adapter_mb']} MB)",
             "value": seed_size["publish_and_hotload_ms"], "unit": "ms", "baseline": seed_size["raw_ms"],
             "baseline_name": "save_file + add_lora", "ratio": seed_size["ratio"]})
    out = Path(a.out or RESULTS / f"{result_stem('sync', model)}.json")
    write_result(out.stem, result, machine, out.parent)
    print(json.dumps(result))
    return result


def seed_size_sync(run_dir: Path, versions: int) -> dict:
    """Publish + hot-load against save_file + add_lora for the rank-32 adapter of Qwen3-VL-8B's shapes."""
    from peft import LoraConfig

    from benchmarks import gpu_bench
    from grpo.tools import tiny_models
    from rollout.engine import EngineConfig, Request, Sampling
    from rollout.worker import RolloutWorker
    from sync import AdapterStore

    text = gpu_bench.TEXT_CONFIG
    preset = tiny_models.TinyPreset(
        vocab_size=1024, text_hidden=text["hidden_size"], text_layers=2, text_heads=text["num_attention_heads"],
        text_kv_heads=text["num_key_value_heads"], text_intermediate=text["intermediate_size"],
        head_dim=text["head_dim"], vision_hidden=0, vision_depth=0, vision_heads=0, vision_intermediate=0,
        patch_size=16, max_position_embeddings=1024)
    model_path = run_dir / "models" / "qwen3-8b-widths-2-layers"
    if not (model_path / "config.json").is_file():
        tmp = model_path.with_name(model_path.name + ".building")
        shutil.rmtree(tmp, ignore_errors=True)
        tiny_models.build_text(tmp, 0, preset)
        tmp.rename(model_path)

    tensors = gpu_bench.adapter_tensors(gpu_bench.model_config(), layers_prefix=gpu_bench.TEXT_LAYERS)
    config = LoraConfig(r=gpu_bench.LORA_RANK, lora_alpha=2 * gpu_bench.LORA_RANK,
                        target_modules=list(gpu_bench.LORA_TARGETS)).to_dict()
    for stale in ("store-8b", "raw-8b"):
        shutil.rmtree(run_dir / stale, ignore_errors=True)
    store = AdapterStore(run_dir / "store-8b", keep_last=2)
    worker = RolloutWorker(EngineConfig(model=str(model_path), max_lora_rank=gpu_bench.LORA_RANK, max_model_len=512,
                                        kv_cache_memory_bytes=128 << 20, merge_adapter=False),
                           store_root=str(store.root), worker_id="bench-sync-8b")
    engine = worker.engine.llm.llm_engine
    publish_ms, hot_ms, raw_ms = [], [], []
    try:
        for v in range(versions + 1):  # version 0 is the warm-up
            raw = run_dir / "raw-8b" / f"r{v}"
            pub_s, hot_s, raw_s = taking_turns(v, lambda: publish_and_hotload(store, worker, tensors, config),
                                               lambda raw=raw, v=v: save_and_add_lora(engine, store, tensors, raw, v))
            shutil.rmtree(raw)  # 333 MB a version: keep the disk
            if v:
                publish_ms.append(pub_s * 1e3)
                hot_ms.append(hot_s * 1e3)
                raw_ms.append(raw_s * 1e3)
        # The loaded adapter serves: its 2 layers are in vLLM's slots and a generate runs with it.
        served = worker.engine.generate([Request([1, 2, 3, 4])], Sampling.greedy(max_tokens=2))[0]
    finally:
        worker.shutdown()
        shutil.rmtree(run_dir / "store-8b", ignore_errors=True)
    median = statistics.median
    return {
        "adapter_mb": round(sum(t.numel() * t.element_size() for t in tensors.values()) / 2**20, 1),
        "layers_in_file": gpu_bench.TEXT_CONFIG["num_hidden_layers"],
        "hotload_model": "Qwen3 text, 2 layers of Qwen3-VL-8B's widths (vLLM loads all 36 layers' tensors)",
        "versions": versions,
        "publish_and_hotload_ms": round(median(hot_ms), 1), "publish_ms": round(median(publish_ms), 1),
        "raw_ms": round(median(raw_ms), 1), "ratio": round(median(hot_ms) / median(raw_ms), 3),
        "served_tokens": len(served.token_ids),
        "load_average": round(os.getloadavg()[0], 2),
    }


def taking_turns(v: int, hot, bare) -> tuple[float, float, float]:
    """(publish s, publish + hot-load s, bare s) of version `v`; each path goes first every other version,
    which spreads the machine's noise evenly."""
    if v % 2:
        raw_s = bare()
        pub_s, hot_s = hot()
    else:
        pub_s, hot_s = hot()
        raw_s = bare()
    return pub_s, hot_s, raw_s


def publish_and_hotload(store, worker, tensors, config) -> tuple[float, float]:
    """Seconds to publish a version, and to publish it and hot-load it into the worker."""
    t0 = time.perf_counter()
    version = store.publish(tensors, config)
    t1 = time.perf_counter()
    worker.sync_adapter(version)
    return t1 - t0, time.perf_counter() - t0


def save_and_add_lora(engine, store, tensors, raw: Path, v: int) -> float:
    """The bare path into folder `raw`: save_file plus the config file the store holds (written bare), vLLM's
    add_lora and remove_lora, nothing else."""
    import safetensors.torch
    from vllm.lora.request import LoRARequest

    from sync.store import ADAPTER_FILE, CONFIG_FILE

    raw.mkdir(parents=True)
    config_bytes = (Path(store.latest().path) / CONFIG_FILE).read_bytes()
    t0 = time.perf_counter()
    safetensors.torch.save_file(tensors, str(raw / ADAPTER_FILE))
    (raw / CONFIG_FILE).write_bytes(config_bytes)
    request = LoRARequest(f"raw-{v}", 100_000 + v, str(raw))
    if not engine.add_lora(request):
        raise RuntimeError(f"vLLM refused the raw adapter {raw}")
    engine.remove_lora(request.lora_int_id)
    return time.perf_counter() - t0


if __name__ == "__main__":
    main()

"""grpo.learner.memory's estimate against the measured peak of a train step, and its table for Qwen3-VL-8B.

    python -m benchmarks.memory_model [--quick] [--preset bench] [--work runs/bench]

1. Measured: for the tiny text and Qwen3-VL models of `preset` (float32, LoRA rank 32), one TrainWorker step on a
   batch packed into one row of about T tokens, at 2 token budgets, with and without activation checkpointing,
   each in a fresh process. Its extra memory is the process's peak resident memory during the step (sampled every
   millisecond) less what it held just before (the model, the adapter, the batch; malloc's free lists trimmed).
   The child runs with a fixed MALLOC_MMAP_THRESHOLD_: with glibc's default, which rises to the size of the
   largest freed block, the activations freed in the backward stay on the heap, fragmented, and the gradients
   allocated next grow the heap anyway, so resident memory records what malloc retains, not the live tensors
   (a GPU's caching allocator reuses freed blocks). Beside it, the figure as a train rank runs: it keeps the
   memory it frees (rollout.runtime.keep_freed_memory; the first child's explicit setting leaves it off).
   The model predicts the same: activations, logprob chunks, vision, and the LoRA gradients and AdamW state the
   first step creates (MemoryEstimate.step_extra).
2. Predicted: Qwen3-VL-8B (benchmarks/gpu_bench.py's config), LoRA rank 32, bf16, at 4096-32768 tokens, with and
   without checkpointing, on 1 and 8 ranks; whether each fits in 48, 80 and 96 GB (GiB here: 2**30 bytes).
The last line printed is one JSON object, also written to benchmarks/results/memory_model.json
(memory_model-quick.json with --quick).
"""
from __future__ import annotations

import argparse
import ctypes
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks._machine import ROOT, PeakRss, write_result

LORA_RANK = 32
SEQUENCES = 4  # sequences per packed row
BUDGETS = {"quick": (1024, 2048), "full": (2048, 4096)}
GPU_BUDGETS = (4096, 8192, 16384, 32768)
GPU_SIZES_GIB = (48, 80, 96)
# The 8B table's images: a quarter of each micro-batch's tokens (the maze: 81 image tokens a turn's prompt).
IMAGE_SHARE = 0.25
MMAP_THRESHOLD = 128 * 1024  # glibc's initial value, held fixed


def one(model_path: str, tokens: int, checkpointing: bool) -> dict:
    """One train step in this process: its measured extra memory and the model's prediction of it."""
    from benchmarks.update import make_batch
    from grpo.learner import forward, memory
    from grpo.learner.config import TrainConfig
    from grpo.learner.lora import LoraConfig
    from grpo.learner.worker import TrainWorker

    lora = LoraConfig(rank=LORA_RANK, alpha=2 * LORA_RANK)
    worker = TrainWorker(model_path, lora=lora, cpu_threads=2, dtype="float32",
                         train=TrainConfig(tokens_per_micro_batch=tokens, activation_checkpointing=checkpointing))
    # Room for the tokens an image adds when expanded (a few per image at the tiny models' 64 px).
    batch, advantages = make_batch(worker.processor, SEQUENCES, tokens // SEQUENCES - 8)
    if not hasattr(worker.processor, "image_processor"):
        # make_batch gives every prompt an image when the tokenizer knows image tokens, as the tiny text
        # model's does: a text model reads the placeholder as a plain token.
        batch = [dataclasses.replace(t, segments=[dataclasses.replace(s, images=[]) for s in t.segments])
                 for t in batch]
    expanded = [worker._expand(item) for item in _items(worker, batch, advantages)]
    row = sum(len(e.input_ids) for e in expanded)
    image = forward.image_token_id(worker.processor) if hasattr(worker.processor, "image_processor") else None
    image_tokens = 0 if image is None else sum(int((e.input_ids == image).sum()) for e in expanded)
    # The loss mask less each sequence's first token, which no earlier token predicts.
    masked = sum(int(e.per_token[0][1:].sum()) for e in expanded)

    ctypes.CDLL("libc.so.6").malloc_trim(0)  # freed model-loading buffers would otherwise hide the step's growth
    with PeakRss() as rss:
        t0 = time.perf_counter()
        metrics = worker.train_step(batch, advantages)
        seconds = time.perf_counter() - t0
    est = memory.estimate(model_path, lora, row, dtype="float32", activation_checkpointing=checkpointing,
                          logprob_tokens=masked, image_tokens=image_tokens)
    return {"tokens": row, "masked_tokens": masked, "image_tokens": image_tokens, "checkpointing": checkpointing,
            "updates": metrics["updates"], "seconds": round(seconds, 2),
            "measured_bytes": rss.grown, "predicted_bytes": est.step_extra,
            "parts_mb": {k: _mb(v) for k, v in vars(est).items() if k not in ("weights", "lora_weights")}}


def _items(worker, batch, advantages):
    from grpo.learner.worker import _Item, token_advantages

    return [_Item(seg, adv, e, traj.num_generated) for e, (traj, a) in enumerate(zip(batch, advantages))
            for seg, adv in zip(traj.segments, token_advantages(traj, a))]


def _mb(n: int) -> float:
    return round(n / 2**20, 1)


def _child(cmd: list[str], env: dict, kind: str, tokens: int) -> dict:
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"the {kind} case at {tokens} tokens failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measured(preset: str, work: Path, budgets: tuple[int, ...]) -> list[dict]:
    from grpo.tools import tiny_models

    rows = []
    for kind in ("text", "vl"):
        path = tiny_models.build(kind, work / "models" / f"{kind}-{preset}", preset=preset)
        for tokens in budgets:
            for checkpointing in (False, True):
                cmd = [sys.executable, "-m", "benchmarks.memory_model", "--one", str(path), str(tokens)]
                cmd += ["--checkpointing"] if checkpointing else []
                r = _child(cmd, {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD)}, kind, tokens)
                as_run = _child(cmd, {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"},
                              kind, tokens)
                r.update(kind=kind, preset=preset, budget=tokens, measured_mb=_mb(r.pop("measured_bytes")),
                         predicted_mb=_mb(r.pop("predicted_bytes")),
                         measured_as_run_mb=_mb(as_run["measured_bytes"]))
                r["ratio"] = round(r["predicted_mb"] / r["measured_mb"], 3)
                rows.append(r)
                print(f"{kind:4} {r['tokens']:6d} tok  ckpt={str(checkpointing):5}  measured {r['measured_mb']:8.1f} MB"
                      f" (as a train rank runs {r['measured_as_run_mb']:8.1f})  predicted {r['predicted_mb']:8.1f} MB"
                      f"  ratio {r['ratio']:.2f}  ({r['seconds']} s)",
                      file=sys.stderr)
    return rows


def qwen3_vl_8b() -> list[dict]:
    from benchmarks.gpu_bench import model_config
    from grpo.learner import memory
    from grpo.learner.lora import LoraConfig

    config, lora, rows = model_config(), LoraConfig(rank=LORA_RANK, alpha=2 * LORA_RANK), []
    for world_size in (1, 8):
        for checkpointing in (False, True):
            for tokens in GPU_BUDGETS:
                est = memory.estimate(config, lora, tokens, dtype="bfloat16", world_size=world_size,
                                      activation_checkpointing=checkpointing, image_tokens=int(tokens * IMAGE_SHARE))
                rows.append({"tokens": tokens, "checkpointing": checkpointing, "ranks": world_size,
                             "parts_gib": {k: round(v / 2**30, 2) for k, v in vars(est).items()},
                             "total_gib": round(est.total / 2**30, 1),
                             "fits": {f"{g}GB": est.fits(g) for g in GPU_SIZES_GIB}})
    print(f"\nQwen3-VL-8B, LoRA r{LORA_RANK}, bf16 (GiB; fits in 48 / 80 / 96)", file=sys.stderr)
    for r in rows:
        fits = " ".join("yes" if ok else " no" for ok in r["fits"].values())
        print(f"ranks {r['ranks']}  ckpt={str(r['checkpointing']):5}  {r['tokens']:6d} tok  "
              f"weights {r['parts_gib']['weights']:6.2f}  activations {r['parts_gib']['activations']:6.2f}  "
              f"total {r['total_gib']:6.1f}  {fits}", file=sys.stderr)
    return rows


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.memory_model", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help=f"token budgets {BUDGETS['quick']} instead of "
                                                        f"{BUDGETS['full']}")
    ap.add_argument("--preset", default="bench", help="a grpo.tools.tiny_models preset")
    ap.add_argument("--work", default=str(ROOT / "runs" / "bench"))
    ap.add_argument("--one", nargs=2, metavar=("MODEL", "TOKENS"), help=argparse.SUPPRESS)  # the child: one case
    ap.add_argument("--checkpointing", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.one:
        print(json.dumps(one(a.one[0], int(a.one[1]), a.checkpointing)))
        return {}
    mode = "quick" if a.quick else "full"
    cases = measured(a.preset, Path(a.work), BUDGETS[mode])
    table = qwen3_vl_8b()
    worst = max(cases, key=lambda r: abs(r["ratio"] - 1))
    result = {"benchmark": "memory_model", "quick": a.quick, "lora_rank": LORA_RANK, "dtype": "float32",
              "cases": cases, "qwen3_vl_8b": {"lora_rank": LORA_RANK, "dtype": "bfloat16",
                                              "image_share": IMAGE_SHARE, "rows": table}}
    fit = {r["tokens"]: r["total_gib"] for r in table if r["ranks"] == 8 and not r["checkpointing"]}
    result["headline"] = [
        {"figure": f"memory model: predicted / measured step memory, worst of {len(cases)} CPU cases "
                   f"({worst['kind']} {a.preset}, {worst['tokens']} tokens, checkpointing {worst['checkpointing']})",
         "value": worst["ratio"], "unit": "ratio"},
        {"figure": "Qwen3-VL-8B LoRA r32 bf16, 8 ranks, no checkpointing: predicted peak per rank at 32768 tokens",
         "value": fit[32768], "unit": "GiB"},
    ]
    write_result("memory_model", result)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()

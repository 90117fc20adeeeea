"""Process-level settings the stack needs before vLLM, Ray or torch start: one place, read by every entry point.

The device decides backends (CPU: float32, gloo, in-process vLLM with a fixed KV cache size; GPU: bfloat16,
NCCL, vLLM's memory fraction and sleep mode), never a fork of the code.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path


def has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def device() -> str:
    return "cuda" if has_cuda() else "cpu"


def default_dtype() -> str:
    # No bf16 matmul path on these CPUs (0.3 GFLOP/s against 60 for fp32): float32 there.
    return "bfloat16" if has_cuda() else "float32"


def configure(run_dir: str | Path) -> Path:
    """Point every cache and temp folder of vLLM, Ray and friends inside `run_dir`, never under $HOME.

    Must run before vllm is imported: vLLM reads its environment at import time.
    """
    run_dir = Path(run_dir).resolve()
    cache = run_dir / ".cache"
    cache.mkdir(parents=True, exist_ok=True)
    env = {
        "VLLM_CACHE_ROOT": str(cache / "vllm"),
        "VLLM_CONFIG_ROOT": str(cache / "vllm-config"),
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_DO_NOT_TRACK": "1",
        "HF_HOME": str(cache / "hf"),
        "HF_HUB_OFFLINE": "1",
        "TRITON_CACHE_DIR": str(cache / "triton"),
        "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
        "XDG_CACHE_HOME": str(cache),
        "RAY_AUTH_MODE": "disabled",
        "RAY_USAGE_STATS_ENABLED": "0",
        "TOKENIZERS_PARALLELISM": "false",
        # Two busy-waiting OpenMP pools on 2 cores turned a 0.1 s step into 0.3-1.9 s (DESIGN.md).
        "OMP_WAIT_POLICY": "PASSIVE",
    }
    if not has_cuda():
        # In-process engine: starts in 5 s instead of 35 s, and needs no __main__ guard in user scripts.
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        # vLLM's sampler torch.compiles two small functions even in eager mode; on the CPU inductor builds
        # them with g++ at the first generate call (39 s in a fresh cache, 12 s in a warm one, measured
        # under load) for no speedup after: eager, that first call took 0.8 s and later calls the same time.
        env["TORCHDYNAMO_DISABLE"] = "1"
    for k, v in env.items():
        os.environ.setdefault(k, v)
    # vLLM drops a rendezvous file into the temp folder at every engine start; keep those in the run too.
    tmp = cache / "tmp"
    tmp.mkdir(exist_ok=True)
    os.environ["TMPDIR"] = str(tmp)
    tempfile.tempdir = str(tmp)
    return cache

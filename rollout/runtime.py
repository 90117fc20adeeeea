"""Process-level settings the stack needs before vLLM, Ray or torch start: one place, read by every entry point.

The device decides backends (CPU: float32, gloo, in-process vLLM with a fixed KV cache size; GPU: bfloat16,
NCCL, vLLM's memory fraction and sleep mode), never a fork of the code.
"""
from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import tempfile
from pathlib import Path


@contextlib.contextmanager
def gc_paused():
    """Python's collector off while a heavy import runs. An import makes objects by the hundred thousand and
    almost no cycles, yet they trigger full collections that scan everything made so far: 9 while vLLM
    imports, a fifth of it (5.1 s -> 4.0 s on 2 cores, measured). A collector that was off stays off."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


# The free memory a kept heap may hold between steps before it is handed back: keep_freed_memory's trim threshold.
KEEP_FREE_BYTES = 2 ** 31 - 1  # 2 GB, the largest value mallopt takes
# A kept heap is released only while less than this share of the machine's memory is available.
LOW_AVAILABLE = 0.25
_kept_heap = False  # keep_freed_memory took effect in this process


def keep_freed_memory() -> None:
    """Keep the memory a process frees for its next allocations, instead of glibc's default of handing every
    block of 128 KB and more back to the kernel. A train step frees its activations at the end and allocates
    them again in the next step, and the kernel faults each page back in zeroed: on these VMs that cost a train
    rank 2-4 s of kernel time a step on top of 1 s of compute (perf: 61% of its time in clear_page_erms). Freed
    blocks now stay on the heap, untrimmed below 2 GB: the process's resident memory stays at its peak, which
    every step reaches anyway; release_freed_memory, after each step, bounds what the heap's holes hold. A process
    whose malloc was tuned through glibc's environment (MALLOC_*_, GLIBC_TUNABLES), or a C library other than
    glibc: left as it is."""
    if any(k.startswith("MALLOC_") and k.endswith("_") for k in os.environ) or "glibc.malloc" in os.environ.get(
            "GLIBC_TUNABLES", ""):
        return
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return
    m_trim_threshold, m_mmap_max = -1, -4  # glibc's malloc.h
    mallopt(m_mmap_max, 0)
    mallopt(m_trim_threshold, KEEP_FREE_BYTES)
    global _kept_heap
    _kept_heap = True


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]


def release_freed_memory(keep_bytes: int = KEEP_FREE_BYTES, low_available: float = LOW_AVAILABLE) -> tuple[int, bool]:
    """After a step, hand the kernel the free pages of a kept heap (keep_freed_memory) when it holds more than
    `keep_bytes` free and the machine is short of memory: less than `low_available` of it available
    (/proc/meminfo's MemAvailable). Returns (the bytes free in the heap, whether they were released).

    A train rank's heap stays at its step's peak: 9.4 GB on the reasoning example's 64-reply steps (SmolLM2-135M,
    32-reply micro-batches, 0.8 GB in use between steps; measured 2026-12-07). Held while another process works
    (the rollout engine, or TRL's side in benchmarks.learning_vs_trl) it pushed a 23.5 GB machine past Ray's
    memory monitor, which killed the run. Released every step, the next step faults its pages in again: on the
    same steps that cost 22% of the train time (91 s -> 112 s over 8 steps), so it is done only under pressure.
    glibc only; elsewhere, or with malloc tuned by the user, a no-op."""
    if not _kept_heap:
        return 0, False
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    free = libc.mallinfo2().fordblks
    if free <= keep_bytes or available_memory_share() >= low_available:
        return free, False
    libc.malloc_trim(0)
    return free, True


def available_memory_share() -> float:
    """MemAvailable over MemTotal (/proc/meminfo); 1.0 where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            info = {line.split(":")[0]: int(line.split()[1]) for line in f}
        return info["MemAvailable"] / info["MemTotal"]
    except (OSError, KeyError, ValueError, IndexError):
        return 1.0


def resident_memory_gb() -> tuple[float, float]:
    """This process's resident memory now and at its peak so far, in GB (Linux: /proc and getrusage)."""
    import resource

    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 1e9, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9


def has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def device() -> str:
    return "cuda" if has_cuda() else "cpu"


def default_dtype() -> str:
    # No bf16 matmul path on these CPUs (0.3 GFLOP/s against 60 for fp32): float32 there.
    return "bfloat16" if has_cuda() else "float32"


def shared_cache_dir(run_dir: str | Path) -> Path:
    """The cache a training run and `grpo eval` use: $GRPO_CACHE_DIR, or `.cache` beside the run folder
    (runs/maze -> runs/.cache), so that runs side by side share one. Nothing in it depends on the run:
    vLLM's and torch's compiled kernels (on a GPU; a compiling engine also put torch's 149 MB precompiled
    header in the temp folder, and its first rollout took 85 s in a fresh cache against 8.6 s in a warm one on
    2 cores), vLLM's caches, temp files. On the CPU vLLM runs eager and it stays small. Hugging Face's home
    (the hub cache, the token) stays the user's: configure."""
    return Path(os.environ.get("GRPO_CACHE_DIR") or Path(run_dir).resolve().parent / ".cache")


def hf_home() -> Path:
    """The user's Hugging Face home as huggingface_hub finds it: $HF_HOME, else $XDG_CACHE_HOME/huggingface,
    else ~/.cache/huggingface."""
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "huggingface"


def configure(run_dir: str | Path, cache_dir: str | Path | None = None) -> Path:
    """Point every cache and temp folder of vLLM, torch, Ray and friends at one cache folder, never under
    $HOME: $GRPO_CACHE_DIR when set, else `cache_dir`, else `run_dir/.cache`. The folder is exported as
    GRPO_CACHE_DIR, so the first call in a process decides, and Ray actors and subprocesses started
    afterwards use the same folder. Hugging Face's home is the user's own ($HF_HOME, else
    ~/.cache/huggingface): their downloaded models, their token, HF_HUB_OFFLINE as they set it.

    Must run before vllm is imported: vLLM reads its environment at import time.
    """
    default = Path(cache_dir) if cache_dir is not None else Path(run_dir) / ".cache"
    cache = Path(os.environ.setdefault("GRPO_CACHE_DIR", str(default.resolve())))
    cache.mkdir(parents=True, exist_ok=True)
    # Hugging Face derives its default home from XDG_CACHE_HOME, which moves below: pinned first.
    os.environ.setdefault("HF_HOME", str(hf_home()))
    env = {
        "VLLM_CACHE_ROOT": str(cache / "vllm"),
        "VLLM_CONFIG_ROOT": str(cache / "vllm-config"),
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_DO_NOT_TRACK": "1",
        "TRITON_CACHE_DIR": str(cache / "triton"),
        "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
        "XDG_CACHE_HOME": str(cache),
        "RAY_AUTH_MODE": "disabled",
        "RAY_USAGE_STATS_ENABLED": "0",
        "TOKENIZERS_PARALLELISM": "false",
        # Two busy-waiting OpenMP pools on 2 cores turned a 0.1 s step into 0.3-1.9 s (measured here).
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
    # vLLM drops a rendezvous file into the temp folder at every engine start, and torch keeps its
    # precompiled header in the temp folder as it is when torch's code cache is first imported.
    tmp = cache / "tmp"
    tmp.mkdir(exist_ok=True)
    os.environ["TMPDIR"] = str(tmp)
    tempfile.tempdir = str(tmp)
    return cache

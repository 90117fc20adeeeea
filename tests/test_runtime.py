"""Process-level settings (rollout/runtime.py): the collector paused around heavy imports, and freed memory kept
for a train rank's next step."""
import gc
import json
import os
import subprocess
import sys

import pytest

from rollout import runtime

# Resident bytes freed by deleting a 256 MB tensor, in a fresh process (mallopt lasts for the whole process).
FREED = """
import sys, torch
from rollout import runtime
def resident(): return int(open("/proc/self/statm").read().split()[1]) * 4096
if sys.argv[1] == "keep":
    runtime.keep_freed_memory()
x = torch.ones(64 << 20)
before = resident()
del x
print(before - resident())
"""


# A hole in a kept heap: a 256 MB block freed below a live one, then release_freed_memory with a bound (argv[1])
# and the share of available memory under which it releases (argv[2]).
HOLE = """
import json, sys, torch
from rollout import runtime
runtime.keep_freed_memory()
x = torch.ones(64 << 20)
y = torch.ones(1 << 18)  # above x on the heap: freeing x leaves a hole, not a free top
del x
held = runtime.resident_memory_gb()[0]
free, released = runtime.release_freed_memory(int(sys.argv[1]), float(sys.argv[2]))
print(json.dumps({"free": free, "released": released, "gb": held - runtime.resident_memory_gb()[0]}))
"""


def _fresh(code: str, *args, **env) -> str:
    """`code` run in a fresh process with `args`, its malloc untuned but for `env`; what it printed."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, check=True,
                          env={**environ, **env}).stdout


def test_a_kept_heap_hands_back_its_holes_only_above_the_bound_and_under_memory_pressure():
    def hole(keep_bytes: int, low_available: float = 1.0) -> dict:
        return json.loads(_fresh(HOLE, keep_bytes, low_available))

    # A machine always short of memory (available share < 1.0), then one never short (< 0.0).
    below, above, plenty = hole(runtime.KEEP_FREE_BYTES), hole(128 << 20), hole(128 << 20, 0.0)
    assert all(r["free"] >= 256 << 20 for r in (below, above, plenty))
    # Under the bound, or with memory to spare, the hole stays resident for the next step.
    assert not below["released"] and abs(below["gb"]) < 0.016
    assert not plenty["released"] and abs(plenty["gb"]) < 0.016
    assert above["released"] and above["gb"] > 0.2  # its pages go back, though live memory sits above them
    assert 0.0 < runtime.available_memory_share() < 1.0


def test_the_collector_is_paused_inside_and_left_as_it_was_after():
    assert gc.isenabled()
    with runtime.gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(KeyError), runtime.gc_paused():
        raise KeyError("an import that fails")
    assert gc.isenabled()
    gc.disable()
    try:
        with runtime.gc_paused():
            pass
        assert not gc.isenabled()  # a caller's choice stays
    finally:
        gc.enable()


def test_freed_memory_stays_in_the_process_for_the_next_allocation():
    def freed(mode: str, **env) -> int:
        return int(_fresh(FREED, mode, **env))

    assert freed("default") > 200 << 20  # glibc's default: the block goes back to the kernel
    assert freed("keep") < 16 << 20
    # A malloc tuned through glibc's environment is the user's: kept as they set it.
    assert freed("keep", MALLOC_MMAP_THRESHOLD_=str(128 << 10)) > 200 << 20


def test_hugging_faces_home_and_offline_switch_stay_the_users(tmp_path, monkeypatch):
    import tempfile

    def configured(**user) -> dict:
        monkeypatch.setattr(os, "environ", {"HOME": str(tmp_path / "home"), **user})
        monkeypatch.setattr(tempfile, "tempdir", tempfile.tempdir)  # configure points it at the cache: put back
        runtime.configure(tmp_path / "run")
        return os.environ

    env = configured()
    # Hugging Face's default home, pinned before XDG_CACHE_HOME moves into the run's cache.
    assert env["HF_HOME"] == str(tmp_path / "home" / ".cache" / "huggingface") and "HF_HUB_OFFLINE" not in env
    assert env["XDG_CACHE_HOME"] == str(tmp_path / "run" / ".cache") == env["GRPO_CACHE_DIR"]
    env = configured(XDG_CACHE_HOME=str(tmp_path / "xdg"))
    assert env["HF_HOME"] == str(tmp_path / "xdg" / "huggingface")
    env = configured(HF_HOME=str(tmp_path / "mine"), HF_HUB_OFFLINE="0", HF_TOKEN="hf_x")
    assert (env["HF_HOME"], env["HF_HUB_OFFLINE"], env["HF_TOKEN"]) == (str(tmp_path / "mine"), "0", "hf_x")
    assert env["VLLM_CACHE_ROOT"] == str(tmp_path / "run" / ".cache" / "vllm")  # the run's caches stay the run's

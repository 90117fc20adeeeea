"""Process-level settings (rollout/runtime.py): the collector paused around heavy imports, and freed memory kept
for a train rank's next step."""
import gc
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
        environ = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
        return int(subprocess.run([sys.executable, "-c", FREED, mode], capture_output=True, text=True, check=True,
                                  env={**environ, **env}).stdout)

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

"""Shared fixtures. Every cache and temp folder of vLLM, Ray and Hugging Face goes under one session folder
that is removed at the end, never under the home folder."""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from rollout import runtime

_SESSION_DIR = Path(tempfile.mkdtemp(prefix="grpo-tests-"))
# A run uses the user's own Hugging Face home (their cache, their token); the tests use one of their own.
os.environ["HF_HOME"] = str(_SESSION_DIR / "hf")
runtime.configure(_SESSION_DIR)


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(_SESSION_DIR, ignore_errors=True)


@pytest.fixture(scope="session")
def session_dir() -> Path:
    return _SESSION_DIR


@pytest.fixture(scope="session")
def tiny_vl(session_dir) -> Path:
    from grpo.tools import tiny_models

    return tiny_models.build("vl", session_dir / "models" / "tiny-vl", seed=0)


@pytest.fixture(scope="session")
def tiny_vl_maze(session_dir) -> Path:
    """The tiny Qwen3-VL at the maze example's preset (its patch size gives one token per maze block)."""
    from examples.maze import maze_config
    from grpo.tools import tiny_models

    return tiny_models.build("vl", session_dir / "models" / "tiny-vl-maze", seed=0, preset=maze_config.PRESET)


@pytest.fixture(scope="session")
def tiny_text(session_dir) -> Path:
    from grpo.tools import tiny_models

    return tiny_models.build("text", session_dir / "models" / "tiny-text", seed=0)


@pytest.fixture(scope="module")
def worker(tiny_text, session_dir):
    """An in-process rollout worker on the tiny text model without LoRA, one per test module."""
    from rollout.engine import EngineConfig
    from rollout.worker import RolloutWorker

    w = RolloutWorker(EngineConfig(model=str(tiny_text), enable_lora=False, max_model_len=512),
                      run_dir=str(session_dir))
    yield w
    w.shutdown()


def pytest_addoption(parser):
    parser.addoption("--cpu-profile", metavar="PATH", default=None,
                     help="write each test's wall time and the machine's busy cores during it (JSON) to PATH")


def _cpu_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of every CPU since boot, from /proc/stat's first line."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle and iowait
    return sum(fields) - idle, sum(fields)


_PROFILE: list[dict] = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    # Wall time alone cannot tell a test that computes from one that waits (a timeout, a restart, a sleep): the
    # share of the machine busy while it ran can. Setup and teardown count, as a module fixture's start does.
    if not item.config.getoption("--cpu-profile"):
        yield
        return
    start, (busy0, total0) = time.perf_counter(), _cpu_jiffies()
    yield
    busy1, total1 = _cpu_jiffies()
    share = (busy1 - busy0) / max(total1 - total0, 1)
    _PROFILE.append({"test": item.nodeid, "wall_s": round(time.perf_counter() - start, 2),
                     "busy_cores": round(share * (os.cpu_count() or 1), 2)})


def pytest_unconfigure(config):
    path = config.getoption("--cpu-profile", default=None)
    if path and _PROFILE:
        wall = sum(r["wall_s"] for r in _PROFILE)
        busy = sum(r["wall_s"] * r["busy_cores"] for r in _PROFILE)
        Path(path).write_text(json.dumps({
            "cpus": os.cpu_count(), "tests": len(_PROFILE), "wall_s": round(wall, 1),
            "mean_busy_cores": round(busy / max(wall, 1e-9), 2),
            "by_wall": sorted(_PROFILE, key=lambda r: -r["wall_s"])}, indent=1) + "\n")

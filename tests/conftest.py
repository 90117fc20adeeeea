"""Shared fixtures. Every cache and temp folder of vLLM, Ray and Hugging Face goes under one session folder
that is removed at the end, never under the home folder."""
from __future__ import annotations

import os
import shutil
import tempfile
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

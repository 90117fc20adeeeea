"""Trainer checkpoints (grpo/learner/checkpoint.py through TrainWorker): bitwise resume, what comes back, garbage
collection, and saves that die halfway."""
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import safetensors.torch
import torch

from _fixtures_train import advantages, dir_listing, max_abs_diff, vl_model, trajectories  # noqa: F401 (fixture)
from grpo.learner import checkpoint
from grpo.algo.config import AlgorithmConfig
from grpo.learner.config import TrainConfig
from grpo.learner.worker import TrainWorker

TRAIN = TrainConfig(lr=1e-2, warmup_steps=2, schedule="cosine", total_steps=5, micro_batch_size=3)
ALGO = AlgorithmConfig(kl_coef=0.05)


def worker(model: str) -> TrainWorker:
    return TrainWorker(model, algorithm=ALGO, train=TRAIN)


def batches(processor, n: int):
    return [(trajectories(processor, 5, seed=s), advantages(5, seed=s)) for s in range(n)]


def assert_same_state(a: dict, b: dict) -> None:
    assert a["step"] == b["step"]
    assert a["model"].keys() == b["model"].keys()
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    assert a["optim"]["state"].keys() == b["optim"]["state"].keys()
    for k, state in a["optim"]["state"].items():
        for n, v in state.items():
            assert torch.equal(torch.as_tensor(v), torch.as_tensor(b["optim"]["state"][k][n])), (k, n)
    assert a["optim"]["param_groups"] == b["optim"]["param_groups"]


def test_should_save():
    assert [s for s in range(8) if checkpoint.should_save(s, 3, 7)] == [3, 6, 7]
    assert [s for s in range(8) if checkpoint.should_save(s, None, 7)] == [7]
    assert not checkpoint.should_save(0, 1, None)


def test_resume_is_bitwise_and_restores_what_was_saved(vl_model, tmp_path):
    straight = worker(vl_model)
    data = batches(straight.processor, 3)
    for b in data[:2]:
        straight.train_step(*b)
    straight.adapter_version = 5
    path = straight.save_checkpoint(tmp_path, data_cursor={"epoch": 0, "index": 10}, state={"best": 0.25})
    draw = torch.rand(3)  # the random state saved is the one after the save
    m_straight = straight.train_step(*data[2])

    torch.manual_seed(999)
    resumed = worker(vl_model)
    assert max_abs_diff(resumed.gather_adapter(), straight.gather_adapter()) > 0
    info = resumed.load_checkpoint(tmp_path)
    assert info == {"step": 2, "path": path, "adapter_version": 5, "data_cursor": {"epoch": 0, "index": 10},
                    "state": {"best": 0.25}}
    assert torch.equal(torch.rand(3), draw)
    m_resumed = resumed.train_step(*data[2])
    assert m_resumed["lr"] == m_straight["lr"] == TRAIN.lr_at(2)
    assert m_resumed["loss"] == m_straight["loss"]
    assert_same_state(straight.gather_state(), resumed.gather_state())


def test_latest_and_garbage_collection(vl_model, tmp_path):
    w = worker(vl_model)
    assert checkpoint.latest(tmp_path) is None and w.load_checkpoint(tmp_path) is None
    data = batches(w.processor, 1)
    paths = []
    for _ in range(3):
        w.train_step(*data[0])
        paths.append(w.save_checkpoint(tmp_path, keep_last=2))
    latest = checkpoint.latest(tmp_path)
    assert (latest.step, latest.path, latest.world_size) == (3, paths[2], 1)
    assert dir_listing(tmp_path) == sorted([checkpoint.MARKER, Path(paths[1]).name, Path(paths[2]).name])
    assert set(dir_listing(paths[2])) == {".metadata", "__0_0.distcp", "rng_rank0.pt", "trainer.pt"}

    marker = json.loads((tmp_path / checkpoint.MARKER).read_text())
    for name in marker["kept"]:
        (tmp_path / name / ".metadata").unlink()
    with pytest.raises(FileNotFoundError, match="its files are gone"):
        checkpoint.latest(tmp_path)


def test_save_that_dies_before_the_marker_is_ignored(vl_model, tmp_path, monkeypatch):
    w = worker(vl_model)
    data = batches(w.processor, 1)
    w.train_step(*data[0])
    first = w.save_checkpoint(tmp_path)
    saved = w.gather_state()
    w.train_step(*data[0])

    def die(*args, **kwargs):
        raise KeyboardInterrupt("killed before the marker")

    monkeypatch.setattr(checkpoint, "atomic_write", die)
    with pytest.raises(KeyboardInterrupt):
        w.save_checkpoint(tmp_path)
    monkeypatch.undo()
    assert len([n for n in dir_listing(tmp_path) if n.startswith("step_")]) == 2  # the dead save's folder
    assert checkpoint.latest(tmp_path).path == first

    fresh = worker(vl_model)
    assert fresh.load_checkpoint(tmp_path)["step"] == 1
    assert_same_state(fresh.gather_state(), saved)
    again = fresh.save_checkpoint(tmp_path, keep_last=1)  # the next save sweeps the dead one away
    assert dir_listing(tmp_path) == sorted([checkpoint.MARKER, Path(again).name])


CHILD = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, {tests!r})
    import safetensors.torch
    from _fixtures_train import advantages, trajectories
    from grpo.algo.config import AlgorithmConfig
    from grpo.learner.config import TrainConfig
    from grpo.learner.worker import TrainWorker

    w = TrainWorker({model!r}, algorithm=AlgorithmConfig(kl_coef=0.05), train=TrainConfig(lr=1e-2, micro_batch_size=3))
    batch = (trajectories(w.processor, 5), advantages(5))
    w.train_step(*batch)
    w.save_checkpoint({root!r}, data_cursor=1)
    safetensors.torch.save_file(w.gather_adapter(), {reference!r})
    w.train_step(*batch)

    def killed(fd):  # DCP fsyncs each data file before it writes .metadata
        os.kill(os.getpid(), signal.SIGKILL)

    os.fsync = killed
    w.save_checkpoint({root!r}, data_cursor=2)
    sys.exit("the save was not killed")
""")


@pytest.mark.slow
def test_save_killed_mid_write_is_ignored(vl_model, tmp_path):
    root, reference = tmp_path / "ckpt", tmp_path / "reference.safetensors"
    script = CHILD.format(tests=str(Path(__file__).parent), model=vl_model, root=str(root), reference=str(reference))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == -9, proc.stderr[-3000:]
    dead = [n for n in dir_listing(root) if n.startswith("step_00000002")]
    assert len(dead) == 1 and not (root / dead[0] / ".metadata").exists()

    latest = checkpoint.latest(root)
    assert latest.step == 1
    resumed = TrainWorker(vl_model, algorithm=AlgorithmConfig(kl_coef=0.05), train=TrainConfig(lr=1e-2, micro_batch_size=3))
    assert resumed.load_checkpoint(root)["data_cursor"] == 1
    assert max_abs_diff(resumed.gather_adapter(), safetensors.torch.load_file(reference)) == 0.0

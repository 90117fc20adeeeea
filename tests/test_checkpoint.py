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
from _fixtures_train import (
    advantages,
    assert_same_state,
    dir_listing,
    max_abs_diff,
    saved_state,
    trajectories,
)

from grpo.algo.config import AlgorithmConfig
from grpo.driver.fault import flip_byte
from grpo.learner import checkpoint
from grpo.learner.config import TrainConfig
from grpo.learner.worker import TrainWorker

TRAIN = TrainConfig(lr=1e-2, warmup_steps=2, schedule="cosine", micro_batch_size=3)
STEPS = 5  # the cosine schedule's length
ALGO = AlgorithmConfig(kl_coef=0.05)


def worker(model: str) -> TrainWorker:
    return TrainWorker(model, algorithm=ALGO, train=TRAIN, total_steps=STEPS)


def batches(processor, n: int):
    return [(trajectories(processor, 5, seed=s), advantages(5, seed=s)) for s in range(n)]


def test_should_save():
    assert [s for s in range(8) if checkpoint.should_save(s, 3, 7)] == [3, 6, 7]
    assert [s for s in range(8) if checkpoint.should_save(s, None, 7)] == [7]
    assert not checkpoint.should_save(0, 1, None)


def test_resume_is_bitwise_and_restores_what_was_saved(tiny_vl, tmp_path):
    straight = worker(tiny_vl)
    data = batches(straight.processor, 3)
    for b in data[:2]:
        straight.train_step(*b)
    straight.adapter_version = 5
    path = straight.save_checkpoint(tmp_path / "at2", state={"cursor": {"epoch": 0, "index": 10}})
    draw = torch.rand(3)  # the random state saved is the one after the save
    m_straight = straight.train_step(*data[2])

    torch.manual_seed(999)
    resumed = worker(tiny_vl)
    assert max_abs_diff(resumed.gather_adapter(), straight.gather_adapter()) > 0
    info = resumed.load_checkpoint(tmp_path / "at2")
    assert info == {"step": 2, "path": path, "adapter_version": 5, "state": {"cursor": {"epoch": 0, "index": 10}},
                    "skipped": []}
    assert torch.equal(torch.rand(3), draw)
    m_resumed = resumed.train_step(*data[2])
    assert m_resumed["lr"] == m_straight["lr"] == TRAIN.lr_at(2, STEPS)
    assert m_resumed["loss"] == m_straight["loss"]
    after = [saved_state(w.save_checkpoint(tmp_path / name)) for w, name in ((straight, "a"), (resumed, "b"))]
    assert after[0]["step"] == 3 and after[0]["model"] and after[0]["optim"]["state"]
    assert_same_state(*after)


def test_latest_and_garbage_collection(tiny_vl, tmp_path):
    w = worker(tiny_vl)
    assert checkpoint.latest(tmp_path) is None and w.load_checkpoint(tmp_path) is None
    data = batches(w.processor, 1)
    paths = []
    for _ in range(3):
        w.train_step(*data[0])
        paths.append(w.save_checkpoint(tmp_path, keep_last=2))
    latest = checkpoint.latest(tmp_path)
    assert (latest.step, latest.path, latest.world_size) == (3, paths[2], 1)
    assert dir_listing(tmp_path) == sorted([checkpoint.MARKER, Path(paths[1]).name, Path(paths[2]).name])
    assert set(dir_listing(paths[2])) == {".metadata", "__0_0.distcp", "rng_rank0.pt", "trainer.pt", "manifest.json"}

    # Checkpoints written before December 2026 have no manifest (a marker of format 1) and also hold a data
    # cursor, unused: they still load, unverified.
    old_format = torch.load(Path(paths[2]) / "trainer.pt", weights_only=False) | {"data_cursor": 7}
    torch.save(old_format, Path(paths[2]) / "trainer.pt")
    (Path(paths[2]) / checkpoint.MANIFEST).unlink()
    marker = json.loads((tmp_path / checkpoint.MARKER).read_text())
    (tmp_path / checkpoint.MARKER).write_text(json.dumps(marker | {"format": 1}))
    assert w.load_checkpoint(tmp_path)["step"] == 3

    for name in marker["kept"]:
        (tmp_path / name / ".metadata").unlink()
    with pytest.raises(checkpoint.CheckpointError, match="no checkpoint under .* verifies") as e:
        checkpoint.latest(tmp_path)
    assert f"{Path(paths[1]).name}: .metadata is gone" in str(e.value) and "delete" in str(e.value)


def test_a_corrupt_or_torn_newest_checkpoint_is_skipped_for_the_one_before(tiny_vl, tmp_path):
    w = worker(tiny_vl)
    data = batches(w.processor, 1)
    paths = []
    for _ in range(3):
        w.train_step(*data[0])
        paths.append(w.save_checkpoint(tmp_path, keep_last=3))
    expected = saved_state(paths[1])
    flip_byte(Path(paths[2]) / "__0_0.distcp")  # one bit of the LoRA weights or optimizer state
    resumed = worker(tiny_vl)
    info = resumed.load_checkpoint(tmp_path)
    assert info["step"] == 2 and info["path"] == paths[1]
    assert info["skipped"] == [f"checkpoint {Path(paths[2]).name} skipped: __0_0.distcp fails its sha256 (corrupt: "
                               f"a changed byte); moved to corrupt/{Path(paths[2]).name}, resuming from step 2"]
    assert_same_state(saved_state(resumed.save_checkpoint(tmp_path / "again")), expected | {"step": 2})
    # Set aside for inspection, out of the marker: the next saves keep verified checkpoints only.
    assert (tmp_path / checkpoint.CORRUPT / Path(paths[2]).name / "__0_0.distcp").is_file()
    assert json.loads((tmp_path / checkpoint.MARKER).read_text())["kept"] == [Path(p).name for p in paths[1::-1]]

    trainer_pt = Path(paths[1]) / "trainer.pt"
    whole = trainer_pt.read_bytes()
    trainer_pt.write_bytes(whole[:-10])  # torn: its last bytes never reached the disk
    info = checkpoint.latest(tmp_path)
    assert info.step == 1 and info.path == paths[0]
    assert info.skipped == ((Path(paths[1]).name, f"trainer.pt has {len(whole) - 10} bytes, its manifest says "
                                                  f"{len(whole)} (torn)"),)


def test_save_that_dies_before_the_marker_is_ignored(tiny_vl, tmp_path, monkeypatch):
    w = worker(tiny_vl)
    data = batches(w.processor, 1)
    w.train_step(*data[0])
    first = w.save_checkpoint(tmp_path)
    saved = saved_state(first)
    w.train_step(*data[0])

    def die(*args, **kwargs):
        raise KeyboardInterrupt("killed before the marker")

    monkeypatch.setattr(checkpoint, "atomic_write", die)
    with pytest.raises(KeyboardInterrupt):
        w.save_checkpoint(tmp_path)
    monkeypatch.undo()
    assert len([n for n in dir_listing(tmp_path) if n.startswith("step_")]) == 2  # the dead save's folder
    assert checkpoint.latest(tmp_path).path == first

    fresh = worker(tiny_vl)
    assert fresh.load_checkpoint(tmp_path)["step"] == 1
    again = fresh.save_checkpoint(tmp_path, keep_last=1)  # the next save sweeps the dead one away
    assert dir_listing(tmp_path) == sorted([checkpoint.MARKER, Path(again).name])
    assert_same_state(saved_state(again), saved)


CHILD = textwrap.dedent("""
    import os, signal, sys
    import safetensors.torch
    from _fixtures_train import advantages, trajectories
    from grpo.algo.config import AlgorithmConfig
    from grpo.learner.config import TrainConfig
    from grpo.learner.worker import TrainWorker

    w = TrainWorker({model!r}, algorithm=AlgorithmConfig(kl_coef=0.05), train=TrainConfig(lr=1e-2, micro_batch_size=3))
    batch = (trajectories(w.processor, 5), advantages(5))
    w.train_step(*batch)
    w.save_checkpoint({root!r}, state={{"cursor": 1}})
    safetensors.torch.save_file(w.gather_adapter(), {reference!r})
    w.train_step(*batch)

    def killed(fd):  # DCP fsyncs each data file before it writes .metadata
        os.kill(os.getpid(), signal.SIGKILL)

    os.fsync = killed
    w.save_checkpoint({root!r}, state={{"cursor": 2}})
    sys.exit("the save was not killed")
""")


@pytest.mark.slow
def test_save_killed_mid_write_is_ignored(tiny_vl, tmp_path):
    root, reference = tmp_path / "ckpt", tmp_path / "reference.safetensors"
    script = CHILD.format(model=str(tiny_vl), root=str(root), reference=str(reference))
    # In tests/, where `python -c` imports from: the script takes its batch from _fixtures_train.
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).parent)
    assert proc.returncode == -9, proc.stderr[-3000:]
    dead = [n for n in dir_listing(root) if n.startswith("step_00000002")]
    assert len(dead) == 1 and not (root / dead[0] / ".metadata").exists()

    latest = checkpoint.latest(root)
    assert latest.step == 1
    resumed = TrainWorker(tiny_vl, algorithm=AlgorithmConfig(kl_coef=0.05),
                          train=TrainConfig(lr=1e-2, micro_batch_size=3))
    assert resumed.load_checkpoint(root)["state"] == {"cursor": 1}
    assert max_abs_diff(resumed.gather_adapter(), safetensors.torch.load_file(reference)) == 0.0

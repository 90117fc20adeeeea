"""Trainer checkpoints: LoRA weights and optimizer state through torch.distributed.checkpoint (DCP), plus
the step, the caller's state (data cursor, adapter version, ...) and every rank's random state.

Layout under the root (a path every rank can reach; on a cluster, shared storage):

    latest.json                  the commit point: the newest complete checkpoint and the ones kept
    step_00000004-<token>/       one save; the token makes every attempt a fresh folder
      .metadata, __*_*.distcp    DCP: LoRA weights and optimizer state, sharded as the ranks held them
      trainer.pt                 rank 0: step, caller state
      rng_rank<r>.pt             each rank's torch, CUDA, Python and numpy random state

A checkpoint exists when latest.json names it. Every file is fsynced before latest.json is replaced by
an atomic rename, so a save killed at any point leaves the previous checkpoint as the latest; the folder
it left behind is named by no marker and is removed by the next save. One writer (one run) per root.
Files hold pickled Python objects: load only checkpoints you wrote.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import random
import re
import secrets
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from grpo.learner import dist
from sync.atomic import atomic_write, fsync_dir, remove_tree, write_new_file

MARKER = "latest.json"
_FORMAT = 1
_DIR = re.compile(r"step_(\d{8,})-[0-9a-f]+")


@dataclass(frozen=True)
class CheckpointInfo:
    step: int
    path: str
    world_size: int  # ranks that wrote it; DCP reshards the weights for another count, the random state not


def latest(root: str | os.PathLike) -> CheckpointInfo | None:
    """The newest complete checkpoint under root, or None when there is none yet."""
    marker = Path(root) / MARKER
    try:
        doc = json.loads(marker.read_text())
    except FileNotFoundError:
        return None
    path = Path(root) / doc["dir"]
    if not (path / ".metadata").is_file() or not (path / "trainer.pt").is_file():
        raise FileNotFoundError(
            f"{marker} names checkpoint {doc['dir']}, but its files are gone: a save only replaces the marker "
            f"after every file is durable, so something else removed them. Restore {path}, or delete {marker} "
            "to start from scratch")
    return CheckpointInfo(int(doc["step"]), str(path), int(doc["world_size"]))


def rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def should_save(step: int, every: int | None, total_steps: int | None) -> bool:
    """Whether to checkpoint after `step` steps: every `every` steps (None: never) and after the last one."""
    return step > 0 and ((every is not None and step % every == 0) or step == total_steps)


def save(root: str | os.PathLike, step: int, model, optimizer, trainer_state: dict[str, Any],
         keep_last: int = 2) -> CheckpointInfo:
    """Write a checkpoint of `step`; collective: every rank calls it with its model and optimizer."""
    from torch.distributed.checkpoint import save as dcp_save
    from torch.distributed.checkpoint.state_dict import get_state_dict

    if keep_last < 1:
        raise ValueError(f"keep_last must be >= 1 (the newest checkpoint is always kept), got {keep_last}")
    rank, world_size = _rank_and_size()
    root = Path(root)
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
    # Every rank must write into the same fresh folder: rank 0 names it.
    name = dist.broadcast_object(f"step_{step:08d}-{secrets.token_hex(4)}" if rank == 0 else None)
    path = root / name
    if rank == 0:
        path.mkdir()
    dist.barrier()

    model_sd, optim_sd = get_state_dict(model, optimizer, options=_options())
    with _single_process_quiet():
        dcp_save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(path),  # fsyncs its files
                 no_dist=not dist.active())
    write_new_file(str(path / f"rng_rank{rank}.pt"), _dumps(rng_state()))
    if rank == 0:
        write_new_file(str(path / "trainer.pt"), _dumps({"format": _FORMAT, "step": step, **trainer_state}))
    dist.barrier()

    if rank == 0:
        fsync_dir(str(path))
        kept = [name] + [d for d in _kept(root) if d != name][: keep_last - 1]
        doc = {"format": _FORMAT, "step": step, "dir": name, "world_size": world_size, "kept": kept}
        atomic_write(str(root / MARKER), (json.dumps(doc, indent=2) + "\n").encode())
        for entry in os.scandir(root):
            if _DIR.fullmatch(entry.name) and entry.name not in kept:
                remove_tree(entry.path)
    dist.barrier()
    return CheckpointInfo(step, str(path), world_size)


def load(root: str | os.PathLike, model, optimizer) -> tuple[CheckpointInfo, dict[str, Any]] | None:
    """Restore the latest checkpoint into `model` and `optimizer` and this rank's random state; collective.

    Returns the checkpoint and the trainer state saved with it, or None when root holds no checkpoint.
    """
    from torch.distributed.checkpoint import load as dcp_load
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    rank, world_size = _rank_and_size()
    # Rank 0 decides, so that no rank can see a marker that a concurrent writer replaced meanwhile.
    info = dist.broadcast_object(latest(root) if rank == 0 else None)
    if info is None:
        return None
    model_sd, optim_sd = get_state_dict(model, optimizer, options=_options())
    state = {"model": model_sd, "optim": optim_sd}
    with _single_process_quiet():
        dcp_load(state, checkpoint_id=info.path, no_dist=not dist.active())
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                   options=_options())
    if info.world_size == world_size:
        set_rng_state(_loads(Path(info.path) / f"rng_rank{rank}.pt"))
    trainer_state = _loads(Path(info.path) / "trainer.pt")
    return info, trainer_state


def _options():
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    # Only the trainable (LoRA) weights: the frozen base model is reloaded from its own folder. Loading
    # then leaves the frozen weights alone, hence strict=False.
    return StateDictOptions(ignore_frozen_params=True, strict=False)


@contextlib.contextmanager
def _single_process_quiet():
    # DCP warns on every call without a process group, even when asked for exactly that (no_dist).
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        yield


def _kept(root: Path) -> list[str]:
    try:
        return list(json.loads((root / MARKER).read_text())["kept"])
    except FileNotFoundError:
        return []


def _rank_and_size() -> tuple[int, int]:
    if dist.active():
        import torch.distributed as tdist

        return tdist.get_rank(), tdist.get_world_size()
    return 0, 1


def _dumps(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _loads(path: Path):
    # The caller's state and Python's random state are arbitrary objects: full unpickling, own files only.
    return torch.load(path, map_location="cpu", weights_only=False)

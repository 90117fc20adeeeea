"""Trainer checkpoints: LoRA weights and optimizer state through torch.distributed.checkpoint (DCP), plus
the step, the caller's state (data cursor, adapter version, ...) and every rank's random state.

Layout under the root (a path every rank can reach; on a cluster, shared storage):

    latest.json                  the commit point: the newest complete checkpoint and the ones kept
    step_00000004-<token>/       one save; the token makes every attempt a fresh folder
      .metadata, __*_*.distcp    DCP: LoRA weights and optimizer state, sharded as the ranks held them
      trainer.pt                 rank 0: step, caller state
      rng_rank<r>.pt             each rank's torch, CUDA, Python and numpy random state
      manifest.json              written last: every other file's sha256 and size, the step, the ranks
    corrupt/                     checkpoints that failed verification, moved aside for inspection

A checkpoint exists when latest.json names it. Every file is fsynced before latest.json is replaced by
an atomic rename, so a save killed at any point leaves the previous checkpoint as the latest; the folder
it left behind is named by no marker and is removed by the next save. One writer (one run) per root.
Loading verifies every file against the manifest and falls back to the newest kept checkpoint that
verifies (a flipped byte, a torn or vanished file), naming what it skipped; it refuses when none does.
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
from sync.atomic import atomic_write, fsync_dir, naming, remove_tree, write_new_file
from sync.format import sha256_file

MARKER = "latest.json"
MANIFEST = "manifest.json"
CORRUPT = "corrupt"
# 2: every checkpoint has a manifest. A marker of format 1 names checkpoints written before manifests,
# which load unverified.
_FORMAT = 2
_DIR = re.compile(r"step_(\d{8,})-[0-9a-f]+")


class CheckpointError(RuntimeError):
    """No kept checkpoint verifies: the message names each one and what failed."""


@dataclass(frozen=True)
class CheckpointInfo:
    step: int
    path: str
    world_size: int  # ranks that wrote it; DCP reshards the weights for another count, the random state not
    skipped: tuple[tuple[str, str], ...] = ()  # (folder, why) of newer kept checkpoints that failed verification

    def notes(self) -> list[str]:
        """One line per skipped checkpoint, for the run's log."""
        return [f"checkpoint {name} skipped: {why}; moved to {CORRUPT}/{name}, resuming from step {self.step}"
                for name, why in self.skipped]


def latest(root: str | os.PathLike) -> CheckpointInfo | None:
    """The newest kept checkpoint under root whose files verify, or None when there is none yet. Newer ones
    that fail are named in `skipped`; raises CheckpointError when every kept checkpoint fails."""
    root = Path(root)
    marker = root / MARKER
    try:
        doc = json.loads(marker.read_text())
        names = [doc["dir"]] + [d for d in doc.get("kept", []) if d != doc["dir"]]
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{marker} is unreadable ({e}): the marker is replaced atomically, so something "
                              f"else damaged it. Restore it, or delete {marker} to start from scratch") from None
    skipped = []
    for name in names:
        problem = verify(root / name, legacy=doc.get("format", 1) < 2)
        if problem is None:
            manifest = _manifest(root / name)
            size = manifest["world_size"] if manifest else int(doc["world_size"])
            return CheckpointInfo(_step_of(name), str(root / name), size, tuple(skipped))
        skipped.append((name, problem))
    # One line: the run's log says it as its one line of a refusal.
    raise CheckpointError(f"no checkpoint under {root} verifies: " +
                          "; ".join(f"{name}: {why}" for name, why in skipped) +
                          f". Restore one of them from a copy, or delete {marker} to start the run from scratch")


def verify(path: Path, legacy: bool = False) -> str | None:
    """What is wrong with the checkpoint folder `path` (None: every file matches its manifest). `legacy`:
    a checkpoint written before manifests, checked only for its files."""
    required = (".metadata", "trainer.pt")
    try:
        manifest = _manifest(path)
    except (OSError, ValueError) as e:
        return f"its {MANIFEST} is unreadable ({e})"
    if manifest is None:
        if legacy and all((path / f).is_file() for f in required):
            return None
        gone = "the folder is gone" if not path.is_dir() else f"it has no {MANIFEST}"
        return f"{gone} (a save only names a checkpoint after its manifest is durable, so it was removed or torn)"
    for name, entry in sorted(manifest["files"].items()):
        try:
            size = (path / name).stat().st_size
        except FileNotFoundError:
            return f"{name} is gone"
        if size != entry["bytes"]:
            return f"{name} has {size} bytes, its manifest says {entry['bytes']} (torn)"
        if sha256_file(str(path / name)) != entry["sha256"]:
            return f"{name} fails its sha256 (corrupt: a changed byte)"
    missing = [f for f in required if f not in manifest["files"]]
    return f"its manifest lists no {', '.join(missing)}" if missing else None


def _manifest(path: Path) -> dict | None:
    try:
        return json.loads((path / MANIFEST).read_text())
    except FileNotFoundError:
        return None


def _step_of(name: str) -> int:
    return int(_DIR.fullmatch(name).group(1))


def set_aside(root: str | os.PathLike, info: CheckpointInfo) -> None:
    """Move the checkpoints `info` skipped to root/corrupt/ and drop them from the marker, so that the next
    saves keep verified checkpoints only (the folders stay for inspection)."""
    root = Path(root)
    bad = {name for name, _ in info.skipped}
    (root / CORRUPT).mkdir(exist_ok=True)
    for name in bad:
        if (root / name).is_dir():
            os.replace(root / name, root / CORRUPT / name)
    doc = json.loads((root / MARKER).read_text())
    doc.update(dir=Path(info.path).name, step=info.step, world_size=info.world_size,
               kept=[d for d in doc["kept"] if d not in bad])
    atomic_write(str(root / MARKER), (json.dumps(doc, indent=2) + "\n").encode())
    fsync_dir(str(root))


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
    with _single_process_quiet(), naming(path), _failed_write():
        dcp_save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(path),  # fsyncs its files
                 no_dist=not dist.active())
    write_new_file(str(path / f"rng_rank{rank}.pt"), _dumps(rng_state()))
    if rank == 0:
        write_new_file(str(path / "trainer.pt"), _dumps({"format": _FORMAT, "step": step, **trainer_state}))
    dist.barrier()

    if rank == 0:
        # Written last, once every rank's files are durable: a folder with a manifest is complete.
        files = {e.name: {"sha256": sha256_file(e.path), "bytes": e.stat().st_size}
                 for e in os.scandir(path) if e.is_file()}
        manifest = {"format": _FORMAT, "step": step, "world_size": world_size, "files": files}
        write_new_file(str(path / MANIFEST), (json.dumps(manifest, indent=1) + "\n").encode())
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
    info = None
    if rank == 0:
        try:
            info = latest(root)
            if info is not None and info.skipped:
                set_aside(root, info)
        except CheckpointError as e:
            info = e  # every rank raises it, none waits for the others
    info = dist.broadcast_object(info)
    if isinstance(info, CheckpointError):
        raise info
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


@contextlib.contextmanager
def _failed_write():
    """DCP gathers every rank's failure into one CheckpointException (not even an Exception) that every rank
    raises: its OSError is raised instead, so that a full or broken disk reads as one (`naming` then adds the
    checkpoint's folder: DCP's writes name no file)."""
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        yield
    except CheckpointException as e:
        failed = next((x for x, _ in e.failures.values() if isinstance(x, OSError)), None)
        if failed is None:
            raise
        raise OSError(failed.errno, failed.strerror, failed.filename) from e


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

"""Storage faults: a write that failed anywhere in the run (the driver, a train rank, a rollout worker) found
in the error that reached the driver, and said in one line with what a user needs to act on it; and a stored
file the run refused (a checkpoint or an adapter that fails its sha256), said in one line too.

Every writer of the run writes to a fresh or temporary name and renames (sync.atomic, grpo.learner.checkpoint),
so a write that fails leaves what was written before it intact: the line names the last complete
checkpoint and adapter, which the same command resumes from once the storage is fixed.
"""
from __future__ import annotations

import errno
import os
import re
import shutil
import sys
import traceback
from pathlib import PurePath

STORAGE_EXIT = 74  # EX_IOERR (sysexits.h): an input/output error
REFUSED_EXIT = 65  # EX_DATAERR (sysexits.h): the input data was incorrect
# Set to 1 for the traceback behind a storage failure or a refusal, printed before its one line.
TRACEBACK_ENV = "GRPO_TRACEBACK"

# What the storage said, and what to do about it.
_FIXES = {
    errno.ENOSPC: "free space on that filesystem, or set output_dir to one with room",
    errno.EDQUOT: "raise your disk quota there, or set output_dir to a filesystem with room",
    errno.EROFS: "the filesystem is mounted read-only: remount it read-write, or set output_dir to a writable one",
    errno.EACCES: "make the folder writable for this user, or set output_dir to a writable one",
    errno.EPERM: "make the folder writable for this user, or set output_dir to a writable one",
    errno.EIO: "the device reported an I/O error: check it (dmesg) and its mount",
    errno.ENOTCONN: "the mount is gone (a network or FUSE filesystem): mount it again",
    errno.ESTALE: "the network filesystem's handle went stale: mount it again",
    errno.ENODEV: "the device behind the folder is gone: mount it again",
}

# What a file of the run is, by a part of its path (the deepest part that matches names it).
_WHAT = (("events.out.tfevents", "TensorBoard's events"), ("tensorboard", "TensorBoard's events"),
         ("eval_samples.jsonl", "the eval samples"), ("samples.jsonl", "the samples"),
         ("metrics.jsonl", "the metrics"), ("config.yaml", "the run's config"), ("summary.json", "the summary"),
         ("curves.png", "the curves"), ("faults_fired.json", "the fault record"),
         ("readers", "a rollout worker's adapter lease"), ("adapters", "an adapter version"),
         ("checkpoints", "a checkpoint"))

# An actor whose constructor raised reaches the driver as text only: Python's line for an OSError in it.
_OSERROR_LINE = re.compile(r"\[Errno (\d+)\] ([^:\n]+?)(?:: '([^'\n]+)')?$", re.MULTILINE)


def storage_error(exc: BaseException) -> OSError | None:
    """The OSError of a failed write behind `exc`, or None when `exc` is something else. One that names its
    file first: Ray re-raises an actor's OSError as a copy that keeps the errno but not the file name."""
    def failed_write(e):
        return isinstance(e, OSError) and e.errno in _FIXES

    return (cause(exc, lambda e: failed_write(e) and e.filename is not None) or cause(exc, failed_write)
            or _from_text(exc))


def refused(exc: BaseException) -> BaseException | None:
    """The refusal behind `exc`: no kept checkpoint verifies (grpo.learner.checkpoint.CheckpointError), or an
    adapter store that holds a corrupt, vanished or conflicting version (sync.AdapterStoreError); None else."""
    from grpo.learner.checkpoint import CheckpointError
    from sync import AdapterStoreError

    # Not Ray's copy (an instance of the actor's error class too): its text is the actor's whole traceback.
    return cause(exc, lambda e: isinstance(e, (CheckpointError, AdapterStoreError)) and not _wraps(e))


def cause(exc: BaseException, match) -> BaseException | None:
    """The first error behind `exc` (itself included) that `match` accepts, through Ray's wrapping of an
    actor's error (`.cause`), Python's exception chain and the errors an error holds (torch's
    CheckpointException keeps each rank's failure in `failures`, others keep theirs in `args`)."""
    seen = set()
    todo = [exc]
    while todo:
        e = todo.pop()
        if not isinstance(e, BaseException) or id(e) in seen:  # an ActorFault's `cause` is its text
            continue
        seen.add(id(e))
        if match(e):
            return e
        todo += [*_held(e.args), *_held(vars(e)), getattr(e, "cause", None), e.__cause__, e.__context__]
    return None


def _held(value, depth: int = 3) -> list:
    """The errors in `value`, an error's args or attributes: itself, or inside its dicts, lists and tuples."""
    if isinstance(value, BaseException):
        return [value]
    if depth == 0:
        return []
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [e for v in value for e in _held(v, depth - 1)]
    return []


def _wraps(e: BaseException) -> bool:
    return isinstance(getattr(e, "cause", None), BaseException)


def _from_text(exc: BaseException) -> OSError | None:
    """A failed write in an actor's constructor: Ray passes it on as text (ActorDiedError), the errno in it."""
    dead = cause(exc, lambda e: getattr(e, "actor_init_failed", False))
    for m in _OSERROR_LINE.finditer(str(dead) if dead is not None else ""):
        if int(m[1]) in _FIXES:
            return OSError(int(m[1]), m[2], m[3])
    return None


def free_space(path: str | None) -> str:
    """The free and total space of the filesystem that holds `path` (or its nearest existing parent)."""
    probe = os.path.abspath(path or ".")
    while not os.path.exists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    try:
        usage = shutil.disk_usage(probe)
    except OSError as e:
        return f"unknown ({e.strerror})"
    return f"{usage.free / 2**20:.1f} MiB free of {usage.total / 2**20:.1f} MiB"


def what(path: str | None) -> str:
    """What the file at `path` is to the run: 'a checkpoint', 'the metrics', ..."""
    for part in reversed(PurePath(path or "").parts):
        for key, label in _WHAT:
            if key in part:
                return label
    return "a file of the run"


def describe(error: OSError, where: str, kept: str) -> str:
    """The one line: what failed and where, the free space there, what is kept, the fix."""
    path = error.filename or "(a file of the run)"
    code = errno.errorcode.get(error.errno, str(error.errno))
    return (f"[grpo] storage failed {where}: {error.strerror} ({code}) writing {what(error.filename)} {path}; "
            f"{free_space(error.filename)} there; {kept}; fix: {_FIXES[error.errno]}, then run the same command "
            f"to resume")


def report(exc: BaseException, where: str, kept) -> int | None:
    """For a run stopped by `exc`: when it is failed storage or a refused file, print its one line on stderr
    (after the traceback with GRPO_TRACEBACK=1) and return the exit status; None for anything else.
    `kept()`: what the run kept (its last checkpoint and adapter), read only when storage failed."""
    failed = storage_error(exc)
    bad = refused(exc) if failed is None else None
    if failed is None and bad is None:
        return None
    if os.environ.get(TRACEBACK_ENV, "") not in ("", "0"):
        traceback.print_exception(exc, file=sys.stderr)
    if failed is not None:
        line, status = describe(failed, where, kept()), STORAGE_EXIT
    else:
        text = " ".join(str(bad).split())
        line, status = f"[grpo] refused {where}: {text}", REFUSED_EXIT
    print(line, file=sys.stderr, flush=True)
    return status

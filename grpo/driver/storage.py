"""Storage faults: a write that failed anywhere in the run (the driver, a train rank, a rollout worker) found
in the error that reached the driver, and said in one line with what a user needs to act on it.

Every writer of the run writes to a fresh or temporary name and renames (sync.atomic, grpo.learner.checkpoint),
so a write that fails leaves what was written before it intact: the line names the last complete
checkpoint and adapter, which the same command resumes from once the storage is fixed.
"""
from __future__ import annotations

import errno
import os
import shutil

STORAGE_EXIT = 74  # EX_IOERR (sysexits.h): an input/output error

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


def storage_error(exc: BaseException) -> OSError | None:
    """The OSError of a failed write behind `exc`, or None when `exc` is something else. One that names its
    file first: Ray re-raises an actor's OSError as a copy that keeps the errno but not the file name."""
    def failed_write(e):
        return isinstance(e, OSError) and e.errno in _FIXES

    return cause(exc, lambda e: failed_write(e) and e.filename is not None) or cause(exc, failed_write)


def cause(exc: BaseException, match) -> BaseException | None:
    """The first error behind `exc` (itself included) that `match` accepts, through Ray's wrapping of an
    actor's error (`.cause`) and Python's exception chain."""
    seen = set()
    todo = [exc]
    while todo:
        e = todo.pop()
        if not isinstance(e, BaseException) or id(e) in seen:  # an ActorFault's `cause` is its text
            continue
        seen.add(id(e))
        if match(e):
            return e
        todo += [getattr(e, "cause", None), e.__cause__, e.__context__]
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


def describe(error: OSError, where: str, kept: str) -> str:
    """The one line: what failed and where, the free space there, what is kept, the fix."""
    path = error.filename or "(a file of the run)"
    code = errno.errorcode.get(error.errno, str(error.errno))
    return (f"[grpo] storage failed {where}: {error.strerror} ({code}) writing {path}; {free_space(error.filename)} "
            f"there; {kept}; fix: {_FIXES[error.errno]}, then run the same command to resume")

"""Crash-safe file operations for shared storage (local disk, NFS, Lustre).

They rely on two POSIX guarantees only: rename within a directory is atomic, and fsync makes a file's
data, or a directory's entries, durable. No locks, no O_TMPFILE, no filesystem-specific calls, because
the adapter root may be any of those filesystems.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil

# Everything written under a temporary name starts with this, so a sweep can find a killed process's
# leftovers and nothing that starts with it can be taken for a finished file or version.
TEMP_PREFIX = ".tmp-"


def temp_name(label: str) -> str:
    """A fresh name in the same directory: pid and random bits keep writers from colliding."""
    return f"{TEMP_PREFIX}{label}-{os.getpid()}-{secrets.token_hex(4)}"


def fsync_dir(path: str) -> None:
    """Make a directory's entries (a created, renamed or removed name) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    except OSError as e:
        # Some FUSE and network filesystems refuse fsync on a directory; they commit metadata
        # operations themselves, so there is nothing more to force.
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise
    finally:
        os.close(fd)


def write_new_file(path: str, data: bytes) -> None:
    """Create path (it must not exist) with data, fsynced; the caller makes its name durable."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str, data: bytes) -> None:
    """Replace path's contents in one step: a reader opens the old file or the new one, never a mix."""
    directory = os.path.dirname(path)
    tmp = os.path.join(directory, temp_name(os.path.basename(path)))
    try:
        write_new_file(tmp, data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(directory)


def remove_tree(path: str) -> None:
    """Remove a directory so that no partial copy of it is ever visible under its own name.

    It is renamed to a temporary name first: a process killed halfway through the deletion leaves a
    temporary folder that the next sweep removes, never a folder with some of its files missing.
    """
    directory = os.path.dirname(path)
    aside = os.path.join(directory, temp_name("rm-" + os.path.basename(path)))
    os.rename(path, aside)
    fsync_dir(directory)
    shutil.rmtree(aside)


def remove_temp_entries(directory: str) -> list[str]:
    """Delete every temporary file or folder in directory; returns their names.

    Only safe where no live process is writing there under a temporary name (the store's single writer).
    """
    removed = []
    for entry in os.scandir(directory):
        if not entry.name.startswith(TEMP_PREFIX):
            continue
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)
        removed.append(entry.name)
    return removed

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
from concurrent.futures import ThreadPoolExecutor
from typing import Iterable, Union

Buffer = Union[bytes, bytearray, memoryview]

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


_SLICE = 1 << 20  # hashed and written in slices: hashing trails the write by one slice


def write_new_file(path: str, data: Buffer | Iterable[Buffer], digest=None, *, durable: bool = True) -> None:
    """Create path (it must not exist) with data, fsynced unless durable=False; the caller makes its name durable.

    data: bytes, or buffers written one after another (a header and tensors' memory, never joined into one
    copy). digest: a hashlib object fed every byte, in order, by a second thread while this one writes
    and fsyncs (hashlib and os.write both release the GIL): hashing costs little wall time on top of the
    write. The buffers must stay unchanged until this returns.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    # One worker runs the updates in submission order, which is the file's byte order.
    hasher = ThreadPoolExecutor(1, thread_name_prefix="sha256") if digest is not None else None
    try:
        hashed = []
        for chunk in ([data] if isinstance(data, (bytes, bytearray, memoryview)) else data):
            view = memoryview(chunk).cast("B")
            for start in range(0, len(view), _SLICE):
                piece = view[start:start + _SLICE]
                if hasher is not None:
                    hashed.append(hasher.submit(digest.update, piece))
                while piece:
                    piece = piece[os.write(fd, piece):]
        if durable:
            os.fsync(fd)
        for update in hashed:
            update.result()
    finally:
        if hasher is not None:
            hasher.shutdown(wait=True, cancel_futures=True)
        os.close(fd)


def atomic_write(path: str, data: bytes, *, durable: bool = True) -> None:
    """Replace path's contents in one step: a reader opens the old file or the new one, never a mix.

    durable=False skips the fsyncs: the replacement stays atomic for every reader, but a machine crash
    may bring back the old contents (right for a file whose writer would not survive that crash either).
    """
    directory = os.path.dirname(path)
    tmp = os.path.join(directory, temp_name(os.path.basename(path)))
    try:
        write_new_file(tmp, data, durable=durable)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if durable:
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

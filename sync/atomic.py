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
import threading
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


_SLICE = 1 << 20  # hashed right before it is written, while it is still in cache
# From this size on a second thread hashes while this one writes and fsyncs (hashlib and os.write both
# release the GIL); below it, handing the work over costs more than it saves on a busy machine.
_THREAD_HASH_BYTES = 16 << 20


def fsync_file(path: str) -> None:
    """Make a file's data durable (written earlier without fsync)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_new_file(path: str, data: Buffer | Iterable[Buffer], digest=None, *, durable: bool = True) -> None:
    """Create path (it must not exist) with data, fsynced unless durable=False; the caller makes its name durable.

    data: bytes, or buffers written one after another (a header and tensors' memory, never joined into one
    copy). digest: a hashlib object fed every byte in order while the file is written, so the file is
    hashed in the same pass. The buffers must stay unchanged until this returns.
    """
    views = [memoryview(chunk).cast("B") for chunk in ([data] if isinstance(data, (bytes, bytearray, memoryview))
                                                       else data)]
    hasher, failed = None, []
    if digest is not None and sum(v.nbytes for v in views) >= _THREAD_HASH_BYTES:
        hasher = threading.Thread(target=_hash_all, args=(digest, views, failed), name="sha256", daemon=True)
        hasher.start()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        with naming(path):
            _write_all(fd, views, digest if hasher is None else None, durable)
    finally:
        if hasher is not None:
            hasher.join()
        os.close(fd)
    if failed:
        raise failed[0]


def _write_all(fd: int, views: list[memoryview], digest, durable: bool) -> None:
    for view in views:
        for start in range(0, len(view), _SLICE):
            piece = view[start:start + _SLICE]
            if digest is not None:
                digest.update(piece)
            while piece:
                piece = piece[os.write(fd, piece):]
    if durable:
        os.fsync(fd)


@contextlib.contextmanager
def naming(path):
    """A write through a descriptor or a buffered file that fails names no file: this attaches `path`, so
    that the run's error line can say which file could not be written."""
    try:
        yield
    except OSError as e:
        if e.filename is not None:
            raise
        raise OSError(e.errno, e.strerror, os.fspath(path)) from e


def _hash_all(digest, views: list[memoryview], failed: list) -> None:
    try:
        for view in views:
            digest.update(view)
    except BaseException as e:  # re-raised by the writing thread
        failed.append(e)


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

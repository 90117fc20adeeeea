"""One run per output folder: an advisory lock (flock) on `<run_dir>/run.lock`, holding the holder's pid and host.

The kernel drops the lock when its holder's process ends, however it ends (kill -9 included), so a killed
run's folder can be resumed at once, while a second run started on a folder that a live run holds is
refused before it starts anything. flock is local to a machine on many network filesystems: on a cluster,
start a run's driver from one machine.
"""
from __future__ import annotations

import fcntl
import os
import socket
from pathlib import Path

LOCK_FILE = "run.lock"


class RunLockedError(RuntimeError):
    pass


class RunLock:
    def __init__(self, run_dir: str | os.PathLike):
        self.path = Path(run_dir) / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> "RunLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode(errors="replace").split()
            os.close(fd)
            pid, host = (holder + ["?", "?"])[:2]
            raise RunLockedError(
                f"{self.path.parent} is in use by another run (pid {pid} on host {host}): wait for it to end or "
                "stop it, or give this run another output_dir") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        # The file stays: removing it would let a new run lock a fresh file while a waiter holds the old one.
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()

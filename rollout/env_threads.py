"""Environment calls of many episodes at once, so a turn waits about one env call, not one per episode.

Threads, because the envs worth overlapping wait (on a sandbox, a simulator, a tool, the network) and
release the GIL meanwhile; pure-Python envs that compute gain nothing but lose little. Each slot is one
thread and an episode keeps its slot, so every call of one env instance runs on the same thread: envs
holding thread-bound handles (sqlite connections, event loops) work.
"""
from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable


class EnvThreads:
    def __init__(self, threads: int):
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self._slots = [ThreadPoolExecutor(1, thread_name_prefix=f"env-{i}") for i in range(threads)]

    @property
    def size(self) -> int:
        return len(self._slots)

    def submit(self, slot: int, fn: Callable, *args, inline: bool = False) -> Future:
        """`fn(*args)` on the slot's thread; with `inline`, run now on this thread, its outcome a finished Future
        (for envs that only compute: a thread's hand-off and wake-up cost more than they do)."""
        if not inline:
            return self._slots[slot % len(self._slots)].submit(fn, *args)
        future: Future = Future()
        try:
            future.set_result(fn(*args))
        except Exception as e:
            future.set_exception(e)
        return future

    def close(self, wait: bool = True) -> None:
        for pool in self._slots:
            pool.shutdown(wait=wait, cancel_futures=not wait)

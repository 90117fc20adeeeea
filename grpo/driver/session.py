"""The driver process around a run: Ray started (or joined) and stopped, and SIGTERM turned into an orderly stop.

A SIGTERM (a scheduler's kill, `timeout`) unwinds like Ctrl-C, so that Ray and its /tmp folder are shut down,
and the process exits with status 143 after one line saying where the run stopped.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading

from grpo.driver import reaper

SIGTERM_EXIT = 128 + signal.SIGTERM

# Set by our SIGTERM handler. A SIGTERM that lands while the driver waits in ray.get or ray.wait reaches
# fit() as SystemExit(1): Ray's wait turns the handler's SystemExit(143) into that (measured, Ray 2.60), so
# fit() asks this, not the exit code, whether a SIGTERM stopped it.
_sigterm_received = threading.Event()


def catch_sigterm():
    """Install the SIGTERM handler for a run (forgetting an earlier run's signal); returns the undo."""
    _sigterm_received.clear()
    return _exit_on_sigterm()


def stopped_by_sigterm(exc: BaseException) -> bool:
    return _sigterm_received.is_set() or (isinstance(exc, SystemExit) and exc.code == SIGTERM_EXIT)


def _exit_on_sigterm():
    # Python's default for SIGTERM exits without running `finally`; this handler raises instead.
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def handler(signum, frame):
        _sigterm_received.set()
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, handler)
    # A handler installed from C (None here) cannot be put back from Python: the default then.
    return lambda: signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


class RaySession:
    """Ray for one fit(): joins `address` when given, else starts a local Ray in its own /tmp folder, watched
    by grpo/driver/reaper.py; `stop` disconnects from a joined cluster, or stops the local Ray and removes its
    folder. A Ray already running in this process (a user's ray.init) is used and left running."""

    def __init__(self):
        self._tmp = None
        self._joined = False
        self._reaper = None  # grpo/driver/reaper.py: Ray's processes die with this one, SIGKILL included

    def start(self, address: str | None, cpus: int) -> None:
        import ray

        if ray.is_initialized():
            return
        try:
            if address:
                self._joined = True
                ray.init(address=address, log_to_driver=False)
            else:
                # Unix socket paths are limited to 107 bytes: Ray's session folder lives under /tmp.
                self._tmp = tempfile.mkdtemp(prefix="grpo-ray-", dir="/tmp")
                self._reaper = subprocess.Popen([sys.executable, reaper.__file__, str(os.getpid()), self._tmp],
                                                stdin=subprocess.DEVNULL, start_new_session=True)
                ray.init(num_cpus=max(os.cpu_count() or 1, cpus), _temp_dir=self._tmp, include_dashboard=False,
                         log_to_driver=False)
        except SystemExit:
            # While ray.init runs, its own SIGTERM handlers are in place and exit silently with status 15
            # or 1 (measured); the only SystemExit out of ray.init, so it is a SIGTERM: the documented 143.
            raise SystemExit(SIGTERM_EXIT) from None
        # ray.init leaves its handler in place, which exits 1 without unwinding: ours again
        # (fit() puts back what was there before it).
        _exit_on_sigterm()

    def stop(self) -> None:
        import ray

        if self._tmp is not None or self._joined:
            ray.shutdown()
            self._joined = False
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
        if self._reaper is not None:
            self._reaper.wait(timeout=10)  # it exits once the folder is gone
            self._reaper = None

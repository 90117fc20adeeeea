"""The driver process around a run: the run opened (a resume or an ask the cluster cannot meet refused before
anything is placed), Ray started (or joined) and stopped, and SIGTERM turned into an orderly stop.

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
from pathlib import Path

from grpo.driver import reaper, resources
from grpo.driver.preflight import check_faults
from grpo.driver.state import check_resume
from rollout import runtime
from sync.atomic import atomic_write

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


def open_run(run_dir: Path, config, ray: RaySession) -> tuple[resources.Placement, list]:
    """Once per fit(), before anything is placed: a resume whose config changes the training is refused
    (grpo.driver.state.check_resume), the caches set, Ray started or joined, an ask the cluster cannot meet
    refused (grpo.driver.resources), then config.yaml written. Returns the placement and the config's changes
    since the run it resumes."""
    import ray as ray_api

    changes = check_resume(run_dir, config)
    run_dir.mkdir(parents=True, exist_ok=True)
    runtime.configure(run_dir, runtime.shared_cache_dir(run_dir))
    ray.start(config.cluster.address, resources.cpus_to_start(config.cluster))
    placement = resources.plan(config.cluster, ray_api.cluster_resources())
    check_faults(config, placement.train_ranks)
    atomic_write(str(run_dir / "config.yaml"), config.to_yaml().encode())
    return placement, changes


def checkpoint_phrase(run_dir: Path) -> str:
    """The run's last checkpoint, for the line a stopped run ends with."""
    from grpo.learner import checkpoint

    try:
        info = checkpoint.latest(str(Path(run_dir) / "checkpoints"))
    except (OSError, ValueError, KeyError, checkpoint.CheckpointError) as e:
        return f"the last checkpoint is unreadable ({e})"
    return f"last checkpoint: step {info.step} at {info.path}" if info else "no checkpoint yet"


def kept_phrase(run_dir: Path) -> str:
    """What a run stopped by failed storage kept: its last checkpoint and its last verified adapter."""
    from sync import AdapterStore, AdapterStoreError

    try:
        adapter = AdapterStore(str(Path(run_dir) / "store")).latest_verified()
    except (OSError, AdapterStoreError) as e:
        return f"{checkpoint_phrase(run_dir)}; no published adapter verifies ({e})"
    return f"{checkpoint_phrase(run_dir)}; last published adapter: " + (f"v{adapter.version} (verified)"
                                                                         if adapter else "none yet")

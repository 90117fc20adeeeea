"""`grpo train --supervise`: a parent process that relaunches a driver that died abnormally.

The driver is the one process a run cannot heal from inside: the out-of-memory killer's SIGKILL, a segfault
in a native library. The parent runs `grpo train` as a child; when the child dies of a signal other than the
user's own stop (SIGTERM, SIGINT), it waits (a backoff that doubles, 2 s to 60 s) and runs the same command
again, which resumes from the last checkpoint, at most `max_relaunches` times. Each relaunch is a line in
the run's metrics.jsonl:

    {"event": "relaunch", "attempt": 1, "signal": "SIGKILL", "ran_s": 84.2, "backoff_s": 2}

An exit with a status (a finished run, a bad config, a storage failure, a run out of restarts) ends the
supervision with that status: running it again would only repeat it.
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from sync.atomic import naming

# The user's own stops: forwarded to the driver, never answered with a relaunch.
_STOPS = (signal.SIGTERM, signal.SIGINT)


def backoff_s(attempt: int) -> int:
    return min(2 ** attempt, 60)


def supervise(command: list[str], run_dir: str | Path, max_relaunches: int) -> int:
    """Run the driver's `command` (`python -m grpo train ...`) until it exits with a status; returns that
    status (128 + the signal of a driver that died once more than allowed)."""
    stopping = []
    child: subprocess.Popen | None = None

    def forward(signum, frame):
        stopping.append(signum)
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in _STOPS}
    try:
        attempt = 0
        while True:
            started = time.monotonic()
            child = subprocess.Popen(command)
            code = child.wait()
            if code >= 0 or stopping or -code in _STOPS:
                return code if code >= 0 else 128 - code
            name = signal.Signals(-code).name
            if attempt >= max_relaunches:
                print(f"[grpo] the driver died of {name}; it was relaunched {attempt} time(s), the limit "
                      f"(--supervise {max_relaunches}): run the same command to resume", file=sys.stderr, flush=True)
                return 128 - code
            attempt += 1
            wait = backoff_s(attempt)
            ran = time.monotonic() - started
            print(f"[grpo] the driver died of {name} after {ran:.0f} s; relaunch {attempt} of {max_relaunches} "
                  f"in {wait} s, resuming from the last checkpoint", file=sys.stderr, flush=True)
            log_event(Path(run_dir) / "metrics.jsonl", {"event": "relaunch", "attempt": attempt, "signal": name,
                                                        "ran_s": round(ran, 1), "backoff_s": wait})
            time.sleep(wait)
            if stopping:  # stopped while waiting: no relaunch
                return 128 + stopping[0]
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def log_event(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with naming(path), path.open("a") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")

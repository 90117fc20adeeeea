"""Ray's processes never outlive the driver that started them.

A driver killed with SIGKILL (the out-of-memory killer, `kill -9`) runs no cleanup: the Ray it started
(GCS, raylet, dashboard and runtime-env agents, workers) would live on as orphans holding memory and cores.
RaySession starts this watcher beside a local Ray:

    python grpo/driver/reaper.py DRIVER_PID RAY_TEMP_DIR    (run as a file: it imports only psutil)

It notes the driver's descendants twice a second; once the driver is gone, it kills every one of them still
alive (the same process: same pid and start time) and removes Ray's temp folder. When the driver stops Ray
itself, the folder goes first and the watcher just exits.
"""
from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

POLL_S = 0.5


def watch(driver_pid: int, ray_dir: str, poll_s: float = POLL_S) -> list[int]:
    """Returns the pids it killed (empty when the driver stopped Ray itself)."""
    import psutil

    seen: dict[int, float] = {}  # pid -> start time, so that a reused pid is never killed
    try:
        driver = psutil.Process(driver_pid)
    except psutil.NoSuchProcess:
        driver = None
    while Path(ray_dir).is_dir():
        try:
            if driver is None or driver.status() == psutil.STATUS_ZOMBIE:
                break
            for child in driver.children(recursive=True):
                if child.pid != os.getpid():  # this watcher is the driver's child too
                    seen.setdefault(child.pid, child.create_time())
        except psutil.NoSuchProcess:
            break
        time.sleep(poll_s)
    else:
        return []
    killed = []
    for pid, started in seen.items():
        try:
            process = psutil.Process(pid)
            if process.create_time() == started:
                process.kill()
                killed.append(pid)
        except psutil.NoSuchProcess:
            continue
    shutil.rmtree(ray_dir, ignore_errors=True)
    return killed


if __name__ == "__main__":
    watch(int(sys.argv[1]), sys.argv[2])

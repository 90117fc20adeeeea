"""One run per output folder: a live holder's folder is refused with its pid and host; a killed holder's is free."""
import os
import socket
import subprocess
import sys

import pytest

from grpo.driver.run_lock import RunLock, RunLockedError

_HOLD = """
import sys, time
from grpo.driver.run_lock import RunLock
RunLock(sys.argv[1]).acquire()
print("locked", flush=True)
time.sleep(600)
"""


def test_a_live_holder_refuses_others_and_a_killed_one_frees_the_folder(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunLockedError, match=rf"pid {holder.pid} on host {socket.gethostname()}"):
            RunLock(tmp_path).acquire()
        holder.kill()  # SIGKILL: no cleanup ran, the kernel dropped the lock
        holder.wait()
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    with RunLock(tmp_path) as lock:
        assert lock.path.read_text() == f"{os.getpid()} {socket.gethostname()}\n"
        with pytest.raises(RunLockedError, match=f"pid {os.getpid()}"):
            RunLock(tmp_path).acquire()  # a second open in the same process is refused as well
    RunLock(tmp_path).acquire().release()


def test_fit_on_a_held_folder_is_refused_before_ray_starts(tmp_path, tiny_vl):
    import ray

    import grpo

    out = tmp_path / "run"
    with RunLock(out):
        config = grpo.RunConfig(model=str(tiny_vl), output_dir=str(out), algorithm={"group_size": 2})
        with pytest.raises(RunLockedError, match=f"pid {os.getpid()} on host"):
            grpo.Trainer(config).fit()
    assert not ray.is_initialized()
    assert not (out / "metrics.jsonl").exists()

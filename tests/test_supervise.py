"""The driver is not a single point of failure: Ray's processes die with a SIGKILLed driver (grpo/driver/reaper.py),
and `grpo train --supervise` relaunches a driver that died of a signal, which resumes from its last checkpoint."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from grpo.driver import supervise

ROOT = Path(__file__).resolve().parents[1]


def test_backoff_doubles_up_to_a_minute():
    assert [supervise.backoff_s(a) for a in (1, 2, 3, 5, 6, 9)] == [2, 4, 8, 32, 60, 60]


def _driver_script(tmp_path: Path, body: str) -> list[str]:
    script = tmp_path / "driver.py"
    script.write_text(body)
    return [sys.executable, str(script)]


def test_a_driver_killed_by_a_signal_is_relaunched_and_an_exit_status_ends_it(tmp_path, capfd):
    # Dies of SIGKILL on its first two runs (as the out-of-memory killer would kill it), exits 0 on the third.
    command = _driver_script(tmp_path, (
        "import os, pathlib, signal\n"
        f"runs = pathlib.Path({str(tmp_path / 'runs')!r})\n"
        "n = int(runs.read_text()) + 1 if runs.exists() else 1\n"
        "runs.write_text(str(n))\n"
        "if n < 3:\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"))
    assert supervise.supervise(command, tmp_path / "run", max_relaunches=3) == 0
    assert (tmp_path / "runs").read_text() == "3"
    events = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [(e["event"], e["attempt"], e["signal"], e["backoff_s"]) for e in events] == [
        ("relaunch", 1, "SIGKILL", 2), ("relaunch", 2, "SIGKILL", 4)]
    err = capfd.readouterr().err
    assert ("[grpo] the driver died of SIGKILL after 0 s; relaunch 1 of 3 in 2 s, resuming from the last "
            "checkpoint") in err

    # Past the limit: the status of a driver killed by SIGKILL, and a line that says so.
    (tmp_path / "runs").unlink()
    assert supervise.supervise(command, tmp_path / "run2", max_relaunches=0) == 128 + signal.SIGKILL
    assert "relaunched 0 time(s), the limit (--supervise 0)" in capfd.readouterr().err
    # An exit with a status (a bad config, a storage failure) would only repeat: not relaunched.
    failing = _driver_script(tmp_path, "raise SystemExit(74)\n")
    assert supervise.supervise(failing, tmp_path / "run3", max_relaunches=3) == 74
    assert not (tmp_path / "run3" / "metrics.jsonl").exists()


def _descendants(pid: int) -> dict[int, float]:
    import psutil

    return {p.pid: p.create_time() for p in psutil.Process(pid).children(recursive=True)}


def _alive(processes: dict[int, float]) -> list[int]:
    import psutil

    out = []
    for pid, started in processes.items():
        try:
            p = psutil.Process(pid)
            if p.create_time() == started and p.status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


@pytest.mark.slow
def test_a_supervised_run_survives_a_sigkill_of_its_driver_and_leaves_no_process_behind(tmp_path, tiny_vl):
    import psutil

    out = tmp_path / "run"
    config = {"model": str(tiny_vl), "output_dir": str(out), "steps": 8, "tasks_per_step": 2,
              "env": {"name": "maze", "options": {"size": 7, "max_turns": 3}}, "algorithm": {"group_size": 2},
              "lora": {"rank": 8, "alpha": 16.0}, "train": {"lr": 1e-3, "micro_batch_size": 16},
              "rollout": {"max_tokens_per_turn": 10, "history": "none"}, "engine": {"max_model_len": 2048},
              "eval": {"seeds": "0-1", "every": 0}, "checkpoint": {"every": 1, "keep": 2},
              "cluster": {"train_ranks": 2}, "metrics": {"plots": False, "tensorboard": False}}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    parent = subprocess.Popen([sys.executable, "-m", "grpo", "train", str(tmp_path / "run.yaml"), "--supervise", "2"],
                              cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        metrics = out / "metrics.jsonl"
        deadline = time.monotonic() + 600
        while not (metrics.exists() and any('"step": 1' in x for x in metrics.read_text().splitlines())):
            assert parent.poll() is None and time.monotonic() < deadline, "the run ended before its first step"
            time.sleep(0.5)
        (driver,) = psutil.Process(parent.pid).children()
        run = _descendants(driver.pid)  # Ray's GCS, raylet, agents, workers, the reaper
        assert len(run) >= 5
        killed_at = time.monotonic()
        os.kill(driver.pid, signal.SIGKILL)
        done = [json.loads(x)["step"] for x in metrics.read_text().splitlines()]
        assert max(done) < 8, "the run finished before the kill: give it more steps"
        while _alive(run) and time.monotonic() - killed_at < 15:
            time.sleep(0.2)
        assert not _alive(run), [psutil.Process(p).name() for p in _alive(run)]
        gone_s = time.monotonic() - killed_at
        _, err = parent.communicate(timeout=600)
        assert parent.returncode == 0, err[-3000:]
    finally:
        if parent.poll() is None:
            parent.kill()
    assert "[grpo] the driver died of SIGKILL" in err and "relaunch 1 of 2" in err and "[grpo] resumed from" in err
    lines = [json.loads(x) for x in metrics.read_text().splitlines()]
    assert [x["attempt"] for x in lines if x.get("event") == "relaunch"] == [1]
    assert [x["step"] for x in lines if "event" not in x] == list(range(1, 9))
    assert json.loads((out / "summary.json").read_text())["steps"] == 8
    print(f"the killed driver's processes were gone {gone_s:.1f} s after the SIGKILL")

"""`grpo train --supervise` relaunches a driver that died of a signal (grpo/driver/supervise.py); a real run whose
driver is SIGKILLed, relaunched and resumed, with nothing of the killed driver's Ray left: tests/test_chaos.py."""
import json
import signal
import sys
from pathlib import Path

from grpo.driver import supervise


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

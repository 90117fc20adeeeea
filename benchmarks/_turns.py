"""Taking turns: contenders run as child processes that each run one training step when told to, so two
systems alternate step by step in one run (A, B, A, B, ...) and share the machine's load fairly.

Child side: `report(event)` prints one marked JSON line on stdout, `wait_go()` blocks until the parent says go.
Parent side: `Contender` starts a child, reads its events, and tells it when to run its next step.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from benchmarks._machine import ROOT

MARK = "@@turns "


def report(event: dict) -> None:
    print(MARK + json.dumps(event), flush=True)


def wait_go() -> None:
    line = sys.stdin.readline()
    if line.strip() != "go":
        raise SystemExit(f"turns: expected 'go' from the parent, got {line!r}")


class Contender:
    """One child process, started in the repository (`argv` runs a `python -m benchmarks.X`); its stderr (and
    unmarked stdout) goes to `log`."""

    def __init__(self, name: str, argv: list[str], log: Path, env: dict | None = None):
        self.name, self.log = name, Path(log)
        self.launched = time.perf_counter()
        # Seconds the child sat ready, waiting for its first "go" while the other contenders started one at a
        # time: not its own start-up, so first_step_done_s leaves it out.
        self.held_s = 0.0
        self._ready_at: float | None = None
        self._log = open(self.log, "w")
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
                                     text=True, env=env, bufsize=1, cwd=ROOT)

    def event(self, kind: str, timeout_s: float = 1800) -> dict:
        """The next event of `kind`; everything else the child prints goes to its log."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"{self.name} exited (code {self.proc.wait()}) before its {kind!r} event: "
                                   f"see {self.log}")
            if not line.startswith(MARK):
                self._log.write(line)
                continue
            event = json.loads(line[len(MARK):])
            event["at_s"] = time.perf_counter() - self.launched
            if event.get("event") == "ready":
                self._ready_at = time.perf_counter()
            if event.get("event") == kind:
                return event
        raise TimeoutError(f"{self.name}: no {kind!r} event within {timeout_s} s: see {self.log}")

    def step(self) -> dict:
        if self._ready_at is not None:
            self.held_s, self._ready_at = time.perf_counter() - self._ready_at, None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        return self.event("step")

    def close(self, timeout_s: float = 300) -> int:
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            # Drain what is left (the last step's wrap-up) so the child never blocks on a full pipe.
            for line in self.proc.stdout:
                self._log.write(line)
            code = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            code = self.proc.wait(60)
        self._log.close()
        return code


def step_each(started: dict, k: int, failed: dict, log_of, label: str) -> tuple[dict, dict]:
    """Step k (0-based) of every started side in turn: their records, and the exit codes of the sides that failed
    (closed and dropped from `started`, their reason in `failed`, `log_of(side)` the log whose tail says why).
    `label` starts the lines it prints."""
    records, exits = {}, {}
    for side, c in list(started.items()):
        try:
            records[side] = c.step()
        except (RuntimeError, TimeoutError) as e:
            failed[side] = f"failed at step {k + 1}: {e}: {log_of(side)}"
            print(f"{label} {side} {failed[side]}", file=sys.stderr, flush=True)
            exits[side] = started.pop(side).close(60)
    return records, exits


def add_workload_args(ap) -> None:
    """The workload flags both contenders take, with one set of defaults, so both sides run the same work."""
    ap.add_argument("--model", required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--lora-rank", type=int, default=16)
    ap.add_argument("--lora-alpha", type=float, default=32.0)
    ap.add_argument("--lr", type=float, default=1e-4)
    # Sequences a forward/backward takes, the batch's gradient accumulated over the micro-batches (TRL:
    # per_device_train_batch_size, with gradient_accumulation_steps making up the batch). Both sides split the
    # same way. 64, the whole batch at once: at 16 neither side's median step changed (engine 2.74 s, TRL 4.32 s
    # on 2026-12-02).
    ap.add_argument("--micro-batch-size", type=int, default=64)

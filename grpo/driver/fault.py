"""Faults: the `fault` config section, deadlines on the driver's calls to actors, and built-in fault injection.

A rollout worker or a train rank that dies (killed, out of memory, node lost) or stops answering within
`fault.call_timeout_s` surfaces in the driver as an `ActorFault`; the trainer then tears the step down,
starts fresh actors, restores the latest checkpoint and goes on, at most `fault.max_restarts` times.

Injection, for tests and for rehearsing on a real cluster: `fault.inject: ["kill:rollout@step=2",
"kill:train_rank=1@step=4", "hang:rollout@step=3"]` makes the named actor kill itself (SIGKILL, as the
out-of-memory killer would) or hang, in the middle of that step's call to it (rollout: the rollout call;
train rank: the train step, with the other ranks inside its collectives). Three more hit what an actor does
not own: `kill:driver@step=N` (the driver SIGKILLs itself after the step's rollout: `grpo train --supervise`
relaunches it), `corrupt:adapter@step=N` (a byte of the adapter the step published flips before the rollout
workers load it, as a torn or rotten write would leave it) and `corrupt:checkpoint@step=N` (a byte of the
checkpoint saved after the step flips). Each fault fires once per run: the driver records what fired in the
run folder (faults_fired.json) before it fires, so neither a replayed step nor a relaunched driver fires it
again.
"""
from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from grpo.algo.config import ConfigError, check_number
from grpo.driver import storage
from sync.atomic import atomic_write

# What each kind of fault can hit.
KINDS = {"kill": ("rollout", "train_rank", "driver"), "hang": ("rollout", "train_rank"),
         "corrupt": ("adapter", "checkpoint")}
TARGETS = ("rollout", "train_rank", "driver", "adapter", "checkpoint")
RECORD = "faults_fired.json"
_SPEC = re.compile(r"(?P<kind>\w+):(?P<target>\w+)(?:=(?P<index>\d+))?@step=(?P<step>\d+)")


@dataclass(frozen=True)
class Fault:
    kind: str     # "kill" | "hang"
    target: str   # "rollout" | "train_rank"
    index: int    # which rollout worker or train rank
    step: int     # the step (1-based, as in metrics.jsonl) whose call it fires in

    @property
    def spec(self) -> str:
        return f"{self.kind}:{self.target}={self.index}@step={self.step}"

    @property
    def actor(self) -> str:
        return f"{self.target}-{self.index}"

    def fire(self) -> None:
        """Runs inside the actor: die as a SIGKILL leaves a process (no cleanup, no exception), or hang."""
        import os
        import signal
        import threading

        if self.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        threading.Event().wait()


def parse_fault(spec: str) -> Fault:
    """`KIND:TARGET[=INDEX]@step=N`, e.g. `kill:rollout@step=2`, `kill:train_rank=1@step=4`, `hang:rollout@step=3`."""
    m = _SPEC.fullmatch(spec.strip()) if isinstance(spec, str) else None
    if m is None or m["target"] not in KINDS.get(m["kind"], ()) or int(m["step"]) < 1:
        pairs = ", ".join(f"{k}:{t}" for k, targets in KINDS.items() for t in targets)
        raise ValueError(f"fault {spec!r}: write KIND:TARGET[=INDEX]@step=N with KIND:TARGET one of {pairs} and "
                         f"N >= 1, e.g. 'kill:train_rank=1@step=4'")
    return Fault(m["kind"], m["target"], int(m["index"] or 0), int(m["step"]))


@dataclass(frozen=True)
class FaultConfig:
    max_restarts: int = 3             # recoveries allowed per fit(); past it the run stops with the last cause
    call_timeout_s: float = 1800.0    # deadline on each call the driver makes to actors during a step
    start_timeout_s: float = 900.0    # deadline for actors to start (placement, model load, process group)
    inject: tuple = ()                # faults to fire, e.g. ("kill:rollout@step=2",); see grpo/driver/fault.py

    def __post_init__(self):
        check_number(self, "max_restarts", integer=True, ge=0)
        check_number(self, "call_timeout_s", gt=0, hint="longer than the slowest rollout or train step")
        check_number(self, "start_timeout_s", gt=0, hint="longer than loading the model into every actor")
        if isinstance(self.inject, str):
            object.__setattr__(self, "inject", (self.inject,))
        for spec in self.inject:
            try:
                parse_fault(spec)
            except ValueError as e:
                raise ConfigError(self, "inject", self.inject, str(e)) from None

    @property
    def faults(self) -> list[Fault]:
        return [parse_fault(s) for s in self.inject]


class InjectionPlan:
    """The driver's record of which faults are due and which already fired; with `record` (a file in the run
    folder) the fired ones are written there before they fire and read back by a later driver of the run."""

    def __init__(self, faults: Sequence[Fault], fired: Sequence[str] = (), record: str | Path | None = None):
        self.faults = list(faults)
        self.record = Path(record) if record is not None else None
        self.fired = set(fired)
        if self.record is not None and self.record.is_file():
            self.fired.update(json.loads(self.record.read_text()))

    def take(self, step: int, target: str) -> list[Fault]:
        """The faults for `target` due in `step` that have not fired yet, marked as fired."""
        due = [f for f in self.faults if f.step == step and f.target == target and f.spec not in self.fired]
        if due:
            self.fired.update(f.spec for f in due)
            if self.record is not None:
                atomic_write(str(self.record), json.dumps(sorted(self.fired)).encode())
        return due


def flip_byte(path: str | Path) -> None:
    """corrupt: one bit of the file's middle byte, in place (as bit rot or a torn write leaves a file)."""
    with open(path, "r+b") as f:
        size = f.seek(0, 2)
        f.seek(size // 2)
        byte = f.read(1)
        f.seek(size // 2)
        f.write(bytes([byte[0] ^ 0x01]))


def arm(actor, fault: Fault) -> None:
    """Queue the fault on the actor ahead of the call it should break: the actor runs its calls in order,
    so it dies (or hangs) with that call in flight and the driver waiting on it."""
    actor.__ray_call__.remote(_fire, fault)


def _fire(_instance, fault: Fault) -> None:
    fault.fire()


class ActorFault(Exception):
    """An actor died or did not answer in time: recoverable by starting fresh actors from the checkpoint."""

    def __init__(self, actor: str, cause: str, waited_s: float = 0.0):
        super().__init__(f"{actor}: {cause}")
        self.actor, self.cause = actor, cause
        self.waited_s = waited_s  # how long the failed call had run when the fault showed (a hang: the deadline)


class ActorStartError(RuntimeError):
    """An actor's constructor raised: a bug or a bad input, which a restart would only repeat."""


def gather(calls: Sequence[tuple[str, Any]], timeout_s: float, what: str, grace_s: float = 10.0) -> list:
    """ray.get of the (actor name, object ref) pairs, in order, within `timeout_s` for all of them.

    Raises ActorFault when an actor died, when one did not answer in time, or when a collective failed
    because a peer died (the dead peer is named, not the survivor that noticed). Any other error of a
    call (a bug, a bad input, a write that failed) is raised as it is: starting again would only repeat it.
    """
    import ray
    from ray.exceptions import RayTaskError

    names = {ref: name for name, ref in calls}
    pending = [ref for _, ref in calls]
    results = {}
    start = time.monotonic()
    deadline = start + timeout_s
    while pending:
        ready, pending = ray.wait(pending, num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
        if not ready:
            raise ActorFault(", ".join(names[r] for r in pending),
                             f"no answer to {what} within {timeout_s:g} s (fault.call_timeout_s)", timeout_s)
        ref = ready[0]
        try:
            results[ref] = ray.get(ref)
        except RayTaskError as e:
            if storage.storage_error(e) is not None:
                # A full or broken disk: a collective's peers fail with it too, and fresh actors would as well.
                raise
            dead = _first_dead(pending, names, grace_s)
            if dead is not None:
                dead.cause, dead.waited_s = f"{dead.cause} (during {what})", time.monotonic() - start
                raise dead from e
            if _is_comm_error(e):
                raise ActorFault(names[ref], f"{what} failed in a collective: {_first_line(e)}",
                                 time.monotonic() - start) from e
            raise
        except _actor_errors() as e:
            if getattr(e, "actor_init_failed", False):
                # Its constructor raised (a model that does not load, an env class a worker cannot import):
                # fresh actors would raise the same.
                raise ActorStartError(f"{names[ref]} could not start, not retried: {e}") from e
            raise ActorFault(names[ref], f"{type(e).__name__} during {what}: {_first_line(e)}",
                             time.monotonic() - start) from e
    return [results[ref] for _, ref in calls]


def _actor_errors() -> tuple:
    from ray import exceptions as x

    return (x.RayActorError, x.WorkerCrashedError, x.NodeDiedError, x.OutOfMemoryError, x.ObjectLostError)


def _first_dead(refs: list, names: dict, grace_s: float) -> ActorFault | None:
    """A survivor's collective fails as soon as its peer dies; the peer's own death may take a moment to show."""
    import ray

    deadline = time.monotonic() + grace_s
    pending = list(refs)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
        if not ready:
            return None
        try:
            ray.get(ready[0])
        except _actor_errors() as e:
            return ActorFault(names[ready[0]], f"{type(e).__name__}: {_first_line(e)}")
        except Exception:
            continue
    return None


def _is_comm_error(error: BaseException) -> bool:
    text = f"{type(getattr(error, 'cause', None)).__name__} {error}"
    return any(s in text for s in ("DistBackendError", "DistNetworkError", "gloo", "NCCL", "Connection closed by peer",
                                   "Connection reset by peer"))


def _first_line(error: BaseException) -> str:
    lines = [s.strip() for s in str(error).splitlines() if s.strip()]
    return lines[0][:300] if lines else type(error).__name__

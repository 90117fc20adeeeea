"""Where a run's numbers go: metrics.jsonl (one line a step), TensorBoard, a Prometheus endpoint (the PNG
curves: grpo.report.curves)."""
from __future__ import annotations

import contextlib
import io
import json
import math
import os
import socket
import time
from pathlib import Path

from sync.atomic import atomic_write, naming


class MetricsSink:
    """Writes each record of a run to metrics.jsonl, TensorBoard, a Prometheus endpoint and W&B.

    A record is a step (`{"step": 3, "rollout": {...}, "train": {...}, ...}`) or an event, a record with an
    "event" key (`{"event": "restart", "step": 3, "cause": ..., "recovery_s": 41.2}`).
    - metrics.jsonl: one line a record, strict JSON (a non-finite number is written as null).
    - Steps: every finite number is a TensorBoard scalar and a W&B value under its key path
      (`rollout/success_rate`), and a Prometheus gauge `grpo_` + that path with non-alphanumerics as `_`
      (`grpo_rollout_success_rate`, `grpo_time_step_s`, `grpo_adapter_version`). The packaged Grafana
      dashboard (grpo/report/dashboards/grpo.json) queries these names: keep them stable.
    - Events are counted, not plotted as steps: Prometheus counter `grpo_<event>s_total`
      (`grpo_restarts_total`, served from 0 from the start), and the running count as the TensorBoard scalar
      `<event>s` at the event's step (in W&B: with the next step's row). Counts include the events already in
      metrics.jsonl, so a resumed run keeps counting.
    """

    def __init__(self, run_dir: Path, tensorboard: bool = True, prometheus_port: int | None = None,
                 wandb=None, run_config: dict | None = None):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / "metrics.jsonl"
        self.event_counts = _count_events(self.path)
        self._tb = self._server = self._registry = self._wandb = None
        self._gauges, self._counters = {}, {}
        if prometheus_port is not None:
            self._serve(prometheus_port)
        if tensorboard:
            self._tb = TensorBoardEvents(self.run_dir / "tensorboard")
        if wandb is not None:
            from grpo.report.wandb_sink import WandbSink

            self._wandb = WandbSink(wandb, self.run_dir, run_config)

    def _serve(self, port: int) -> None:
        from prometheus_client import CollectorRegistry, start_http_server

        self._registry = CollectorRegistry()
        try:
            self._server, _ = start_http_server(port, registry=self._registry)
        except OSError as e:
            raise OSError(f"metrics.prometheus_port={port}: cannot serve /metrics there ({e}); pick a free port "
                          "or leave it unset") from None
        # The dashboard's restart panel reads this counter; it exists at 0 before any restart.
        self._counter("restart")

    def log(self, record: dict) -> None:
        append(self.path, (json.dumps(json_safe(record), sort_keys=True, allow_nan=False) + "\n").encode())
        step = int(record.get("step", 0))
        if "event" in record:
            self._event(str(record["event"]), step)
            return
        values = flatten(record)
        if self._tb is not None:
            self._tb.scalars(values, step)
        if self._registry is not None:
            for key, value in values.items():
                self._gauge(key).set(value)
        if self._wandb is not None:
            self._wandb.log(values, step)

    def _event(self, name: str, step: int) -> None:
        self.event_counts[name] = count = self.event_counts.get(name, 0) + 1
        if self._registry is not None:
            self._counter(name).inc()
        if self._tb is not None:
            self._tb.scalars({f"{name}s": float(count)}, step)
        if self._wandb is not None:
            self._wandb.event({f"{name}s": count})

    def _gauge(self, key: str):
        if key not in self._gauges:
            from prometheus_client import Gauge

            self._gauges[key] = Gauge(prometheus_name(key), key, registry=self._registry)
        return self._gauges[key]

    def _counter(self, event: str):
        if event not in self._counters:
            from prometheus_client import Counter

            counter = Counter(prometheus_name(f"{event}s"), f"{event} events of this run",
                              registry=self._registry)
            counter.inc(self.event_counts.get(event, 0))
            self._counters[event] = counter
        return self._counters[event]

    def close(self) -> None:
        self._tb = None
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._wandb is not None:
            self._wandb.close()
            self._wandb = None


class TensorBoardEvents:
    """TensorBoard scalars, one event a record, written in the caller's thread. torch's SummaryWriter writes
    from a thread of its own: on a full disk that thread dies with a traceback of its own, and the error
    reaches the run only at a later call, or at none."""

    def __init__(self, folder: Path):
        from tensorboard.compat.proto.event_pb2 import Event

        folder.mkdir(parents=True, exist_ok=True)
        # TensorBoard's own file name: one file a process, so a resumed run adds a file.
        self.path = folder / f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}.0"
        self._write(Event(wall_time=time.time(), file_version="brain.Event:2"))

    def scalars(self, values: dict[str, float], step: int) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        summary = Summary(value=[Summary.Value(tag=k, simple_value=v) for k, v in values.items()])
        self._write(Event(wall_time=time.time(), step=step, summary=summary))

    def _write(self, event) -> None:
        from tensorboard.summary.writer.record_writer import RecordWriter

        record = io.BytesIO()
        RecordWriter(record).write(event.SerializeToString())
        append(self.path, record.getvalue())


def append(path: Path, data: bytes) -> None:
    """Append whole records (JSON lines, TensorBoard events) to a file of the run. A write that fails (a full
    disk) takes back what it wrote: the file never ends in a torn record that a resumed run cannot read."""
    with naming(path):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            end = os.lseek(fd, 0, os.SEEK_END)
            view = memoryview(data)
            try:
                while view:
                    view = view[os.write(fd, view):]
            except OSError:
                with contextlib.suppress(OSError):  # the write's own error is the one to report
                    os.ftruncate(fd, end)
                raise
        finally:
            os.close(fd)


def prometheus_name(key: str) -> str:
    """`rollout/success_rate` -> `grpo_rollout_success_rate` (a counter adds `_total` when served)."""
    return "grpo_" + "".join(c if c.isalnum() else "_" for c in key)


def json_safe(value):
    """The value as plain JSON: every NaN and infinity replaced by None, so that json.dumps writes strict JSON
    (null) instead of the bare NaN that strict readers (jq, JavaScript, Go) refuse; tuples as lists, keys as
    strings, and anything else JSON cannot hold (an env's own objects in `info`) as its repr."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if value is None or isinstance(value, (bool, int, str)):
        return value
    return repr(value)


def _count_events(path: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    for record in read_metrics(path):
        if "event" in record:
            counts[str(record["event"])] = counts.get(str(record["event"]), 0) + 1
    return counts


def flatten(record: dict, prefix: str = "") -> dict[str, float]:
    """{"train": {"loss": 1.0}} -> {"train/loss": 1.0}: finite numbers only (what is plotted and served)."""
    out = {}
    for k, v in record.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}/"))
        elif isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            out[f"{prefix}{k}"] = float(v)
    return out


def read_metrics(path: Path) -> list[dict]:
    """Every record of a metrics.jsonl file (or any JSONL file of the run), in order; [] when there is none."""
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def drop_steps_after(path: Path, step: int) -> int:
    """Remove the step records past `step` from a JSONL file of the run (metrics.jsonl, samples.jsonl; events
    stay): a run resumed or recovered from the checkpoint of `step` logs those steps again, and each step keeps
    only the lines of its last run. Returns how many were removed."""
    path = Path(path)
    if not path.exists():
        return 0
    lines = path.read_text().splitlines()
    kept = [line for line in lines if not line.strip() or _kept_after(json.loads(line), step)]
    if len(kept) == len(lines):
        return 0
    atomic_write(str(path), "".join(line + "\n" for line in kept if line.strip()).encode(), durable=False)
    return len(lines) - len(kept)


def _kept_after(record: dict, step: int) -> bool:
    return "event" in record or int(record.get("step", 0)) <= step

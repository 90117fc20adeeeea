"""Where a run's numbers go: metrics.jsonl (one line a step), TensorBoard, a Prometheus endpoint, PNG curves."""
from __future__ import annotations

import json
import math
from pathlib import Path


class MetricsSink:
    def __init__(self, run_dir: Path, tensorboard: bool = True, prometheus_port: int | None = None):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / "metrics.jsonl"
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(self.run_dir / "tensorboard"))
        self._gauges = {}
        self._registry = None
        if prometheus_port is not None:
            from prometheus_client import CollectorRegistry, start_http_server

            self._registry = CollectorRegistry()
            start_http_server(prometheus_port, registry=self._registry)

    def log(self, record: dict) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")
        step = int(record.get("step", 0))
        for key, value in _numbers(record):
            if self._tb is not None:
                self._tb.add_scalar(key, value, step)
            if self._registry is not None:
                self._gauge(key).set(value)
        if self._tb is not None:
            self._tb.flush()

    def _gauge(self, key: str):
        if key not in self._gauges:
            from prometheus_client import Gauge

            name = "grpo_" + "".join(c if c.isalnum() else "_" for c in key)
            self._gauges[key] = Gauge(name, key, registry=self._registry)
        return self._gauges[key]

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None


def _numbers(record: dict, prefix: str = ""):
    for k, v in record.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            yield from _numbers(v, key + "/")
        elif isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            yield key, float(v)


def read_metrics(path: Path) -> list[dict]:
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


CURVES = ("rollout/success_rate", "eval/success_rate", "rollout/mean_reward", "train/sampler_abs_diff")


def curve_series(records: list[dict], keys=CURVES, start: dict | None = None) -> dict[str, list[tuple[float, float]]]:
    """(step, value) points per key, in `keys` order; `start` gives step-0 values (the eval before training,
    which no step record holds)."""
    series = {k: [(0, float(start[k]))] for k in keys if start and start.get(k) is not None}
    for r in records:
        flat = dict(_numbers(r))
        for k in keys:
            if k in flat:
                series.setdefault(k, []).append((flat.get("step", 0), flat[k]))
    return {k: series[k] for k in keys if k in series}


def plot_curves(metrics_path: Path, out_png: Path, keys=CURVES, start: dict | None = None) -> Path | None:
    """One panel per curve over steps; returns the PNG's path, or None with nothing to plot."""
    series = curve_series(read_metrics(metrics_path), keys, start)
    if not series:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(series), 1, figsize=(7, 2.4 * len(series)), squeeze=False)
    for ax, (k, pts) in zip(axes[:, 0], series.items()):
        xs, ys = zip(*pts)
        ax.plot(xs, ys, marker="o", markersize=3)
        ax.set_ylabel(k.split("/")[-1])
        ax.set_title(k, fontsize=9)
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("step")
    fig.tight_layout()
    fig.savefig(out_png, dpi=100)
    plt.close(fig)
    return Path(out_png)

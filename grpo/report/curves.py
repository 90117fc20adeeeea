"""curves.png: a run's metrics.jsonl drawn over integer steps, from the eval before training (step 0) to the
eval after it (the last step).

`curve_series` is the pure part (which points each panel plots); `plot_curves` only draws them.
"""
from __future__ import annotations

import math
from pathlib import Path

from grpo.report.metrics import flatten, read_metrics

# (title, keys drawn together, how): "lines" shares one axis, "stack" stacks the parts of a whole as bars, "log" is a
# log axis for small positive numbers (the mismatch: 3e-10 of noise must not look like a spike).
PANELS = (
    ("success rate (rollout: sampled, eval: greedy)", ("rollout/success_rate", "eval/success_rate"), "lines"),
    ("mean reward", ("rollout/mean_reward",), "lines"),
    ("policy loss", ("train/loss",), "lines"),
    ("grad norm", ("train/grad_norm",), "lines"),
    ("|trainer - vLLM| logprob, mean", ("train/sampler_abs_diff",), "log"),
    ("step time (s)", ("time/rollout_s", "time/train_s", "time/sync_s"), "stack"),
)
CURVES = tuple(k for _, keys, _ in PANELS for k in keys)


def curve_series(records: list[dict], keys=CURVES, start: dict | None = None,
                 end: dict | None = None) -> dict[str, list[tuple[int, float]]]:
    """(step, value) points per key, in `keys` order, with every `reward/<name>` component right after
    rollout/mean_reward when that is drawn. `start` gives step-0 values (the eval before training, which no
    step record holds); `end` gives values at the last step (the eval after training), replacing a point
    already at that step."""
    flat = [flatten(r) for r in records]
    components = sorted({k for f in flat for k in f if k.startswith("reward/")})
    keys = list(keys)
    if "rollout/mean_reward" in keys:
        i = keys.index("rollout/mean_reward") + 1
        keys = keys[:i] + components + keys[i:]
    series = {k: [(0, float(start[k]))] for k in keys if start and start.get(k) is not None}
    for f in flat:
        for k in keys:
            if k in f:
                series.setdefault(k, []).append((int(f.get("step", 0)), f[k]))
    last = max((int(f.get("step", 0)) for f in flat), default=0)
    for k, v in (end or {}).items():
        if k in keys and v is not None:
            series[k] = [p for p in series.get(k, []) if p[0] != last] + [(last, float(v))]
    return {k: series[k] for k in keys if k in series}


def panels(series: dict) -> list[tuple[str, dict, str]]:
    """The panels that have data: (title, {key: points}, how); reward components join the reward panel."""
    out = []
    for title, keys, how in PANELS:
        if "rollout/mean_reward" in keys:
            keys = keys + tuple(k for k in series if k.startswith("reward/"))
        got = {k: series[k] for k in keys if k in series}
        if got:
            out.append((title, got, how))
    return out


def figure(series: dict):
    """The matplotlib figure for `series` (None when there is nothing to draw)."""
    shown = panels(series)
    if not shown:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(len(shown), 1, figsize=(7, 2.3 * len(shown)), squeeze=False, sharex=True)
    for ax, (title, got, how) in zip(axes[:, 0], shown):
        if how == "stack":
            # Stacked bars: one per step (an area would vanish for a one-step run).
            steps = sorted({s for pts in got.values() for s, _ in pts})
            bottom = [0.0] * len(steps)
            for k, pts in got.items():
                part = [dict(pts).get(s, 0.0) for s in steps]
                ax.bar(steps, part, bottom=bottom, width=0.6, label=k.split("/")[-1])
                bottom = [b + p for b, p in zip(bottom, part)]
        else:
            for k, pts in got.items():
                xs, ys = zip(*pts)
                ax.plot(xs, ys, marker="o", markersize=3, label=k)
            ys = [y for pts in got.values() for _, y in pts]
            if how == "log" and min(ys) > 0:
                # At least two decades: noise around a constant stays a flat line.
                ax.set_yscale("log")
                mid = math.sqrt(min(ys) * max(ys))
                ax.set_ylim(min(min(ys), mid / 10) / 1.5, max(max(ys), mid * 10) * 1.5)
            else:
                ax.ticklabel_format(axis="y", useOffset=False)
                if how == "log":
                    ax.set_ylim(bottom=0)
        if len(got) > 1:
            ax.legend(fontsize=7, loc="best")
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[-1, 0].set_xlabel("step")
    fig.tight_layout()
    return fig


def plot_curves(metrics_path: Path, out_png: Path, keys=CURVES, start: dict | None = None,
                end: dict | None = None) -> Path | None:
    """Draw metrics.jsonl to `out_png`; returns its path, or None with nothing to plot."""
    fig = figure(curve_series(read_metrics(metrics_path), keys, start, end))
    if fig is None:
        return None
    import matplotlib.pyplot as plt

    fig.savefig(out_png, dpi=100)
    plt.close(fig)
    return Path(out_png)

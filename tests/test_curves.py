"""curves.png: the points each panel plots (a pure function, by hand), and what the drawn axes show."""
import math

from grpo.report.curves import curve_series, figure, panels, plot_curves


def test_curve_series_by_hand():
    records = [{"step": 1, "rollout": {"success_rate": 0.25}},
               {"step": 2, "rollout": {"success_rate": 0.5}, "eval": {"success_rate": 0.4, "solved_seeds": [1]}}]
    series = curve_series(records, start={"eval/success_rate": 0.3})
    assert series == {"rollout/success_rate": [(1, 0.25), (2, 0.5)], "eval/success_rate": [(0, 0.3), (2, 0.4)]}
    assert curve_series(records, start={"eval/success_rate": None})["eval/success_rate"] == [(2, 0.4)]
    assert curve_series([]) == {}


def test_the_eval_after_training_is_the_last_point_and_replaces_one_at_that_step():
    records = [{"step": 1, "rollout": {"success_rate": 0.25}}, {"step": 2, "rollout": {"success_rate": 0.5}}]
    ends = curve_series(records, start={"eval/success_rate": 0.3}, end={"eval/success_rate": 0.75})
    assert ends["eval/success_rate"] == [(0, 0.3), (2, 0.75)]
    records[1]["eval"] = {"success_rate": 0.5}  # an eval at the last step, then the same adapter's eval after
    assert curve_series(records, end={"eval/success_rate": 0.5})["eval/success_rate"] == [(2, 0.5)]


def test_reward_components_follow_the_mean_reward_and_share_its_panel():
    records = [{"step": 1, "rollout": {"mean_reward": 0.6}, "reward": {"format": 1.0, "correct": 0.2},
                "train": {"loss": -0.5, "grad_norm": 2.0}, "time": {"rollout_s": 3.0, "train_s": 2.0, "sync_s": 0.5}}]
    series = curve_series(records)
    assert list(series) == ["rollout/mean_reward", "reward/correct", "reward/format", "train/loss", "train/grad_norm",
                            "time/rollout_s", "time/train_s", "time/sync_s"]
    titles = {title: list(got) for title, got, _ in panels(series)}
    assert titles["mean reward"] == ["rollout/mean_reward", "reward/correct", "reward/format"]
    assert titles["step time (s)"] == ["time/rollout_s", "time/train_s", "time/sync_s"]


def test_axes_show_integer_steps_and_no_offset_on_the_mismatch():
    records = [{"step": s, "rollout": {"success_rate": 0.1 * s}, "train": {"loss": 1.0 / s, "sampler_abs_diff": d},
                "time": {"rollout_s": 1.0, "train_s": 2.0, "sync_s": 0.1}}
               for s, d in ((1, 1.0e-7), (2, 1.0e-7 + 3e-10), (3, 1.0e-7))]
    fig = figure(curve_series(records, start={"eval/success_rate": 0.0}, end={"eval/success_rate": 0.5}))
    axes = {ax.get_title(): ax for ax in fig.axes}
    fig.canvas.draw()
    for ax in axes.values():
        ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
        assert ticks and all(t == int(t) for t in ticks), ticks
    mismatch = axes["|trainer - vLLM| logprob, mean"]
    assert mismatch.get_yscale() == "log"
    low, high = mismatch.get_ylim()  # 3e-10 of noise on 1e-7 fills a sliver of the axis, not all of it
    assert math.log10(high / low) > 0.5
    assert axes["policy loss"].yaxis.get_major_formatter().get_useOffset() is False
    stack = axes["step time (s)"]
    assert math.isclose(max(stack.get_ylim()), 3.1, rel_tol=0.1)  # the parts stack to the step's 3.1 s
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_plot_curves_writes_a_png_or_says_there_is_nothing(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    assert plot_curves(metrics, tmp_path / "none.png") is None
    metrics.write_text('{"step": 1, "rollout": {"success_rate": 0.5}}\n')
    out = plot_curves(metrics, tmp_path / "c.png", start={"eval/success_rate": 0.3}, end={"eval/success_rate": 0.6})
    assert out == tmp_path / "c.png" and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

"""Curves from metrics records: the values each panel plots, and the eval before training at step 0."""
from grpo.metrics import curve_series, plot_curves


def test_curve_series_by_hand():
    records = [{"step": 1, "rollout": {"success_rate": 0.25}},
               {"step": 2, "rollout": {"success_rate": 0.5}, "eval": {"success_rate": 0.4, "solved_seeds": [1]}}]
    series = curve_series(records, start={"eval/success_rate": 0.3})
    assert series == {"rollout/success_rate": [(1, 0.25), (2, 0.5)], "eval/success_rate": [(0, 0.3), (2, 0.4)]}
    assert curve_series(records, start={"eval/success_rate": None})["eval/success_rate"] == [(2, 0.4)]
    assert curve_series([]) == {}


def test_plot_curves_writes_a_png_or_says_there_is_nothing(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    assert plot_curves(metrics, tmp_path / "none.png") is None
    metrics.write_text('{"step": 1, "rollout": {"success_rate": 0.5}}\n')
    out = plot_curves(metrics, tmp_path / "c.png", start={"eval/success_rate": 0.3})
    assert out == tmp_path / "c.png" and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

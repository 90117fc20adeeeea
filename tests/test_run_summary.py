"""summary.json's mechanism fields: how greedy episodes failed, and the sampled success and zero-signal share
at the first and the last step, on records and episodes whose numbers are counted by hand."""
import json

from grpo.report import summary as run_summary
from rollout.trajectory import Trajectory


def _episode(success: bool, turns: int, parse_errors: int, stop_reason: str) -> Trajectory:
    return Trajectory(task_id="maze:0", group_id=0, seed=0, segments=[], turn_rewards=[0.0] * turns,
                      num_turns=turns, stop_reason=stop_reason, adapter_version=1, success=success,
                      parse_errors=parse_errors)


def test_episode_outcomes_counts_failures_by_stop_reason_and_unparseable_turns():
    trajs = [_episode(True, 13, 0, "done"), _episode(False, 30, 20, "max_turns"),
             _episode(False, 30, 2, "max_turns"), _episode(False, 7, 1, "done")]
    out = run_summary.episode_outcomes(trajs)
    assert out == {"episodes": 4, "failed": 3, "failed_by_stop_reason": {"done": 1, "max_turns": 2},
                   "unparseable_turn_share": round(23 / 80, 4), "unparseable_turn_share_failed": round(23 / 67, 4),
                   "failed_mostly_unparseable": 1}


def test_episode_outcomes_of_no_failure_has_no_share_to_divide():
    out = run_summary.episode_outcomes([_episode(True, 13, 0, "done")])
    assert out["failed"] == 0 and out["failed_by_stop_reason"] == {}
    assert out["unparseable_turn_share"] == 0.0 and out["unparseable_turn_share_failed"] is None


def test_mechanism_reads_the_first_and_last_step_and_skips_events(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [{"step": 1, "rollout": {"success_rate": 0.25}, "zero_signal_groups": 3},
             {"step": 2, "rollout": {"success_rate": 0.5}, "zero_signal_groups": 2},
             {"event": "restart", "step": 2},
             {"step": 3, "rollout": {"success_rate": 0.5}, "zero_signal_groups": 6},
             {"step": 3, "rollout": {"success_rate": 0.875}, "zero_signal_groups": 7}]  # step 3 again, after a restart
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    before = {"success_rate": 0.4, "outcomes": {"failed": 38}}
    out = run_summary.mechanism(path, 8, before, {"success_rate": 0.9})
    assert out == {"first_step_rollout_success": 0.25, "zero_signal_share_first_step": 0.375,
                   "last_step_rollout_success": 0.875, "zero_signal_share_last_step": 0.875,
                   "eval_before_outcomes": {"failed": 38}, "eval_after_outcomes": None}


def test_mechanism_without_steps_gives_none(tmp_path):
    out = run_summary.mechanism(tmp_path / "metrics.jsonl", 8, {}, {})
    assert out["first_step_rollout_success"] is None and out["zero_signal_share_last_step"] is None

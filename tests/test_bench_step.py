"""The step benchmarks' arithmetic on hand-made numbers: the breakdown of a step, the medians, the reward."""
import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1] / "benchmarks"))

from _single_turn import DigitsEnv, digit_reward  # noqa: E402


def test_breakdown_splits_a_step_into_parts_that_add_up():
    from _timed_trainer import breakdown

    clock = {"rollout_call_s": 1.0, "advantages_s": 0.01, "sleep_s": 0.02, "train_s": 0.5, "publish_s": 0.05,
             "wake_s": 0.03, "hotload_s": 0.04, "step_s": 1.7, "checkpoint_s": 0.2}
    parts = breakdown(clock, {"wall_s": 0.9, "engine_s": 0.6})
    assert abs(parts["rollout_engine_s"] - 0.6) < 1e-12
    assert abs(parts["rollout_env_and_bookkeeping_s"] - 0.3) < 1e-12
    assert abs(parts["rollout_ray_s"] - 0.1) < 1e-12
    assert abs(parts["sleep_wake_s"] - 0.05) < 1e-12
    # 1.7 + 0.2 - (0.6 + 0.3 + 0.1 + 0.01 + 0.5 + 0.05 + 0.04 + 0.05 + 0.2) = 0.05
    assert abs(parts["rest_s"] - 0.05) < 1e-9
    assert abs(sum(parts.values()) - (1.7 + 0.2)) < 1e-9


def test_summary_takes_medians_from_the_second_step():
    from step import summarize

    def rec(step_s, engine_s, tokens):
        return {"time": {"step_s": step_s}, "rollout": {"generated_tokens": tokens},
                "parts": {"rollout_engine_s": engine_s}}

    out = summarize([rec(9.0, 8.0, 100), rec(1.0, 0.5, 100), rec(2.0, 1.5, 200), rec(3.0, 0.7, 300)])
    assert out["step_s"] == 2.0 and out["parts_s"] == {"rollout_engine_s": 0.7}
    assert out["parts_share"] == {"rollout_engine_s": 0.35}
    assert out["generated_tokens_per_s"] == 100.0  # 600 tokens in 6 s
    assert out["median_over_steps"] == "2..4"


def test_vs_trl_medians_skip_the_first_two_steps():
    from vs_trl import median_from

    assert median_from([30.0, 9.0, 1.0, 3.0, 2.0]) == 2.0
    assert median_from([5.0, 4.0]) is None


def test_digit_reward_and_the_single_turn_env():
    assert digit_reward("12 ab") == 0.5
    assert digit_reward("  ") == 0.0 and digit_reward("0 1 2") == 1.0
    env = DigitsEnv()
    assert env.reset(9).text == env.reset(1).text  # 8 prompts, by seed modulo 8
    out = env.step("42 ab")
    assert out.done and out.reward == 0.5 and out.info == {"success": True}

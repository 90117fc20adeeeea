"""The step benchmarks' arithmetic on hand-made numbers: the breakdown of a step, the medians, the reward."""
from benchmarks._single_turn import DigitsEnv, digit_reward


def test_breakdown_splits_a_step_into_parts_that_add_up():
    from benchmarks._timed_trainer import breakdown

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
    from benchmarks.step import summarize

    def rec(step_s, engine_s, tokens):
        return {"time": {"step_s": step_s}, "rollout": {"generated_tokens": tokens},
                "parts": {"rollout_engine_s": engine_s}}

    out = summarize([rec(9.0, 8.0, 100), rec(1.0, 0.5, 100), rec(2.0, 1.5, 200), rec(3.0, 0.7, 300)])
    assert out["step_s"] == 2.0 and out["parts_s"] == {"rollout_engine_s": 0.7}
    assert out["parts_share"] == {"rollout_engine_s": 0.35}
    assert out["generated_tokens_per_s"] == 100.0  # 600 tokens in 6 s
    assert out["median_over_steps"] == "2..4"


def test_vs_trl_medians_skip_the_first_two_steps():
    from benchmarks.vs_trl import median_from

    assert median_from([30.0, 9.0, 1.0, 3.0, 2.0]) == 2.0
    assert median_from([5.0, 4.0]) is None


def test_digit_reward_and_the_single_turn_env():
    assert digit_reward("12 ab") == 0.5
    assert digit_reward("  ") == 0.0 and digit_reward("0 1 2") == 1.0
    env = DigitsEnv()
    assert env.reset(9).text == env.reset(1).text  # 8 prompts, by seed modulo 8
    out = env.step("42 ab")
    assert out.done and out.reward == 0.5 and out.info == {"success": True}


def test_step_clock_turns_the_trainers_phases_into_marks_and_parts():
    from benchmarks._timed_trainer import StepClock

    steps, ready = [], []
    clock = StepClock(on_ready=ready.append, on_step=steps.append, t0=0.0)
    clock.on_train_begin(None)
    for phase in ("start", "actors_start"):
        clock.on_phase_end(None, phase, 1.0)
    clock.on_phase_end(None, "eval", 2.0)
    clock.on_eval(None, "before", {})
    marks = ready[0]
    assert list(marks) == ["start_called_s", "ray_ready_s", "actors_ready_s", "eval_before_start_s",
                           "eval_before_end_s"]
    assert abs(marks["eval_before_end_s"] - marks["eval_before_start_s"] - 2.0) < 1e-9
    for _ in range(2):
        for phase, s in (("rollout", 1.0), ("advantages", 0.01), ("sleep", 0.02), ("train", 0.5),
                         ("publish", 0.05), ("wake_up", 0.03), ("hotload", 0.04)):
            clock.on_phase_end(None, phase, s)
        record = {"step": len(steps) + 1, "time": {"step_s": 1.7}, "rollout": {"wall_s": 0.9, "engine_s": 0.6}}
        clock.on_step_end(None, record)
        clock.on_phase_end(None, "checkpoint", 0.2)  # saved after the step's record: the next step's part
    first, second = (r["parts"] for r in steps)
    assert first["checkpoint_s"] == 0.0 and second["checkpoint_s"] == 0.2
    assert abs(first["rest_s"] - 0.05) < 1e-9 and abs(second["rest_s"] - 0.05) < 1e-9

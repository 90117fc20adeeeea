"""benchmarks/learning_vs_trl.py's figures from hand-written curves, and TRL's batch split: no Ray, vLLM or TRL."""
import pytest

from benchmarks import learning_vs_trl as L
from benchmarks._learning_trl import batch_split

# TRL: 0.20 after 100 s of start-up, 0.30 at 400 s, 0.35 at its last step, 700 s.
TRL = [{"step": 0, "wall_s": 100.0, "test_accuracy": 0.20}, {"step": 2, "wall_s": 400.0, "test_accuracy": 0.30},
       {"step": 4, "wall_s": 700.0, "test_accuracy": 0.35}]
# The engine passes 0.35 first at 280 s (0.3125 at 190 s does not reach it).
ENGINE = [{"step": 0, "wall_s": 100.0, "test_accuracy": 0.20}, {"step": 2, "wall_s": 190.0, "test_accuracy": 0.3125},
          {"step": 4, "wall_s": 280.0, "test_accuracy": 0.375}, {"step": 6, "wall_s": 370.0, "test_accuracy": 0.35}]


def test_curve_adds_each_steps_seconds_to_the_start_up_less_its_evaluation():
    ready = {"at_s": 130.0, "eval_s": 30.0, "test_accuracy": 0.25}
    steps = [{"step": 1, "step_s": 40.0}, {"step": 2, "step_s": 50.0, "test_accuracy": 0.5, "eval_s": 20.0},
             {"step": 3, "step_s": 45.5, "test_accuracy": 0.625}]
    assert L.curve(ready, steps) == [{"step": 0, "wall_s": 100.0, "test_accuracy": 0.25},
                                     {"step": 2, "wall_s": 190.0, "test_accuracy": 0.5},
                                     {"step": 3, "wall_s": 235.5, "test_accuracy": 0.625}]


def test_ratio_is_the_engines_first_time_at_trls_final_accuracy_over_trls_time():
    got = L.seed_ratio(ENGINE, TRL)
    assert got == {"trl_final_test": 0.35, "trl_wall_s": 700.0, "engine_reach_s": 280.0, "ratio": 0.4, "reason": None}


def test_ratio_is_null_with_a_reason_when_the_engine_never_reaches_it():
    got = L.seed_ratio(ENGINE[:2], TRL)
    assert got["ratio"] is None and got["engine_reach_s"] is None
    assert got["reason"] == "the engine's test accuracy never reached TRL's final 0.3500 (its best: 0.3125)"


def test_median_over_seeds_counts_a_seed_that_never_reached_as_the_largest():
    reached = [{"ratio": 0.4}, {"ratio": 0.25}]
    never = {"ratio": None}
    assert L.median_ratio(reached + [{"ratio": 0.6}]) == {"value": 0.4, "reason": None}
    assert L.median_ratio(reached + [never]) == {"value": 0.4, "reason": None}
    assert L.median_ratio([{"ratio": 0.4}, never, never]) == {
        "value": None, "reason": "the engine never reached TRL's final test accuracy in 2 of 3 seeds"}
    assert L.median_ratio([{"ratio": 0.4}, never])["value"] is None  # (0.4 + inf) / 2: no number
    assert L.median_ratio([]) == {"value": None, "reason": "no seed ran both sides to the end"}
    assert L.median_over_seeds([0.5, None, 0.25, 0.375]) == 0.375
    assert L.median_over_seeds([None]) is None


def test_summary_takes_medians_over_the_seeds_that_ran_both_sides():
    second = [{**p, "test_accuracy": p["test_accuracy"] + 0.1} for p in ENGINE]
    runs = [{"engine": {"curve": ENGINE, "complete": True}, "trl": {"curve": TRL, "complete": True},
             "ratio": L.seed_ratio(ENGINE, TRL)},
            {"engine": {"curve": second, "complete": True}, "trl": {"curve": TRL, "complete": True},
             "ratio": L.seed_ratio(second, TRL)},
            {"seed": 2, "engine": {"curve": ENGINE[:1], "complete": False},
             "trl": {"curve": [*TRL[:-1], {**TRL[-1], "test_accuracy": 0.9}], "complete": True}}]
    runs[0]["seed"], runs[1]["seed"] = 0, 1
    got = L.summarize(runs)
    # The second seed reaches 0.35 at 190 s (0.4125): 190 / 700 = 0.271; the third seed's engine stopped early.
    assert got["time_to_trl_final_ratio_runs"] == [0.4, 0.271]
    assert got["time_to_trl_final_ratio"] == round((0.4 + 0.271) / 2, 3)
    assert got["test_after_engine"] == 0.4 and got["test_after_trl"] == 0.35
    assert got["test_before_engine"] == 0.25 and got["wall_s_trl"] == 700.0
    assert got["seeds_finished"] == [0, 1]  # the third seed's TRL 0.9 is left out with its engine


def test_trl_batch_split_matches_the_engines_updates_and_micro_batches():
    # 8 prompts x 8, 2 updates of 32, micro-batches of 32: one micro-batch an update, two a generation.
    assert batch_split(8, 8, 2, 32) == {"per_device_train_batch_size": 32, "gradient_accumulation_steps": 1,
                                        "steps_per_generation": 2}
    assert batch_split(8, 8, 2, 8) == {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 4,
                                       "steps_per_generation": 8}
    with pytest.raises(ValueError, match="train.updates_per_batch=3 must divide the batch of 64"):
        batch_split(8, 8, 3, 32)
    with pytest.raises(ValueError, match="train.micro_batch_size=12 must divide the mini-batch of 32"):
        batch_split(8, 8, 2, 12)


def test_a_kept_seed_is_taken_under_its_protocol_and_refused_under_another(tmp_path):
    wanted = {"config": {"steps": 20, "lora": {"rank": 16}}, "steps": 20, "eval_every": 2, "trl_generate": "vllm",
              "trl_packages": ["trl==1.16.0"]}
    steps = [{"step": n} for n in range(1, 21)]
    run = {"seed": 1, **{side: {"curve": curve, "steps": steps, "exit_code": 0, "complete": True}
                         for side, curve in (("engine", ENGINE), ("trl", TRL))}}
    assert L.saved_seed(tmp_path, 1, wanted) is None
    path = L.keep_seed(tmp_path, run, wanted)
    assert path == tmp_path / "seed1.json" and not list(tmp_path.glob("*.tmp"))
    assert L.saved_seed(tmp_path, 1, wanted) == run
    restarted = {**run, "engine": {**run["engine"], "exit_code": 1}}
    L.keep_seed(tmp_path, restarted, wanted)
    assert L.saved_seed(tmp_path, 1, wanted) is None  # kept before the check existed: it runs again
    L.keep_seed(tmp_path, run, wanted)
    other = {**wanted, "eval_every": 4, "config": {"steps": 20, "lora": {"rank": 8}}}
    with pytest.raises(SystemExit, match=r"another protocol \(differs in config, eval_every\)"):
        L.saved_seed(tmp_path, 1, other)


def test_a_seed_counts_as_finished_only_when_both_sides_trained_every_step():
    done = {"engine": {"complete": True}, "trl": {"complete": True}}
    assert L.finished(done)
    assert not L.finished({**done, "trl": {"complete": False}})
    assert not L.finished({"engine": {"complete": True}})  # TRL never started


def test_a_side_is_complete_only_for_one_clean_attempt_over_every_step():
    steps = [{"step": n, "step_s": 1.0} for n in (1, 2, 3)]
    assert L.side_complete({"steps": steps, "exit_code": 0}, 3)
    assert not L.side_complete({"steps": steps, "exit_code": 1}, 3)
    assert not L.side_complete({"steps": steps[:2], "exit_code": 0}, 3)
    # Seen on 2026-12-04: the supervisor restarted the engine from step 1 after the OOM killer took a worker at
    # step 17 (no checkpoint yet), and the steps it then reported had been counted as steps 17 to 20.
    restarted = [{"step": n} for n in (1, 2, 1)]
    assert not L.side_complete({"steps": restarted, "exit_code": 0}, 3)

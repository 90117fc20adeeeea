"""The progress bar's figures: a step that trained nothing shows no mismatch reading, not 0."""
from grpo.driver.progress import postfix


def _record(train: dict, **extra) -> dict:
    return {"step": 3, "rollout": {"mean_reward": 0.875, "success_rate": 0.875, "mean_turns": 17.56},
            "train": train, "time": {"step_s": 12.34}, **extra}


def test_a_trained_step_shows_its_mismatch():
    shown = postfix(_record({"sampler_abs_diff": 6.8e-08, "updates": 4.0}, eval={"success_rate": 0.90625}))
    assert shown == {"reward": "0.88", "success": "88%", "turns": "17.6", "mismatch": "6.8e-08",
                     "step_s": "12.3", "eval": "91%"}


def test_a_step_that_trained_nothing_has_no_mismatch_reading():
    # What TrainWorker.train_step returns when every group was dropped (no generated token to train).
    shown = postfix(_record({"step": 3.0, "lr": 1e-3, "skipped": 1.0, "updates": 0.0}))
    assert shown["mismatch"] == "none"


def test_a_step_that_drew_more_groups_shows_how_many_it_trained_on():
    record = _record({"sampler_abs_diff": 1e-7})
    assert "groups" not in postfix(record)
    record["rollout"].update(groups_drawn=40, groups_trained=16, draw_rounds=2)
    assert postfix(record)["groups"] == "16/40"

"""eval.select "best": validation picks the adapter the test set scores. A run trained against its own
validation (a format reward of -1 pays the maze warm start to stop replying moves) ends below where it
started; the test set then scores the best validated adapter, kept in the store past garbage collection."""
import json
from pathlib import Path

import pytest

import grpo
from grpo.config import ConfigError
from grpo.tools.export import export
from sync import AdapterStore


def test_select_takes_last_or_best_and_names_anything_else():
    assert grpo.RunConfig(model="m").eval.select == "last"
    assert grpo.RunConfig(model="m", eval={"select": "best"}).eval.select == "best"
    with pytest.raises(ConfigError, match="EvalConfig.select='median' is not allowed: 'last'.*'best'"):
        grpo.RunConfig(model="m", eval={"select": "median"})


@pytest.mark.slow
def test_the_best_validated_adapter_is_tested_kept_and_exported(tmp_path):
    from examples.maze import maze_config

    out = tmp_path / "run"
    summary = grpo.Trainer(grpo.RunConfig(
        model=str(maze_config.WARMSTART), output_dir=str(out), steps=3, tasks_per_step=2,
        env={"name": "maze", "options": dict(maze_config.ENV_OPTIONS, format_reward=-1.0)},
        algorithm={"group_size": 4}, lora={"rank": 8, "alpha": 16.0}, train={"lr": 2e-2, "micro_batch_size": 64},
        rollout={"temperature": 0.7, "max_tokens_per_turn": maze_config.MAX_TOKENS_PER_TURN,
                 "history": maze_config.HISTORY}, engine={"max_model_len": 1024},
        eval={"seeds": "0-5", "test_seeds": "6-11", "every": 1, "select": "best"},
        checkpoint={"every": 1, "keep": 1}, cluster={"train_ranks": 1},
        metrics={"tensorboard": False, "plots": False})).fit()

    selected = summary["selected"]
    validation = [summary["eval_before"]] + [summary["evals"][str(s)]["success_rate"] for s in range(1, 4)]
    # The objective pays for unreadable replies: the precondition of this test is a run that got worse.
    assert validation[3] < max(validation), f"validation before and after steps 1-3: {validation}"
    assert selected["last_step_validation"] == validation[3]  # the last step's eval, measured again after it
    best_step = validation.index(max(validation))  # the earliest of the highest
    assert (selected["rule"], selected["step"], selected["last_step"]) == ("best", best_step, 3)
    # Served again at the end, it validates as it did when it was picked (greedy decoding, the same seeds).
    assert selected["validation"] == selected["validation_at_step"] == max(validation) == summary["eval_after"]

    store = AdapterStore(out / "store")
    versions = [v.version for v in store.versions()]
    best = selected["adapter_version"]
    # Versions: v1 the start, one a step: the best is the version served after its step, kept by its lease while
    # garbage collection took every other version but the newest three.
    assert summary["adapter_version"] == best == best_step + 1 and store.verify(best)
    assert versions == sorted({best, 2, 3, 4}) and store.readers() == [f"best-v{best:06d}"]
    assert summary["adapter_path"] == store.verify(best).path
    episodes = [json.loads(x) for x in (out / "eval_samples.jsonl").read_text().splitlines()]
    tested = [e for e in episodes if e["label"] == "test"]
    assert len(tested) == 6 and {e["adapter_version"] for e in tested} == {best}
    assert {e["adapter_version"] for e in episodes if e["label"] == "selected"} == {best}
    assert {e["adapter_version"] for e in episodes if e["label"] == "after"} == {4}

    # `grpo export` takes the adapter the run tested, its card the figures measured for it.
    exported = export(out)
    assert (exported.step, exported.version) == (best_step, best) and exported.adapter.name == f"step{best_step}"
    weights = "adapter_model.safetensors"
    assert (exported.adapter / weights).read_bytes() == (Path(store.verify(best).path) / weights).read_bytes()
    card = (exported.adapter / "README.md").read_text()
    assert f"| test (6 seeds) | {summary['test_before']:.1%} | {summary['test_after']:.1%} |" in card
    print(json.dumps({"validation": validation, "selected": selected, "test_before": summary["test_before"],
                      "test_after": summary["test_after"]}))

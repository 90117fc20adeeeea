"""`grpo eval` and eval.select: the figures by hand; on a real run's folder (the maze warm start, a tiny
Qwen3-VL: real vLLM, Ray and FSDP) the adapter validation selected, tested, exported, and evaluated again
episode for episode as the trainer's own evals did."""
import json
from pathlib import Path

import pytest

from grpo.cli import main
from grpo.driver.eval import eval_summary, resolve
from rollout.trajectory import RolloutStats, Trajectory


def _traj(seed, success, reward):
    return Trajectory(task_id=f"maze:{seed}", group_id=seed, seed=seed, segments=[], turn_rewards=[reward],
                      num_turns=1, stop_reason="done", adapter_version=1, success=success,
                      info={"rewards": {"task": reward}})


def test_eval_summary_by_hand_with_pass_at_k():
    # Two seeds, three samples each: seed 0 solved once, seed 1 never.
    trajs = [_traj(0, False, 0.0), _traj(0, True, 1.0), _traj(0, False, 0.0)] + [_traj(1, False, 0.5)] * 3
    stats = RolloutStats(episodes=6, turns=6, generated_tokens=0, prompt_tokens=0, engine_calls=1, wall_s=1.0,
                         engine_s=1.0, success_rate=1 / 6, mean_reward=2.5 / 6, mean_turns=1.0, parse_errors=0,
                         stop_reasons={"done": 6})
    out = eval_summary(trajs, stats, samples=3)
    assert out["pass_at_3"] == 0.5 and out["solved_seeds"] == [0] and out["samples"] == 3
    assert out["success_rate"] == 1 / 6 and out["episodes"] == 6 and out["stop_reasons"] == {"done": 6}
    assert out["rewards"] == {"task": 2.5 / 6}
    assert "pass_at_1" not in eval_summary(trajs, stats)


def test_eval_summary_counts_the_episodes_that_called_a_tool_and_had_one_answered():
    calls = [(0, {}), (2, {"bad_arguments": 2}), (2, {"bad_arguments": 1}), (1, {})]
    trajs = [Trajectory(task_id=f"calc:{i}", group_id=i, seed=i, segments=[], turn_rewards=[0.0], num_turns=1,
                        stop_reason="done", adapter_version=0, success=False, tool_calls=n, tool_errors=errors)
             for i, (n, errors) in enumerate(calls)]
    stats = RolloutStats(episodes=4, turns=4, generated_tokens=0, prompt_tokens=0, engine_calls=1, wall_s=1.0,
                         engine_s=1.0, success_rate=0.0, mean_reward=0.0, mean_turns=1.0, parse_errors=0,
                         stop_reasons={"done": 4}, tool_calls=5, tool_errors={"bad_arguments": 3})
    out = eval_summary(trajs, stats)
    # Called: episodes 1, 2, 3; answered (a call without an error): 2 and 3.
    assert (out["tool_calls"], out["episodes_calling"], out["episodes_with_a_call_answered"]) == (5, 0.75, 0.5)
    assert "tool_calls" not in eval_summary(trajs, RolloutStats(**{**stats.__dict__, "tool_calls": None}))


def test_resolve_names_what_it_needs(tmp_path, tiny_vl):
    with pytest.raises(FileNotFoundError, match="neither a run folder"):
        resolve(str(tmp_path))
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 4, "lora_alpha": 8, "base_model_name_or_path": "x"}))
    cfg, found, run_dir = resolve(str(adapter), model=str(tiny_vl), overrides=["--env.options", "{size: 7}"])
    assert (found, run_dir, cfg.lora.rank, cfg.model) == (str(adapter), None, 4, str(tiny_vl))
    assert cfg.env.options == {"size": 7}
    assert main(["eval", str(tmp_path / "none")]) == 2


def _episodes(path, label=None):
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    return {e["seed"]: [t["reply"] for t in e["turns"]] for e in lines if label is None or e["label"] == label}


def _last_json(capsys):
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_select_takes_last_or_best_and_names_anything_else():
    import grpo
    from grpo.config import ConfigError

    assert grpo.RunConfig(model="m").eval.select == "last"
    assert grpo.RunConfig(model="m", eval={"select": "best"}).eval.select == "best"
    with pytest.raises(ConfigError, match="EvalConfig.select='median' is not allowed: 'last'.*'best'"):
        grpo.RunConfig(model="m", eval={"select": "median"})


@pytest.mark.slow
def test_the_best_validated_adapter_is_tested_kept_exported_and_evaluated_as_the_run_did(tmp_path, capsys):
    """eval.select best on a run trained against its own validation (a format reward of -1 pays the maze warm
    start to stop replying moves): it ends below where it started, the test set scores the best validated
    adapter, kept in the store past garbage collection; `grpo export` and `grpo eval` take that adapter, and
    `grpo eval` reproduces the run's own evals of it and of the base episode for episode."""
    import grpo
    from examples.maze import maze_config
    from grpo.tools.export import export
    from sync import AdapterStore

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
    printed = capsys.readouterr().out
    assert "greedy success, 6 validation seeds, after training" in printed and str(out.resolve()) in printed

    selected = summary["selected"]
    validation = [summary["eval_before"]] + [summary["evals"][str(s)]["success_rate"] for s in range(1, 4)]
    # The objective pays for unreadable replies: the precondition of this test is a run that got worse.
    assert validation[3] < max(validation), f"validation before and after steps 1-3: {validation}"
    assert selected["last_step_validation"] == validation[3]  # the last step's eval, measured again after it
    best_step = validation.index(max(validation))  # the earliest of the highest
    assert (selected["rule"], selected["step"], selected["last_step"]) == ("best", best_step, 3)
    line = next(x for x in printed.splitlines() if x.startswith("adapter (eval.select best)"))
    assert " ".join(line.split()) == (f"adapter (eval.select best) step {best_step}'s, validated above step 3's "
                                      f"{validation[3]:.1%}")
    # Served again at the end, it validates as it did when it was picked (greedy decoding, the same seeds).
    assert selected["validation"] == selected["validation_at_step"] == max(validation) == summary["eval_after"]

    store = AdapterStore(out / "store")
    best = selected["adapter_version"]
    # Versions: v1 the start, one a step: the best is the version served after its step, kept by its lease while
    # garbage collection took every other version but the newest three.
    assert summary["adapter_version"] == best == best_step + 1
    assert [v.version for v in store.versions()] == sorted({best, 2, 3, 4})
    assert store.readers() == [f"best-v{best:06d}"] and summary["adapter_path"] == store.verify(best).path
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

    # `grpo eval` serves the same adapter and replies as the run's eval of it did, turn for turn.
    assert main(["eval", str(out)]) == 0
    again = _last_json(capsys)
    assert Path(again["adapter"]).resolve() == Path(summary["adapter_path"]).resolve()
    for key in ("success_rate", "mean_reward", "mean_turns", "stop_reasons", "episodes", "solved_seeds"):
        assert again[key] == summary["eval_after_detail"][key], key
    trained = _episodes(out / "eval" / f"v{best:06d}.jsonl")
    assert trained == _episodes(out / "eval_samples.jsonl", "selected") and len(trained) == 6
    assert main(["eval", str(out), "--base"]) == 0
    base = _last_json(capsys)
    assert base["adapter"] is None and base["success_rate"] == summary["eval_before"]
    untrained = _episodes(out / "eval" / "base.jsonl")
    assert untrained == _episodes(out / "eval_samples.jsonl", "before")
    # The eval serves the adapter it names: a trained one replies otherwise than the base; the starting adapter
    # (LoRA B = 0) as the base does.
    assert (untrained != trained) == (best_step > 0)
    print(json.dumps({"validation": validation, "selected": selected, "test_before": summary["test_before"],
                      "test_after": summary["test_after"]}))


def test_a_corrupt_adapter_is_refused_with_one_that_verifies(tmp_path, tiny_vl, capsys):
    import torch

    from grpo.driver.eval import verified
    from grpo.driver.fault import flip_byte
    from sync import AdapterStore, AdapterStoreError

    store = AdapterStore(tmp_path / "store")
    config = {"r": 4, "lora_alpha": 8, "base_model_name_or_path": str(tiny_vl), "peft_type": "LORA"}
    v1, v2 = (store.verify(store.publish({"w": torch.full((4, 4), float(v))}, config)).path for v in (1, 2))
    assert verified(v2) == v2
    flip_byte(Path(v2) / "adapter_model.safetensors")  # a flipped bit in the weights
    with pytest.raises(AdapterStoreError, match=f"sha256.*--adapter {v1} \\(v1, the newest that verifies\\)"):
        verified(v2)
    assert main(["eval", v2, "--model", str(tiny_vl)]) == 2
    err = capsys.readouterr().err
    assert f"grpo eval: {v2} is refused" in err and f"--adapter {v1}" in err and "resume the run" in err
    outside = tmp_path / "mine"  # an adapter folder of the user's, outside a store: no checksum to check
    outside.mkdir()
    assert verified(str(outside)) == str(outside)

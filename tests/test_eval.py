"""`grpo eval`: the figures by hand, and on a real run's folder the trainer's own evals, episode for
episode (the maze warm start, a tiny Qwen3-VL: real vLLM, Ray and FSDP)."""
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


@pytest.mark.slow
def test_eval_reproduces_the_runs_evals_episode_for_episode(tmp_path, capsys):
    import grpo
    from examples.maze import maze_config

    # The maze warm start (31% on the 64 eval mazes): some seeds solved, and rewards that differ in a group.
    out = tmp_path / "run"
    summary = grpo.Trainer(grpo.RunConfig(
        model=str(maze_config.WARMSTART), output_dir=str(out), steps=1, tasks_per_step=2,
        # 10 turns (not 30) keep the test short; the replies, not the successes, are compared.
        env={"name": "maze", "options": dict(maze_config.ENV_OPTIONS, max_turns=10, progress_reward=0.1)},
        algorithm={"group_size": 4}, lora={"rank": 8, "alpha": 16.0},
        train={"lr": 2e-2, "micro_batch_size": 64},
        rollout={"temperature": 0.7, "max_tokens_per_turn": maze_config.MAX_TOKENS_PER_TURN,
                 "history": maze_config.HISTORY}, engine={"max_model_len": 1024},
        eval={"seeds": "0-7"}, cluster={"train_ranks": 1}, metrics={"tensorboard": False, "plots": False})).fit()
    printed = capsys.readouterr().out
    assert "greedy success, 8 validation seeds, after training" in printed and str(out.resolve()) in printed

    assert main(["eval", str(out)]) == 0
    after = _last_json(capsys)
    assert Path(after["adapter"]).resolve() == Path(summary["adapter_path"]).resolve()
    for key in ("success_rate", "mean_reward", "mean_turns", "stop_reasons", "episodes", "solved_seeds"):
        assert after[key] == summary["eval_after_detail"][key], key
    trained = _episodes(out / "eval" / "v000002.jsonl")
    assert trained == _episodes(out / "eval_samples.jsonl", "after") and len(trained) == 8

    assert main(["eval", str(out), "--base"]) == 0
    base = _last_json(capsys)
    assert base["adapter"] is None and base["success_rate"] == summary["eval_before"]
    untrained = _episodes(out / "eval" / "base.jsonl")
    assert untrained == _episodes(out / "eval_samples.jsonl", "before")
    # The adapters differ in what they reply: the eval serves the one it names.
    assert untrained != trained


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

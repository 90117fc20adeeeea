"""The maze example's configs: the CPU run matches what the warm start was trained on, the GPU recipe
validates without a GPU, and every evaluation maze is solvable within each turn limit."""
from pathlib import Path

import pytest

from envs.maze import maze_stats
from examples.maze import maze_config
from grpo import train
from grpo.config import RunConfig

HERE = Path(__file__).resolve().parents[1] / "examples" / "maze"


def test_cpu_config_matches_the_warm_start_options():
    cfg = RunConfig.from_yaml(HERE / "cpu.yaml")
    assert cfg.env.name == maze_config.ENV and cfg.env.options == maze_config.GRPO_ENV_OPTIONS
    assert cfg.rollout.history == maze_config.HISTORY
    assert cfg.rollout.max_tokens_per_turn == maze_config.MAX_TOKENS_PER_TURN
    assert cfg.eval_seeds == list(maze_config.EVAL_SEEDS)
    assert cfg.unseen_seeds == list(maze_config.UNSEEN_SEEDS)
    assert cfg.train_seed_offset >= maze_config.TRAIN_SEED_BASE
    assert cfg.eval.target_success == 0.95


@pytest.mark.parametrize("name", ["cpu.yaml", "qwen3_vl_8b.yaml"])
def test_every_eval_maze_is_solvable_within_the_turn_limit(name):
    cfg = RunConfig.from_yaml(HERE / name)
    opts = cfg.env.options
    for seeds in (cfg.eval_seeds, cfg.unseen_seeds):
        stats = maze_stats(seeds, size=opts["size"], max_turns=opts["max_turns"])
        assert stats["solvable"] == len(seeds)


def test_gpu_recipe_matches_the_seed_and_validates_without_a_gpu(capsys):
    cfg = RunConfig.from_yaml(HERE / "qwen3_vl_8b.yaml")
    assert cfg.lora.rank == 32 and cfg.group_size == 8 and cfg.algorithm.kl_coef == 0.0
    assert cfg.env.options["size"] == 9 and cfg.rollout.temperature == 0.7 == cfg.train.temperature
    assert cfg.cluster.colocate and cfg.cluster.train_ranks > 1
    assert train.main([str(HERE / "qwen3_vl_8b.yaml"), "--dry-run"]) == 0
    assert '"valid": true' in capsys.readouterr().out


def test_cpu_run_is_the_seeds_recipe_sparse_reward_episode_advantages_one_temperature():
    cfg = RunConfig.from_yaml(HERE / "cpu.yaml")
    assert cfg.env.options.get("progress_reward", 0) == 0 and cfg.env.options.get("format_reward", 0) == 0
    assert cfg.algorithm.step_weight == 0
    assert cfg.rollout.temperature == cfg.train.temperature
    assert cfg.unseen_seeds and cfg.eval.target_success == 0.95


def test_ablation_variants_add_shaping_then_step_level_advantages():
    from examples.maze import ablate

    runs = {name: RunConfig.from_yaml(HERE / "cpu.yaml", flags) for name, flags in ablate.VARIANTS.items()}
    assert list(runs) == ["outcome", "shaping", "step_level"]
    assert [r.env.options.get("progress_reward", 0) for r in runs.values()] == [0, maze_config.PROGRESS_REWARD,
                                                                                 maze_config.PROGRESS_REWARD]
    assert [r.algorithm.step_weight for r in runs.values()] == [0, 0, 1.0]


def test_ablation_curve_and_table_from_a_summary():
    from examples.maze import ablate

    summary = {"eval_before": 0.4375, "eval_after": 0.96875, "unseen_after": 0.90625, "steps": 6, "grpo_wall_s": 412.4,
               "evals": {"2": {"success_rate": 0.5}, "4": {"success_rate": 0.75}, "6": {"success_rate": 0.953125}},
               "first_step_rollout_success": 0.390625, "last_step_rollout_success": 0.9375,
               "zero_signal_share_first_step": 0.25, "zero_signal_share_last_step": 0.75}
    # the final eval (after training) replaces the periodic one at the last step
    assert ablate.eval_curve(summary) == [(0, 0.4375), (2, 0.5), (4, 0.75), (6, 0.96875)]
    row = ablate.table({"outcome": summary}).splitlines()[-1]
    assert row == "| outcome | 43.8% | 96.9% | 90.6% | 39.1% -> 93.8% | 25.0% -> 75.0% | 412 s |"

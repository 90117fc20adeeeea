"""The maze example's configs: the CPU run matches what the warm start was trained on, the GPU recipe
validates without a GPU, and every evaluation maze is solvable within each turn limit."""
from pathlib import Path

import pytest

from envs.maze import maze_stats
from examples.maze import maze_config
from grpo import train
from grpo.run_config import RunConfig

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

"""The maze example's configs: the warm start reads its options from the CPU run, the GPU recipe validates
without a GPU, and every evaluation maze is solvable within each turn limit."""
import dataclasses
import json
from pathlib import Path

import pytest

from envs.maze import EVAL_SEEDS, maze_stats
from examples.maze import maze_config
from grpo import train
from grpo.config import RunConfig

HERE = Path(__file__).resolve().parents[1] / "examples" / "maze"


def test_the_warm_start_reads_its_options_from_the_cpu_run():
    cfg = RunConfig.from_yaml(HERE / "cpu.yaml")
    assert maze_config.CPU_RUN == cfg
    # The values the shipped warm start (examples/maze/warmstart) was trained on: changing one means
    # rebuilding it (python -m examples.maze.sft).
    # turn_cost only changes the reward, which the warm start's supervised data never sees.
    assert (maze_config.ENV, maze_config.ENV_OPTIONS) == ("maze", {"size": 9, "cell_px": 8, "max_turns": 30,
                                                                   "turn_cost": 0.01})
    assert (maze_config.SIZE, maze_config.CELL_PX, maze_config.MAX_TURNS) == (9, 8, 30)
    assert (maze_config.HISTORY, maze_config.MAX_TOKENS_PER_TURN) == ("none", 8)
    assert maze_config.EVAL_SEEDS == list(EVAL_SEEDS)
    assert len(maze_config.TEST_SEEDS) == 64 and not set(maze_config.TEST_SEEDS) & set(maze_config.EVAL_SEEDS)
    assert maze_config.SFT_GATE_SEEDS == list(range(10_000, 10_064))
    assert maze_config.TRAIN_SEED_BASE == 1_000_000 and cfg.eval.target_success == 0.95


def test_cpu_run_learning_rate_is_the_cosine_over_its_steps():
    # The figures of the schedule when cpu.yaml also set train.total_steps: 16, to the last digit.
    cfg = RunConfig.from_yaml(HERE / "cpu.yaml")
    assert cfg.steps == 16
    assert [cfg.train.lr_at(s, cfg.steps) for s in range(18)] == [
        0.001, 0.002, 0.002, 0.001977435120963641, 0.0019108719811121771, 0.0018036483342212268,
        0.0016611408216728604, 0.0014904953652058021, 0.001300268840560683, 0.0011, 0.0008997311594393172,
        0.0007095046347941978, 0.0005388591783271399, 0.00039635166577877323, 0.00028912801888782293,
        0.00022256487903635875, 0.0002, 0.0002]


@pytest.mark.parametrize("name", ["cpu.yaml", "qwen3_vl_8b.yaml"])
def test_every_eval_maze_is_solvable_within_the_turn_limit(name):
    cfg = RunConfig.from_yaml(HERE / name)
    opts = cfg.env.options
    for seeds in (cfg.eval_seeds, cfg.test_seeds):
        stats = maze_stats(seeds, size=opts["size"], max_turns=opts["max_turns"])
        assert stats["solvable"] == len(seeds)


def test_gpu_recipe_matches_the_seed_and_validates_without_a_gpu(capsys):
    cfg = RunConfig.from_yaml(HERE / "qwen3_vl_8b.yaml")
    assert cfg.lora.rank == 32 and cfg.group_size == 8 and cfg.algorithm.kl_coef == 0.0
    assert cfg.env.options["size"] == 9 and cfg.rollout.temperature == 0.7
    assert cfg.cluster.colocate and cfg.cluster.train_ranks > 1
    assert train.main([str(HERE / "qwen3_vl_8b.yaml"), "--dry-run"]) == 0
    assert '"valid": true' in capsys.readouterr().out


def test_cpu_run_is_the_task_reward_less_a_turn_cost_episode_advantages_one_temperature():
    cfg = RunConfig.from_yaml(HERE / "cpu.yaml")
    assert cfg.env.options.get("progress_reward", 0) == 0 and cfg.env.options.get("format_reward", 0) == 0
    assert cfg.env.options["turn_cost"] == 0.01
    assert cfg.algorithm.step_weight == 0
    assert cfg.rollout.temperature == 0.7 and not hasattr(cfg.train, "temperature")
    assert cfg.test_seeds and cfg.eval.target_success == 0.95


def test_ablation_variants_add_shaping_then_step_level_advantages():
    from examples.maze import ablate

    runs = {name: RunConfig.from_yaml(HERE / "cpu.yaml", flags) for name, flags in ablate.VARIANTS.items()}
    assert list(runs) == ["outcome", "shaping", "step_level"]
    assert [r.env.options.get("progress_reward", 0) for r in runs.values()] == [0, maze_config.PROGRESS_REWARD,
                                                                                 maze_config.PROGRESS_REWARD]
    assert [r.algorithm.step_weight for r in runs.values()] == [0, 0, 1.0]


def test_ablation_curve_and_table_from_a_summary():
    from examples.maze import ablate

    summary = {"eval_before": 0.4375, "eval_after": 0.96875, "test_after": 0.90625, "steps": 6, "grpo_wall_s": 412.4,
               "evals": {"2": {"success_rate": 0.5}, "4": {"success_rate": 0.75}, "6": {"success_rate": 0.953125}},
               "first_step_rollout_success": 0.390625, "last_step_rollout_success": 0.9375,
               "zero_signal_share_first_step": 0.25, "zero_signal_share_last_step": 0.75}
    # the final eval (after training) replaces the periodic one at the last step
    assert ablate.eval_curve(summary) == [(0, 0.4375), (2, 0.5), (4, 0.75), (6, 0.96875)]
    row = ablate.table({"outcome": summary}).splitlines()[-1]
    assert row == "| outcome | 43.8% | 96.9% | 90.6% | 39.1% -> 93.8% | 25.0% -> 75.0% | 412 s |"


def test_seed_runs_change_sampling_training_mazes_and_initialisation():
    from examples.maze import seeds

    configs = [RunConfig.from_yaml(HERE / "cpu.yaml", seeds.seed_flags(s)) for s in range(3)]
    assert [(c.seed, c.train_seed_offset, c.train.seed) for c in configs] == [
        (0, 1_000_000, 0), (1, 2_000_000, 1), (2, 3_000_000, 2)]
    default = RunConfig.from_yaml(HERE / "cpu.yaml")  # seed 0 is make maze's run
    assert (default.seed, default.train_seed_offset, default.train.seed) == (0, 1_000_000, 0)


def _seed_run(reached_at):
    """Step records of a run that evaluated at steps 2 and 4 (and reached 95% at `reached_at`, or not)."""
    evals = {2: 0.9 if reached_at != 2 else 0.953125, 4: 0.96875 if reached_at == 4 else 0.921875}
    metrics = [{"step": s, "rollout": {"groups_drawn": 16 + 8 * s, "groups_trained": 16 - s},
                **({"eval": {"success_rate": evals[s]}, "wall_s": 100.0 * s} if s in evals else {})}
               for s in (1, 2, 3, 4)]
    summary = {"eval_before": 0.40625, "eval_after": evals[4] if reached_at != 2 else evals[2],
               "test_after": 0.9375, "steps": 4 if reached_at != 2 else 2, "grpo_wall_s": 450.0,
               "evals": {str(s): {"success_rate": v} for s, v in evals.items()}}
    return summary, metrics


def test_seed_table_gives_each_seed_and_the_spread_over_seeds():
    from examples.maze import seeds

    runs = {0: _seed_run(4), 1: _seed_run(None)}
    assert seeds.reached(runs[0][1], 0.95) == {"step": 4, "wall_s": 400.0, "groups_drawn": 24 + 32 + 40 + 48,
                                               "groups_trained": 15 + 14 + 13 + 12}
    assert seeds.reached(runs[1][1], 0.95) == {"step": None, "wall_s": None, "groups_drawn": None,
                                               "groups_trained": None}
    rows = [seeds.row(s, summary, metrics, 0.95, group_size=8) for s, (summary, metrics) in runs.items()]
    assert (rows[0]["groups_drawn"], rows[0]["groups_trained"], rows[0]["draws_per_kept_group"]) == (144, 54, 2.67)
    lines = seeds.table(rows, 16).splitlines()
    assert lines[2] == ("| 0 | 0: 40.6%, 2: 90.0%, 4: 96.9% | 4 | 432 | 400 s | 96.9% | 93.8% | 144 / 54 (2.67) |")
    assert lines[3].startswith("| 1 | 0: 40.6%, 2: 90.0%, 4: 92.2% | not reached | - | - | 92.2% |")
    assert lines[4].startswith("| 1 of 2 reached 95% | | median 4.0, mean 4.0, 4.0-4.0 | median 432.0, mean 432.0, "
                               "432.0-432.0 | median 400.0 s")
    assert "median 94.5%, mean 94.5%, 92.2-96.9%" in lines[4]


def test_seed_table_goes_between_the_readme_markers(tmp_path):
    from examples.maze import seeds

    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n{seeds.BEGIN}\nold\n{seeds.END}\n\nafter\n")
    seeds.write_docs("| new |", readme)
    assert readme.read_text() == f"# x\n\n{seeds.BEGIN}\n| new |\n{seeds.END}\n\nafter\n"
    readme.write_text("# no markers\n")
    with pytest.raises(ValueError, match="maze-seeds"):
        seeds.write_docs("| new |", readme)


def test_the_pipelined_recipe_keeps_cpu_yamls_updates_and_evals_per_episode():
    from examples.maze import run

    base = RunConfig.from_yaml(HERE / "cpu.yaml")
    piped = RunConfig.from_yaml(HERE / "cpu.yaml", run.overrides_of(["--pipelined", "--steps", "40"]))
    assert (piped.pipeline.max_staleness, piped.cluster.colocate) == (1, False)
    assert (piped.output_dir, piped.steps) == ("runs/maze_pipelined", 40)  # not make maze's folder; flags win
    piped = dataclasses.replace(piped, steps=32)

    def per_episode(c):
        return (c.train.updates_per_batch / c.tasks_per_step, c.tasks_per_step * c.eval.every,
                c.tasks_per_step * c.train.warmup_steps, c.tasks_per_step * c.steps,
                c.tasks_per_step * c.checkpoint.every)
    assert per_episode(piped) == per_episode(base)
    assert piped.tasks_per_step < base.tasks_per_step


def _block(text: str, begin: str, end: str) -> str:
    assert begin in text and end in text, f"no {begin} block"
    return text.split(begin, 1)[1].split(end, 1)[0].strip()


def test_readme_maze_figures_are_what_the_result_files_hold():
    # The figures the two READMEs state are rendered from examples/maze/results/*.json, which the runs write.
    from examples.maze import baselines, seeds

    results = baselines.load_results()
    assert {"grpo", "sft"} <= set(results), "run python -m examples.maze.baselines"
    assert len(results["grpo"]["seeds"]) == 5 and all(len(r["seeds"]) >= 3 for r in results.values())
    for path, blocks in baselines.BLOCKS.items():
        for begin, end, render in blocks:
            assert _block(path.read_text(), begin, end) == render(results), f"{path}: rerun examples.maze.baselines"
    saved = json.loads((HERE / "results" / "seeds.json").read_text())
    readme = (HERE / "README.md").read_text()
    assert _block(readme, seeds.BEGIN, seeds.END) == seeds.table(saved["rows"], saved["tasks_per_step"])
    # The seed runs the table shows are the GRPO rows of the baselines, seed by seed.
    assert [r["test_after"] for r in saved["rows"]] == [r["test_after"] for r in results["grpo"]["seeds"]]

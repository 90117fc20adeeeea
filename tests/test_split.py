"""Training never draws a task the evaluations score: seeds that name the same task (a maze layout, a dataset
row) are skipped by the trainer's draw (envs/split.py), the maze example's sets share no test layout with any
training draw, and a dataset that leaves nothing to train on is refused before the run starts."""
import json

import pytest

import envs
from envs.base import Env, Observation
from envs.dataset import DatasetEnv
from envs.maze.layout import generate_maze
from envs.split import MAX_SKIP, HeldOut, SplitError, held_out, training_seeds
from grpo.config import RunConfig
from grpo.driver.preflight import check_run
from grpo.driver.state import TaskSampler


def _rows(n):
    return [{"prompt": f"What is {i}+1?", "answer": i + 1} for i in range(n)]


def _correct(prompt, completion, row):
    return float(str(row["answer"]) in completion)


class Tens(Env):
    """Seed s is task s % 10: ten tasks, any number of seeds."""

    def task_key(self, seed):
        return seed % 10

    def reset(self, seed):
        return Observation(str(seed % 10))

    def step(self, action_text):
        raise NotImplementedError


class Unkeyed(Tens):
    def task_key(self, seed):
        return None


def test_a_draw_skips_the_held_out_seeds_and_every_seed_of_their_tasks():
    env = Tens()
    skip = held_out(env, [3, 14])  # tasks 3 and 4
    assert skip == HeldOut(frozenset({3, 14}), frozenset({3, 4}))
    seeds, after = training_seeds(env, 100, 8, skip)
    assert seeds == [100, 101, 102, 105, 106, 107, 108, 109] and after == 110
    # An env that keys no task: only the held-out seeds themselves are skipped.
    assert training_seeds(Unkeyed(), 12, 4, held_out(Unkeyed(), [13, 14])) == ([12, 15, 16, 17], 18)


def test_a_draw_with_no_task_left_stops_with_the_reason():
    env = Tens()
    with pytest.raises(SplitError, match="eval.seeds or eval.test_seeds"):
        training_seeds(env, 0, 1, held_out(env, range(10)))
    assert MAX_SKIP == 10_000


def test_sampler_resumes_at_its_cursor_with_the_same_draws():
    whole = TaskSampler("maze", {"size": 7}, 1_000_000, 0, held_out=range(64))
    first = [t.seed for t in whole.take(40)]
    part = TaskSampler("maze", {"size": 7}, 1_000_000, 0, held_out=range(64))
    head = [t.seed for t in part.take(15)]
    rest = [t.seed for t in TaskSampler("maze", {"size": 7}, 1_000_000, part.cursor, held_out=range(64)).take(25)]
    assert head + rest == first
    # Size 7 has 768 layouts: 64 eval mazes hold ~8% of them, so the draw skips some seeds and its cursor says so.
    held = {generate_maze(7, s).key for s in range(64)}
    assert not held & {generate_maze(7, s).key for s in first}
    assert whole.cursor == first[-1] + 1 - 1_000_000 > 40


def test_maze_seeds_that_draw_one_layout_share_its_key():
    env = envs.make("maze", size=9)
    by_key = {}
    for seed in range(3000):
        by_key.setdefault(env.task_key(seed), []).append(seed)
    same = [seeds for seeds in by_key.values() if len(seeds) > 1]
    assert same  # 3000 seeds over 401,408 layouts: about 11 pairs expected
    a, b = same[0][:2]
    assert generate_maze(9, a) == generate_maze(9, b)
    assert len(by_key) == len({generate_maze(9, s) for s in range(3000)})


def test_dataset_env_with_default_options_never_trains_on_an_eval_row():
    env = DatasetEnv(_rows(100), rewards=_correct)  # holdout 0: the draw cycles through all 100 rows
    cfg = RunConfig(model="m", env={"name": "dataset", "options": {"data": _rows(100), "rewards": _correct}})
    sampler = TaskSampler("dataset", cfg.env.options, cfg.train_seed_offset, held_out=cfg.held_out_seeds)
    rows = {env.row_index(t.seed) for t in sampler.take(1000)}
    assert rows == set(range(64, 100))  # every row but the 64 that eval.seeds 0-63 score
    # The same draw without the split would have trained on them.
    assert {env.row_index(cfg.train_seed_offset + i) for i in range(1000)} == set(range(100))


def test_dataset_env_test_rows_are_skipped_too():
    env = DatasetEnv(_rows(200), rewards=_correct)
    sampler = TaskSampler("dataset", {"data": _rows(200), "rewards": _correct}, 1_000_000,
                          held_out=list(range(64)) + list(range(150, 160)))
    rows = {env.row_index(t.seed) for t in sampler.take(2000)}
    assert rows == set(range(64, 150)) | set(range(160, 200))


def test_a_dataset_the_evals_cover_is_refused_before_the_run(tmp_path):
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in _rows(64)))
    cfg = RunConfig(model=str(tmp_path), env={"name": "dataset", "options": {
        "data": str(data), "rewards": "test_split:_correct"}})
    with pytest.raises(SplitError, match="more rows than eval.seeds and eval.test_seeds"):
        check_run(cfg, files=False)


def test_test_seeds_that_are_also_eval_seeds_are_refused():
    with pytest.raises(ValueError, match="test_seeds=.60-70. is not allowed: seeds apart from eval.seeds"):
        RunConfig(model="m", eval={"seeds": "0-63", "test_seeds": "60-70"})


@pytest.mark.slow
def test_maze_example_test_set_shares_no_layout_with_any_training_draw_or_validation():
    from envs.maze import overlap

    report = overlap.overlap(overlap.example_sets())
    assert report["test_vs_training"] == 0 and report["test_vs_validation"] == 0
    assert report["sets"]["test"] == {"seeds": 64, "layouts": 64}
    for seed in range(5):
        assert report["shared_layouts"][f"test~grpo_seed{seed}"] == 0
        assert report["shared_layouts"][f"validation~grpo_seed{seed}"] == 0
    # The shipped warm start's vision phase drew before the split existed: it holds validation layouts
    # (reported, not hidden), never a test one.
    assert report["shared_layouts"]["test~sft_expert_vision"] == 0
    assert report["validation_vs_training"]["sft_expert_vision"] == 15

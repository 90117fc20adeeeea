"""The maze warm start: the SFT code on a tiny setting, and the checkpoint the repo ships."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from examples.maze import maze_config as mc
from examples.maze import sft

WARMSTART = mc.WARMSTART


def _log(path: Path) -> list[dict]:
    return [json.loads(line) for line in (path / "sft_log.jsonl").read_text().splitlines()]


def test_block_labels_match_the_expert_and_the_walls_everywhere():
    import envs
    from envs.maze import expert_action

    env = envs.make("maze", **mc.ENV_OPTIONS)
    env.reset(1_000_003)
    labels = sft.block_labels(env.maze)
    for r in range(mc.SIZE):
        for c in range(mc.SIZE):
            move = labels.move[r * mc.SIZE + c].item()
            if not env.maze.is_open((r, c)):
                assert move == sft.IGNORE
                continue
            text = expert_action(env.maze, (r, c))
            assert text == ("('stop', 'stop')" if move == sft.STOP_CLASS else f"('move', {move})")
            for d, (dr, dc) in enumerate([(0, 1), (-1, 0), (0, -1), (1, 0)]):  # right, up, left, down
                assert labels.open[r * mc.SIZE + c, d].item() == float(env.maze.is_open((r + dr, c + dc)))


def test_training_states_never_use_an_eval_maze():
    import random

    import envs

    env = envs.make("maze", **mc.ENV_OPTIONS)
    stream = sft.state_stream(mc.ENV_OPTIONS, 0.3, 0.5, 12, random.Random(0), buffer=64)
    assert next(stream).labels is not None
    assert sft.VISION_SEED_BASE >= mc.TRAIN_SEED_BASE > max(mc.SFT_GATE_SEEDS) > max(mc.EVAL_SEEDS)
    placed = next(sft.placed_states(mc.ENV_OPTIONS, [sft.VISION_SEED_BASE], random.Random(0)))
    env.reset(sft.VISION_SEED_BASE)
    r, c = divmod(placed.agent, mc.SIZE)
    assert env.maze.is_open((r, c)) and placed.image.size == (mc.SIZE * mc.CELL_PX,) * 2


class _LabelHead(torch.nn.Module):
    """Stands in for the tower's linear head: logits that pick `moves` (one per block, mazes in order)."""

    def __init__(self, moves: torch.Tensor):
        super().__init__()
        self.moves = moves

    def forward(self, vision: torch.Tensor) -> torch.Tensor:
        logits = torch.zeros(len(vision), 10)
        logits[torch.arange(len(vision)), self.moves.clamp(min=0)] = 1.0
        return logits


def test_tower_map_scores_an_oracle_head_one_and_a_constant_head_by_hand(tmp_path, tiny_vl_maze):
    from envs.maze import generate_maze, shortest_path
    from grpo.learner.forward import load_model, load_processor

    path = tiny_vl_maze
    model, processor = load_model(path), load_processor(path)
    cfg = sft.SFTConfig(out=str(tmp_path / "o"), eval_episodes=4)
    mazes = [generate_maze(mc.SIZE, s) for s in cfg.eval_seeds]
    truth = torch.cat([sft.block_labels(m).move for m in mazes])
    assert sft.tower_map(model, _LabelHead(truth), processor, cfg) == {
        "open_accuracy": 1.0, "path_accuracy": 1.0, "path_perfect": 1.0}

    # Always "right": correct exactly where the expert moves right; no path ends in a right move (the stop).
    got = sft.tower_map(model, _LabelHead(torch.zeros_like(truth)), processor, cfg)
    on = truth != sft.IGNORE
    path_moves = [sft.block_labels(m).move[[r * mc.SIZE + c for r, c in shortest_path(m)]] for m in mazes]
    assert got["open_accuracy"] == round(float((truth[on] == 0).float().mean()), 4)
    assert got["path_accuracy"] == round(float((torch.cat(path_moves) == 0).float().mean()), 4)
    assert got["path_perfect"] == 0.0


def test_a_few_steps_learn_save_and_reload_deterministically(tmp_path):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    # Four turns per episode and 4 eval mazes keep the evaluations short; band 0..1 keeps the first one.
    cfg = dict(batch_size=4, vision_steps=4, max_steps=8, eval_every=8, warmup_steps=1, lr=3e-3, max_turns=4,
               eval_episodes=4, held_states=8, greedy_from=0.0, band_low=0.0, stop_at=0.0, band_high=1.0)
    result = sft.train(sft.SFTConfig(out=str(tmp_path / "a"), **cfg))
    assert result["step"] == 8 and 0.0 <= result["eval_success"] <= 1.0
    steps = [r for r in _log(tmp_path / "a") if "step" in r and "loss" in r]
    assert len(steps) == 8
    first, last = steps[0]["loss"], steps[-1]["loss"]
    assert last < 0.7 * first, (first, last)
    assert all(r["aux_loss"] is not None for r in steps)
    vision = [r for r in _log(tmp_path / "a") if "vision_step" in r]
    assert [r["vision_step"] for r in vision] == [1, 2, 3, 4]
    assert "path_perfect" in vision[-1] and "path_perfect" not in vision[0]  # the map check ends the phase

    model = AutoModelForImageTextToText.from_pretrained(tmp_path / "a")
    processor = AutoProcessor.from_pretrained(tmp_path / "a")
    assert processor.image_processor.patch_size == 4
    assert not list((tmp_path / "a").glob("tiny_model.json"))  # not mistaken for an untrained build
    assert sum(p.numel() for p in model.parameters()) < 1_000_000

    again = sft.train(sft.SFTConfig(out=str(tmp_path / "b"), **cfg))
    steps_b = [r for r in _log(tmp_path / "b") if "step" in r and "loss" in r]
    assert [r["loss"] for r in steps_b] == [r["loss"] for r in steps]
    assert again["eval_success"] == result["eval_success"]


def test_the_maze_prompt_is_short_and_one_image_token_per_block(tiny_vl_maze):
    import envs
    from grpo.learner.forward import expand, load_processor

    path = tiny_vl_maze
    enc = sft.Encoder(load_processor(path))
    first = envs.make("maze", **mc.ENV_OPTIONS).reset(0)
    ids = enc.prompt(first.text)
    assert len(ids) < 140  # the rules are about 110 words; each a token
    assert max(len(enc.target(a)) for a in ("('move', 0)", "('stop', 'stop')")) <= mc.MAX_TOKENS_PER_TURN
    expanded = expand(enc.processor, ids, first.images)
    assert int((expanded.input_ids == enc.processor.image_token_id).sum()) == mc.SIZE * mc.SIZE


needs_warmstart = pytest.mark.skipif(not (WARMSTART / "config.json").is_file(),
                                     reason="no shipped warm start: python -m examples.maze.sft")


@needs_warmstart
def test_shipped_warmstart_matches_its_log():
    from grpo.learner.forward import load_model, load_processor

    log = _log(WARMSTART)
    result = next(r["result"] for r in log if "result" in r)
    chosen = next(r["eval"] for r in log if "eval" in r and r["eval"]["step"] == result["step"])
    # Every option the warm start saw; turn_cost changes only the reward, which supervised data never sees.
    assert all(result["options"][k] == v for k, v in mc.ENV_OPTIONS.items() if k != "turn_cost")
    assert 0.30 <= result["eval_success"] <= 0.60
    assert sum(f.stat().st_size for f in WARMSTART.iterdir()) < 10 << 20
    # The recipe's second run made it, and its greedy failures are navigation: out of turns, few unparseable
    # replies among their turns.
    assert {k: result["options"][k] for k in sft.HABIT_STAGE} == sft.HABIT_STAGE
    failed = 64 - len(chosen["solved"])
    assert chosen["ended"].get("out_of_turns", 0) >= 0.9 * failed
    assert chosen["parse_errors"] < 0.05 * failed * mc.MAX_TURNS

    torch.set_num_threads(1)
    model, enc = load_model(WARMSTART), sft.Encoder(load_processor(WARMSTART))
    seeds = range(8)
    got = {e["seed"] for e in sft.greedy_episodes(model, enc, seeds, mc.ENV_OPTIONS) if e["success"]}
    want = {s for s in chosen["solved"] if s in seeds}
    # Same torch build and threads: the same episodes. Elsewhere a near tie may flip one.
    assert len(got ^ want) <= 1, (sorted(got), sorted(want))


@needs_warmstart
@pytest.mark.slow
def test_vllm_greedy_episodes_of_the_warmstart_are_the_logged_ones(session_dir):
    """The number GRPO starts from is vLLM's: its greedy episodes must be the ones the SFT log counted."""
    from rollout.engine import EngineConfig
    from rollout.worker import RolloutWorker, Task

    log = _log(WARMSTART)
    result = next(r["result"] for r in log if "result" in r)
    chosen = next(r["eval"] for r in log if "eval" in r and r["eval"]["step"] == result["step"])
    seeds = mc.EVAL_SEEDS[:16]  # the engine's per-turn cost, not the episode count, sets the time
    worker = RolloutWorker(EngineConfig(model=str(WARMSTART), enable_lora=False, dtype="float32"),
                           run_dir=str(session_dir))
    try:
        tasks = [Task(mc.ENV, s, dict(mc.ENV_OPTIONS)) for s in seeds]
        trajectories, _ = worker.rollout(tasks, 1, mc.rollout_config(), greedy=True)
    finally:
        worker.shutdown()
    got = {t.seed for t in trajectories if t.success}
    want = {s for s in chosen["solved"] if s in seeds}
    assert len(got ^ want) <= 1, (sorted(got), sorted(want))


def test_habit_labels_its_move_only_where_the_expert_goes_its_way_and_its_move_is_open():
    import random

    from envs.maze import expert_action, generate_maze

    maze = generate_maze(mc.SIZE, 1_000_000)
    habit = sft.Habit(when=0, move=2, rate=1.0)  # the expert goes right, left is open: left
    opened = [(r, c) for r in range(mc.SIZE) for c in range(mc.SIZE) if maze.is_open((r, c))]
    where = [b for b in opened if expert_action(maze, b) == "('move', 0)" and maze.is_open((b[0], b[1] - 1))]
    assert where and len(where) < len(opened)
    rng = random.Random(0)
    for block in opened:
        assert habit.applies(maze, block) == (block in where)
        assert habit.label(maze, block, rng) == ("('move', 2)" if block in where else expert_action(maze, block))
        assert sft.NO_HABIT.label(maze, block, rng) == expert_action(maze, block)
    # rate 0.55: the habit's move in about 55% of 2000 draws at one such block
    half = sft.Habit(when=0, move=2, rate=0.55)
    share = sum(half.label(maze, where[0], rng) == "('move', 2)" for _ in range(2000)) / 2000
    assert 0.5 < share < 0.6


@pytest.mark.parametrize("when,move,rate", [(0, 0, 0.5), (4, 2, 0.5), (0, 2, 1.5)])
def test_habit_rejects_what_is_not_a_habit(when, move, rate):
    with pytest.raises(ValueError, match="habit_"):
        sft.Habit(when, move, rate)

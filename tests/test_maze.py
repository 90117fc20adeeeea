import hashlib
import json
import random
import subprocess
import sys
from collections import Counter, deque

import numpy as np
import pytest
from PIL import Image

from envs.maze import (
    EVAL_SEEDS,
    Maze,
    MazeEnv,
    action_text,
    expert_action,
    expert_actions,
    generate_maze,
    maze_stats,
    shortest_path,
)
from envs.maze.env import main
from envs.maze.render import AGENT, PATH, TARGET, WALL

STOP = action_text("stop")

# A hand-made layout: the only route from the start (1, 1) to the target (3, 1) goes right twice, down
# twice, left twice.
#   #####
#   #A..#
#   ###.#
#   #T..#
#   #####
HAND_MAZE = Maze(rows=("#####", "#...#", "###.#", "#...#", "#####"), start=(1, 1), target=(3, 1))


def open_blocks(maze):
    return {(r, c) for r in range(maze.size) for c in range(maze.size) if maze.is_open((r, c))}


def pixel(image, block, cell_px, dx=0.0, dy=0.0):
    """The pixel at a block's centre, offset by (dx, dy) blocks."""
    row, col = block
    return image.getpixel((int((col + 0.5 + dx) * cell_px), int((row + 0.5 + dy) * cell_px)))


def test_same_seed_gives_same_maze_and_image_and_seeds_differ():
    a, b = MazeEnv(), MazeEnv()
    obs_a, obs_b = a.reset(17), b.reset(17)
    assert a.maze == b.maze
    assert obs_a.images[0].tobytes() == obs_b.images[0].tobytes()
    assert generate_maze(9, np.int64(17)) == a.maze
    with pytest.raises(TypeError):
        generate_maze(9, "17")  # random.Random would hash the string: a different maze from seed 17
    layouts = {generate_maze(9, seed) for seed in EVAL_SEEDS}
    assert len(layouts) > 60  # 64 draws from ~100k spanning trees x 4 corner pairs: almost all distinct


def test_golden_layout_and_image_bytes():
    # Any drift in the RNG use, Wilson's walk, the corner choice or the drawing changes these.
    assert generate_maze(7, 3).ascii() == "\n".join(
        ["#######", "#.#..T#", "#.#.#.#", "#...#.#", "#.#####", "#A....#", "#######"]
    )
    image = MazeEnv().reset(0).images[0]
    assert (image.size, image.mode) == ((288, 288), "RGB")
    digest = hashlib.sha256(image.tobytes()).hexdigest()
    assert digest == "0183f2b84b427e0385a9a15a83af514eef27a86faaa0c8e64fed2aa31fe436b6"


@pytest.mark.parametrize("size", [5, 7, 9, 11])
def test_every_maze_is_perfect(size):
    n = (size - 1) // 2
    for seed in EVAL_SEEDS:
        maze = generate_maze(size, seed)
        blocks = open_blocks(maze)
        cells = {(2 * r + 1, 2 * c + 1) for r in range(n) for c in range(n)}
        assert cells <= blocks
        assert all(0 < r < size - 1 and 0 < c < size - 1 for r, c in blocks)  # border walls
        assert not any(r % 2 == 0 and c % 2 == 0 for r, c in blocks)  # grid corners are always walls
        edges = sum((r, c + 1) in blocks for r, c in blocks) + sum((r + 1, c) in blocks for r, c in blocks)
        seen, queue = {maze.start}, deque([maze.start])
        while queue:
            r, c = queue.popleft()
            for nxt in ((r + 1, c), (r - 1, c), (r, c + 1), (r, c - 1)):
                if nxt in blocks and nxt not in seen:
                    seen.add(nxt)
                    queue.append(nxt)
        # Connected with |E| = |V| - 1 is a tree: exactly one path between any two blocks.
        assert seen == blocks
        assert edges == len(blocks) - 1


def test_wilson_samples_spanning_trees_uniformly():
    # The 3 x 3 cell grid has 192 spanning trees. A uniform sampler hits all of them and its chi-square
    # statistic (191 degrees of freedom, sd ~19.5) stays near 191; a DFS backtracker's bias towards long
    # corridors pushes it far above 289, five sd out.
    counts = Counter(generate_maze(7, seed).rows for seed in range(9600))
    assert len(counts) == 192
    expected = 9600 / 192
    assert sum((k - expected) ** 2 / expected for k in counts.values()) < 289


def test_agent_and_target_in_opposite_corners_all_pairs_used():
    pairs = Counter()
    for seed in EVAL_SEEDS:
        maze = generate_maze(9, seed)
        assert {maze.start[0], maze.target[0]} == {1, 7}
        assert {maze.start[1], maze.target[1]} == {1, 7}
        pairs[maze.start] += 1
    assert set(pairs) == {(1, 1), (1, 7), (7, 1), (7, 7)}


def test_solver_on_a_hand_made_maze():
    assert shortest_path(HAND_MAZE) == [(1, 1), (1, 2), (1, 3), (2, 3), (3, 3), (3, 2), (3, 1)]
    assert expert_actions(HAND_MAZE) == [action_text(d) for d in (0, 0, 3, 3, 2, 2)] + [STOP]
    assert expert_action(HAND_MAZE, (2, 3)) == "('move', 3)"
    assert expert_action(HAND_MAZE, (3, 1)) == STOP
    with pytest.raises(ValueError, match="not an open block"):
        expert_action(HAND_MAZE, (0, 0))


def test_shortest_path_reaches_the_target_one_block_at_a_time():
    for seed in EVAL_SEEDS:
        maze = generate_maze(9, seed)
        path = shortest_path(maze)
        assert path[0] == maze.start and path[-1] == maze.target
        assert all(maze.is_open(block) for block in path)
        assert all(abs(a[0] - b[0]) + abs(a[1] - b[1]) == 1 for a, b in zip(path, path[1:]))
        assert len(set(path)) == len(path)


def test_expert_actions_then_stop_earn_reward_one():
    for seed in EVAL_SEEDS:
        env = MazeEnv()
        env.reset(seed)
        actions = expert_actions(env.maze)
        assert actions[-1] == STOP
        for i, action in enumerate(actions):
            result = env.step(action)
            assert result.done == (i == len(actions) - 1)
            assert not result.info["wall_bump"] and not result.info["parse_error"]
        assert result.reward == 1.0 and result.info["success"] and result.info["position"] == env.maze.target


def test_expert_action_recovers_from_off_path_states():
    rng = random.Random(0)
    for seed in range(16):
        env = MazeEnv()
        env.reset(seed)
        for _ in range(8):  # wander, bumping into walls on the way
            env.step(action_text(rng.randrange(4)))
        moves_needed = len(shortest_path(env.maze, env.position)) - 1
        for _ in range(moves_needed + 1):
            result = env.step(expert_action(env.maze, env.position))
        assert result.done and result.reward == 1.0


def test_wall_bump_leaves_agent_in_place():
    env = MazeEnv()
    env.reset(0)  # agent at (7, 7), next to the right border wall
    result = env.step("('move', 0)")
    assert result.info["wall_bump"] and not result.info["parse_error"]
    assert result.info["position"] == (7, 7) == env.position
    assert result.info["turn"] == 1 and not result.done and result.reward == 0.0
    assert "wall" in result.observation.text
    assert env.state_key() == (7, 7)
    env.step("('move', 1)")
    assert env.state_key() == env.position == (6, 7)


def test_parse_error_costs_a_turn_and_earns_no_format_reward():
    env = MazeEnv(format_reward=0.05)
    env.reset(0)
    result = env.step("I will go right")
    assert result.info["parse_error"] and not result.info["wall_bump"]
    assert result.info["position"] == (7, 7) and result.info["turn"] == 1
    assert result.reward == 0.0 and not result.done
    assert "('move', 0)" in result.observation.text  # the feedback shows the format again


def test_format_reward_on_every_parsed_turn():
    env = MazeEnv(format_reward=0.05)
    env.reset(0)
    assert env.step("('move', 0)").reward == 0.05  # a wall bump still parsed
    assert env.step("('move', 1)").reward == 0.05
    env.reset(0)
    for action in expert_actions(env.maze):
        result = env.step(action)
    assert result.reward == 1.05 and result.info["task_reward"] == 1.0


def test_stop_off_target_ends_episode_with_zero():
    env = MazeEnv()
    env.reset(0)
    result = env.step("('stop', 'stop')")
    assert result.done and result.reward == 0.0
    assert not result.info["success"] and not result.info["truncated"]
    with pytest.raises(RuntimeError, match="reset"):
        env.step("('move', 1)")


def test_turn_limit_ends_episode():
    env = MazeEnv(max_turns=3)
    env.reset(0)
    results = [env.step("('move', 0)") for _ in range(3)]  # three wall bumps
    assert [r.done for r in results] == [False, False, True]
    assert results[-1].info["truncated"] and results[-1].info["turn"] == 3 and results[-1].reward == 0.0


def test_images_identical_for_the_same_state():
    env = MazeEnv()
    first = env.reset(0).images[0]
    moved = env.step("('move', 1)").observation.images[0]
    back = env.step("('move', 3)").observation.images[0]
    assert moved.tobytes() != first.tobytes()
    assert back.tobytes() == first.tobytes()


@pytest.mark.parametrize("cell_px", [16, 32])
def test_pixels_show_agent_and_target_where_the_state_says(cell_px):
    env = MazeEnv(cell_px=cell_px)
    image = env.reset(0).images[0]
    maze = env.maze
    assert image.size == (9 * cell_px, 9 * cell_px)
    assert pixel(image, maze.start, cell_px) == AGENT
    assert pixel(image, maze.target, cell_px) == TARGET
    assert pixel(image, maze.target, cell_px, dx=-0.45, dy=-0.45) == PATH  # the square leaves a margin
    assert pixel(image, (0, 0), cell_px) == WALL
    image = env.step("('move', 1)").observation.images[0]
    assert pixel(image, (6, 7), cell_px) == AGENT
    assert pixel(image, (7, 7), cell_px) == PATH
    for action in expert_actions(env.maze, env.position)[:-1]:
        image = env.step(action).observation.images[0]
    # On the target: the circle on top, the square's corners still showing.
    assert pixel(image, maze.target, cell_px) == AGENT
    assert pixel(image, maze.target, cell_px, dx=-0.28, dy=-0.28) == TARGET


def test_first_observation_gives_rules_and_exact_action_format():
    env = MazeEnv(size=7, max_turns=20)
    obs = env.reset(1)
    for action in [action_text(d) for d in range(4)] + [STOP]:
        assert action in obs.text
    assert "20 turns" in obs.text
    assert len(obs.images) == 1 and obs.images[0].size == (224, 224)


def test_options_are_validated_and_exposed():
    env = MazeEnv(size=7, cell_px=16, max_turns=12, format_reward=0.1, keep_images=True)
    assert (env.size, env.cell_px, env.max_turns, env.format_reward, env.keep_images) == (7, 16, 12, 0.1, True)
    assert MazeEnv().keep_images is False
    for bad in [{"size": 8}, {"size": 3}, {"size": "9"}, {"cell_px": 2}, {"max_turns": 0}, {"keep_images": 1}]:
        with pytest.raises(ValueError, match=next(iter(bad))):
            MazeEnv(**bad)


def test_stats_count_the_stop_as_a_turn():
    # Shortest paths of the eval mazes at size 9: 12 moves for 52 seeds, then 16 and 20. Solving in 12
    # moves needs 13 turns with the stop.
    assert maze_stats(EVAL_SEEDS, 9, max_turns=12)["solvable"] == 0
    assert maze_stats(EVAL_SEEDS, 9, max_turns=13)["solvable"] == 52
    assert maze_stats(EVAL_SEEDS, 9, max_turns=21)["solvable"] == 64


def test_stats_cli_last_line_is_json():
    out = subprocess.run(
        [sys.executable, "-m", "envs.maze", "--stats", "--seeds", "0-63", "--json"],
        capture_output=True, text=True, check=True,
    ).stdout
    stats = json.loads(out.strip().splitlines()[-1])
    assert stats["solvable"] == 64
    assert stats["shortest_path"]["min"] == 12
    assert stats["shortest_path"]["median"] == 12
    assert stats["shortest_path"]["max"] == 20


def test_render_cli_saves_the_first_image(tmp_path, capsys):
    out = tmp_path / "maze.png"
    main(["--render", "5", "--out", str(out), "--size", "7"])
    env = MazeEnv(size=7)
    assert Image.open(out).convert("RGB").tobytes() == env.reset(5).images[0].tobytes()
    assert env.maze.ascii() in capsys.readouterr().out


def test_progress_reward_is_the_shortening_of_the_way_to_the_target():
    env = MazeEnv(progress_reward=0.1)
    env.reset(0)
    moves = expert_actions(env.maze)
    d_start = len(moves) - 1
    rewards = [env.step(a).reward for a in moves]
    assert rewards[:-1] == pytest.approx([0.1] * d_start) and rewards[-1] == 1.0
    env.reset(0)  # agent at (7, 7): a bump into the border wall changes nothing, a step back costs
    assert env.step("('move', 0)").reward == 0.0
    first = env.step(moves[0])
    assert first.reward == pytest.approx(0.1) and first.info["task_reward"] == 0.0
    back = {"('move', 0)": 2, "('move', 1)": 3, "('move', 2)": 0, "('move', 3)": 1}[moves[0]]
    assert env.step(f"('move', {back})").reward == pytest.approx(-0.1)
    assert MazeEnv().progress_reward == 0.0  # sparse by default
    with pytest.raises(ValueError, match="progress_reward"):
        MazeEnv(progress_reward=-1)


def test_turn_cost_ranks_two_solutions_by_their_length():
    env = MazeEnv(turn_cost=0.01)
    env.reset(0)
    moves = expert_actions(env.maze)
    shortest = sum(env.step(a).reward for a in moves)
    env.reset(0)
    detour = env.step("('move', 0)").reward + sum(env.step(a).reward for a in moves)  # a bump first: one turn more
    assert shortest == pytest.approx(1.0 - 0.01 * len(moves)) and detour == pytest.approx(shortest - 0.01)
    with pytest.raises(ValueError, match="turn_cost"):
        MazeEnv(turn_cost=1.5)

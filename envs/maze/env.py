"""The maze task (after VisGym's Maze2D): walk the blue circle to the red square, then stop.

A perfect maze from Wilson's algorithm (a uniform spanning tree) on a grid of blocks with border walls;
the agent and the target sit in opposite corner cells. Actions are text, `('move', d)` with d 0 right,
1 up, 2 left, 3 down, and `('stop', 'stop')`. Only `random.Random(seed)` draws anything, so a seed gives
the same maze and the same image on every machine.

    python -m envs.maze --stats --seeds 0-63 --json
    python -m envs.maze --render 0 --out maze0.png
    python -m envs.maze --overlap           # the layouts the maze example's sets share, one JSON line
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
from collections import Counter
from typing import Iterable, Optional, Union

from PIL import Image

from envs.base import Env, Observation, StepResult
from envs.maze.layout import MOVES, Cell, Maze, check_size, generate_maze
from envs.maze.render import render
from envs.maze.solver import distances_to, next_direction, shortest_path
from envs.seeds import parse_seeds

EVAL_SEEDS = range(64)
DEFAULT_SIZE = 9  # VisGym's "easy": 4 x 4 cells inside the border walls
# Measured with `--stats`: at size 9 the eval mazes (seeds 0-63) need 12 to 20 moves (median 12; 52 of
# them 12), and seeds 0-9999 at most 28, the longest any 4 x 4 maze allows (opposite corner cells share a
# checkerboard colour, so no path visits all 16 cells). 30 turns, the stop included, leave every maze of the
# default size solvable, and the eval mazes at least 9 spare turns for mistakes.
DEFAULT_MAX_TURNS = 30

DIRECTION_NAMES = {0: "right", 1: "up", 2: "left", 3: "down"}
Action = Union[tuple[str, int], tuple[str, str]]  # ("move", d) or ("stop", "stop")

# Finds the first well-formed action anywhere in a reply: either quote style, any spacing, any case,
# the direction bare or quoted. The pattern has no nested repetition, so any input is matched in linear time.
_ACTION_RE = re.compile(
    r"""\(\s*['"](?:(move)['"]\s*,\s*['"]?([0-3])['"]?|stop['"]\s*,\s*['"]stop['"])\s*\)""",
    re.IGNORECASE,
)


def parse_action(text: str) -> Optional[Action]:
    """The first valid action in `text`, or None. Never raises, whatever the string."""
    match = _ACTION_RE.search(text)
    if match is None:
        return None
    if match.group(1):
        return ("move", int(match.group(2)))
    return ("stop", "stop")


def action_text(kind_or_dir: Union[int, str]) -> str:
    """The canonical text of an action: a direction 0-3 gives "('move', d)", "stop" gives "('stop', 'stop')"."""
    if kind_or_dir == "stop":
        return "('stop', 'stop')"
    if isinstance(kind_or_dir, int) and not isinstance(kind_or_dir, bool) and kind_or_dir in MOVES:
        return f"('move', {kind_or_dir})"
    raise ValueError(f"action must be a direction 0-3 (0 right, 1 up, 2 left, 3 down) or 'stop', got {kind_or_dir!r}")


def expert_actions(maze: Maze, start: Optional[Cell] = None) -> list[str]:
    """The shortest solution from `start` (default: the maze's start) as action texts, ending with stop."""
    path = shortest_path(maze, start)
    direction = {delta: d for d, delta in MOVES.items()}
    moves = [direction[(b[0] - a[0], b[1] - a[1])] for a, b in zip(path, path[1:])]
    return [action_text(d) for d in moves] + [action_text("stop")]


def expert_action(maze: Maze, position: Cell) -> str:
    """The best next action from any open block, e.g. `expert_action(env.maze, env.position)`."""
    d = next_direction(maze, tuple(position))
    return action_text("stop" if d is None else d)


class MazeEnv(Env):
    """Options: `size` blocks per side (odd, >= 5), `cell_px` pixels per block, `max_turns` (the stop
    counts as a turn), `format_reward` added on every turn whose action parsed (keep it small next to the
    task reward of 1), `progress_reward` times the moves by which a turn shortened the way to the target
    (negative when it lengthened it; a potential-based shaping, so the best policy stays the shortest
    path; 0: the sparse task reward only), `turn_cost` taken off every turn (so that of two episodes that
    both solve the maze the shorter one scores higher; the shortest path stays the best policy),
    `keep_images` whether the rollout keeps earlier images in the conversation. `info["task_reward"]` is
    always the sparse 1-on-success alone.
    """

    blocking = False  # a step computes for tens of microseconds: a thread's hand-off would cost more than it does

    def __init__(
        self,
        size: int = DEFAULT_SIZE,
        cell_px: int = 32,
        max_turns: int = DEFAULT_MAX_TURNS,
        format_reward: float = 0.0,
        progress_reward: float = 0.0,
        turn_cost: float = 0.0,
        keep_images: bool = False,  # the latest image shows the whole state; older ones only cost tokens
    ):
        check_size(size)
        _check_int("cell_px", cell_px, 4, "e.g. 32: one vision token per block after a 2 x 2 merge of 16 px patches")
        _check_int("max_turns", max_turns, 1, "the final stop counts as a turn")
        if isinstance(format_reward, bool) or not isinstance(format_reward, (int, float)):
            raise ValueError(f"MazeEnv format_reward={format_reward!r} is not allowed: a number (default 0)")
        if isinstance(progress_reward, bool) or not isinstance(progress_reward, (int, float)) or progress_reward < 0:
            raise ValueError(f"MazeEnv progress_reward={progress_reward!r} is not allowed: a number >= 0 (e.g. 0.05; "
                             "0 keeps the sparse reward)")
        if isinstance(turn_cost, bool) or not isinstance(turn_cost, (int, float)) or not 0 <= turn_cost < 1:
            raise ValueError(f"MazeEnv turn_cost={turn_cost!r} is not allowed: a number in [0, 1) (e.g. 0.01; "
                             "0 keeps the sparse reward)")
        if not isinstance(keep_images, bool):
            raise ValueError(f"MazeEnv keep_images={keep_images!r} is not allowed: True or False")
        self.size, self.cell_px, self.max_turns = size, cell_px, max_turns
        self.format_reward, self.keep_images = float(format_reward), keep_images
        self.progress_reward, self.turn_cost = float(progress_reward), float(turn_cost)
        self._maze: Optional[Maze] = None
        self._distance: dict[Cell, int] = {}
        self._position: Cell = (0, 0)
        self._turn = 0
        self._done = True

    @property
    def maze(self) -> Maze:
        if self._maze is None:
            raise RuntimeError("call reset(seed) first")
        return self._maze

    @property
    def position(self) -> Cell:
        return self._position

    @property
    def turn(self) -> int:
        return self._turn

    @property
    def done(self) -> bool:
        return self._done

    def task_key(self, seed: int) -> str:
        return generate_maze(self.size, seed).key

    def state_key(self) -> Cell:
        # The image shows the layout and the agent; the layout is the task's, so the block is the state.
        return tuple(self._position)

    def render(self) -> Image.Image:
        """The current state as an image (the same state gives the same bytes)."""
        return render(self.maze, self._position, self.cell_px)

    def reset(self, seed: int) -> Observation:
        self._maze = generate_maze(self.size, seed)
        self._position, self._turn, self._done = self._maze.start, 0, False
        self._distance = distances_to(self._maze, self._maze.target) if self.progress_reward else {}
        return Observation(text=self._rules(), images=[self.render()])

    def step(self, action_text: str) -> StepResult:
        if self._done:
            raise RuntimeError("the episode is over (or never started): call reset(seed)")
        self._turn += 1
        before = self._position
        action = parse_action(action_text)
        wall_bump = success = False
        if action is None:
            feedback = (
                "I could not read an action, so you stay where you are. Reply with one action, "
                "e.g. ('move', 0) or ('stop', 'stop')."
            )
        elif action[0] == "stop":
            self._done = True
            success = self._position == self._maze.target
            feedback = "You stopped on the target: solved." if success else "You stopped off the target: episode over."
        else:
            d = action[1]
            nxt = (self._position[0] + MOVES[d][0], self._position[1] + MOVES[d][1])
            wall_bump = not self._maze.is_open(nxt)
            if wall_bump:
                feedback = f"There is a wall to the {DIRECTION_NAMES[d]}; you stay where you are."
            else:
                self._position = nxt
                feedback = f"You moved {DIRECTION_NAMES[d]}."
        truncated = not self._done and self._turn >= self.max_turns
        if truncated:
            self._done = True
            feedback += " Out of turns: episode over."
        elif not self._done:
            feedback += f" Turns left: {self.max_turns - self._turn}."
        task_reward = 1.0 if success else 0.0
        info = {
            "success": success,
            "parse_error": action is None,
            "wall_bump": wall_bump,
            "position": self._position,
            "turn": self._turn,
            "task_reward": task_reward,
            "truncated": truncated,
        }
        reward = task_reward + (self.format_reward if action is not None else 0.0) - self.turn_cost
        if self.progress_reward:
            reward += self.progress_reward * (self._distance[before] - self._distance[self._position])
        return StepResult(Observation(text=feedback, images=[self.render()]), reward, self._done, info)

    def _rules(self) -> str:
        return (
            f"You are in a maze drawn as {self.size} x {self.size} blocks: gray blocks are walls, white "
            "blocks are open. You are the blue circle; the goal is the red square. Each turn, reply with "
            "exactly one action:\n"
            "('move', 0) moves one block right, ('move', 1) up, ('move', 2) left, ('move', 3) down;\n"
            "('stop', 'stop') ends the episode, and wins only when you are on the red square.\n"
            f"Moving into a wall leaves you in place. You have {self.max_turns} turns, the stop included."
        )


def _check_int(name: str, value: int, low: int, hint: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"MazeEnv {name}={value!r} is not allowed: an integer >= {low} ({hint})")


def maze_stats(seeds: Iterable[int], size: int = DEFAULT_SIZE, max_turns: int = DEFAULT_MAX_TURNS) -> dict:
    """Solvability within `max_turns` (moves plus the stop) and the shortest-path lengths, in moves."""
    lengths = []
    for seed in seeds:
        maze = generate_maze(size, seed)
        lengths.append(distances_to(maze, maze.target)[maze.start])
    return {
        "size": size,
        "max_turns": max_turns,
        "seeds": len(lengths),
        "solvable": sum(n + 1 <= max_turns for n in lengths),
        "shortest_path": {
            "min": min(lengths),
            "median": statistics.median(lengths),
            "max": max(lengths),
            "counts": {str(n): k for n, k in sorted(Counter(lengths).items())},
        },
    }


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m envs.maze", description=__doc__.split("\n\n")[0])
    parser.add_argument("--stats", action="store_true", help="solvability and shortest-path lengths")
    parser.add_argument("--seeds", type=parse_seeds, default=list(EVAL_SEEDS), help="e.g. 0-63 or 0,5,9-12")
    parser.add_argument("--size", type=int, default=DEFAULT_SIZE)
    parser.add_argument("--max-turns", type=int, default=DEFAULT_MAX_TURNS)
    parser.add_argument("--cell-px", type=int, default=32)
    parser.add_argument("--json", action="store_true", help="end the stats with one JSON line")
    parser.add_argument("--render", type=int, metavar="SEED", help="save the first image of this seed")
    parser.add_argument("--out", help="PNG path for --render")
    parser.add_argument("--overlap", action="store_true", help="one JSON line: the layouts each pair of the maze "
                        "example's sets shares (validation, test, the SFT's draws, GRPO's draws for seeds 0-4)")
    parser.add_argument("--pick-test", type=int, metavar="FIRST", help="the test seeds: the first 64 from FIRST "
                        "whose layouts no other set of the example holds")
    args = parser.parse_args(argv)
    if args.overlap or args.pick_test is not None:
        from envs.maze import overlap

        if args.overlap:
            print(json.dumps(overlap.overlap(overlap.example_sets())))
        else:
            avoid = {k: v for k, v in overlap.example_sets(train=range(0)).items() if k != "test"}
            print(overlap.seed_spec(overlap.pick_test_seeds(args.pick_test, 64, avoid)))
        return
    if not args.stats and args.render is None:
        parser.error("nothing to do: pass --stats, --render SEED --out FILE.png, --overlap or --pick-test FIRST")
    if args.render is not None and not args.out:
        parser.error("--render needs --out FILE.png")
    try:
        env = MazeEnv(size=args.size, cell_px=args.cell_px, max_turns=args.max_turns)
    except ValueError as e:
        parser.error(str(e))
    if args.render is not None:
        env.reset(args.render)
        env.render().save(args.out)
        print(env.maze.ascii())
        print(f"saved {args.out}")
    if args.stats:
        stats = maze_stats(args.seeds, args.size, args.max_turns)
        sp = stats["shortest_path"]
        print(f"size {args.size}, max_turns {args.max_turns}: {stats['solvable']}/{stats['seeds']} solvable")
        print(f"shortest path (moves): min {sp['min']}, median {sp['median']}, max {sp['max']}")
        print("  ".join(f"{n}:{k}" for n, k in sp["counts"].items()))
        if args.json:
            print(json.dumps(stats))


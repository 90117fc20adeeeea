"""The maze task (after VisGym's Maze2D): walk the blue circle to the red square, then stop.

`layout` owns `Maze` and draws one from a seed; `solver` and `render` read a layout; `env` is the
`MazeEnv` the registry builds, with the action parser and the expert.
"""
from envs.maze.env import (
    DEFAULT_MAX_TURNS,
    DEFAULT_SIZE,
    EVAL_SEEDS,
    MazeEnv,
    action_text,
    expert_action,
    expert_actions,
    maze_stats,
    parse_action,
)
from envs.maze.layout import MOVES, Cell, Maze, generate_maze
from envs.maze.solver import distances_to, next_direction, shortest_path

__all__ = [
    "DEFAULT_MAX_TURNS", "DEFAULT_SIZE", "EVAL_SEEDS", "MOVES", "Cell", "Maze", "MazeEnv", "action_text",
    "distances_to", "expert_action", "expert_actions", "generate_maze", "maze_stats", "next_direction",
    "parse_action", "shortest_path",
]

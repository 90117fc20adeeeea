"""Breadth-first search over a maze's open blocks: shortest paths and the best next move from anywhere."""
from __future__ import annotations

from collections import deque
from typing import Optional

from envs.maze.layout import MOVES, Cell, Maze


def distances_to(maze: Maze, goal: Cell) -> dict[Cell, int]:
    """Moves from every reachable open block to `goal`."""
    dist = {goal: 0}
    queue = deque([goal])
    while queue:
        row, col = queue.popleft()
        for d_row, d_col in MOVES.values():
            nxt = (row + d_row, col + d_col)
            if nxt not in dist and maze.is_open(nxt):
                dist[nxt] = dist[(row, col)] + 1
                queue.append(nxt)
    return dist


def next_direction(maze: Maze, position: Cell, dist: Optional[dict[Cell, int]] = None) -> Optional[int]:
    """The move that brings `position` one block closer to the target; None on the target itself."""
    dist = distances_to(maze, maze.target) if dist is None else dist
    if position not in dist:
        raise ValueError(f"{position} is not an open block connected to the target {maze.target}")
    if position == maze.target:
        return None
    row, col = position
    # In a perfect maze exactly one neighbour is closer; the fixed order keeps other layouts deterministic.
    return next(
        d for d, (d_row, d_col) in MOVES.items() if dist.get((row + d_row, col + d_col)) == dist[position] - 1
    )


def shortest_path(maze: Maze, start: Optional[Cell] = None) -> list[Cell]:
    """Blocks from `start` (default: the maze's start) to the target, both included."""
    position = maze.start if start is None else tuple(start)
    dist = distances_to(maze, maze.target)
    path = [position]
    while (d := next_direction(maze, position, dist)) is not None:
        position = (position[0] + MOVES[d][0], position[1] + MOVES[d][1])
        path.append(position)
    return path

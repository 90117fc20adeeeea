"""A maze layout: blocks of wall and path, the start and the target; `generate_maze` draws one from a seed.

Only `random.Random(seed)` draws anything, so a seed gives the same maze on every machine.
"""
from __future__ import annotations

import operator
import random
from dataclasses import dataclass
from typing import Optional

Cell = tuple[int, int]  # (row, col) of a block; row 0 is the top

# Direction d -> (d_row, d_col): 0 right, 1 up, 2 left, 3 down, as in the action text ('move', d).
MOVES: dict[int, Cell] = {0: (0, 1), 1: (-1, 0), 2: (0, -1), 3: (1, 0)}


@dataclass(frozen=True)
class Maze:
    """A layout: `rows` of '#' (wall) and '.' (path) blocks, and the agent's start and target blocks."""

    rows: tuple[str, ...]
    start: Cell
    target: Cell

    @property
    def key(self) -> str:
        """The layout's fingerprint: equal exactly when two mazes have the same walls, start and target (seeds
        collide: a 9 x 9 maze is one of 401,408 layouts, so a draw of 96,000 seeds holds about a fifth of them)."""
        return "/".join(self.rows) + f"|{self.start[0]},{self.start[1]}|{self.target[0]},{self.target[1]}"

    @property
    def size(self) -> int:
        return len(self.rows)

    def is_open(self, block: Cell) -> bool:
        row, col = block
        return 0 <= row < self.size and 0 <= col < self.size and self.rows[row][col] == "."

    def ascii(self, agent: Optional[Cell] = None) -> str:
        """The layout as text, 'A' the agent (default: at the start) and 'T' the target."""
        agent = self.start if agent is None else agent
        grid = [list(row) for row in self.rows]
        grid[self.target[0]][self.target[1]] = "T"
        grid[agent[0]][agent[1]] = "A"
        return "\n".join("".join(row) for row in grid)


def generate_maze(size: int, seed: int) -> Maze:
    """Wilson's algorithm on the ((size - 1) / 2)^2 cells at odd block coordinates, then a corner pair."""
    check_size(size)
    rng = random.Random(operator.index(seed))  # an int (numpy's too): other types would seed differently
    n = (size - 1) // 2
    cells = [(r, c) for r in range(n) for c in range(n)]
    open_blocks = {(2 * r + 1, 2 * c + 1) for r, c in cells}
    in_tree = {rng.choice(cells)}
    for cell in cells:
        # A random walk from `cell` until it meets the tree; keeping only the last exit from each visited
        # cell erases the walk's loops, and loop-erased walks are what make the spanning tree uniform.
        exit_to = {}
        current = cell
        while current not in in_tree:
            r, c = current
            neighbours = [(r + dr, c + dc) for dr, dc in MOVES.values() if 0 <= r + dr < n and 0 <= c + dc < n]
            exit_to[current] = rng.choice(neighbours)
            current = exit_to[current]
        current = cell
        while current not in in_tree:
            in_tree.add(current)
            (r, c), (r2, c2) = current, exit_to[current]
            open_blocks.add((r + r2 + 1, c + c2 + 1))  # the wall block between the two cells
            current = (r2, c2)
    rows = tuple("".join("." if (r, c) in open_blocks else "#" for c in range(size)) for r in range(size))
    corners = [(1, 1), (1, size - 2), (size - 2, size - 2), (size - 2, 1)]
    k = rng.randrange(4)
    return Maze(rows=rows, start=corners[k], target=corners[(k + 2) % 4])


def check_size(size: int) -> None:
    if isinstance(size, bool) or not isinstance(size, int) or size < 5 or size % 2 == 0:
        raise ValueError(
            f"maze size={size!r} is not allowed: an odd integer >= 5, blocks per side with the border walls "
            "(7: 3 x 3 cells; 9: 4 x 4 cells, VisGym's easy)"
        )

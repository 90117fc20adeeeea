"""Draws a maze state as a PIL image: walls gray, paths white, agent a blue circle, target a red square.

Pixels come from numpy masks rather than PIL's shape drawing, so the image bytes do not depend on the
Pillow version: the same state gives the same image on every machine.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
from PIL import Image

from envs.maze.layout import Maze

WALL = (128, 128, 128)
PATH = (255, 255, 255)
AGENT = (0, 0, 255)
TARGET = (255, 0, 0)

# The target's half-side (0.3 block) is smaller than the agent's radius (0.35 block) but its corners stick
# out, so an agent standing on the target still shows both.
_AGENT_RADIUS = 0.35
_TARGET_HALF_SIDE = 0.3


@lru_cache(maxsize=None)
def _sprites(cell_px: int) -> tuple[np.ndarray, np.ndarray]:
    """Boolean (cell_px, cell_px) masks of the agent's circle and the target's square, pixel centres tested."""
    centre = (np.arange(cell_px) + 0.5) / cell_px - 0.5  # block-relative coordinates in [-0.5, 0.5]
    y, x = np.meshgrid(centre, centre, indexing="ij")
    circle = x * x + y * y <= _AGENT_RADIUS**2
    square = (np.abs(x) <= _TARGET_HALF_SIDE) & (np.abs(y) <= _TARGET_HALF_SIDE)
    return circle, square


@lru_cache(maxsize=256)
def _background(rows: tuple[str, ...], target: tuple[int, int], cell_px: int) -> np.ndarray:
    """A layout's pixels with its target and without the agent: fixed for a whole episode, so drawn once (it
    was most of a maze env step's time)."""
    walls = np.array([[ch == "#" for ch in row] for row in rows])
    blocks = np.where(walls[..., None], np.uint8(WALL), np.uint8(PATH)).astype(np.uint8)
    pixels = blocks.repeat(cell_px, axis=0).repeat(cell_px, axis=1)
    _paint(pixels, target, _sprites(cell_px)[1], TARGET, cell_px)
    pixels.setflags(write=False)
    return pixels


def _paint(pixels: np.ndarray, block: tuple[int, int], mask: np.ndarray, colour, cell_px: int) -> None:
    row, col = block
    pixels[row * cell_px : (row + 1) * cell_px, col * cell_px : (col + 1) * cell_px][mask] = colour


def render(maze: Maze, agent: tuple[int, int], cell_px: int) -> Image.Image:
    pixels = _background(maze.rows, maze.target, cell_px).copy()
    _paint(pixels, agent, _sprites(cell_px)[0], AGENT, cell_px)
    return Image.fromarray(pixels)

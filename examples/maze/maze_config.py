"""The maze example's options, in one place: the SFT warm start, its shipped checkpoint and `make maze` read them.

The SFT rollouts, the greedy evaluations and GRPO must all show the model the same prompt and the same
image, or what the warm start learned does not transfer. Change a value here and the shipped checkpoint
under `warmstart/` no longer matches: rebuild it with `python -m examples.maze.sft`.
"""
from __future__ import annotations

from pathlib import Path

# VisGym's "easy" size, 4 x 4 cells: about 400k layouts, so the 64 eval mazes test more than memory
# (size 7 has 768 layouts in all).
SIZE = 9
# 8 px per block at the "maze" preset's 4 px patches: the 2 x 2 merge gives one language token per block
# (81 image tokens) from a 72 x 72 image.
CELL_PX = 8
# The eval mazes need 12 to 20 moves plus the stop; every 4 x 4 maze is solvable in 29 turns.
MAX_TURNS = 30
# Each turn shows the rules, the last feedback and the current image, which holds the whole state.
HISTORY = "none"
# The longest action, "('stop', 'stop')", is 6 tokens, then the end of turn.
MAX_TOKENS_PER_TURN = 8

ENV = "maze"
ENV_OPTIONS = {"size": SIZE, "cell_px": CELL_PX, "max_turns": MAX_TURNS}
# GRPO trains on the sparse task reward, as the seed did: 1 for stopping on the target, 0 otherwise. Progress
# shaping (PROGRESS_REWARD per move that shortens the way) is an option the ablation (examples/maze/ablate.py)
# measures; it changes no prompt or image, so the warm start is unaffected either way.
PROGRESS_REWARD = 0.1
GRPO_ENV_OPTIONS = dict(ENV_OPTIONS)

PRESET = "maze"
WARMSTART = Path(__file__).resolve().parent / "warmstart"

from envs.maze import EVAL_SEEDS  # noqa: E402  seeds 0-63, the fixed evaluation
UNSEEN_SEEDS = range(10_000, 10_064)  # a second set of 64 the warm start never trains or stops on
TRAIN_SEED_BASE = 1_000_000  # training mazes are seeds from here on, so they miss both eval sets


def rollout_config():
    """The RolloutConfig every maze evaluation and rollout uses (sampling settings are the caller's)."""
    from rollout.worker import RolloutConfig

    return RolloutConfig(history=HISTORY, max_tokens_per_turn=MAX_TOKENS_PER_TURN)

"""Training draws that never hold a task the evaluations score.

Seeds can name the same task: maze seeds collide on layouts (a 9 x 9 maze is one of 401,408), a dataset's
seeds cycle through its rows. `Env.task_key(seed)` names the task; a training draw skips every seed whose key
is that of a held-out seed, and the held-out seeds themselves (the validation set `eval.seeds` and the
test set `eval.test_seeds`). The trainer's TaskSampler draws through `training_seeds`, and
`python -m envs.maze --overlap` checks the draws it makes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from envs.base import Env

# Consecutive held-out seeds after which a draw gives up: the env has no task left to train on.
MAX_SKIP = 10_000


class SplitError(ValueError):
    """No training task is left: every seed the draw tries gives a task of the held-out sets."""


@dataclass(frozen=True)
class HeldOut:
    """What a training draw skips: the held-out seeds themselves, and every seed whose task key one of them has."""

    seeds: frozenset = frozenset()
    keys: frozenset = frozenset()

    def __or__(self, other: HeldOut) -> HeldOut:
        return HeldOut(self.seeds | other.seeds, self.keys | other.keys)

    def holds(self, env: Env, seed: int) -> bool:
        return seed in self.seeds or (bool(self.keys) and env.task_key(seed) in self.keys)


def held_out(env: Env, seeds: Iterable[int]) -> HeldOut:
    """The seeds and their task keys (no keys where the env keys no task: then the seeds alone are skipped)."""
    seeds = frozenset(int(s) for s in seeds)
    keys = (env.task_key(s) for s in seeds)
    return HeldOut(seeds, frozenset(k for k in keys if k is not None))


def training_seeds(env: Env, start: int, n: int, skip: HeldOut) -> tuple[list[int], int]:
    """The first `n` seeds from `start` on that `skip` does not hold, and the seed after the last one tried."""
    seeds, seed, skipped = [], int(start), 0
    while len(seeds) < n:
        if skip.holds(env, seed):
            skipped += 1
            if skipped >= MAX_SKIP:
                raise SplitError(
                    f"{type(env).__name__}: the {MAX_SKIP} training seeds before {seed + 1} all give tasks that "
                    "eval.seeds or eval.test_seeds score, so training has nothing else to draw; give the env more "
                    "tasks than the evaluations hold (the dataset env: more rows than eval.seeds and "
                    "eval.test_seeds together, or fewer eval seeds)")
        else:
            seeds.append(seed)
            skipped = 0
        seed += 1
    return seeds, seed

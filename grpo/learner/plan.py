"""How a batch is dealt: into mini-batches (one optimizer update each), over ranks, into micro-batches.

Every rank deals the whole batch by the same rules, so each knows every rank's share without an exchange.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Plan:
    """One optimizer update as this rank runs it."""
    micro: list[list[int]]  # this rank's micro-batches, item indices
    passes: int  # forward/backward passes every rank runs: the most micro-batches any rank has
    normalizer: float  # loss_normalizer over the whole mini-batch, all ranks
    filler: int  # the item a rank with fewer micro-batches runs, with zero weight, to keep in step

    def schedule(self) -> list[tuple[list[int], bool]]:
        return [(self.micro[k], True) if k < len(self.micro) else ([self.filler], False)
                for k in range(self.passes)]


def split(n: int, parts: int, seed: int) -> list[list[int]]:
    """0..n-1 dealt into `parts` near-equal mini-batches (fewer when n < parts), shuffled by `seed`: items
    arrive task by task, and an update on one task's episodes alone would chase that maze. Every rank
    draws the same permutation from the same seed."""
    parts = min(parts, n)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist() if parts > 1 else list(range(n))
    bounds = [n * k // parts for k in range(parts + 1)]
    return [sorted(order[bounds[k]:bounds[k + 1]]) for k in range(parts)]


def shard(indices: list[int], lengths: dict[int, int], world_size: int) -> list[list[int]]:
    """Longest first, each to the rank with the fewest tokens so far (ties: lowest rank): deterministic."""
    shares: list[list[int]] = [[] for _ in range(world_size)]
    load = [0] * world_size
    for i in sorted(indices, key=lambda i: (-lengths[i], i)):
        r = min(range(world_size), key=lambda r: (load[r], r))
        shares[r].append(i)
        load[r] += lengths[i]
    return shares


def micro_batches(indices: list[int], lengths: dict[int, int], size: int,
                  prompts: dict[int, tuple] | None = None) -> list[list[int]]:
    """Neighbours in length share a micro-batch, which keeps right-padding small. With `prompts` (each item's
    prompt, train.share_prompts) the items of one prompt are neighbours first, longest prompt group first, so
    that they share a micro-batch, and its prompt pass, as far as `size` allows."""
    if prompts is None:
        ordered = sorted(indices, key=lambda i: (-lengths[i], i))
    else:
        longest: dict[tuple, int] = {}
        first: dict[tuple, int] = {}
        for i in sorted(indices):
            longest[prompts[i]] = max(longest.get(prompts[i], 0), lengths[i])
            first.setdefault(prompts[i], i)
        ordered = sorted(indices, key=lambda i: (-longest[prompts[i]], first[prompts[i]], -lengths[i], i))
    return [ordered[k:k + size] for k in range(0, len(ordered), size)]


def token_rows(lengths: dict[int, int], budget: int) -> list[list[int]]:
    """Items into rows of at most `budget` tokens, first-fit by decreasing length (an item longer than the
    budget gets a row of its own); deterministic: ties go by index."""
    rows: list[list[int]] = []
    room: list[int] = []
    for i in sorted(lengths, key=lambda i: (-lengths[i], i)):
        for r, left in enumerate(room):
            if lengths[i] <= left:
                rows[r].append(i)
                room[r] -= lengths[i]
                break
        else:
            rows.append([i])
            room.append(budget - lengths[i])
    return rows

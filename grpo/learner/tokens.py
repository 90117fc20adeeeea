"""Per-token tensors of a trajectory's segments, as the trainer's loss reads them: advantages and loss masks."""
from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any, Sequence

import torch


@dataclass(frozen=True)
class Item:
    """One segment as a train step deals it to a rank."""
    segment: Any  # rollout.trajectory.Segment
    advantages: torch.Tensor  # per token of the segment: its turn's advantage on generated tokens, 0 elsewhere
    mask: torch.Tensor  # per token: 1 on the generated tokens that train (trained_masks)
    episode: int  # the index of its trajectory in the batch
    episode_tokens: int  # the trained tokens of its whole trajectory: sequence_mean's per-episode length


def token_advantages(trajectory, advantage: float | Sequence[float]) -> list[torch.Tensor]:
    """Per segment of `trajectory`, a per-token tensor: `advantage` on every generated token, or with one
    value per turn, each turn's value on that turn's reply."""
    spans = trajectory.turn_spans()
    if torch.is_tensor(advantage):
        advantage = advantage.tolist()
    # numbers.Real also takes numpy's scalars; anything else is one value per turn.
    per_turn = None if isinstance(advantage, numbers.Real) else [float(a) for a in advantage]
    if per_turn is not None and len(per_turn) != sum(len(s) for s in spans):
        raise ValueError(f"trajectory {trajectory.task_id} has {sum(len(s) for s in spans)} generated replies but "
                         f"{len(per_turn)} per-turn advantages: one per turn")
    out, turn = [], 0
    for seg, runs in zip(trajectory.segments, spans):
        t = torch.zeros(len(seg.token_ids), dtype=torch.float32)
        for start, end in runs:
            t[start:end] = float(advantage) if per_turn is None else per_turn[turn]
            turn += 1
        out.append(t)
    return out


def trained_masks(trajectory, mask_truncated: bool) -> list[torch.Tensor]:
    """Per segment of `trajectory`, its loss mask as a long tensor; with `mask_truncated`, 0 on the replies
    vLLM cut at the token limit (Trajectory.truncated)."""
    masks = [torch.as_tensor(seg.loss_mask, dtype=torch.long) for seg in trajectory.segments]
    if not (mask_truncated and any(trajectory.truncated)):
        return masks
    reply = 0
    for mask, runs in zip(masks, trajectory.turn_spans()):
        for start, end in runs:
            if trajectory.truncated[reply]:
                mask[start:end] = 0
            reply += 1
    return masks

"""Group-relative advantages: each episode's reward against the other episodes of the same task (no critic)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from grpo.config import AlgorithmConfig


@dataclass(frozen=True)
class GroupAdvantages:
    advantages: torch.Tensor  # (num_groups, G); 0 for every episode of a zero-signal group
    zero_signal: torch.Tensor  # (num_groups,) bool: all G rewards equal, so no episode is better than another
    keep: torch.Tensor  # (num_groups,) bool: groups to train on (all, unless zero-signal groups are dropped)


def group_advantages(rewards: torch.Tensor, config: AlgorithmConfig) -> GroupAdvantages:
    """`rewards` is (num_groups, G), one row per task.

    Baseline "mean": A = r - mean(r); "leave_one_out": A_i = r_i - mean of the other G - 1 rewards.
    With scale_rewards="group" A is then divided by the group's std + eps (the sample std, with G - 1,
    as TRL and verl compute it); with "none" it is not (Dr. GRPO: no bias towards low-variance groups).
    """
    if rewards.dim() != 2 or rewards.shape[1] < 2:
        raise ValueError(f"rewards must be (num_groups, G) with G >= 2, got shape {tuple(rewards.shape)}")
    r = rewards if rewards.is_floating_point() else rewards.float()
    g = r.shape[1]
    if config.baseline == "leave_one_out":
        adv = r - (r.sum(dim=1, keepdim=True) - r) / (g - 1)
    else:
        adv = r - r.mean(dim=1, keepdim=True)
    if config.scale_rewards == "group":
        adv = adv / (r.std(dim=1, keepdim=True) + config.eps)
    # Exactly 0: r - mean(r) can leave a rounding residue that the division inflates (seven float32
    # rewards of 0.7 would get advantages of 0.056 each).
    zero_signal = (r == r[:, :1]).all(dim=1)
    adv = torch.where(zero_signal[:, None], torch.zeros_like(adv), adv)
    keep = ~zero_signal if config.drop_zero_signal_groups else torch.ones_like(zero_signal)
    return GroupAdvantages(advantages=adv, zero_signal=zero_signal, keep=keep)

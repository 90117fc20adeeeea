"""Group-relative advantages: each episode's reward against the other episodes of the same task (no critic)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Hashable, Optional, Sequence

import torch

from grpo.algo.config import AlgorithmConfig


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


def next_draw(wanted: int, with_signal: int, drawn: int, cap: int) -> int:
    """Dynamic sampling: how many more tasks to draw once `drawn` tasks gave `with_signal` groups with signal,
    to reach `wanted` of them without passing `cap` draws in all; 0 when done. The next draw assumes the rate
    seen so far holds (at least one in `cap`: a step that found none yet draws the rest of its cap at once)."""
    if with_signal >= wanted or drawn >= cap:
        return 0
    rate = max(with_signal / drawn, 1 / cap)
    return min(cap - drawn, math.ceil((wanted - with_signal) / rate - 1e-9))


@dataclass(frozen=True)
class StepAdvantages:
    advantages: list[list[float]]  # per episode, one value per turn; 0 where a turn's state has no peers
    anchored_share: float  # the share of turns whose state at least one other turn of the group also had


def discounted_returns(turn_rewards: Sequence[float], gamma: float) -> list[float]:
    """R_t = r_t + gamma * R_{t+1}: the reward still to come from each turn."""
    out, running = [0.0] * len(turn_rewards), 0.0
    for t in range(len(turn_rewards) - 1, -1, -1):
        running = float(turn_rewards[t]) + gamma * running
        out[t] = running
    return out


def step_advantages(turn_rewards: Sequence[Sequence[float]], turn_states: Sequence[Sequence[Hashable]],
                    group_ids: Sequence[int], config: AlgorithmConfig) -> StepAdvantages:
    """GiGPO's step-level advantages: all turns of one group that began in the same env state (an "anchor
    state", `turn_states`, None for unknown) form a step group; each turn's discounted return
    (`config.step_gamma`) is compared with that step group's mean, and divided by its std + eps with
    scale_rewards="group". A turn alone in its step group, or in one whose returns are all equal, gets 0.

    In a maze, the episodes of a group share the start and often the blocks after it: from one block, the
    move that reached the target sooner scores above the one that wandered, inside episodes that all
    succeeded or all failed too, where the episode-level advantage is 0.
    """
    if not (len(turn_rewards) == len(turn_states) == len(group_ids)):
        raise ValueError(f"{len(turn_rewards)} reward lists, {len(turn_states)} state lists and {len(group_ids)} "
                         "group ids: one of each per episode")
    returns, buckets = [], {}
    for i, (rewards, states, group) in enumerate(zip(turn_rewards, turn_states, group_ids)):
        if len(rewards) != len(states):
            raise ValueError(f"episode {i} has {len(rewards)} turn rewards but {len(states)} turn states")
        returns.append(discounted_returns(rewards, config.step_gamma))
        for t, state in enumerate(states):
            if state is not None:
                buckets.setdefault((group, state), []).append((i, t))
    adv = [[0.0] * len(r) for r in returns]
    anchored = 0
    for members in buckets.values():
        if len(members) < 2:
            continue
        anchored += len(members)
        r = torch.tensor([returns[i][t] for i, t in members], dtype=torch.float64)
        if bool((r == r[0]).all()):
            continue
        a = r - r.mean()
        if config.scale_rewards == "group":
            a = a / (r.std() + config.eps)
        for (i, t), v in zip(members, a.tolist()):
            adv[i][t] = v
    turns = sum(len(r) for r in returns)
    return StepAdvantages(advantages=adv, anchored_share=anchored / turns if turns else 0.0)


def overlong_penalty(reply_tokens: int, limit: int, buffer: int, penalty: float = 1.0) -> float:
    """DAPO's soft overlong punishment of a reply of `reply_tokens` tokens under a limit of `limit`: 0 up to
    limit - buffer, then falling linearly to -penalty at the limit (and beyond)."""
    over = reply_tokens - (limit - buffer)
    return -penalty * min(max(over, 0), buffer) / buffer


def shaped_turn_rewards(trajectory, algo: AlgorithmConfig, reply_limit: Optional[int]) -> list[float]:
    """The trajectory's turn rewards, each with its reply's overlong penalty (algo.overlong_buffer) added."""
    buffer = algo.overlong_buffer
    if buffer is None or reply_limit is None:
        return list(trajectory.turn_rewards)
    return [r + overlong_penalty(n, reply_limit, buffer, algo.overlong_penalty)
            for r, n in zip(trajectory.turn_rewards, trajectory.reply_tokens)] + list(
        trajectory.turn_rewards[len(trajectory.reply_tokens):])


def batch_advantages(trajs: Sequence, algo: AlgorithmConfig,
                     reply_limit: Optional[int] = None) -> tuple[list, list[int], dict]:
    """A step's advantages from its episodes (in groups of algo.group_size, group by group): per episode its
    group-relative advantage, or with step_weight > 0 one value per turn, the episode's advantage plus
    step_weight x the turn's step-level advantage; the indices of the episodes to train on; and the credit
    figures logged with the step. With algo.overlong_buffer, each reply's overlong penalty under
    `reply_limit` (rollout.max_tokens_per_turn) is added to its turn's reward first."""
    g = algo.group_size
    shaping = algo.overlong_buffer is not None and reply_limit is not None
    turn_rewards = [shaped_turn_rewards(t, algo, reply_limit) for t in trajs] if shaping else None
    episode_rewards = [sum(r) for r in turn_rewards] if shaping else [t.reward for t in trajs]
    rewards = torch.tensor(episode_rewards, dtype=torch.float32).view(-1, g)
    out = group_advantages(rewards, algo)
    episode = out.advantages.flatten().tolist()
    keep = out.keep.repeat_interleave(g).tolist()
    credit = {"zero_signal_groups": int(out.zero_signal.sum())}
    if shaping:
        penalties = [r - t.reward for r, t in zip(episode_rewards, trajs)]
        credit["overlong_penalty_mean"] = sum(penalties) / len(penalties) if penalties else 0.0
    if algo.step_weight == 0:
        return episode, [i for i in range(len(trajs)) if keep[i]], credit
    steps = step_advantages(turn_rewards or [t.turn_rewards for t in trajs], [t.turn_states for t in trajs],
                            [t.group_id for t in trajs], algo)
    adv = [[a + algo.step_weight * s for s in per_turn] for a, per_turn in zip(episode, steps.advantages)]
    # A group with equal rewards can still rank the moves made from a shared state.
    stepped = [any(any(steps.advantages[i]) for i in range(k * g, (k + 1) * g)) for k in range(len(trajs) // g)]
    kept = [i for i in range(len(trajs)) if keep[i] or stepped[i // g]]
    flat = [abs(s) for per_turn in steps.advantages for s in per_turn]
    credit.update(step_anchored_share=steps.anchored_share, step_adv_abs_mean=sum(flat) / len(flat) if flat else 0.0)
    return adv, kept, credit

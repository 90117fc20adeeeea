"""Typed configuration, validated when built, and the checks every config class here reuses.

A bad value fails at construction with a `ConfigError` naming the field, the value and what is allowed,
not steps later inside a tensor op. Config classes call the `check_*` helpers from `__post_init__`.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, Optional, Sequence


class ConfigError(ValueError):
    def __init__(self, config: Any, name: str, value: Any, allowed: str):
        # A class name stands in for the config when the error is about building one (an unknown field).
        owner = config if isinstance(config, str) else type(config).__name__
        self.field = f"{owner}.{name}"
        self.value = value
        self.allowed = allowed
        super().__init__(f"{self.field}={value!r} is not allowed: {allowed}")


def require(config: Any, name: str, ok: bool, allowed: str) -> None:
    """Raise a ConfigError for field `name` unless `ok`; for rules the other helpers do not cover."""
    if not ok:
        raise ConfigError(config, name, getattr(config, name), allowed)


def check_choice(config: Any, name: str, choices: Sequence[Any]) -> None:
    require(config, name, getattr(config, name) in choices, "one of " + ", ".join(map(repr, choices)))


def check_bool(config: Any, name: str) -> None:
    require(config, name, isinstance(getattr(config, name), bool), "True or False")


def check_number(
    config: Any,
    name: str,
    *,
    integer: bool = False,
    ge: Optional[float] = None,
    gt: Optional[float] = None,
    le: Optional[float] = None,
    lt: Optional[float] = None,
    optional: bool = False,
    hint: str = "",
) -> None:
    """A finite number (an integer if `integer`) within the given bounds; None too if `optional`."""
    value = getattr(config, name)
    bounds = [f"{op} {b}" for op, b in ((">=", ge), (">", gt), ("<=", le), ("<", lt)) if b is not None]
    allowed = ("an integer" if integer else "a number") + (" " + " and ".join(bounds) if bounds else "")
    allowed += ", or None" if optional else ""
    allowed += f" ({hint})" if hint else ""
    if value is None and optional:
        return
    # bool is an Integral in Python, and YAML reads "1e-6" as a string: neither is a number here.
    kind = numbers.Integral if integer else numbers.Real
    ok = isinstance(value, kind) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and all(
        (ge is None or value >= ge, gt is None or value > gt, le is None or value <= le, lt is None or value < lt)
    )
    require(config, name, ok, allowed)


@dataclass(frozen=True)
class AlgorithmConfig:
    """GRPO's advantage and loss settings (grpo.advantages, grpo.loss)."""

    group_size: int = 8  # episodes per task (G)
    scale_rewards: str = "group"  # "group": divide by the group's std + eps; "none": Dr. GRPO
    baseline: str = "mean"  # "mean" | "leave_one_out" (each episode's baseline excludes itself, RLOO)
    eps: float = 1e-6
    drop_zero_signal_groups: bool = False  # groups whose rewards are all equal: keep (advantage 0) or drop
    clip_low: float = 0.2  # the ratio is clipped to [1 - clip_low, 1 + clip_high]
    clip_high: float = 0.28  # clip-higher (DAPO): more room for raising unlikely tokens, against collapse
    dual_clip: Optional[float] = None  # c > 1: bounds a negative advantage's loss at c * |A| (dual-clip PPO)
    loss_agg: str = "token_mean"  # "token_mean" | "sequence_mean" | "seq_sum_norm" (Dr. GRPO)
    seq_sum_norm_len: Optional[int] = None  # the fixed length seq_sum_norm divides by, e.g. max response tokens
    kl_coef: float = 0.0  # weight of the KL penalty to the reference (base) model; 0 turns it off
    kl_estimator: str = "k3"  # "k1" | "k2" | "k3" (Schulman's estimators of KL(policy || reference))
    tis_cap: Optional[float] = None  # truncated importance sampling vs the sampler's logprobs; None: off
    # Step-level advantages (GiGPO's "anchor states"): each turn also gets its discounted return against
    # the other turns of its group taken from the same env state (Env.state_key), weighted by this; 0: off.
    step_weight: float = 0.0
    step_gamma: float = 0.95  # discount of the step-level return: sooner success from the same state is better

    def __post_init__(self):
        check_number(self, "group_size", integer=True, ge=2, hint="a group of one has no baseline")
        check_choice(self, "scale_rewards", ("group", "none"))
        check_choice(self, "baseline", ("mean", "leave_one_out"))
        check_number(self, "eps", gt=0)
        check_bool(self, "drop_zero_signal_groups")
        check_number(self, "clip_low", ge=0, lt=1, hint="the ratio's lower bound 1 - clip_low must stay positive")
        check_number(self, "clip_high", ge=0)
        check_number(self, "dual_clip", gt=1, optional=True, hint="e.g. 3.0")
        check_choice(self, "loss_agg", ("token_mean", "sequence_mean", "seq_sum_norm"))
        check_number(self, "seq_sum_norm_len", integer=True, ge=1, optional=True)
        require(
            self, "seq_sum_norm_len", self.loss_agg != "seq_sum_norm" or self.seq_sum_norm_len is not None,
            "an integer >= 1 when loss_agg='seq_sum_norm' (e.g. the max response tokens)",
        )
        check_number(self, "kl_coef", ge=0)
        check_choice(self, "kl_estimator", ("k1", "k2", "k3"))
        check_number(self, "tis_cap", ge=1, optional=True, hint="e.g. 2.0; a cap below 1 shrinks on-policy tokens")
        check_number(self, "step_weight", ge=0, hint="GiGPO uses 1.0; 0 turns step-level advantages off")
        check_number(self, "step_gamma", gt=0, le=1, hint="e.g. 0.95")

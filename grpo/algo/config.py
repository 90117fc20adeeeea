"""Typed configuration, validated when built, and the checks every config class here reuses.

A bad value fails at construction with a `ConfigError` naming the field, the value and what is allowed,
not steps later inside a tensor op. Config classes call the `check_*` helpers from `__post_init__`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

# The helpers live in rollout (the lowest package that validates a config); re-exported here for grpo.
from rollout.checks import ConfigError, check_bool, check_choice, check_number, require

__all__ = ["AlgorithmConfig", "ConfigError", "check_bool", "check_choice", "check_number", "require"]


@dataclass(frozen=True)
class AlgorithmConfig:
    """GRPO's advantage and loss settings (grpo.algo.advantages, grpo.algo.loss)."""

    group_size: int = 8  # episodes per task (G)
    scale_rewards: str = "group"  # "group": divide by the group's std + eps; "none": Dr. GRPO
    baseline: str = "mean"  # "mean" | "leave_one_out" (each episode's baseline excludes itself, RLOO)
    eps: float = 1e-6  # added to the group's std before dividing by it
    drop_zero_signal_groups: bool = False  # groups whose rewards are all equal: keep (advantage 0) or drop
    # DAPO's dynamic sampling: a step keeps drawing new tasks until `tasks_per_step` groups carry signal
    # (rewards not all equal), so every step trains on a full batch; needs drop_zero_signal_groups.
    dynamic_sampling: bool = False
    # The cap on a step's draws with dynamic_sampling: at most this many times `tasks_per_step` tasks; a step
    # that reaches it trains on the groups with signal it found (logged as rollout/groups_trained).
    max_draw_factor: int = 4
    clip_low: float = 0.2  # the ratio is clipped to [1 - clip_low, 1 + clip_high]
    clip_high: float = 0.28  # clip-higher (DAPO): more room for raising unlikely tokens, against collapse
    dual_clip: Optional[float] = None  # c > 1: bounds a negative advantage's loss at c * |A| (dual-clip PPO)
    # "token_mean": every generated token of the batch weighs the same; "sequence_mean": each episode's mean
    # over its own generated tokens, averaged over episodes (GRPO); "seq_sum_norm": each episode's token sum
    # over seq_sum_norm_len, averaged over episodes (Dr. GRPO). An episode counts once however many
    # segments (turns, with history none or text) it is split into.
    loss_agg: str = "token_mean"
    seq_sum_norm_len: Optional[int] = None  # the fixed length seq_sum_norm divides by, e.g. max response tokens
    # Weight of the KL penalty to the reference: the starting policy (the base model, or the `adapter` the
    # run starts from); 0 turns it off.
    kl_coef: float = 0.0
    # "k2" | "k3" as the penalty (Schulman's estimators of KL(policy || reference)); "k1" only as a logged
    # metric (kl_coef 0): its expected gradient on-policy is zero.
    kl_estimator: str = "k3"
    tis_cap: Optional[float] = None  # truncated importance sampling vs the sampler's logprobs; None: off
    # The old policy of the PPO ratio. "trainer": the trainer's logprobs before the batch's first update, at the
    # cost of a scoring pass over every mini-batch after the first; "sampler": the rollout engine's logprobs of
    # the sampled tokens (the behaviour policy, which off-policy rollouts need), no scoring pass. On-policy in
    # float32 the two agree to a few float32 ulps: mean |difference| (sampler_abs_diff) 3e-8 to 7e-7 and the
    # largest (sampler_abs_diff_max) 5e-7 to 6e-6 in the tests, which assert 1.5e-5 to 2.5e-5 at most.
    old_logprobs: str = "trainer"
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
        check_bool(self, "dynamic_sampling")
        check_number(self, "max_draw_factor", integer=True, ge=1, hint="e.g. 4: up to 4 x tasks_per_step tasks a step")
        require(
            self, "dynamic_sampling", not self.dynamic_sampling or self.drop_zero_signal_groups,
            "True only with algorithm.drop_zero_signal_groups: true: dynamic sampling replaces the groups with "
            "equal rewards by new ones, so those groups must be dropped; set both",
        )
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
        require(
            self, "kl_estimator", not (self.kl_estimator == "k1" and self.kl_coef > 0),
            f"'k1' as a penalty (kl_coef={self.kl_coef}): k1 = log(policy / reference) has zero expected gradient "
            "on the sampled tokens, so it adds noise, not a pull towards the reference; set "
            "algorithm.kl_estimator to 'k3' (unbiased, low variance) or 'k2' (its gradient is the KL's)",
        )
        check_number(self, "tis_cap", ge=1, optional=True, hint="e.g. 2.0; a cap below 1 shrinks on-policy tokens")
        check_choice(self, "old_logprobs", ("trainer", "sampler"))
        require(
            self, "old_logprobs", self.old_logprobs != "sampler" or self.tis_cap is None,
            f"together with algorithm.tis_cap={self.tis_cap}: the TIS weight min(exp(old - sampler), cap) is then 1 "
            "on every token, a setting that does nothing; set algorithm.tis_cap: null, or keep it and set "
            "algorithm.old_logprobs: trainer (TIS then corrects the trainer-vs-sampler mismatch)",
        )
        check_number(self, "step_weight", ge=0, hint="GiGPO uses 1.0; 0 turns step-level advantages off")
        check_number(self, "step_gamma", gt=0, le=1, hint="e.g. 0.95")

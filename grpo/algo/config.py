"""Typed configuration, validated when built, and the checks every config class here reuses.

A bad value fails at construction with a `ConfigError` naming the field, the value and what is allowed,
not steps later inside a tensor op. Config classes call the `check_*` helpers from `__post_init__`.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

# The helpers live in rollout (the lowest package that validates a config); re-exported here for grpo.
from rollout.checks import ConfigError, check_bool, check_choice, check_number, require

__all__ = ["AlgorithmConfig", "ConfigError", "check_bool", "check_choice", "check_number", "require"]

LOSS_TYPES = ("grpo", "dr_grpo", "dapo", "gspo", "cispo", "sapo")
# The fields a loss_type sets, as TRL's names of the same objectives do (docs/algorithms.md); a field left
# unset takes FIELD_DEFAULTS. A loss_type absent here sets nothing.
PRESETS = {
    "dr_grpo": {"loss_agg": "seq_sum_norm", "scale_rewards": "none"},
    "dapo": {"loss_agg": "token_mean", "scale_rewards": "group"},
    "gspo": {"loss_agg": "sequence_mean"},
}
FIELD_DEFAULTS = {"loss_agg": "token_mean", "scale_rewards": "group"}
IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask", "geometric_mask")
_CLIPPED = ("grpo", "dr_grpo", "dapo", "gspo")  # the objectives with PPO's clipped ratio (dual_clip applies)


@dataclass(frozen=True)
class AlgorithmConfig:
    """GRPO's advantage and loss settings (grpo.algo.advantages, grpo.algo.loss)."""

    group_size: int = 8  # episodes per task (G)
    # The objective (docs/algorithms.md): "grpo" (the clipped ratio), "dr_grpo" (sets loss_agg seq_sum_norm,
    # scale_rewards none), "dapo" (sets loss_agg token_mean, scale_rewards group), "gspo" (the sequence's
    # length-normalised ratio, clipped per sequence; sets loss_agg sequence_mean), "cispo" (the clipped
    # importance weight, stop-gradient, times the logprob), "sapo" (a soft gate in place of the clip). A
    # field a preset sets may be left unset or set to the preset's value; another value is refused.
    loss_type: str = "grpo"
    # "group": divide by the group's std + eps; "none": Dr. GRPO. Unset: the loss_type's, else "group".
    scale_rewards: Optional[str] = None
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
    # segments (turns, with history none or text) it is split into. Unset: the loss_type's, else "token_mean".
    loss_agg: Optional[str] = None
    # The fixed length seq_sum_norm divides by, e.g. max response tokens; unset in a run with loss_type dr_grpo:
    # rollout.max_tokens_per_turn.
    seq_sum_norm_len: Optional[int] = None
    sapo_tau_pos: float = 1.0  # SAPO's gate temperature for tokens with a positive advantage (the paper's 1.0)
    sapo_tau_neg: float = 1.05  # and for the others (1.05: a sharper gate against negative updates)
    # Weight of the KL penalty to the reference: the starting policy (the base model, or the `adapter` the
    # run starts from); 0 turns it off.
    kl_coef: float = 0.0
    # "k2" | "k3" as the penalty (Schulman's estimators of KL(policy || reference)); "k1" only as a logged
    # metric (kl_coef 0): its expected gradient on-policy is zero.
    kl_estimator: str = "k3"
    # The importance-sampling correction against the sampler's logprobs, w = exp(old - sampler) per token, or
    # per sequence (its episode's generated tokens) exp(sum) for sequence_*, exp(mean) for geometric_mask:
    # "token_truncate"/"sequence_truncate" weight by w truncated to [tis_floor, tis_cap]; "token_mask"/
    # "sequence_mask" by w, 0 outside it; "geometric_mask" by 1, 0 outside it. Unset with tis_cap set:
    # token_truncate (TIS); unset without: off.
    importance_sampling: Optional[str] = None
    tis_cap: Optional[float] = None  # the importance weight's upper threshold; None: no correction
    # Its lower threshold; None: none, except 1 / tis_cap for geometric_mask (a band symmetric in log space).
    tis_floor: Optional[float] = None
    # DeepSeek-V3.2's off-policy sequence masking: a sequence with a negative advantage whose mean
    # log(sampler / policy) over its tokens exceeds this gives no gradient; None: off.
    off_policy_mask_threshold: Optional[float] = None
    # DAPO's soft overlong penalty: a reply of L tokens loses overlong_penalty * (L - (limit - buffer)) / buffer
    # reward when longer than limit - buffer, the limit being rollout.max_tokens_per_turn; None: off.
    overlong_buffer: Optional[int] = None
    overlong_penalty: float = 1.0  # the reward a reply at the limit loses (DAPO: 1)
    mask_truncated: bool = False  # replies cut at the limit (vLLM's finish_reason "length") give no gradient
    # Only the tokens whose entropy is in this top share of the micro-batch's generated tokens train (the
    # 80/20 rule of high-entropy minority tokens); 1.0: all tokens.
    top_entropy_quantile: float = 1.0
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
        check_choice(self, "loss_type", LOSS_TYPES)
        self._apply_preset()
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
        require(self, "dual_clip", self.dual_clip is None or self.loss_type in _CLIPPED,
                f"None with loss_type {self.loss_type!r}: the dual clip bounds PPO's clipped ratio, which only "
                f"{', '.join(_CLIPPED)} have")
        check_choice(self, "loss_agg", ("token_mean", "sequence_mean", "seq_sum_norm"))
        check_number(self, "seq_sum_norm_len", integer=True, ge=1, optional=True)
        require(
            self, "seq_sum_norm_len",
            self.loss_agg != "seq_sum_norm" or self.seq_sum_norm_len is not None or self.loss_type == "dr_grpo",
            "an integer >= 1 when loss_agg='seq_sum_norm' (e.g. the max response tokens; a run with loss_type "
            "dr_grpo takes rollout.max_tokens_per_turn)",
        )
        check_number(self, "kl_coef", ge=0)
        check_choice(self, "kl_estimator", ("k1", "k2", "k3"))
        require(
            self, "kl_estimator", not (self.kl_estimator == "k1" and self.kl_coef > 0),
            f"'k1' as a penalty (kl_coef={self.kl_coef}): k1 = log(policy / reference) has zero expected gradient "
            "on the sampled tokens, so it adds noise, not a pull towards the reference; set "
            "algorithm.kl_estimator to 'k3' (unbiased, low variance) or 'k2' (its gradient is the KL's)",
        )
        check_number(self, "sapo_tau_pos", gt=0)
        check_number(self, "sapo_tau_neg", gt=0)
        check_number(self, "tis_cap", ge=1, optional=True, hint="e.g. 2.0; a cap below 1 shrinks on-policy tokens")
        if self.importance_sampling is None and self.tis_cap is not None:
            object.__setattr__(self, "importance_sampling", "token_truncate")
        if self.importance_sampling is not None:
            check_choice(self, "importance_sampling", IS_MODES)
            require(self, "importance_sampling", self.tis_cap is not None,
                    "a mode together with algorithm.tis_cap, its threshold (e.g. 2.0), or None (no correction)")
        check_number(self, "tis_floor", gt=0, le=1, optional=True, hint="the weight's lower threshold, e.g. 0.5")
        require(self, "tis_floor", self.tis_floor is None or self.tis_cap is not None,
                "None without algorithm.tis_cap: no importance-sampling correction is on")
        check_number(self, "off_policy_mask_threshold", ge=0, optional=True, hint="e.g. 0.5")
        check_number(self, "overlong_buffer", integer=True, ge=1, optional=True,
                     hint="e.g. a quarter of rollout.max_tokens_per_turn")
        check_number(self, "overlong_penalty", ge=0)
        check_bool(self, "mask_truncated")
        check_number(self, "top_entropy_quantile", gt=0, le=1, hint="e.g. 0.2: the top 20% of tokens by entropy")
        check_choice(self, "old_logprobs", ("trainer", "sampler"))
        require(
            self, "old_logprobs", self.old_logprobs != "sampler" or self.tis_cap is None,
            f"together with algorithm.tis_cap={self.tis_cap}: the importance weight exp(old - sampler) is then 1 "
            "on every token, a setting that does nothing; set algorithm.tis_cap: null, or keep it and set "
            "algorithm.old_logprobs: trainer (the weight then corrects the trainer-vs-sampler mismatch)",
        )
        check_number(self, "step_weight", ge=0, hint="GiGPO uses 1.0; 0 turns step-level advantages off")
        check_number(self, "step_gamma", gt=0, le=1, hint="e.g. 0.95")

    def _apply_preset(self) -> None:
        """The fields the loss_type sets, and the defaults of those left unset: one value each, never two."""
        preset = PRESETS.get(self.loss_type, {})
        for name, value in preset.items():
            given = getattr(self, name)
            require(self, name, given is None or given == value,
                    f"unset or {value!r}: algorithm.loss_type={self.loss_type!r} sets algorithm.{name}={value!r} "
                    f"(a preset, as TRL's loss_type is); drop one of the two, or use loss_type 'grpo' and set "
                    f"{name} yourself")
            object.__setattr__(self, name, value)
        for name, value in FIELD_DEFAULTS.items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, value)

    @property
    def sequence_level(self) -> list[str]:
        """The fields whose setting reads a whole sequence's tokens at once: GSPO's ratio, the sequence and
        geometric importance weights, the off-policy mask."""
        return [name for name, on in (
            ("loss_type", self.loss_type == "gspo"),
            ("importance_sampling", self.importance_sampling in ("sequence_truncate", "sequence_mask",
                                                                 "geometric_mask")),
            ("off_policy_mask_threshold", self.off_policy_mask_threshold is not None)) if on]

    def for_run(self, max_tokens_per_turn: int, history: str) -> "AlgorithmConfig":
        """This config in a run whose replies stop at `max_tokens_per_turn` tokens, with rollout.history
        `history`: dr_grpo's seq_sum_norm_len defaults to that limit, the overlong buffer must fit under it,
        and the sequence-level settings are refused where each turn is a segment of its own."""
        if self.overlong_buffer is not None and self.overlong_buffer > max_tokens_per_turn:
            raise ConfigError(self, "overlong_buffer", self.overlong_buffer,
                              f"at most rollout.max_tokens_per_turn={max_tokens_per_turn} tokens: the "
                              "penalty ramps up over the buffer's last tokens before that limit")
        if history in ("text", "none") and self.sequence_level:
            name = self.sequence_level[0]
            raise ConfigError(self, name, getattr(self, name),
                              f"not with rollout.history={history!r}: each turn is then a segment of its own, "
                              "trained in micro-batches of their own, and this setting reads all the tokens of an "
                              "episode in one forward; set rollout.history: full, or turn it off")
        if self.loss_agg == "seq_sum_norm" and self.seq_sum_norm_len is None:
            return dataclasses.replace(self, seq_sum_norm_len=max_tokens_per_turn)
        return self

"""The policy-gradient losses over per-token logprobs (GRPO's clipped ratio, GSPO, CISPO, SAPO), with an
optional KL penalty, importance-sampling corrections against the sampler, and token masks.

Micro-batch independence: every aggregation is a sum over tokens or sequences divided by one number for
the whole batch (`loss_normalizer`), so the micro-batch losses sum to the full-batch loss and their
gradients to its gradient, however the batch is split.

A sequence is an episode. When an episode is split into several rows (one segment per turn, with history
none or text), sequence_mean divides each row by its episode's generated tokens (`sequence_tokens`) and the
normaliser counts episodes (`sequences`), so the episode weighs what it would as one row.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence, Union

import torch

from grpo.algo.config import AlgorithmConfig

# exp(20) ~ 5e8, far outside any clip range: the clamp only stops a stray logprob from overflowing to inf.
_MAX_LOG_RATIO = 20.0


@dataclass(frozen=True)
class LossOutput:
    loss: torch.Tensor  # scalar: this micro-batch's share of the batch loss (backward it, or sum and backward)
    metrics: dict[str, torch.Tensor]  # detached means over this call's generated tokens
    maxima: dict[str, torch.Tensor]  # detached maxima over this call's generated tokens (0 without any)
    tokens: torch.Tensor  # generated tokens in this call: the weight for merging metrics (merge_metrics)
    counts: dict[str, torch.Tensor] = field(default_factory=dict)  # detached counts, summed over calls
    # Detached means over other weights than `tokens`: name -> (sum, weight), merged as sum(sums) / sum(weights).
    ratios: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)


def loss_normalizer(masks: Union[torch.Tensor, Sequence[torch.Tensor]], config: AlgorithmConfig,
                    sequences: Optional[int] = None) -> float:
    """The batch-level denominator, from the loss mask of the whole batch (one tensor, or the list of
    micro-batch masks, whose padded lengths may differ). token_mean: generated tokens; sequence_mean:
    sequences; seq_sum_norm: sequences x seq_sum_norm_len. `sequences` is how many episodes the rows
    belong to when an episode spans several rows; by default each row is one (zero-length ones included).

    With data parallelism, where gradients are averaged over ranks, compute it over all ranks' masks and
    pass normalizer / world_size to each rank's policy_loss.
    """
    masks = [masks] if isinstance(masks, torch.Tensor) else list(masks)
    if config.loss_agg == "token_mean":
        return float(sum(int(m.bool().sum()) for m in masks))
    if sequences is None:
        sequences = sum(m.shape[0] for m in masks)
    if config.loss_agg == "sequence_mean":
        return float(sequences)
    if config.seq_sum_norm_len is None:
        raise ValueError("loss_agg 'seq_sum_norm' needs algorithm.seq_sum_norm_len (a run config sets it to "
                         "rollout.max_tokens_per_turn for loss_type dr_grpo; AlgorithmConfig.for_run)")
    return float(sequences * config.seq_sum_norm_len)


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    config: AlgorithmConfig,
    normalizer: float,
    *,
    ref_logprobs: Optional[torch.Tensor] = None,
    sampler_logprobs: Optional[torch.Tensor] = None,
    sequence_tokens: Optional[torch.Tensor] = None,
    sequence_ids: Optional[torch.Tensor] = None,
    entropy: Optional[torch.Tensor] = None,
) -> LossOutput:
    """The per-token policy term of `config.loss_type` (docs/algorithms.md), r = exp(logprobs - old_logprobs):
    - grpo, dr_grpo, dapo: -A * r clipped PPO-style to [1 - clip_low, 1 + clip_high] (the pessimistic max of
      the clipped and unclipped losses); with `dual_clip` c a negative advantage's loss is at most c * |A|.
    - gspo: the same with GSPO-token's ratio sg(s) * exp(logprobs - sg(logprobs)), s the sequence's
      exp(mean log r): every token of a sequence is clipped or not together, and with one advantage per
      sequence the gradient is GSPO's.
    - cispo: -sg(min(r, 1 + clip_high)) * A * logprobs: the weight is clipped, no token loses its gradient.
    - sapo: -A * (4 / tau) * sigmoid(tau * (r - 1)), tau = sapo_tau_pos for A > 0, sapo_tau_neg otherwise:
      the gradient is A * r * grad(logprobs) times 4 * s(1 - s), 1 on-policy, fading smoothly off it.
    Then, all detached: the importance weight of `importance_sampling` from exp(old_logprobs -
    sampler_logprobs); the off-policy mask (`off_policy_mask_threshold`, against the sampler's logprobs:
    `old_logprobs` themselves with old_logprobs "sampler"); the entropy mask (`top_entropy_quantile` of
    `entropy`'s values on this call's generated tokens). Masked tokens keep their place in the normaliser,
    as in TRL. With `kl_coef` > 0 it adds kl_coef * KL estimate against `ref_logprobs` on every token (logged
    whenever given). Given `sampler_logprobs` it logs |old_logprobs - sampler_logprobs|, mean
    (sampler_abs_diff) and max (sampler_abs_diff_max): trainer vs rollout engine on the sampled tokens, the
    alarm for a weight sync that silently failed.

    All log-prob tensors are (B, T) over the same tokens; `advantages` is (B,) or (B, T); `mask` is 1 on
    generated tokens, 0 on prompt, observation and padding tokens (their values are never used).
    `sequence_tokens` (B,), for sequence_mean: the generated tokens of the episode each row belongs to,
    when an episode spans several rows; by default each row's own. (B, T) gives it per token, for rows that
    hold several episodes' sequences (packed). `sequence_ids` (B, T): the sequence each token belongs to, for
    the sequence-level settings (AlgorithmConfig.sequence_level) on packed rows; by default its row. A
    sequence must lie whole in one call.
    """
    if not normalizer > 0:
        raise ValueError(
            f"normalizer must be > 0, got {normalizer!r}: a batch without generated tokens has nothing to train on"
        )
    _check_shapes(logprobs, old_logprobs=old_logprobs, mask=mask, ref_logprobs=ref_logprobs,
                  sampler_logprobs=sampler_logprobs, sequence_ids=sequence_ids, entropy=entropy)
    if advantages.shape not in (logprobs.shape[:1], logprobs.shape):
        raise ValueError(
            f"advantages must be (B,) or (B, T) for logprobs {tuple(logprobs.shape)}, got {tuple(advantages.shape)}"
        )
    if sequence_tokens is not None and sequence_tokens.shape not in (logprobs.shape[:1], logprobs.shape):
        raise ValueError(f"sequence_tokens must be (B,) or (B, T) for logprobs {tuple(logprobs.shape)}, "
                         f"got {tuple(sequence_tokens.shape)}: one count per row, or per token")
    if config.kl_coef > 0 and ref_logprobs is None:
        raise ValueError(f"kl_coef={config.kl_coef} needs ref_logprobs (the reference model's logprobs)")
    for name in ("importance_sampling", "off_policy_mask_threshold"):
        if getattr(config, name) is not None and sampler_logprobs is None:
            raise ValueError(f"{name}={getattr(config, name)!r} needs sampler_logprobs (the rollout engine's logprobs)")
    if config.top_entropy_quantile < 1 and entropy is None:
        raise ValueError(f"top_entropy_quantile={config.top_entropy_quantile} needs entropy (each token's entropy)")

    m = mask.bool()
    tokens = m.sum()
    adv = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages
    adv = adv.expand_as(logprobs)
    metrics, maxima, counts, ratios = {}, {}, {}, {}
    seq = _Sequences(m, sequence_ids)

    def mean(x: torch.Tensor) -> torch.Tensor:
        return torch.where(m, x.detach().to(logprobs.dtype), 0.0).sum() / tokens.clamp(min=1)

    def largest(x: torch.Tensor) -> torch.Tensor:  # masked-out tokens never win; 0 without any token
        return torch.where(m, x.detach().to(logprobs.dtype), 0.0).max() if m.numel() else logprobs.new_zeros(())

    log_ratio = _masked(logprobs - old_logprobs, m).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    if config.loss_type == "gspo":
        sequence_log_ratio = seq.mean(log_ratio.detach())
        metrics["sequence_ratio_mean"] = mean(sequence_log_ratio.exp())
        log_ratio = sequence_log_ratio + _masked(logprobs - logprobs.detach(), m)
    ratio = log_ratio.exp()
    metrics["ratio_mean"] = mean(ratio)
    maxima["ratio_max"] = largest(ratio)
    if config.loss_type == "cispo":
        cap = 1 + config.clip_high
        pg = -adv * ratio.detach().clamp(max=cap) * _masked(logprobs, m)
        metrics["clip_fraction"] = mean(ratio > cap)
    elif config.loss_type == "sapo":
        tau = torch.where(adv > 0, config.sapo_tau_pos, config.sapo_tau_neg).to(ratio.dtype)
        gate = torch.sigmoid(tau * (ratio - 1))
        pg = -adv * gate * 4 / tau
        metrics["sapo_gate_mean"] = mean(4 * gate * (1 - gate))  # the gradient's weight against plain PG's
    else:
        unclipped = -adv * ratio
        clipped = -adv * ratio.clamp(1 - config.clip_low, 1 + config.clip_high)
        pg = torch.maximum(unclipped, clipped)
        metrics["clip_fraction"] = mean(clipped > unclipped)
        if config.dual_clip is not None:
            bound = -adv * config.dual_clip
            dual = (adv < 0) & (pg > bound)
            pg = torch.where(dual, bound, pg)
            metrics["dual_clip_fraction"] = mean(dual)

    if sampler_logprobs is not None:
        mismatch = _masked(old_logprobs - sampler_logprobs, m).detach()
        metrics["sampler_abs_diff"] = mean(mismatch.abs())
        maxima["sampler_abs_diff_max"] = largest(mismatch.abs())
        if config.importance_sampling is not None:
            weight, cut = importance_weights(mismatch, seq, config)
            pg = pg * weight
            metrics["tis_weight_mean"] = mean(weight)
            maxima["tis_weight_max"] = largest(weight)
            kind = "truncated" if config.importance_sampling.endswith("truncate") else "masked"
            metrics[f"is_{kind}_fraction"] = mean(cut)
            if config.importance_sampling != "token_truncate" and config.importance_sampling != "token_mask":
                counts[f"is_{kind}_sequences"] = seq.count(cut)
        if config.off_policy_mask_threshold is not None:
            behaviour = old_logprobs if config.old_logprobs == "sampler" else sampler_logprobs
            drift = seq.mean(_masked(behaviour - logprobs, m).detach())
            off = (adv < 0) & (drift > config.off_policy_mask_threshold)
            pg = torch.where(off, 0.0, pg)
            metrics["off_policy_masked_fraction"] = mean(off)
            counts["off_policy_masked_sequences"] = seq.count(off)

    if entropy is not None:
        entropy = entropy.detach()
        metrics["entropy"] = mean(entropy)
        if config.top_entropy_quantile < 1:
            low = entropy_mask(entropy, m, config.top_entropy_quantile)
            pg = torch.where(low, 0.0, pg)
            metrics["entropy_masked_fraction"] = mean(low)
            trained = m & ~low
            ratios["entropy_trained"] = (torch.where(trained, entropy.to(logprobs.dtype), 0.0).sum(), trained.sum())

    per_token = pg
    if ref_logprobs is not None:
        kl = _kl(_masked(ref_logprobs - logprobs, m).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO), config.kl_estimator)
        metrics["kl"] = mean(kl)
        if config.kl_coef > 0:
            per_token = per_token + config.kl_coef * kl

    per_token = _masked(per_token, m)
    if config.loss_agg == "sequence_mean":
        lengths = m.sum(dim=-1) if sequence_tokens is None else sequence_tokens.to(m.device)
        if lengths.dim() == 2:
            total = (per_token / lengths.clamp(min=1)).sum()
        else:
            total = (per_token.sum(dim=-1) / lengths.clamp(min=1)).sum()
    else:
        total = per_token.sum()
    return LossOutput(loss=total / normalizer, metrics=metrics, maxima=maxima, tokens=tokens, counts=counts,
                      ratios=ratios)


def importance_weights(log_ratio: torch.Tensor, seq: "_Sequences", config: AlgorithmConfig):
    """Per token, the importance weight of `config.importance_sampling` from log(old / sampler) (masked,
    detached), and where it was truncated or masked. Sequence modes use the sequence's summed log-ratio
    (the product of its token ratios), geometric_mask its mean (their geometric mean)."""
    mode, cap = config.importance_sampling, config.tis_cap
    floor = config.tis_floor if config.tis_floor is not None or mode != "geometric_mask" else 1 / cap
    if mode.startswith("sequence"):
        log_ratio = seq.sum(log_ratio)
    elif mode == "geometric_mask":
        log_ratio = seq.mean(log_ratio)
    w = log_ratio.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO).exp()
    outside = (w > cap) | (w < floor) if floor is not None else w > cap
    if mode.endswith("truncate"):
        return w.clamp(min=floor, max=cap), outside
    return torch.where(outside, 0.0, 1.0 if mode == "geometric_mask" else w), outside


def entropy_mask(entropy: torch.Tensor, m: torch.Tensor, top: float) -> torch.Tensor:
    """True on the generated tokens whose entropy is below the (1 - top) quantile of the generated tokens'
    entropies (linear interpolation, torch.quantile's default): those do not train."""
    values = entropy[m].float()
    if values.numel() == 0:
        return torch.zeros_like(m)
    threshold = torch.quantile(values, 1 - top).to(entropy.dtype)
    return m & (entropy < threshold)


class _Sequences:
    """The sequences of a call's tokens: each row's own, or the ids given; sums and means over each one's
    masked tokens, spread back to its tokens."""

    def __init__(self, m: torch.Tensor, ids: Optional[torch.Tensor]):
        if ids is None:
            ids = torch.arange(m.shape[0], device=m.device)[:, None].expand(m.shape)
        self.m = m
        _, self.index = torch.unique(ids, return_inverse=True)
        self.n = int(self.index.max()) + 1 if self.index.numel() else 0
        self.lengths = self._total(m.to(torch.float64)).clamp(min=1)

    def _total(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.where(self.m, x, 0.0)
        return x.new_zeros(self.n).index_add(0, self.index.flatten(), x.flatten())

    def sum(self, x: torch.Tensor) -> torch.Tensor:
        return self._total(x)[self.index]

    def mean(self, x: torch.Tensor) -> torch.Tensor:
        return (self._total(x) / self.lengths.to(x.dtype))[self.index]

    def count(self, flag: torch.Tensor) -> torch.Tensor:
        """Sequences with at least one generated token flagged."""
        return (self._total((flag & self.m).to(torch.float64)) > 0).sum()


def merge_metrics(outputs: Sequence[LossOutput],
                  reduce: Optional[Callable[[list[float], str], list[float]]] = None) -> dict[str, float]:
    """Batch metrics from micro-batch outputs: token-weighted means (a plain mean of means would weight a
    short micro-batch like a long one), the maxima, the counts and ratios summed, generated_tokens and the
    batch loss (the sum of the outputs' losses).

    With data parallelism pass `reduce(values, op)`, op "sum" or "max" over all ranks
    (grpo.learner.dist.all_reduce), and call it on every rank with outputs of the same policy_loss
    settings: the metrics then cover every rank's outputs.
    """
    reduce = reduce or (lambda values, op: values)
    means, maxima = list(outputs[0].metrics), list(outputs[0].maxima)
    tokens = [float(o.tokens) for o in outputs]
    sums = reduce([sum(float(o.metrics[n]) * w for o, w in zip(outputs, tokens)) for n in means]
                  + [sum(tokens), sum(float(o.loss.detach()) for o in outputs)], "sum")
    total = sums[len(means)]
    merged = {n: s / max(total, 1.0) for n, s in zip(means, sums)}
    if maxima:
        merged.update(zip(maxima, reduce([max(float(o.maxima[n]) for o in outputs) for n in maxima], "max")))
    counts, ratios = list(outputs[0].counts), list(outputs[0].ratios)
    if counts or ratios:
        summed = reduce([sum(float(o.counts[n]) for o in outputs) for n in counts]
                        + [sum(float(o.ratios[n][k]) for o in outputs) for n in ratios for k in (0, 1)], "sum")
        merged.update(zip(counts, summed))
        pairs = summed[len(counts):]
        merged.update({n: pairs[2 * j] / max(pairs[2 * j + 1], 1.0) for j, n in enumerate(ratios)})
    merged.update(loss=sums[len(means) + 1], generated_tokens=total)
    return merged


def _kl(log_ref_ratio: torch.Tensor, estimator: str) -> torch.Tensor:
    """Schulman's estimators of KL(policy || reference) per sampled token, from log(ref / policy)."""
    if estimator == "k1":
        return -log_ref_ratio
    if estimator == "k2":
        return 0.5 * log_ref_ratio**2
    return log_ref_ratio.exp() - 1 - log_ref_ratio


def _masked(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    # where, not multiply: padding may hold -inf or NaN, and 0 * inf is NaN in the forward and the backward.
    return torch.where(m, x, 0.0)


def _check_shapes(logprobs: torch.Tensor, **others: Optional[torch.Tensor]) -> None:
    for name, t in others.items():
        if t is not None and t.shape != logprobs.shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, logprobs {tuple(logprobs.shape)}: they must match")

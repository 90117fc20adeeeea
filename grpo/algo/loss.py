"""The clipped policy-gradient loss over per-token logprobs, with an optional KL penalty and truncated
importance-sampling (TIS) correction.

Micro-batch independence: every aggregation is a sum over tokens or sequences divided by one number for
the whole batch (`loss_normalizer`), so the micro-batch losses sum to the full-batch loss and their
gradients to its gradient, however the batch is split.

A sequence is an episode. When an episode is split into several rows (one segment per turn, with history
none or text), sequence_mean divides each row by its episode's generated tokens (`sequence_tokens`) and the
normaliser counts episodes (`sequences`), so the episode weighs what it would as one row.
"""
from __future__ import annotations

from dataclasses import dataclass
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
) -> LossOutput:
    """Per token: -A * ratio with ratio = exp(logprobs - old_logprobs), clipped PPO-style to
    [1 - clip_low, 1 + clip_high] (the pessimistic max of the clipped and unclipped losses); with
    `dual_clip` c a negative advantage's loss is at most c * |A|. With `tis_cap` the policy term is weighted
    by min(exp(old_logprobs - sampler_logprobs), tis_cap), detached. With `kl_coef` > 0 it adds
    kl_coef * KL estimate against `ref_logprobs` (which is logged whenever given). Given `sampler_logprobs`
    it logs |old_logprobs - sampler_logprobs|, mean (sampler_abs_diff) and max (sampler_abs_diff_max):
    trainer vs rollout engine on the sampled tokens, the alarm for a weight sync that silently failed.

    All log-prob tensors are (B, T) over the same tokens; `advantages` is (B,) or (B, T); `mask` is 1 on
    generated tokens, 0 on prompt, observation and padding tokens (their values are never used).
    `sequence_tokens` (B,), for sequence_mean: the generated tokens of the episode each row belongs to,
    when an episode spans several rows; by default each row's own. (B, T) gives it per token, for rows that
    hold several episodes' sequences (packed).
    """
    if not normalizer > 0:
        raise ValueError(
            f"normalizer must be > 0, got {normalizer!r}: a batch without generated tokens has nothing to train on"
        )
    _check_shapes(
        logprobs, old_logprobs=old_logprobs, mask=mask, ref_logprobs=ref_logprobs, sampler_logprobs=sampler_logprobs
    )
    if advantages.shape not in (logprobs.shape[:1], logprobs.shape):
        raise ValueError(
            f"advantages must be (B,) or (B, T) for logprobs {tuple(logprobs.shape)}, got {tuple(advantages.shape)}"
        )
    if sequence_tokens is not None and sequence_tokens.shape not in (logprobs.shape[:1], logprobs.shape):
        raise ValueError(f"sequence_tokens must be (B,) or (B, T) for logprobs {tuple(logprobs.shape)}, "
                         f"got {tuple(sequence_tokens.shape)}: one count per row, or per token")
    if config.kl_coef > 0 and ref_logprobs is None:
        raise ValueError(f"kl_coef={config.kl_coef} needs ref_logprobs (the reference model's logprobs)")
    if config.tis_cap is not None and sampler_logprobs is None:
        raise ValueError(f"tis_cap={config.tis_cap} needs sampler_logprobs (the rollout engine's logprobs)")

    m = mask.bool()
    tokens = m.sum()
    adv = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages
    metrics, maxima = {}, {}

    def mean(x: torch.Tensor) -> torch.Tensor:
        return torch.where(m, x.detach().to(logprobs.dtype), 0.0).sum() / tokens.clamp(min=1)

    ratio = _masked(logprobs - old_logprobs, m).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO).exp()
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1 - config.clip_low, 1 + config.clip_high)
    pg = torch.maximum(unclipped, clipped)
    metrics["ratio_mean"] = mean(ratio)
    metrics["clip_fraction"] = mean(clipped > unclipped)
    if config.dual_clip is not None:
        bound = -adv * config.dual_clip
        dual = (adv < 0) & (pg > bound)
        pg = torch.where(dual, bound, pg)
        metrics["dual_clip_fraction"] = mean(dual)

    if sampler_logprobs is not None:
        mismatch = _masked(old_logprobs - sampler_logprobs, m).detach()
        metrics["sampler_abs_diff"] = mean(mismatch.abs())
        maxima["sampler_abs_diff_max"] = mismatch.abs().max()  # masked-out tokens are 0: they never win
        if config.tis_cap is not None:
            weight = mismatch.exp().clamp(max=config.tis_cap)
            pg = pg * weight
            metrics["tis_weight_mean"] = mean(weight)

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
    return LossOutput(loss=total / normalizer, metrics=metrics, maxima=maxima, tokens=tokens)


def merge_metrics(outputs: Sequence[LossOutput],
                  reduce: Optional[Callable[[list[float], str], list[float]]] = None) -> dict[str, float]:
    """Batch metrics from micro-batch outputs: token-weighted means (a plain mean of means would weight a
    short micro-batch like a long one), the maxima, generated_tokens and the batch loss (the sum of the
    outputs' losses).

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

import math

import pytest
import torch
from torch.testing import assert_close

from grpo.algo.config import AlgorithmConfig
from grpo.algo.loss import loss_normalizer, merge_metrics, policy_loss

LN2 = math.log(2)


def t(values, **kw):
    return torch.tensor(values, dtype=torch.float64, **kw)


def leaf(values):
    return t(values, requires_grad=True)


def test_clip_higher_token_mean_loss_gradient_and_metrics():
    # old logprobs 0, so ratio = exp(logprobs). Clip range [1 - 0.2, 1 + 0.3] = [0.8, 1.3].
    # A = +1, loss -min(r, clip(r)): r 0.5 -> -0.5, 0.9 -> -0.9, 1 -> -1, 1.1 -> -1.1, 1.5 -> -1.3 (clipped)
    # A = -1, loss max(r, clip(r)):   r 0.5 -> 0.8 (clipped), 0.9, 1, 1.1, 1.5 -> 1.5
    # token mean: (-4.8 + 5.3) / 10 = 0.05; clip fraction 2/10; mean ratio 10/10.
    # Gradient -A * r / 10 where unclipped, 0 where clipped.
    ratios = [0.5, 0.9, 1.0, 1.1, 1.5]
    logprobs = leaf([[math.log(r) for r in ratios]] * 2)
    config = AlgorithmConfig(clip_low=0.2, clip_high=0.3)
    out = policy_loss(logprobs, torch.zeros(2, 5, dtype=torch.float64), t([1.0, -1.0]), torch.ones(2, 5), config, 10.0)
    out.loss.backward()
    assert_close(out.loss, t(0.05))
    assert_close(logprobs.grad, t([[-0.05, -0.09, -0.10, -0.11, 0.0], [0.0, 0.09, 0.10, 0.11, 0.15]]))
    assert out.metrics["clip_fraction"].item() == pytest.approx(0.2)
    assert out.metrics["ratio_mean"].item() == pytest.approx(1.0)
    assert int(out.tokens) == 10
    assert not any(m.requires_grad for m in out.metrics.values())


def test_dual_clip_bounds_negative_advantages():
    # c = 3, clip range [0.8, 1.3]. Row A = -1: r 5 -> max(5, 1.3) = 5, above 3 * |A| -> 3 (no gradient);
    # r 2 -> 2 (gradient r = 2). Row A = +1: r 5 -> -1.3 (clipped), r 1 -> -1 (gradient -1).
    # Loss (3 + 2 - 1.3 - 1) / 4 = 0.675; gradient [[0, 0.5], [0, -0.25]].
    logprobs = leaf([[math.log(5), LN2], [math.log(5), 0.0]])
    config = AlgorithmConfig(clip_low=0.2, clip_high=0.3, dual_clip=3.0)
    out = policy_loss(logprobs, torch.zeros(2, 2, dtype=torch.float64), t([-1.0, 1.0]), torch.ones(2, 2), config, 4.0)
    out.loss.backward()
    assert_close(out.loss, t(0.675))
    assert_close(logprobs.grad, t([[0.0, 0.5], [0.0, -0.25]]))
    assert out.metrics["dual_clip_fraction"].item() == pytest.approx(0.25)
    assert out.metrics["clip_fraction"].item() == pytest.approx(0.25)


# On-policy (ratio 1) each generated token's loss is -A. Row 0: 3 tokens, A = 1; row 1: 1 token after an
# observation token, A = -2; row 2: a zero-length response, A = 5.
AGG_MASK = [[1, 1, 1, 0], [0, 1, 0, 0], [0, 0, 0, 0]]
AGG_ADV = [1.0, -2.0, 5.0]


@pytest.mark.parametrize(
    "agg, expected_loss, expected_grad",
    [
        # (-3 + 2) / 4 tokens; gradient -A / 4 per token.
        ("token_mean", -0.25, [[-0.25] * 3 + [0], [0, 0.5, 0, 0], [0] * 4]),
        # per-sequence means -1, 2, 0, summed and divided by 3 sequences; gradient -A / (len * 3).
        ("sequence_mean", 1 / 3, [[-1 / 9] * 3 + [0], [0, 2 / 3, 0, 0], [0] * 4]),
        # (-3 + 2) / (3 sequences * 4); gradient -A / 12.
        ("seq_sum_norm", -1 / 12, [[-1 / 12] * 3 + [0], [0, 1 / 6, 0, 0], [0] * 4]),
    ],
)
def test_aggregation_modes_by_hand(agg, expected_loss, expected_grad):
    config = AlgorithmConfig(loss_agg=agg, seq_sum_norm_len=4)
    mask = torch.tensor(AGG_MASK)
    logprobs = leaf([[-1.0, -2.0, -0.5, 0.0]] * 3)
    out = policy_loss(logprobs, logprobs.detach(), t(AGG_ADV), mask, config, loss_normalizer(mask, config))
    out.loss.backward()
    assert_close(out.loss, t(expected_loss))
    assert_close(logprobs.grad, t(expected_grad))


def test_normalizers_by_hand_and_over_micro_batch_masks():
    mask = torch.tensor(AGG_MASK)
    expected = {"token_mean": 4.0, "sequence_mean": 3.0, "seq_sum_norm": 12.0}
    for agg, value in expected.items():
        config = AlgorithmConfig(loss_agg=agg, seq_sum_norm_len=4)
        assert loss_normalizer(mask, config) == value
        # Micro-batches may be padded to different lengths: the counts still add up.
        assert loss_normalizer([mask[:1], mask[1:, :2]], config) == value


@pytest.mark.parametrize(
    "agg, expected_loss, a_grad, b_grad",
    [
        # Episode A: 3 tokens, advantage 3; B: 1 token, advantage -1; ratio 1. Episode means -3 and 1, over 2
        # episodes: -1; gradient -A / (episode tokens * 2): -1/2 on A's tokens, 1/2 on B's.
        ("sequence_mean", -1.0, -0.5, 0.5),
        # Token sums -9 and 1 over (2 episodes * 4): -1; gradient -A / 8.
        ("seq_sum_norm", -1.0, -3 / 8, 1 / 8),
    ],
)
def test_an_episode_split_into_turns_weighs_as_one_sequence(agg, expected_loss, a_grad, b_grad):
    config = AlgorithmConfig(loss_agg=agg, seq_sum_norm_len=4)
    # As one row each (history full) ...
    whole_mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    whole = leaf([[0.0] * 3] * 2)
    out = policy_loss(whole, whole.detach(), t([3.0, -1.0]), whole_mask, config, loss_normalizer(whole_mask, config))
    out.loss.backward()
    assert_close(out.loss, t(expected_loss))
    assert_close(whole.grad, t([[a_grad] * 3, [b_grad, 0, 0]]))
    # ... and with A's two turns as two rows (history none), in two micro-batches.
    masks = [torch.tensor([[1, 1]]), torch.tensor([[1, 0], [1, 0]])]
    normalizer = loss_normalizer(masks, config, sequences=2)
    turn1, rest = leaf([[0.0, 0.0]]), leaf([[0.0, 0.0]] * 2)
    first = policy_loss(turn1, turn1.detach(), t([3.0]), masks[0], config, normalizer, sequence_tokens=t([3.0]))
    second = policy_loss(rest, rest.detach(), t([3.0, -1.0]), masks[1], config, normalizer,
                         sequence_tokens=t([3.0, 1.0]))
    (first.loss + second.loss).backward()
    assert_close(first.loss + second.loss, t(expected_loss))
    assert_close(turn1.grad, t([[a_grad] * 2]))
    assert_close(rest.grad, t([[a_grad, 0], [b_grad, 0]]))
    # ... and the three turns packed into one row, each token with its episode's generated tokens.
    packed = leaf([[0.0] * 6])
    out = policy_loss(packed, packed.detach(), t([[3.0, 3.0, 3.0, 3.0, -1.0, -1.0]]),
                      torch.tensor([[1, 1, 1, 0, 1, 0]]), config, normalizer,
                      sequence_tokens=t([[3.0, 3.0, 3.0, 3.0, 1.0, 1.0]]))
    out.loss.backward()
    assert_close(out.loss, t(expected_loss))
    assert_close(packed.grad, t([[a_grad, a_grad, a_grad, 0, b_grad, 0]]))
    # Counting rows as sequences (the old rule) would count A twice.
    assert loss_normalizer(masks, config) == 1.5 * normalizer


def random_batch(seed):
    rows, cols = 6, 7
    g = torch.Generator().manual_seed(seed)
    lengths = [7, 3, 0, 5, 1, 6]  # generated tokens per row, one zero-length response
    starts = [0, 2, 0, 1, 4, 1]  # prompt/observation tokens before them
    mask = torch.zeros(rows, cols, dtype=torch.bool)
    for row, (start, n) in enumerate(zip(starts, lengths)):
        mask[row, start : start + n] = True
    old = -torch.rand(rows, cols, generator=g, dtype=torch.float64) * 3
    return {
        "logprobs": (old + torch.randn(rows, cols, generator=g, dtype=torch.float64) * 0.4).requires_grad_(),
        "old_logprobs": old,
        "advantages": torch.randn(rows, generator=g, dtype=torch.float64),
        "mask": mask,
        "ref_logprobs": old + torch.randn(rows, cols, generator=g, dtype=torch.float64) * 0.3,
        "sampler_logprobs": old + torch.randn(rows, cols, generator=g, dtype=torch.float64) * 0.3,
    }


def micro_batch_loss_and_grad(batch, config, splits):
    logprobs, mask = batch["logprobs"], batch["mask"]
    logprobs.grad = None
    row_slices, start = [], 0
    for n in splits:
        row_slices.append(slice(start, start + n))
        start += n
    # Each micro-batch trimmed to its own last generated token, as a padding collator would.
    columns = torch.arange(1, mask.shape[1] + 1)
    widths = [int((mask[rows].any(dim=0) * columns).max().clamp(min=1)) for rows in row_slices]
    normalizer = loss_normalizer([mask[rows, :w] for rows, w in zip(row_slices, widths)], config)
    outputs = []
    for rows, w in zip(row_slices, widths):
        part = {k: (v[rows, :w] if v.dim() == 2 else v[rows]) for k, v in batch.items() if k != "mask"}
        out = policy_loss(
            part.pop("logprobs"), part.pop("old_logprobs"), part.pop("advantages"), mask[rows, :w],
            config, normalizer, **part,
        )
        out.loss.backward()
        outputs.append(out)
    return outputs, logprobs.grad.clone()


@pytest.mark.parametrize("agg", ["token_mean", "sequence_mean", "seq_sum_norm"])
def test_micro_batches_give_the_full_batch_loss_gradient_and_metrics(agg):
    config = AlgorithmConfig(loss_agg=agg, seq_sum_norm_len=7, dual_clip=3.0, kl_coef=0.1, tis_cap=1.5)
    batch = random_batch(0)
    full, full_grad = micro_batch_loss_and_grad(batch, config, [6])
    assert full[0].metrics["clip_fraction"] > 0  # the data exercises clipping
    for splits in ([2, 3, 1], [1] * 6, [3, 3]):
        outputs, grad = micro_batch_loss_and_grad(batch, config, splits)
        assert_close(sum(o.loss for o in outputs), full[0].loss)
        assert_close(grad, full_grad)
        merged, whole = merge_metrics(outputs), merge_metrics(full)
        assert merged.keys() == whole.keys() and "sampler_abs_diff_max" in whole
        for name in whole:
            assert merged[name] == pytest.approx(whole[name], rel=1e-9, abs=1e-12), name


def test_merging_over_ranks_equals_merging_all_outputs():
    # Two data-parallel ranks, one micro-batch each: `reduce` hands each rank the other's values summed
    # or maxed, as dist.all_reduce does.
    outputs, _ = micro_batch_loss_and_grad(random_batch(2), AlgorithmConfig(kl_coef=0.1), [2, 4])
    other = {}
    merge_metrics(outputs[1:], lambda values, op: other.setdefault(op, values))
    combine = {"sum": lambda a, b: a + b, "max": max}
    ranks = merge_metrics(outputs[:1], lambda values, op: [combine[op](a, b) for a, b in zip(values, other[op])])
    whole = merge_metrics(outputs)
    assert ranks.keys() == whole.keys() and whole["generated_tokens"] == 22
    for name in whole:
        assert ranks[name] == pytest.approx(whole[name], rel=1e-12), name


@pytest.mark.parametrize(
    "estimator, expected_kl, expected_grad",
    [
        # k2 = (logprobs - ref)^2 / 2 = ln2^2 / 2 each; gradient logprobs - ref = +-ln2.
        ("k2", LN2**2 / 2, [LN2, -LN2]),
        # k3 = e^x - 1 - x with x = ref - logprobs: 0.5 - 1 + ln2 and 2 - 1 - ln2, mean 0.25;
        # gradient 1 - e^x: 0.5 and -1.
        ("k3", 0.25, [0.5, -1.0]),
    ],
)
def test_kl_estimators_by_hand(estimator, expected_kl, expected_grad):
    # Zero advantages leave only the KL term: loss = 0.1 * mean KL, gradient 0.1 * dKL / 2 tokens.
    logprobs = leaf([[0.0, 0.0]])
    config = AlgorithmConfig(kl_coef=0.1, kl_estimator=estimator)
    ref = t([[-LN2, LN2]])
    out = policy_loss(logprobs, logprobs.detach(), t([0.0]), torch.ones(1, 2), config, 2.0, ref_logprobs=ref)
    out.loss.backward()
    assert out.metrics["kl"].item() == pytest.approx(expected_kl)
    assert_close(out.loss, t(0.1 * expected_kl))
    assert_close(logprobs.grad, t([[0.1 * g / 2 for g in expected_grad]]))


@pytest.mark.parametrize("estimator, expected_kl", [("k1", 0.0), ("k3", 0.25)])
def test_kl_is_logged_without_being_a_penalty_when_kl_coef_is_zero(estimator, expected_kl):
    # k1 = logprobs - ref = +ln2 and -ln2, mean 0: a metric only (a k1 penalty is refused, test_algo_config).
    logprobs = leaf([[0.0, 0.0]])
    ref = t([[-LN2, LN2]])
    config = AlgorithmConfig(kl_estimator=estimator)
    out = policy_loss(logprobs, logprobs.detach(), t([0.0]), torch.ones(1, 2), config, 2.0, ref_logprobs=ref)
    assert out.metrics["kl"].item() == pytest.approx(expected_kl)
    assert out.loss.item() == 0.0


def test_truncated_importance_sampling_by_hand():
    # old - sampler = +ln2 and -ln2: weights min(2, 1.5) = 1.5 and 0.5. On-policy with A = 1 each token's
    # loss is -w: (-1.5 - 0.5) / 2 = -1; gradient -w / 2. The weights carry no gradient to the sampler.
    logprobs = leaf([[0.0, 0.0]])
    sampler = t([[-LN2, LN2]], requires_grad=True)
    config = AlgorithmConfig(tis_cap=1.5)
    out = policy_loss(logprobs, logprobs.detach(), t([1.0]), torch.ones(1, 2), config, 2.0, sampler_logprobs=sampler)
    out.loss.backward()
    assert_close(out.loss, t(-1.0))
    assert_close(logprobs.grad, t([[-0.75, -0.25]]))
    assert sampler.grad is None
    assert out.metrics["tis_weight_mean"].item() == pytest.approx(1.0)
    assert out.metrics["sampler_abs_diff"].item() == pytest.approx(LN2)


def test_sampler_mismatch_is_logged_without_tis():
    logprobs = leaf([[0.0, 0.0]])
    sampler = t([[-0.1, 0.3]])
    config = AlgorithmConfig()
    out = policy_loss(logprobs, logprobs.detach(), t([1.0]), torch.ones(1, 2), config, 2.0, sampler_logprobs=sampler)
    assert out.metrics["sampler_abs_diff"].item() == pytest.approx(0.2)
    assert out.maxima["sampler_abs_diff_max"].item() == pytest.approx(0.3)
    assert "tis_weight_mean" not in out.metrics
    assert_close(out.loss, t(-1.0))


def test_per_token_advantages_match_broadcast_ones():
    batch = random_batch(1)
    config = AlgorithmConfig()
    args = (batch["logprobs"], batch["old_logprobs"])
    per_seq = policy_loss(*args, batch["advantages"], batch["mask"], config, 30.0)
    per_token = policy_loss(*args, batch["advantages"][:, None].expand(6, 7), batch["mask"], config, 30.0)
    assert_close(per_seq.loss, per_token.loss)


@pytest.mark.parametrize("agg", ["token_mean", "sequence_mean", "seq_sum_norm"])
def test_masked_garbage_and_empty_sequences_give_no_nan(agg):
    # Padding positions hold -inf and NaN; one row and then a whole micro-batch have no generated token.
    config = AlgorithmConfig(loss_agg=agg, seq_sum_norm_len=3, kl_coef=0.1, tis_cap=2.0, dual_clip=3.0)
    logprobs = leaf([[-0.5, float("-inf"), float("nan")], [float("nan")] * 3])
    mask = torch.tensor([[1, 0, 0], [0, 0, 0]])
    old = t([[-0.7, float("nan"), 0.0], [0.0, float("-inf"), 0.0]])
    extra = {"ref_logprobs": old.clone(), "sampler_logprobs": old.clone()}
    out = policy_loss(logprobs, old, t([1.0, -1.0]), mask, config, 2.0, **extra)
    out.loss.backward()
    assert torch.isfinite(out.loss) and torch.isfinite(logprobs.grad).all()
    assert logprobs.grad[0, 1:].eq(0).all() and logprobs.grad[1].eq(0).all()
    logprobs.grad = None
    extra = {"ref_logprobs": old[1:], "sampler_logprobs": old[1:]}
    empty = policy_loss(logprobs[1:], old[1:], t([-1.0]), mask[1:], config, 2.0, **extra)
    empty.loss.backward()
    assert empty.loss.item() == 0.0 and logprobs.grad.eq(0).all() and int(empty.tokens) == 0
    assert all(math.isfinite(v) for v in merge_metrics([empty]).values())


def test_bad_inputs_are_refused_with_the_fix():
    lp, mask, adv = torch.zeros(2, 3), torch.ones(2, 3), torch.zeros(2)
    with pytest.raises(ValueError, match="normalizer must be > 0"):
        policy_loss(lp, lp, adv, mask, AlgorithmConfig(), 0.0)
    with pytest.raises(ValueError, match="needs ref_logprobs"):
        policy_loss(lp, lp, adv, mask, AlgorithmConfig(kl_coef=0.1), 1.0)
    with pytest.raises(ValueError, match="needs sampler_logprobs"):
        policy_loss(lp, lp, adv, mask, AlgorithmConfig(tis_cap=2.0), 1.0)
    with pytest.raises(ValueError, match=r"mask has shape \(2, 2\)"):
        policy_loss(lp, lp, adv, mask[:, :2], AlgorithmConfig(), 1.0)
    with pytest.raises(ValueError, match="advantages must be"):
        policy_loss(lp, lp, torch.zeros(3), mask, AlgorithmConfig(), 1.0)
    with pytest.raises(ValueError, match=r"sequence_tokens must be \(B,\) or \(B, T\)"):
        policy_loss(lp, lp, adv, mask, AlgorithmConfig(), 1.0, sequence_tokens=torch.ones(3))

"""The objectives of algorithm.loss_type, the importance-sampling modes and the token masks (issue 37), on
hand-computed numbers; a finite-difference gradient check of GSPO, CISPO and SAPO in float64."""
import math

import pytest
import torch
from torch.testing import assert_close

from grpo.algo.advantages import batch_advantages, overlong_penalty
from grpo.algo.config import AlgorithmConfig, ConfigError
from grpo.algo.loss import merge_metrics, policy_loss
from rollout.trajectory import Segment, Trajectory

LN2 = math.log(2)


def t(values, **kw):
    return torch.tensor(values, dtype=torch.float64, **kw)


def grad_of(out, lp):
    (g,) = torch.autograd.grad(out.loss, lp)
    return g


# ---------------------------------------------------------------------------------------- the presets
def test_presets_set_their_fields_and_refuse_a_conflicting_one():
    dr = AlgorithmConfig(loss_type="dr_grpo", seq_sum_norm_len=16)
    assert (dr.loss_agg, dr.scale_rewards) == ("seq_sum_norm", "none")
    dapo = AlgorithmConfig(loss_type="dapo")
    assert (dapo.loss_agg, dapo.scale_rewards) == ("token_mean", "group")
    assert AlgorithmConfig(loss_type="gspo").loss_agg == "sequence_mean"
    same = AlgorithmConfig(loss_type="dr_grpo", loss_agg="seq_sum_norm", scale_rewards="none")  # the preset's own
    assert same.loss_agg == "seq_sum_norm"
    assert (AlgorithmConfig().loss_agg, AlgorithmConfig().scale_rewards) == ("token_mean", "group")
    with pytest.raises(ConfigError, match=r"loss_agg='token_mean' .*loss_type='dr_grpo' sets algorithm\.loss_agg"
                                          r"='seq_sum_norm'"):
        AlgorithmConfig(loss_type="dr_grpo", loss_agg="token_mean")
    with pytest.raises(ConfigError, match=r"scale_rewards='none' .*loss_type='dapo' sets algorithm\.scale_rewards"):
        AlgorithmConfig(loss_type="dapo", scale_rewards="none")
    with pytest.raises(ConfigError, match="one of 'grpo', 'dr_grpo', 'dapo', 'gspo', 'cispo', 'sapo'"):
        AlgorithmConfig(loss_type="bnpo")


def test_a_run_fills_dr_grpos_length_and_refuses_what_cannot_work():
    assert AlgorithmConfig(loss_type="dr_grpo").for_run(48, "full").seq_sum_norm_len == 48
    assert AlgorithmConfig(loss_type="dr_grpo", seq_sum_norm_len=9).for_run(48, "full").seq_sum_norm_len == 9
    for kw in ({"loss_type": "gspo"}, {"tis_cap": 2.0, "importance_sampling": "geometric_mask"},
               {"tis_cap": 2.0, "importance_sampling": "sequence_mask"}, {"off_policy_mask_threshold": 0.5}):
        AlgorithmConfig(**kw).for_run(48, "full")
        with pytest.raises(ConfigError, match=r"rollout\.history='text': each turn is then a segment"):
            AlgorithmConfig(**kw).for_run(48, "text")
    AlgorithmConfig(tis_cap=2.0).for_run(48, "none")  # token-level: exact across segments
    with pytest.raises(ConfigError, match=r"overlong_buffer=64 .*at most rollout\.max_tokens_per_turn=48"):
        AlgorithmConfig(overlong_buffer=64).for_run(48, "full")


def test_importance_sampling_fields():
    assert AlgorithmConfig(tis_cap=2.0).importance_sampling == "token_truncate"  # configs before the modes
    assert AlgorithmConfig().importance_sampling is None
    with pytest.raises(ConfigError, match=r"importance_sampling='token_mask' .*together with algorithm\.tis_cap"):
        AlgorithmConfig(importance_sampling="token_mask")
    with pytest.raises(ConfigError, match=r"importance_sampling='per_token' .*one of 'token_truncate'"):
        AlgorithmConfig(importance_sampling="per_token", tis_cap=2.0)
    with pytest.raises(ConfigError, match=r"tis_floor=0.5 .*without algorithm\.tis_cap"):
        AlgorithmConfig(tis_floor=0.5)
    with pytest.raises(ConfigError, match=r"dual_clip=3.0 .*with loss_type 'cispo'"):
        AlgorithmConfig(loss_type="cispo", dual_clip=3.0)
    with pytest.raises(ConfigError, match=r"top_entropy_quantile=0 "):
        AlgorithmConfig(top_entropy_quantile=0)


# -------------------------------------------------------------------------------------- the objectives
def test_gspo_clips_whole_sequences_on_their_length_normalised_ratio():
    # Sequence 0: log-ratios ln2, 0 -> s = exp(ln2 / 2) = 1.414 > 1.28 with A = 1: clipped, no gradient.
    # Sequence 1: s = 1, A = -1: loss 1 a token, gradient -A * s / 2 tokens / 2 sequences = 0.25 a token.
    lp = t([[LN2, 0.0], [0.0, 0.0]], requires_grad=True)
    old = t([[0.0, 0.0], [0.0, 0.0]])
    out = policy_loss(lp, old, t([1.0, -1.0]), torch.ones(2, 2), AlgorithmConfig(loss_type="gspo"), 2.0)
    assert out.loss.item() == pytest.approx((-1.28 + 1.0) / 2)
    assert_close(grad_of(out, lp), t([[0.0, 0.0], [0.25, 0.25]]))
    assert out.metrics["clip_fraction"].item() == pytest.approx(0.5)
    assert out.metrics["sequence_ratio_mean"].item() == pytest.approx((math.sqrt(2) + 1) / 2)


def test_cispo_weighs_every_token_by_its_clipped_detached_ratio():
    # r = 2 (clipped to 1 + 0.28) and 0.5 (not: no lower bound), A = 1: d loss / d lp = -A * w / normalizer.
    lp = t([[LN2, -LN2]], requires_grad=True)
    out = policy_loss(lp, t([[0.0, 0.0]]), t([1.0]), torch.ones(1, 2), AlgorithmConfig(loss_type="cispo"), 2.0)
    assert_close(grad_of(out, lp), t([[-1.28 / 2, -0.5 / 2]]))
    assert out.loss.item() == pytest.approx(-(1.28 * LN2 - 0.5 * LN2) / 2)
    assert out.metrics["clip_fraction"].item() == pytest.approx(0.5)


def test_sapo_gate_is_the_policy_gradient_on_policy_and_soft_off_it():
    # r = 1: value -A * 4 / tau * sigmoid(0) = -2 A / tau, gradient -A (4 s (1 - s) = 1).
    # r = 2, A = 1, tau 1: value -4 sigmoid(1), gradient -4 sigmoid(1) (1 - sigmoid(1)) * 2.
    lp = t([[0.0, 0.0], [LN2, 0.0]], requires_grad=True)
    adv = t([[1.0, -1.0], [1.0, 1.0]])
    out = policy_loss(lp, torch.zeros(2, 2, dtype=torch.float64), adv, torch.ones(2, 2),
                      AlgorithmConfig(loss_type="sapo"), 1.0)
    s1 = 1 / (1 + math.exp(-1))
    assert out.loss.item() == pytest.approx(-2.0 + 2 / 1.05 - 4 * s1 - 2.0)
    assert_close(grad_of(out, lp), t([[-1.0, 1.0], [-8 * s1 * (1 - s1), -1.0]]))


def _tiny_policy(seed=0):
    """Logits of a 2 x 3 batch over a 5-token vocabulary as the parameter, the sampled targets and old logprobs."""
    g = torch.Generator().manual_seed(seed)
    theta = torch.randn(2, 3, 5, generator=g, dtype=torch.float64)
    targets = torch.randint(0, 5, (2, 3), generator=g)
    old = (torch.log_softmax(theta + 0.3 * torch.randn(2, 3, 5, generator=g, dtype=torch.float64), -1)
           .gather(-1, targets[..., None]).squeeze(-1))
    return theta, targets, old


def _logprobs(theta, targets):
    return torch.log_softmax(theta, -1).gather(-1, targets[..., None]).squeeze(-1)


def _finite_differences(f, theta, h=1e-6):
    grad = torch.zeros_like(theta)
    for i in range(theta.numel()):
        d = torch.zeros_like(theta).view(-1)
        d[i] = h
        d = d.view_as(theta)
        grad.view(-1)[i] = (f(theta + d) - f(theta - d)) / (2 * h)
    return grad


@pytest.mark.parametrize("loss_type", ["gspo", "sapo"])
def test_gspo_and_sapo_gradients_match_finite_differences_of_their_objectives(loss_type):
    # GSPO's value is -A * min(s, clip(s)) per token whatever sg() does: the GSPO-token gradient that autograd
    # takes must be the derivative of the GSPO objective (one advantage a sequence).
    theta, targets, old = _tiny_policy()
    adv, mask = t([0.7, -1.3]), torch.tensor([[1, 1, 0], [1, 1, 1]])
    algo = AlgorithmConfig(loss_type=loss_type, clip_low=0.2, clip_high=0.28)

    def loss(th):
        return policy_loss(_logprobs(th, targets), old, adv, mask, algo, 2.0).loss

    theta_ = theta.clone().requires_grad_(True)
    (auto,) = torch.autograd.grad(loss(theta_), theta_)
    assert auto.abs().max() > 1e-3  # the check compares a gradient, not zeros
    assert_close(auto, _finite_differences(lambda th: loss(th).item(), theta), atol=1e-8, rtol=1e-6)


def test_cispo_gradient_matches_finite_differences_of_its_weighted_logprob():
    # CISPO's gradient is sg(w) * A * grad(log pi): finite differences of sum(w * A * log pi) / n with w fixed
    # at min(r, 1 + clip_high) of the point.
    theta, targets, old = _tiny_policy(1)
    adv, mask = t([[0.7, -0.4, 1.1], [-1.3, 0.2, 0.5]]), torch.tensor([[1, 1, 0], [1, 1, 1]])
    algo = AlgorithmConfig(loss_type="cispo")
    w = (_logprobs(theta, targets) - old).exp().clamp(max=1.28)
    theta_ = theta.clone().requires_grad_(True)
    (auto,) = torch.autograd.grad(policy_loss(_logprobs(theta_, targets), old, adv, mask, algo, 5.0).loss, theta_)
    fd = _finite_differences(lambda th: float((-(w * adv * _logprobs(th, targets)) * mask).sum() / 5.0), theta)
    assert auto.abs().max() > 1e-3
    assert_close(auto, fd, atol=1e-8, rtol=1e-6)


# ------------------------------------------------------------------------------ importance sampling
# Two sequences with log(old / sampler) ln2, ln2 (ratios 2, 2) and ln0.5, 0 (0.5, 1); lp = old, A = -1: each token's
# loss is its weight, and so is its gradient.
IS_CASES = [
    ("token_truncate", {"tis_cap": 1.5}, [[1.5, 1.5], [0.5, 1.0]], 0.5),
    ("token_truncate", {"tis_cap": 1.5, "tis_floor": 0.6}, [[1.5, 1.5], [0.6, 1.0]], 0.75),
    ("token_mask", {"tis_cap": 1.5}, [[0.0, 0.0], [0.5, 1.0]], 0.5),
    ("token_mask", {"tis_cap": 1.5, "tis_floor": 0.6}, [[0.0, 0.0], [0.0, 1.0]], 0.75),
    ("sequence_truncate", {"tis_cap": 3.0}, [[3.0, 3.0], [0.5, 0.5]], 0.5),  # products 4 and 0.5
    ("sequence_mask", {"tis_cap": 3.0}, [[0.0, 0.0], [0.5, 0.5]], 0.5),
    ("geometric_mask", {"tis_cap": 1.5}, [[0.0, 0.0], [1.0, 1.0]], 0.5),  # means 2 and 0.707 in [1 / 1.5, 1.5]
    ("geometric_mask", {"tis_cap": 1.5, "tis_floor": 0.8}, [[0.0, 0.0], [0.0, 0.0]], 1.0),
]


@pytest.mark.parametrize("mode, thresholds, weights, cut_share", IS_CASES)
def test_importance_sampling_modes(mode, thresholds, weights, cut_share):
    old = t([[0.0, 0.0], [0.0, 0.0]])
    sampler = t([[-LN2, -LN2], [LN2, 0.0]])
    lp = old.clone().requires_grad_(True)
    algo = AlgorithmConfig(importance_sampling=mode, **thresholds)
    out = policy_loss(lp, old, t([-1.0, -1.0]), torch.ones(2, 2), algo, 1.0, sampler_logprobs=sampler)
    w = t(weights)
    assert out.loss.item() == pytest.approx(float(w.sum()))
    assert_close(grad_of(out, lp), w)
    assert out.metrics["tis_weight_mean"].item() == pytest.approx(float(w.mean()))
    assert out.maxima["tis_weight_max"].item() == pytest.approx(float(w.max()))
    kind = "truncated" if mode.endswith("truncate") else "masked"
    assert out.metrics[f"is_{kind}_fraction"].item() == pytest.approx(cut_share)
    if not mode.startswith("token"):
        assert out.counts[f"is_{kind}_sequences"].item() == round(cut_share * 2)


def test_packed_sequences_are_the_ids_not_the_rows():
    # The two sequences of IS_CASES side by side in one row, told apart by sequence_ids.
    old, sampler = t([[0.0] * 4]), t([[-LN2, -LN2, LN2, 0.0]])
    algo = AlgorithmConfig(importance_sampling="geometric_mask", tis_cap=1.5)
    out = policy_loss(old, old, t([-1.0]), torch.ones(1, 4), algo, 1.0, sampler_logprobs=sampler,
                      sequence_ids=torch.tensor([[3, 3, 7, 7]]))
    assert out.loss.item() == pytest.approx(2.0)
    assert out.counts["is_masked_sequences"].item() == 1


def test_off_policy_mask_drops_negative_sequences_that_drifted():
    # mean log(sampler / policy): 0.6, 0.6 and 0.2; threshold 0.5: only sequence 0 (A < 0, drifted) is dropped.
    lp = torch.zeros(3, 2, dtype=torch.float64, requires_grad=True)
    sampler = t([[0.6, 0.6], [0.6, 0.6], [0.2, 0.2]])
    out = policy_loss(lp, lp.detach(), t([-1.0, 1.0, -1.0]), torch.ones(3, 2),
                      AlgorithmConfig(off_policy_mask_threshold=0.5), 6.0, sampler_logprobs=sampler)
    assert_close(grad_of(out, lp), t([[0.0, 0.0], [-1 / 6, -1 / 6], [1 / 6, 1 / 6]]))
    assert out.metrics["off_policy_masked_fraction"].item() == pytest.approx(2 / 6)
    assert out.counts["off_policy_masked_sequences"].item() == 1
    # With the sampler as the old policy, the sampler's logprobs are old_logprobs (sampler_logprobs: the trainer's).
    out = policy_loss(lp, sampler, t([-1.0, 1.0, -1.0]), torch.ones(3, 2),
                      AlgorithmConfig(off_policy_mask_threshold=0.5, old_logprobs="sampler"), 6.0,
                      sampler_logprobs=lp.detach())
    assert out.counts["off_policy_masked_sequences"].item() == 1


def test_top_entropy_quantile_trains_only_the_high_entropy_tokens():
    # Entropies 1, 2, 3, 4 (and 9 on a prompt token): the 0.5 quantile is 2.5, so the tokens at 3 and 4 train.
    lp = torch.zeros(2, 3, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    entropy = t([[1.0, 2.0, 9.0], [3.0, 4.0, 9.0]])
    out = policy_loss(lp, lp.detach(), t([1.0, 1.0]), mask, AlgorithmConfig(top_entropy_quantile=0.5), 4.0,
                      entropy=entropy)
    assert_close(grad_of(out, lp), t([[0.0, 0.0, 0.0], [-0.25, -0.25, 0.0]]))
    assert out.metrics["entropy_masked_fraction"].item() == pytest.approx(0.5)
    merged = merge_metrics([out])
    assert (merged["entropy"], merged["entropy_trained"]) == (pytest.approx(2.5), pytest.approx(3.5))
    with pytest.raises(ValueError, match="needs entropy"):
        policy_loss(lp, lp.detach(), t([1.0, 1.0]), mask, AlgorithmConfig(top_entropy_quantile=0.5), 4.0)


def test_counts_and_ratios_merge_as_sums():
    lp = torch.zeros(1, 2, dtype=torch.float64)
    algo = AlgorithmConfig(top_entropy_quantile=0.5, off_policy_mask_threshold=0.5)
    outs = [policy_loss(lp, lp, t([-1.0]), torch.ones(1, 2), algo, 1.0, sampler_logprobs=t([[s, s]]),
                        entropy=t([e])) for s, e in ((0.6, [1.0, 3.0]), (0.0, [5.0, 7.0]))]
    merged = merge_metrics(outs)
    assert merged["off_policy_masked_sequences"] == 1
    assert merged["entropy_trained"] == pytest.approx(5.0)  # 3 and 7: one trained token in each call


# ------------------------------------------------------------------------------------ overlong replies
def test_overlong_penalty_is_linear_over_the_buffer():
    assert [overlong_penalty(n, 10, 4) for n in (5, 6, 8, 10, 12)] == [0.0, 0.0, -0.5, -1.0, -1.0]
    assert overlong_penalty(9, 10, 4, penalty=2.0) == -1.5


def _trajectory(reply_tokens, truncated, reward=1.0):
    return Trajectory(task_id="t:0", group_id=0, seed=0, segments=[], turn_rewards=[reward] * len(reply_tokens),
                      num_turns=len(reply_tokens), stop_reason="done", adapter_version=None,
                      turn_states=[None] * len(reply_tokens), reply_tokens=reply_tokens, truncated=truncated)


def test_overlong_penalty_shapes_the_rewards_before_the_advantages():
    trajs = [_trajectory([10], [True]), _trajectory([5], [False])]  # rewards 1 - 1 and 1 - 0
    algo = AlgorithmConfig(group_size=2, scale_rewards="none", overlong_buffer=4)
    adv, kept, credit = batch_advantages(trajs, algo, reply_limit=10)
    assert adv == pytest.approx([-0.5, 0.5]) and kept == [0, 1]
    assert credit["overlong_penalty_mean"] == pytest.approx(-0.5)
    assert batch_advantages(trajs, AlgorithmConfig(group_size=2), reply_limit=10)[2] == {"zero_signal_groups": 1}
    steps = batch_advantages(trajs, AlgorithmConfig(group_size=2, scale_rewards="none", overlong_buffer=4,
                                                    step_weight=1.0), reply_limit=10)[0]
    assert steps == [pytest.approx([-0.5]), pytest.approx([0.5])]  # no shared states: the episode's advantage


def test_mask_truncated_zeroes_the_replies_cut_at_the_limit():
    from grpo.learner.tokens import trained_masks

    traj = _trajectory([2, 1, 2], [False, True, False])
    traj.segments = [Segment([1, 2, 3, 4, 5], [0, 1, 1, 0, 1], [0.0] * 5), Segment([6, 7, 8], [0, 1, 1], [0.0] * 3)]
    assert [m.tolist() for m in trained_masks(traj, True)] == [[0, 1, 1, 0, 0], [0, 1, 1]]
    assert [m.tolist() for m in trained_masks(traj, False)] == [[0, 1, 1, 0, 1], [0, 1, 1]]

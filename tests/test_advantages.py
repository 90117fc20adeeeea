import math

import pytest
import torch
from torch.testing import assert_close

from grpo.algo.advantages import discounted_returns, group_advantages, step_advantages
from grpo.algo.config import AlgorithmConfig


def adv(rewards, **config):
    return group_advantages(torch.tensor(rewards, dtype=torch.float64), AlgorithmConfig(group_size=2, **config))


def test_group_scaled_advantages():
    # [1, 0, 0, 0]: mean 0.25, r - mean = [0.75, -0.25, -0.25, -0.25]; sample variance
    # (0.5625 + 3 * 0.0625) / 3 = 0.25, std 0.5 -> [1.5, -0.5, -0.5, -0.5].
    # [2, 4, 6, 8]: mean 5, r - mean = [-3, -1, 1, 3]; variance 20 / 3, std s = 2.582 -> [-3, -1, 1, 3] / s.
    out = adv([[1, 0, 0, 0], [2, 4, 6, 8]], eps=1e-12)
    s = math.sqrt(20 / 3)
    expected = [[1.5, -0.5, -0.5, -0.5], [-3 / s, -1 / s, 1 / s, 3 / s]]
    assert_close(out.advantages, torch.tensor(expected, dtype=torch.float64))


def test_eps_is_added_to_the_std():
    # 0.75 / (0.5 + 0.25) = 1.0 and -0.25 / 0.75 = -1/3.
    out = adv([[1, 0, 0, 0]], eps=0.25)
    assert_close(out.advantages, torch.tensor([[1.0, -1 / 3, -1 / 3, -1 / 3]], dtype=torch.float64))


def test_unscaled_advantages_dr_grpo():
    out = adv([[1, 0, 0, 0], [2, 4, 6, 8]], scale_rewards="none")
    expected = [[0.75, -0.25, -0.25, -0.25], [-3.0, -1.0, 1.0, 3.0]]
    assert_close(out.advantages, torch.tensor(expected, dtype=torch.float64))


def test_leave_one_out_baseline():
    # r_i minus the mean of the other three: 1 - 0 = 1, 0 - 1/3 = -1/3 (= 4/3 of r - mean).
    out = adv([[1, 0, 0, 0]], baseline="leave_one_out", scale_rewards="none")
    assert_close(out.advantages, torch.tensor([[1.0, -1 / 3, -1 / 3, -1 / 3]], dtype=torch.float64))
    # Scaled by the std 0.5 as well: [2, -2/3, -2/3, -2/3].
    out = adv([[1, 0, 0, 0]], baseline="leave_one_out", eps=1e-12)
    assert_close(out.advantages, torch.tensor([[2.0, -2 / 3, -2 / 3, -2 / 3]], dtype=torch.float64))


def test_equal_reward_groups_get_exactly_zero_and_can_be_dropped():
    # Seven float32 rewards of 0.7: r - mean(r) leaves ~6e-8, which std (~6e-8) + eps would turn into 0.056.
    rewards = torch.tensor([[0.7] * 7, [1, 0, 1, 0, 1, 0, 1], [0.0] * 7], dtype=torch.float32)
    out = group_advantages(rewards, AlgorithmConfig())
    assert torch.equal(out.advantages[0], torch.zeros(7)) and torch.equal(out.advantages[2], torch.zeros(7))
    assert out.zero_signal.tolist() == [True, False, True]
    assert out.keep.tolist() == [True, True, True]
    assert not torch.isnan(out.advantages).any()
    dropped = group_advantages(rewards, AlgorithmConfig(drop_zero_signal_groups=True))
    assert dropped.keep.tolist() == [False, True, False]
    assert torch.equal(dropped.advantages, out.advantages)


def test_the_trainer_trains_only_the_episodes_of_groups_with_signal_when_asked():
    from types import SimpleNamespace

    from grpo.algo.advantages import batch_advantages

    trajs = [SimpleNamespace(reward=r) for r in [1, 0, 1, 0, 1, 1, 1, 1, 0, 0, 0, 1]]
    for drop, kept_expected in [(False, list(range(12))), (True, [0, 1, 2, 3, 8, 9, 10, 11])]:
        algo = AlgorithmConfig(drop_zero_signal_groups=drop, scale_rewards="none", group_size=4)
        adv, kept, credit = batch_advantages(trajs, algo)
        assert kept == kept_expected and credit == {"zero_signal_groups": 1}
        assert adv == [0.5, -0.5, 0.5, -0.5, 0.0, 0.0, 0.0, 0.0, -0.25, -0.25, -0.25, 0.75]


def test_integer_rewards_become_float():
    out = group_advantages(torch.tensor([[1, 0]]), AlgorithmConfig(scale_rewards="none"))
    assert out.advantages.dtype == torch.float32 and out.advantages.tolist() == [[0.5, -0.5]]


@pytest.mark.parametrize("shape", [(4,), (3, 1), (2, 2, 2)])
def test_rewards_must_be_groups_of_at_least_two(shape):
    with pytest.raises(ValueError, match="num_groups, G"):
        group_advantages(torch.zeros(shape), AlgorithmConfig())


def test_discounted_returns_by_hand():
    assert discounted_returns([0, 0, 1], 0.5) == [0.25, 0.5, 1.0]
    assert discounted_returns([1, 0, 2], 1.0) == [3.0, 2.0, 2.0]
    assert discounted_returns([], 0.9) == []


def test_step_advantages_compare_turns_from_the_same_state_within_a_group():
    # Group 0: A reaches the reward two turns after state "s0", B never does; s1, s2, s3 are seen once.
    # Group 1: C also starts in "s0", but other groups' states are never its peers.
    rewards = [[0, 0, 1], [0, 0], [1]]
    states = [["s0", "s1", "s2"], ["s0", "s3"], ["s0"]]
    out = step_advantages(rewards, states, [0, 0, 1], AlgorithmConfig(step_gamma=0.5))
    # Returns from s0: A 0.25, B 0 -> mean 0.125, sample std 0.125 * sqrt(2) -> +-1/sqrt(2).
    assert out.advantages[0] == pytest.approx([2 ** -0.5, 0, 0], abs=1e-5)  # eps=1e-6 in the std
    assert out.advantages[1] == pytest.approx([-(2 ** -0.5), 0], abs=1e-5)
    assert out.advantages[2] == [0.0]
    assert out.anchored_share == pytest.approx(2 / 6)
    unscaled = step_advantages(rewards, states, [0, 0, 1], AlgorithmConfig(step_gamma=0.5, scale_rewards="none"))
    assert unscaled.advantages[0][0] == pytest.approx(0.125)
    assert unscaled.advantages[1][0] == pytest.approx(-0.125)


def test_step_advantages_zero_for_equal_returns_unknown_states_and_revisits():
    # A loop: "a" is visited twice in one episode, both visits are peers; equal returns give exactly 0.
    out = step_advantages([[0, 0, 0], [0]], [["a", "b", "a"], ["a"]], [0, 0], AlgorithmConfig())
    assert out.advantages == [[0.0, 0.0, 0.0], [0.0]]
    assert out.anchored_share == pytest.approx(3 / 4)
    none = step_advantages([[0, 1], [0, 0]], [[None, None], [None, None]], [0, 0], AlgorithmConfig())
    assert none.advantages == [[0.0, 0.0], [0.0, 0.0]] and none.anchored_share == 0.0
    # Returns 0.125, 0.25, 0.5, 1: the revisit of "a" is closer to the reward than the first visit.
    loop = step_advantages([[0, 0, 0, 1]], [["a", "b", "a", "c"]], [0], AlgorithmConfig(step_gamma=0.5,
                                                                                         scale_rewards="none"))
    assert loop.advantages[0] == pytest.approx([-0.1875, 0.0, 0.1875, 0.0])


def test_step_advantages_reject_mismatched_inputs():
    with pytest.raises(ValueError, match="2 turn rewards but 1 turn states"):
        step_advantages([[0, 1]], [["a"]], [0], AlgorithmConfig())
    with pytest.raises(ValueError, match="one of each per episode"):
        step_advantages([[0]], [["a"]], [0, 1], AlgorithmConfig())

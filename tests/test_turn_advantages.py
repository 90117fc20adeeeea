"""Per-turn advantages reach exactly the tokens of their turn's reply, in every history mode."""
import pytest
import torch

from grpo.learner.tokens import token_advantages
from rollout.trajectory import Segment, Trajectory


def _traj(masks: list[list[int]], turns: int) -> Trajectory:
    segments = [Segment(token_ids=list(range(len(m))), loss_mask=m, sampler_logprobs=[0.0] * len(m)) for m in masks]
    return Trajectory(task_id="t:0", group_id=0, seed=0, segments=segments, turn_rewards=[0.0] * turns,
                      num_turns=turns, stop_reason="done", adapter_version=1)


def test_one_segment_holding_every_turn():
    # history "full": prompt, reply 0, observation, reply 1 (ends the sequence), one segment.
    t = _traj([[0, 0, 1, 1, 0, 0, 1]], turns=2)
    assert t.turn_spans() == [[(2, 4), (6, 7)]]
    (adv,) = token_advantages(t, [0.5, -2.0])
    assert adv.tolist() == [0, 0, 0.5, 0.5, 0, 0, -2.0]


def test_one_segment_per_turn():
    # history "none"/"text": each turn's context ends in its own reply.
    t = _traj([[0, 0, 1, 1], [0, 0, 0, 1]], turns=2)
    assert t.turn_spans() == [[(2, 4)], [(3, 4)]]
    first, second = token_advantages(t, [1.0, 3.0])
    assert first.tolist() == [0, 0, 1, 1] and second.tolist() == [0, 0, 0, 3]


def test_one_advantage_for_the_whole_episode():
    first, second = token_advantages(_traj([[0, 1], [0, 1, 1]], turns=2), -0.25)
    assert first.tolist() == [0, -0.25] and second.tolist() == [0, -0.25, -0.25]
    assert first.dtype == torch.float32


def test_wrong_number_of_turn_advantages_is_an_error():
    with pytest.raises(ValueError, match="2 generated replies but 3 per-turn advantages"):
        token_advantages(_traj([[0, 1, 0, 1]], turns=2), [1.0, 2.0, 3.0])


def test_scalar_advantages_of_any_numeric_type():
    import numpy as np

    t = _traj([[0, 1, 1]], turns=1)
    for a in (0.5, np.float32(0.5), torch.tensor(0.5), torch.tensor([0.5])):
        assert token_advantages(t, a)[0].tolist() == [0, 0.5, 0.5], type(a)

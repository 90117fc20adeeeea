"""Issue 19's settings that used to train something other than what they say: each is exact or refused.

rollout.top_p < 1, algorithm.kl_estimator k1 as a penalty and lora.dropout > 0 are refused at config time;
sequence_mean and seq_sum_norm average over episodes however an episode is split into segments; with a
starting adapter the KL reference is that adapter, its own lora_dropout does not apply, and a lora section
that disagrees with its shape is refused.
"""
import dataclasses

import peft
import pytest
import torch
from _fixtures_train import advantages, max_abs_diff, trajectories
from safetensors.torch import load_file

from grpo.algo.config import AlgorithmConfig, ConfigError
from grpo.config import RunConfig
from grpo.learner import forward
from grpo.learner.config import TrainConfig
from grpo.learner.lora import LoraConfig, adapter_config, randomize_adapter
from grpo.learner.worker import TrainWorker
from rollout.trajectory import Segment
from rollout.worker import RolloutConfig

# lr = adam_eps = 1 makes Adam's first update about the gradient itself (tests/test_train_worker.py,
# `comparable`): equal weights after one update mean equal gradients.
GRADIENT = TrainConfig(lr=1.0, adam_eps=1.0, max_grad_norm=None, micro_batch_size=2)


def test_top_p_below_one_is_refused_for_training():
    with pytest.raises(ConfigError) as e:
        RunConfig(model="m", rollout={"top_p": 0.9})
    assert e.value.field == "RunConfig.rollout.top_p"
    assert "renormalised over the nucleus" in str(e.value) and "set rollout.top_p: 1" in str(e.value)
    assert RunConfig(model="m").rollout.top_p == 1.0
    assert RolloutConfig(top_p=0.9).top_p == 0.9  # sampling alone, outside training, may use it


def test_k1_is_refused_as_a_penalty_and_kept_as_a_metric():
    with pytest.raises(ConfigError) as e:
        RunConfig(model="m", algorithm={"kl_coef": 0.1, "kl_estimator": "k1"})
    assert e.value.field == "AlgorithmConfig.kl_estimator"
    assert "zero expected gradient" in str(e.value) and "algorithm.kl_estimator to 'k3'" in str(e.value)
    assert AlgorithmConfig(kl_estimator="k1").kl_estimator == "k1"  # logged against ref_logprobs, no penalty
    assert AlgorithmConfig(kl_coef=0.1, kl_estimator="k2").kl_coef == 0.1


def test_lora_dropout_is_refused():
    with pytest.raises(ConfigError) as e:
        RunConfig(model="m", lora={"dropout": 0.05})
    assert e.value.field == "LoraConfig.dropout"
    assert "verl and TRL" in str(e.value) and "Set lora.dropout: 0" in str(e.value)


@pytest.fixture(scope="module")
def start_adapter(tiny_vl, tmp_path_factory) -> str:
    """A random adapter saved with lora_dropout 0.1, as SFT adapters often are."""
    settings = LoraConfig(rank=4, alpha=8)
    model = peft.get_peft_model(forward.load_model(tiny_vl), dataclasses.replace(
        settings.peft_config(), lora_dropout=0.1))
    randomize_adapter(model, seed=1, scale=0.1)
    path = tmp_path_factory.mktemp("start-adapter")
    model.save_pretrained(path)
    return str(path)


def turn_segments(trajectory):
    """The same episode as history none or text store it, one segment per turn, each turn scored after the
    same prefix as in the one growing segment (so the trainer's logprobs are the same)."""
    (seg,) = trajectory.segments
    segments = []
    for start, end in trajectory.turn_spans()[0]:
        mask = [1 if start <= k < end else 0 for k in range(end)]
        lps = [lp if m else 0.0 for lp, m in zip(seg.sampler_logprobs, mask)]
        segments.append(Segment(seg.token_ids[:end], mask, lps, []))
    return dataclasses.replace(trajectory, segments=segments)


@pytest.mark.parametrize("agg, updates", [("sequence_mean", 1), ("seq_sum_norm", 1), ("sequence_mean", 2)])
def test_an_episode_weighs_the_same_in_one_segment_or_one_per_turn(tiny_vl, start_adapter, agg, updates):
    algorithm = AlgorithmConfig(loss_agg=agg, seq_sum_norm_len=16)
    train = dataclasses.replace(GRADIENT, updates_per_batch=updates)
    whole = TrainWorker(tiny_vl, algorithm=algorithm, train=train, adapter_path=start_adapter)
    split = TrainWorker(tiny_vl, algorithm=algorithm, train=train, adapter_path=start_adapter)
    # Episodes of 1 to 3 turns: counted by row, the 3-turn episodes would weigh three times as much.
    batch = [t for turns in (1, 2, 3) for t in trajectories(whole.processor, 2, seed=turns, turns=turns, images=False)]
    adv = advantages(len(batch), seed=5)
    per_turn = [turn_segments(t) for t in batch]
    assert sum(len(t.segments) for t in per_turn) == 12
    before = whole.gather_adapter()
    m_whole, m_split = whole.train_step(batch, adv), split.train_step(per_turn, adv)
    assert m_whole["generated_tokens"] == m_split["generated_tokens"]
    assert m_whole["loss"] == pytest.approx(m_split["loss"], rel=1e-6, abs=1e-9)
    assert max_abs_diff(whole.gather_adapter(), split.gather_adapter()) <= 1e-6
    assert max_abs_diff(whole.gather_adapter(), before) > 1e-2  # it did train


def test_the_kl_reference_is_the_starting_adapter(tiny_vl, start_adapter):
    worker = TrainWorker(tiny_vl, algorithm=AlgorithmConfig(kl_coef=0.1), train=GRADIENT, adapter_path=start_adapter)
    trainable = [n for n, p in worker.model.named_parameters() if p.requires_grad]
    assert trainable and all(".default." in n for n in trainable)
    batch, adv = trajectories(worker.processor, 4, images=False), advantages(4)
    first = worker.train_step(batch, adv)
    # Before any update the policy is the starting adapter: no KL to it (the base model is far away).
    assert first["kl"] < 1e-7
    second = worker.train_step(batch, adv)
    assert second["kl"] > 1e-4  # the trained adapter moved away from the frozen one
    # The reference stayed the starting adapter, the trained adapter still trains, and only it is published.
    assert [n for n, p in worker.model.named_parameters() if p.requires_grad] == trainable
    saved = load_file(f"{start_adapter}/adapter_model.safetensors")
    state = worker.model.state_dict()
    for key, value in saved.items():
        assert torch.equal(state[key.replace(".weight", ".reference.weight")], value), key
    assert worker.gather_adapter().keys() == saved.keys()


def test_a_starting_adapters_dropout_does_not_apply(tiny_vl, start_adapter):
    assert peft.PeftConfig.from_pretrained(start_adapter).lora_dropout == 0.1
    worker = TrainWorker(tiny_vl, train=GRADIENT, adapter_path=start_adapter)
    assert adapter_config(worker.model)["lora_dropout"] == 0.0
    metrics = worker.train_step(trajectories(worker.processor, 4, images=False), advantages(4))
    assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-6)  # on-policy: new logprobs equal the old


def test_a_fresh_adapters_kl_reference_is_the_base_model(tiny_vl):
    # A fresh adapter (B = 0) is the base model: its reference needs no copy.
    worker = TrainWorker(tiny_vl, algorithm=AlgorithmConfig(kl_coef=0.1), lora=LoraConfig(rank=4, alpha=8),
                         train=GRADIENT)
    assert list(worker.model.peft_config) == ["default"]
    assert worker.train_step(trajectories(worker.processor, 2, images=False), advantages(2))["kl"] < 1e-7


def test_a_lora_section_that_disagrees_with_the_starting_adapter_is_refused(tmp_path, tiny_text):
    import json

    from grpo.driver.preflight import check_run

    adapter = tmp_path / "sft"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps(
        {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]}))
    base = dict(model=str(tiny_text), adapter=str(adapter), env="maze")
    with pytest.raises(ConfigError) as e:
        check_run(RunConfig(**base))  # the default lora section: rank 32
    assert e.value.field == "RunConfig.lora.rank" and "set lora.rank: 8" in str(e.value)
    with pytest.raises(ConfigError) as e:
        check_run(RunConfig(**base, lora={"rank": 8, "alpha": 16.0}))
    assert e.value.field == "RunConfig.lora.target_modules" and "['q_proj', 'v_proj']" in str(e.value)
    check_run(RunConfig(**base, lora={"rank": 8, "alpha": 16.0, "target_modules": ["v_proj", "q_proj"]}))

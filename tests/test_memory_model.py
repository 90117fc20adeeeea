"""grpo.learner.memory on a made-up config, every part's bytes worked out by hand."""
from types import SimpleNamespace

import pytest

from grpo.learner import memory
from grpo.learner.lora import LoraConfig

# hidden 64, intermediate 128, 4 heads and 2 kv heads of 16, 2 layers, vocab 1000; LoRA rank 4 on all 7 targets.
TEXT = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            num_hidden_layers=2, vocab_size=1000)
LORA = LoraConfig(rank=4, alpha=8.0)
# A layer: q and o 64 x 64, k and v 64 x 32, gate/up/down 64 x 128, two norms of 64, q/k norms of 16.
LAYER = 2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128 + 2 * 64 + 2 * 16
PARAMS = 2 * LAYER + 2 * 1000 * 64 + 64  # untied embedding and head, final norm
LORA_PARAMS = 2 * 4 * ((64 + 64) * 2 + (64 + 32) * 2 + (64 + 128) * 3)


def text_config(**over):
    return SimpleNamespace(**{**TEXT, **over})


def test_parameter_counts():
    assert memory.layer_params(text_config()) == LAYER == 37024
    assert memory.base_params(text_config()) == PARAMS == 202112
    assert memory.base_params(text_config(tie_word_embeddings=True)) == PARAMS - 64000
    assert memory.lora_params(text_config(), LORA) == LORA_PARAMS == 8192


def test_layer_activations_per_token():
    # bf16: peft casts each LoRA branch's input to float32 on its own (q, k, v: three copies of the 64-wide
    # normed input; gate, up: two), RMSNorms keep float32 inputs, SDPA q/k/v/out in bf16 plus the lse.
    lora_in = 4 * (3 * 64 + 64 + 2 * 64 + 128)
    lora_mid = 4 * 4 * 7
    norms = 4 * (64 + 64 + 64 + 32)
    sdpa = 2 * (64 + 32 + 32 + 64) + 4 * 4
    mlp = 3 * 2 * 128
    assert memory.layer_activation_bytes(text_config(), LORA, "bfloat16") == lora_in + lora_mid + norms + sdpa + mlp
    # float32: the branches reading one input share it.
    shared = 4 * (64 + 64 + 64 + 128) + lora_mid + norms + 4 * (64 + 32 + 32 + 64) + 4 * 4 + 3 * 4 * 128
    assert memory.layer_activation_bytes(text_config(), LORA, "float32") == shared == 4608
    # Only the targeted branches count.
    qv = LoraConfig(rank=4, target_modules=("q_proj", "v_proj"))
    assert memory.layer_activation_bytes(text_config(), qv, "bfloat16") == 4 * 2 * 64 + 4 * 4 * 2 + norms + sdpa + mlp


def test_every_part_by_hand():
    est = memory.estimate(text_config(), LORA, 100, dtype="bfloat16", logprob_tokens=50)
    layer = 4224  # test_layer_activations_per_token's bf16 sum
    outside = 4 * 64 + 2 * 2 * 16  # the final norm's float32 input; RoPE's cos and sin
    backward = (3 * 2 + 4) * 128
    assert est.weights == 2 * PARAMS
    assert (est.lora_weights, est.lora_grads, est.optimizer) == (4 * 8192, 4 * 8192, 8 * 8192)
    assert est.activations == 100 * (2 * layer + outside + backward) == 1_004_800
    assert est.logprobs == 50 * 64 * 2 + 3 * 50 * 1000 * 4
    assert est.vision == 0
    assert est.total == sum(vars(est).values())
    assert est.step_extra == est.total - est.weights - est.lora_weights


def test_checkpointing_keeps_layer_inputs_and_one_layer():
    plain = memory.estimate(text_config(), LORA, 100)
    ckpt = memory.estimate(text_config(), LORA, 100, activation_checkpointing=True)
    assert ckpt.activations == 100 * (2 * 2 * 64 + 4224 + 320 + 1280) == 608_000
    assert ckpt.activations < plain.activations
    assert ckpt.weights == plain.weights and ckpt.logprobs == plain.logprobs


def test_more_ranks_shard_weights_and_adam_state():
    one = memory.estimate(text_config(), LORA, 100)
    two = memory.estimate(text_config(), LORA, 100, world_size=2)
    # Half the weights, plus the other half of the root unit and of one decoder layer, gathered.
    assert two.weights == PARAMS + (PARAMS - 2 * LAYER + LAYER) * 2 // 2 == 367200
    assert two.weights < one.weights
    assert (two.lora_weights, two.optimizer) == (one.lora_weights // 2, one.optimizer // 2)
    assert two.lora_grads == one.lora_grads  # accumulated unsharded over micro-batches
    assert two.activations == one.activations


def test_vision_tower():
    vision = SimpleNamespace(hidden_size=32, intermediate_size=64, spatial_merge_size=2, in_channels=3,
                             temporal_patch_size=2, patch_size=4, num_position_embeddings=16, depth=1,
                             out_hidden_size=64, deepstack_visual_indexes=[0])
    config = SimpleNamespace(text_config=text_config(), vision_config=vision)
    block = 2 * 2 * 32 + (32 * 96 + 96) + (32 * 32 + 32) + (32 * 64 + 64) + (64 * 32 + 32)
    merger = 128 * 128 + 128 + 128 * 64 + 64
    tower = (3 * 2 * 4 * 4 * 32 + 32) + 16 * 32 + block + (merger + 2 * 32) + (merger + 2 * 128)
    assert memory.vision_params(config) == tower == 62016
    est = memory.estimate(config, LORA, 100, image_tokens=10)
    # 10 merged tokens = 40 patches; the block's working set, and the features for 1 + 1 deepstack levels.
    assert est.vision == 2 * (40 * (6 * 32 + 2 * 64) + 10 * 2 * 64)
    assert memory.estimate(config, LORA, 100).vision == 0


def test_fits_and_errors_name_the_field():
    est = memory.estimate(text_config(), LORA, 100)
    assert est.fits(1) and not est.fits(est.total / 2**30 / 2)
    with pytest.raises(ValueError, match="world_size"):
        memory.estimate(text_config(), LORA, 100, world_size=0)
    with pytest.raises(ValueError, match="tokens_per_micro_batch"):
        memory.estimate(text_config(), LORA, 0)
    with pytest.raises(ValueError, match="dtype"):
        memory.estimate(text_config(), LORA, 100, dtype="int8")

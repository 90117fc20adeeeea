"""The peak memory of one train rank (grpo.learner.worker), estimated from the model's config alone.

Counted, in bytes, one field each:
- weights: the frozen base in the train dtype. Under FSDP2 on `world_size` ranks a rank holds 1/world_size of
  them, plus one decoder layer gathered while it runs (no prefetch of the next) and the root unit (embeddings,
  final norm, lm_head, vision tower), which stays gathered through forward and backward;
- lora_weights and optimizer: float32 LoRA weights (4 bytes a parameter) and AdamW's two moments (8), sharded;
- lora_grads: float32, counted whole: the trainer accumulates them unsharded over the micro-batches of an
  update (no gradient sync before the last), which is the peak's moment;
- activations: what autograd keeps for the backward of one packed micro-batch of `tokens` tokens. Frozen
  linear layers keep nothing (their input gradient needs only W); each LoRA branch keeps its float32 input
  (peft casts it to the adapter's dtype: one copy per branch unless the model is float32 already) and its
  rank-r intermediate; RMSNorms keep a float32 copy of their input; SDPA keeps q, k, v, its output and the
  log-sum-exp (no [T, T] scores); SwiGLU keeps gate, act(gate) and up. With activation checkpointing only each
  layer's input is kept, plus one layer's activations while it is recomputed; either way the backward of the
  last MLP adds its gradients while those activations are still held: three [tokens, intermediate] ones in the
  train dtype and the LoRA branch's float32 input gradient;
- logprobs: the masked positions' hidden states and three [LOGPROB_CHUNK_TOKENS, vocab] float32 buffers
  (the recomputed chunk's logits, its log-softmax, their gradient);
- vision (Qwen-VL): approximate. The tower is frozen and adapter-free, so it keeps nothing for the backward:
  one block's working set over the micro-batch's patches (hidden x 6 + MLP x 2 a patch), plus the image
  features the language model reads (merged tokens x (1 + deepstack levels) x its hidden).
`total` adds them all, though the vision tower's working set is freed before the decoder's activations peak:
an upper bound by that much. Allocator slack, the CUDA context and communication buffers are not counted.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from grpo.learner.forward import LOGPROB_CHUNK_TOKENS
from grpo.learner.lora import LoraConfig

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
GIB = 2**30


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per part on one train rank at its peak."""
    weights: int
    lora_weights: int
    lora_grads: int
    optimizer: int
    activations: int
    logprobs: int
    vision: int

    @property
    def total(self) -> int:
        return sum(getattr(self, f.name) for f in fields(self))

    @property
    def step_extra(self) -> int:
        """What the first train step adds to a rank that holds the model and its fresh adapter."""
        return self.total - self.weights - self.lora_weights

    def fits(self, gib: float) -> bool:
        return self.total <= gib * GIB


def text_config(config):
    return getattr(config, "text_config", None) or config


def _widths(t) -> tuple[int, int, int, int, int, int]:
    """hidden, intermediate, q width, kv width, heads, head_dim of a text config."""
    head_dim = getattr(t, "head_dim", None) or t.hidden_size // t.num_attention_heads
    kv_heads = getattr(t, "num_key_value_heads", None) or t.num_attention_heads
    return (t.hidden_size, t.intermediate_size, t.num_attention_heads * head_dim, kv_heads * head_dim,
            t.num_attention_heads, head_dim)


def layer_params(config) -> int:
    """Parameters of one decoder layer (Qwen3-style: q/k norms, SwiGLU MLP, two RMSNorms)."""
    h, i, q, kv, _, d = _widths(text_config(config))
    bias = (q + 2 * kv + h) if getattr(text_config(config), "attention_bias", False) else 0
    return 2 * h * q + 2 * h * kv + bias + 3 * h * i + 2 * h + 2 * d


def vision_params(config) -> int:
    """Parameters of a Qwen3-VL vision tower: patch embedding, position table, blocks, mergers; 0 without one."""
    v = getattr(config, "vision_config", None)
    if v is None:
        return 0
    hv, iv, m2 = v.hidden_size, v.intermediate_size, v.spatial_merge_size ** 2
    patch = v.in_channels * v.temporal_patch_size * v.patch_size ** 2 * hv + hv
    block = 4 * hv + 3 * hv * hv + 3 * hv + hv * hv + hv + 2 * hv * iv + iv + hv
    merged = hv * m2
    merger = merged * merged + merged + merged * v.out_hidden_size + v.out_hidden_size
    deepstack = len(getattr(v, "deepstack_visual_indexes", None) or ())
    return (patch + v.num_position_embeddings * hv + v.depth * block + merger + 2 * hv
            + deepstack * (merger + 2 * merged))


def base_params(config) -> int:
    t = text_config(config)
    tied = getattr(config, "tie_word_embeddings", False)
    return (t.vocab_size * t.hidden_size * (1 if tied else 2) + t.hidden_size
            + t.num_hidden_layers * layer_params(config) + vision_params(config))


def lora_params(config, lora: LoraConfig) -> int:
    h, i, q, kv, _, _ = _widths(text_config(config))
    shapes = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
              "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}
    per_layer = sum(lora.rank * sum(shapes[name]) for name in lora.target_modules if name in shapes)
    return text_config(config).num_hidden_layers * per_layer


def layer_activation_bytes(config, lora: LoraConfig, dtype: str) -> int:
    """Bytes one decoder layer keeps for the backward, per token."""
    b = DTYPE_BYTES[dtype]
    h, i, q, kv, heads, _ = _widths(text_config(config))
    targets = set(lora.target_modules)
    # The LoRA branches reading one input share its float32 copy only when the model is float32 already.
    groups = [(("q_proj", "k_proj", "v_proj"), h), (("o_proj",), q), (("gate_proj", "up_proj"), h),
              (("down_proj",), i)]
    lora_in = sum(4 * width * (min(1, n) if b == 4 else n)
                  for names, width in groups for n in [len(targets.intersection(names))])
    lora_mid = 4 * lora.rank * sum(len(targets.intersection(names)) for names, _ in groups)
    norms = 4 * (2 * h + q + kv)  # input and post-attention norms, q_norm and k_norm: a float32 copy each
    sdpa = b * (2 * q + 2 * kv) + 4 * heads  # q, k, v, output; log-sum-exp per head
    mlp = 3 * b * i  # gate (SiLU's input), SiLU's output, up (the product's two inputs)
    return lora_in + lora_mid + norms + sdpa + mlp


def estimate(config, lora: LoraConfig, tokens: int, *, dtype: str = "bfloat16", activation_checkpointing: bool = False,
             world_size: int = 1, logprob_tokens: int | None = None, image_tokens: int = 0) -> MemoryEstimate:
    """One rank's peak for packed micro-batches of `tokens` tokens, `logprob_tokens` of them in the loss mask
    (default: all) and `image_tokens` of them image tokens. `config`: a transformers config or a model folder."""
    if isinstance(config, str) or hasattr(config, "__fspath__"):
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(config)
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype={dtype!r}: use one of {sorted(DTYPE_BYTES)} (the train dtype, train.dtype)")
    if not (isinstance(world_size, int) and world_size >= 1):
        raise ValueError(f"world_size={world_size!r}: the number of train ranks, an integer >= 1")
    if not (isinstance(tokens, int) and tokens >= 1):
        raise ValueError(f"tokens={tokens!r}: the tokens of one packed micro-batch "
                         "(train.tokens_per_micro_batch), an integer >= 1")
    b, t = DTYPE_BYTES[dtype], text_config(config)
    h, layers = t.hidden_size, t.num_hidden_layers
    total, layer = base_params(config), layer_params(config)
    gathered = 0 if world_size == 1 else (total - layers * layer + layer) * b * (world_size - 1) // world_size
    trainable = lora_params(config, lora)

    per_layer = layer_activation_bytes(config, lora, dtype)
    kept = b * h if activation_checkpointing else per_layer
    # Outside the layers: the final norm's float32 input and RoPE's cos and sin, shared by every layer.
    outside = 4 * h + 2 * b * _widths(t)[5]
    backward = (3 * b + 4) * t.intermediate_size
    activations = tokens * (layers * kept + (per_layer if activation_checkpointing else 0) + outside + backward)
    masked = tokens if logprob_tokens is None else logprob_tokens
    logprobs = masked * h * b + 3 * min(masked, LOGPROB_CHUNK_TOKENS) * t.vocab_size * 4

    vision = 0
    v = getattr(config, "vision_config", None)
    if v is not None and image_tokens:
        patches = image_tokens * v.spatial_merge_size ** 2
        levels = 1 + len(getattr(v, "deepstack_visual_indexes", None) or ())
        vision = b * (patches * (6 * v.hidden_size + 2 * v.intermediate_size) + image_tokens * levels * h)
    return MemoryEstimate(weights=total * b // world_size + gathered, lora_weights=4 * trainable // world_size,
                          lora_grads=4 * trainable, optimizer=8 * trainable // world_size,
                          activations=activations, logprobs=logprobs, vision=vision)

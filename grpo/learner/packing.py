"""Packed micro-batches: expanded sequences side by side in one row, no padding, each attending only to itself.

Each sequence's position ids restart at 0 where it begins; transformers reads a restart in the position ids
of a row given without an attention mask as the start of a new sequence and keeps attention inside each
one: variable-length kernels with flash attention, a block-diagonal causal mask otherwise. Over a row of
many sequences that mask makes SDPA attend over the whole row, mostly to masked-out pairs (a row of 64 maze
turns ran 2-7x slower than the padded batch); so with SDPA the decoder runs `packed_sdpa`, SDPA on each
sequence alone, and its mask step (`packed_mask`) finds where the sequences start in O(L) instead of
building the [L, L] mask. For the Qwen-VL families the multimodal rotary positions of each sequence are
computed from its own tokens and images, as if it stood alone, with a text row in front (the position ids
those models split into the mask's and the rotary's). The images of the row keep their order of
appearance, so the vision tower sees what it would unpacked.
"""
from __future__ import annotations

import torch

from grpo.learner.forward import Batch, Expanded, has_sliding_window, image_token_id, unwrapped, vision_token_ids

# Image-text families whose masks transformers builds from more than the position ids (Gemma 3 attends both
# ways inside an image) or whose packing is not tested here.
PACKABLE_IMAGE_TEXT = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")


PACKED_SDPA = "grpo_packed_sdpa"


def prepare(model) -> None:
    """Refuse a model whose packed forward is not known to equal its unpacked one; with SDPA, switch its
    decoder's attention to packed_sdpa (idempotent; padded batches run plain SDPA through it)."""
    config = unwrapped(model).config
    if hasattr(config, "vision_config") and config.model_type not in PACKABLE_IMAGE_TEXT:
        raise ValueError(f"train.tokens_per_micro_batch (packed sequences) supports the image-text families "
                         f"{', '.join(PACKABLE_IMAGE_TEXT)} and text models, not {config.model_type}: leave it "
                         "null (padded micro-batches of train.micro_batch_size sequences)")
    text = getattr(config, "text_config", None) or config
    # With sliding-window layers the mask is more than causal-per-sequence: SDPA's dense mask stays exact.
    if text._attn_implementation == "sdpa" and not has_sliding_window(text):
        _register()
        text._attn_implementation = PACKED_SDPA


def packed_sdpa(module, query, key, value, attention_mask, **kwargs):
    """SDPA on each sequence of a packed row alone (causal inside it); anything else, as SDPA itself."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if not _is_starts(attention_mask):
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    bounds = attention_mask.tolist() + [query.shape[2]]
    outs = [sdpa_attention_forward(module, query[:, :, s:e], key[:, :, s:e], value[:, :, s:e], None, **kwargs)[0]
            for s, e in zip(bounds, bounds[1:])]
    return torch.cat(outs, dim=1), None


def packed_mask(batch_size: int, q_length: int, kv_length: int, q_offset: int = 0, kv_offset: int = 0,
                mask_function=None, attention_mask=None, **kwargs):
    """For one packed row, the starts of its sequences (a 1-D long tensor, what packed_sdpa reads) instead of
    its [L, L] block-diagonal mask, found in O(L): a token that may not attend to the one before it begins a
    sequence. Anything else: SDPA's mask."""
    from transformers.masking_utils import sdpa_mask

    if batch_size == 1 and attention_mask is None and q_length == kv_length > 1 and q_offset == kv_offset == 0:
        q = torch.arange(1, q_length, device=kwargs.get("device", "cpu"))
        zero = torch.zeros_like(q)
        sees_previous = mask_function(zero, zero, q, q - 1)
        if not bool(sees_previous.all()):
            return torch.cat([zero[:1], (~sees_previous).nonzero().flatten() + 1])
    return sdpa_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                     kv_offset=kv_offset, mask_function=mask_function, attention_mask=attention_mask, **kwargs)


def _is_starts(mask) -> bool:
    return mask is not None and mask.dim() == 1 and mask.dtype == torch.long


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    # Looked up when called, so that a test can watch them.
    AttentionInterface.register(PACKED_SDPA, lambda *args, **kw: packed_sdpa(*args, **kw))
    AttentionMaskInterface.register(PACKED_SDPA, lambda **kw: packed_mask(**kw))


def pack(processor, seqs: list[Expanded], model) -> Batch:
    """One row holding every sequence of `seqs`, in order, with their position ids and their starts."""
    prepare(model)
    pad = image_token_id(processor)
    ids = torch.cat([s.input_ids for s in seqs])[None]
    per_token = [torch.cat([s.per_token[k] for s in seqs])[None] for k in range(len(seqs[0].per_token))]
    starts = torch.zeros_like(ids, dtype=torch.bool)
    offset = 0
    for s in seqs:
        starts[0, offset] = True
        offset += len(s.input_ids)
    text = torch.cat([torch.arange(len(s.input_ids)) for s in seqs])[None]
    rope = _rope_index(model)
    positions = text if rope is None else torch.cat([text[None], torch.cat(
        [_rope_positions(rope, s, pad) for s in seqs], dim=-1)])
    pix = [s.pixel_values for s in seqs if s.pixel_values is not None]
    grids = [s.image_grid_thw for s in seqs if s.image_grid_thw is not None]
    return Batch(ids, torch.ones_like(ids), per_token, torch.cat(pix) if pix else None,
                 torch.cat(grids) if grids else None, pad, vision_token_ids(processor),
                 position_ids=positions, seq_starts=starts)


def _rope_index(model):
    return getattr(getattr(unwrapped(model), "model", None), "get_rope_index", None)


def _rope_positions(rope_index, seq: Expanded, pad: int) -> torch.Tensor:
    """[3, 1, T]: the sequence's multimodal rotary positions, computed from it alone."""
    ids = seq.input_ids[None]
    positions, _ = rope_index(ids, mm_token_type_ids=(ids == pad).int(), image_grid_thw=seq.image_grid_thw,
                              attention_mask=torch.ones_like(ids))
    return positions

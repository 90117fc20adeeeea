"""Packed micro-batches: expanded sequences side by side in one row, no padding, each attending only to itself.

Each sequence's position ids restart at 0 where it begins; transformers reads a restart in the position ids
of a row given without an attention mask as the start of a new sequence and keeps attention inside each
one (a block-diagonal causal mask with SDPA, variable-length kernels with flash attention). For the Qwen-VL
families the multimodal rotary positions of each sequence are computed from its own tokens and images, as if
it stood alone, with a text row in front (the position ids those models split into the mask's and the
rotary's). The images of the row keep their order of appearance, so the vision tower sees what it would
unpacked. Sequences go into rows first-fit by decreasing length, up to a token budget.
"""
from __future__ import annotations

import torch

from grpo.learner.forward import Batch, Expanded, image_token_id, vision_token_ids

# Image-text families whose masks transformers builds from more than the position ids (Gemma 3 attends both
# ways inside an image) or whose packing is not tested here.
PACKABLE_IMAGE_TEXT = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")


def check_packable(model) -> None:
    """Refuse a model whose packed forward is not known to equal its unpacked one."""
    config = model.config
    if hasattr(config, "vision_config") and config.model_type not in PACKABLE_IMAGE_TEXT:
        raise ValueError(f"train.tokens_per_micro_batch (packed sequences) supports the image-text families "
                         f"{', '.join(PACKABLE_IMAGE_TEXT)} and text models, not {config.model_type}: leave it "
                         "null (padded micro-batches of train.micro_batch_size sequences)")


def pack(processor, seqs: list[Expanded], model) -> Batch:
    """One row holding every sequence of `seqs`, in order, with their position ids and their starts."""
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
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return getattr(getattr(inner, "model", None), "get_rope_index", None)


def _rope_positions(rope_index, seq: Expanded, pad: int) -> torch.Tensor:
    """[3, 1, T]: the sequence's multimodal rotary positions, computed from it alone."""
    ids = seq.input_ids[None]
    positions, _ = rope_index(ids, mm_token_type_ids=(ids == pad).int(), image_grid_thw=seq.image_grid_thw,
                              attention_mask=torch.ones_like(ids))
    return positions

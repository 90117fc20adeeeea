"""Packed rows: logprobs and gradients equal to the padded batch's, text and vision, and rows that keep to
the token budget."""
from __future__ import annotations

import pytest
import torch
from _fixtures_train import trajectories
from test_logprobs import assert_equal_passes, lora_model, value_and_grads

from grpo.learner import forward, packing, plan


def sequences(processor, count: int, images: bool):
    return [forward.expand(processor, s.token_ids, s.images, [torch.as_tensor(s.loss_mask)])
            for t in trajectories(processor, count, images=images) for s in t.segments]


def unpacked(lp: torch.Tensor, seqs) -> list[torch.Tensor]:
    out, offset = [], 0
    for s in seqs:
        out.append(lp[0, offset:offset + len(s.input_ids)])
        offset += len(s.input_ids)
    return out


@pytest.mark.parametrize("kind", ["vl", "text"])
def test_packed_logprobs_and_gradients_equal_the_padded_ones(kind, tiny_vl, tiny_text, monkeypatch):
    split = []  # what each decoder forward's mask step found: a packed row's sequence starts, or None
    mask = packing.packed_mask

    def spy(**kw):
        out = mask(**kw)
        split.append(out.tolist() if packing._is_starts(out) else None)
        return out

    monkeypatch.setattr(packing, "packed_mask", spy)
    path = tiny_vl if kind == "vl" else tiny_text
    processor = forward.load_processor(path)
    model = lora_model(forward.load_model(path))
    seqs = sequences(processor, 3, images=kind == "vl")
    lengths = {len(s.input_ids) for s in seqs}
    assert len(seqs) >= 3 and len(lengths) > 1  # unequal lengths: the padded batch has padding
    padded = forward.collate(processor, seqs, forward.tokenizer_of(processor).pad_token_id)
    packed = packing.pack(processor, seqs, model)
    assert packed.input_ids.shape == (1, sum(len(s.input_ids) for s in seqs))
    if kind == "vl":
        assert packed.pixel_values is not None and packed.position_ids.shape[0] == 4  # text row + 3 rotary rows
    weights = [torch.linspace(-1, 1, len(s.input_ids)) for s in seqs]

    def padded_loss():
        lp = forward.token_logprobs(model, padded, padded.per_token[0], 0.7)
        return torch.cat([(lp[i, :len(w)] * w) for i, w in enumerate(weights)])

    def packed_loss():
        lp = forward.token_logprobs(model, packed, packed.per_token[0], 0.7)
        return torch.cat([(row * w) for row, w in zip(unpacked(lp, seqs), weights)])

    ref, ref_g = value_and_grads(model, padded_loss)
    assert not any(split)  # padded rows: plain SDPA
    got, got_g = value_and_grads(model, packed_loss)
    offsets = [sum(len(s.input_ids) for s in seqs[:k]) for k in range(len(seqs))]
    assert split and all(found == offsets for found in split if found is not None)
    text_config = getattr(model.get_base_model().config, "text_config", None) or model.get_base_model().config
    assert text_config._attn_implementation == packing.PACKED_SDPA
    assert_equal_passes(ref, ref_g, got, got_g)  # one row against three


def test_packing_a_sequence_twice_gives_it_the_same_logprobs_wherever_it_stands(tiny_vl):
    # Attention stays inside each sequence: the second copy does not see the first.
    processor = forward.load_processor(tiny_vl)
    model = lora_model(forward.load_model(tiny_vl))
    seq = sequences(processor, 1, images=True)[0]
    packed = packing.pack(processor, [seq, seq], model)
    with torch.no_grad():
        lp = forward.token_logprobs(model, packed, packed.per_token[0])
    first, second = unpacked(lp, [seq, seq])
    assert first.abs().max() > 0.1 and (first - second).abs().max() <= 1e-5


def test_rows_keep_to_the_budget_first_fit_by_decreasing_length():
    rows = plan.token_rows({0: 50, 1: 300, 2: 120, 3: 200, 4: 90, 5: 600}, budget=400)
    assert rows == [[5], [1, 4], [3, 2, 0]]  # 600 alone (over the budget), 300 + 90, 200 + 120 + 50
    assert plan.token_rows({}, 10) == []

"""Logprobs from the hidden states at the masked positions, in chunks: equal to the full logits' in value and
gradient, on an image-text model and on a text model whose forward caps its logits (Gemma's softcapping)."""
from __future__ import annotations

import pytest
import torch
from _fixtures_train import trajectories

from grpo.learner import forward
from grpo.learner.lora import LoraConfig, apply_lora, randomize_adapter


def full_logits_logprobs(model, batch, mask, temperature):
    """The reference: the whole [B, T, vocabulary] logits, then the masked positions picked."""
    logits = model(**batch.model_kwargs(), use_cache=False).logits
    want = mask[:, 1:].bool()
    picked = logits[:, :-1][want].float()
    if batch.banned_ids:
        picked[:, list(batch.banned_ids)] = float("-inf")
    lp = torch.log_softmax(picked / temperature, dim=-1).gather(-1, batch.input_ids[:, 1:][want].unsqueeze(-1))
    out = torch.zeros(batch.input_ids.shape)
    out[:, 1:][want] = lp.squeeze(-1)
    return out


def lora_model(base):
    torch.manual_seed(0)
    model = apply_lora(base, LoraConfig(rank=4, alpha=8.0))
    randomize_adapter(model, seed=1)
    return model


def value_and_grads(model, fn):
    model.zero_grad(set_to_none=True)
    lp = fn()
    (lp * torch.linspace(-1, 1, lp.numel()).view_as(lp)).sum().backward()
    return lp.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_equal_passes(ref, ref_g, got, got_g) -> None:
    """Two computations of the same logprobs (`value_and_grads` of each) agree: the values within 1e-5, the
    gradients within 1e-5 of the largest entry (their sums run in another order), on values and gradients
    large enough for the comparison to mean something."""
    assert ref.abs().max() > 0.1 and (got - ref).abs().max() <= 1e-5
    scale = max(float(g.abs().max()) for g in ref_g.values())
    assert got_g.keys() == ref_g.keys() and scale > 1e-4
    assert max(float((got_g[k] - ref_g[k]).abs().max()) for k in ref_g) <= 1e-5 * max(1.0, scale)


def assert_same(model, batch, mask, temperature):
    ref, ref_g = value_and_grads(model, lambda: full_logits_logprobs(model, batch, mask, temperature))
    got, got_g = value_and_grads(model, lambda: forward.token_logprobs(model, batch, mask, temperature, chunk_tokens=5))
    assert int(mask[:, 1:].sum()) > 10  # more than two chunks
    assert_equal_passes(ref, ref_g, got, got_g)  # the projection runs on fewer rows, in another order
    assert type(model.get_base_model().get_output_embeddings()).__name__ == "Linear"  # put back


def test_chunked_logprobs_equal_the_full_logits_on_an_image_text_model(tiny_vl):
    processor = forward.load_processor(tiny_vl)
    model = lora_model(forward.load_model(tiny_vl))
    seqs = [forward.expand(processor, s.token_ids, s.images, [torch.as_tensor(s.loss_mask)])
            for t in trajectories(processor, 3) for s in t.segments]
    batch = forward.collate(processor, seqs, forward.tokenizer_of(processor).pad_token_id)
    assert batch.pixel_values is not None and batch.banned_ids
    assert_same(model, batch, batch.per_token[0], temperature=0.7)


def test_chunked_logprobs_cap_the_logits_where_the_model_does():
    from transformers import Gemma2Config, Gemma2ForCausalLM

    torch.manual_seed(0)
    config = Gemma2Config(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=2, num_key_value_heads=1, head_dim=16, final_logit_softcapping=2.0)
    model = lora_model(Gemma2ForCausalLM(config))
    ids = torch.randint(0, 300, (2, 24))
    mask = torch.ones_like(ids)
    mask[:, :6] = 0
    batch = forward.Batch(ids, torch.ones_like(ids), [mask], None, None, None)
    assert_same(model, batch, mask, temperature=1.0)
    assert model.get_base_model().config.final_logit_softcapping == 2.0  # put back
    # The cap is in force: without it the logprobs differ.
    capped = forward.token_logprobs(model, batch, mask).detach()
    model.get_base_model().config.final_logit_softcapping = None
    assert (forward.token_logprobs(model, batch, mask).detach() - capped).abs().max() > 1e-3


@pytest.mark.parametrize("chunk", [1, 7, 4096])
def test_the_chunk_size_does_not_change_the_logprobs(tiny_text, chunk):
    model = lora_model(forward.load_model(tiny_text))
    ids = torch.randint(3, 200, (2, 30), generator=torch.Generator().manual_seed(0))
    mask = (torch.arange(30) >= 10).long().expand(2, 30).clone()
    batch = forward.Batch(ids, torch.ones_like(ids), [mask], None, None, None)
    with torch.no_grad():
        one = forward.token_logprobs(model, batch, mask, 0.9, chunk_tokens=chunk)
        ref = full_logits_logprobs(model, batch, mask, 0.9)
    assert (one - ref).abs().max() <= 1e-5

"""Shared prompts (train.share_prompts): the sequences of a micro-batch that begin with the same prompt run it
once, and each runs only its own continuation against the prompt's keys and values.

A GRPO group is G completions of one prompt, so a padded micro-batch of text sequences runs each prompt G
times. Here the distinct prompts run first as one batch, keeping their keys and values (a DynamicCache);
the continuations then run as a second batch that attends to their prompt's cached keys and values, with
the position ids they hold in the whole sequence. Attention, rotary positions and the masked logprobs are
those of the unshared forward, and the gradient reaches the prompt's activations from every continuation
through the cache, so logprobs and gradients equal the unshared pass's (tests/test_shared_prompt.py, 1e-5
in float32). A sequence's prompt is every token before its first scored one: the hidden state of the
prompt's last token scores the continuation's first token.

Every micro-batch runs the two passes, whatever its prompts (a batch with no prompt in common too): the
ranks of an FSDP group then make the same collectives. Text models whose cache is plain (no sliding window,
no vision tower) only: `prepare` refuses the others.
"""
from __future__ import annotations

import torch

from rollout.models import has_sliding_window


def prepare(model) -> None:
    """Refuse a model whose shared-prompt forward is not known to equal its unshared one."""
    config = (model.get_base_model() if hasattr(model, "get_base_model") else model).config
    why = None
    if hasattr(config, "vision_config"):
        why = f"{config.model_type} is an image-text model"
    elif has_sliding_window(config):
        why = f"{config.model_type} has sliding-window layers, whose cache keeps only the last tokens"
    elif getattr(config, "final_logit_softcapping", None) is not None:
        why = f"{config.model_type} caps its logits"
    if why is not None:
        raise ValueError(f"train.share_prompts supports text models with a plain key-value cache: {why}. Set "
                         "train.share_prompts: false")


def prompt_of(segment) -> tuple:
    """A segment's prompt: its tokens before the first scored one (grpo.learner.plan.micro_batches groups by it)."""
    return tuple(segment.token_ids[:list(segment.loss_mask).index(1)])


def token_logprobs(model, head_owner, batch, want: torch.Tensor, scorer_for) -> torch.Tensor:
    """forward.token_logprobs's [B, T] result through the two passes. `head_owner`: the model under peft's
    wrapper, which holds the output projection; `want` [B, T-1]: token t+1 is scored from the hidden state
    at t; `scorer_for(want, targets, first)` builds the output projection's stand-in."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    ids, attn = batch.input_ids, batch.attention_mask
    B, T = ids.shape
    lengths = attn.sum(1).tolist()
    scored = want.any(1).tolist()
    first = want.int().argmax(1).add(1).tolist()  # the first scored token, where scored
    split = [first[b] if scored[b] else lengths[b] for b in range(B)]
    rows = ids.tolist()
    prompts: dict[tuple, int] = {}
    owner = [prompts.setdefault(tuple(rows[b][:split[b]]), len(prompts)) for b in range(B)]
    P = max(split)
    prompt_ids = torch.full((len(prompts), P), int(ids[0, 0]), dtype=ids.dtype, device=ids.device)
    prompt_mask = torch.zeros((len(prompts), P), dtype=attn.dtype, device=ids.device)
    for p, u in prompts.items():
        prompt_ids[u, :len(p)] = torch.as_tensor(p, dtype=ids.dtype)
        prompt_mask[u, :len(p)] = 1
    S = max(1, max(n - s for n, s in zip(lengths, split)))
    rest_ids = torch.full((B, S), int(ids[0, 0]), dtype=ids.dtype, device=ids.device)
    rest_mask = torch.zeros((B, S), dtype=attn.dtype, device=ids.device)
    rest_want = torch.zeros((B, S), dtype=torch.bool, device=ids.device)
    for b in range(B):
        n = lengths[b] - split[b]
        rest_ids[b, :n] = ids[b, split[b]:lengths[b]]
        rest_mask[b, :n] = 1
        if scored[b]:
            rest_want[b, :n] = want[b, split[b] - 1:lengths[b] - 1]
    head = head_owner.get_output_embeddings()
    last = torch.as_tensor([len(p) - 1 for p in prompts], device=ids.device)
    try:
        head_owner.set_output_embeddings(_LastHidden(last))
        out = model(input_ids=prompt_ids, attention_mask=prompt_mask, use_cache=True)
        cache, prompt_last = out.past_key_values, out.logits
        if not isinstance(cache, DynamicCache) or any(type(layer) is not DynamicLayer for layer in cache.layers):
            raise RuntimeError(f"train.share_prompts needs a plain DynamicCache, {type(head_owner).__name__} "
                               f"returned {type(cache).__name__}: set train.share_prompts: false")
        at = torch.as_tensor(owner, device=ids.device)
        cache.batch_select_indices(at)
        head_owner.set_output_embeddings(scorer_for(rest_want, rest_ids[rest_want], prompt_last[at]))
        positions = torch.as_tensor(split, device=ids.device)[:, None] + torch.arange(S, device=ids.device)
        lp = model(input_ids=rest_ids, attention_mask=torch.cat([prompt_mask[at], rest_mask], 1),
                   position_ids=positions, past_key_values=cache, use_cache=True).logits
    finally:
        head_owner.set_output_embeddings(head)
    result = torch.zeros((B, T), dtype=lp.dtype, device=lp.device)
    b, s = rest_want.nonzero(as_tuple=True)
    result[b, torch.as_tensor(split, device=ids.device)[b] + s] = lp
    return result


class _LastHidden(torch.nn.Module):
    """Stands in for the output projection of the prompts' pass: the hidden state of each prompt's last token."""

    def __init__(self, last: torch.Tensor):
        super().__init__()
        self.last = last

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), self.last]

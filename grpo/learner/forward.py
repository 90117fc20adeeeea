"""The trainer's view of a trajectory: model inputs built from token ids and images, and per-token logprobs.

Sequences arrive in the compact form the rollout engine sent to vLLM (one image placeholder per image);
`expand` turns them into what the model runs, one placeholder per merged patch, exactly as vLLM expands
them, so the trainer's forward sees what vLLM saw.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import torch

from rollout.models import (  # noqa: F401  (re-exported: the trainer side reads models through here)
    check_model_dir,
    has_sliding_window,
    image_inputs,
    image_length,
    image_sequences,
    image_token_id,
    load_processor,
    merge_newlines,
    tokenizer_of,
    vision_token_ids,
)


def unwrapped(model):
    """The transformers model under a peft wrapper (or the model itself)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def load_model(model_path: str | Path, dtype: torch.dtype = torch.float32):
    """Load a causal LM or an image-text-to-text model by path, whichever the folder holds."""
    import json

    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    path = check_model_dir(model_path)
    config = json.loads((path / "config.json").read_text())
    auto = AutoModelForImageTextToText if "vision_config" in config else AutoModelForCausalLM
    return auto.from_pretrained(path, dtype=dtype)


@dataclass
class Expanded:
    """One sequence as the model runs it."""
    input_ids: torch.Tensor          # [T] long
    per_token: list[torch.Tensor]    # the caller's per-token tensors, expanded alongside the ids
    pixel_values: torch.Tensor | None
    image_grid_thw: torch.Tensor | None


def expand(processor, ids: list[int], images: list, per_token: list[torch.Tensor] = ()) -> Expanded:
    """Replace each image placeholder with the ids vLLM runs for that image (once per merged patch for the
    Qwen-VL families: rollout.models.image_sequences); inserted tokens take value 0 in `per_token`."""
    ids_t = torch.as_tensor(ids, dtype=torch.long)
    per_token = [torch.as_tensor(t) for t in per_token]
    if not images:
        return Expanded(ids_t, per_token, None, None)
    pad = image_token_id(processor)
    where = (ids_t == pad).nonzero().flatten().tolist()
    if len(where) != len(images):
        raise ValueError(f"the sequence has {len(where)} image placeholders but {len(images)} images travel with it")
    vis, counts = image_inputs(processor, images)
    out, source, start = [], [], 0
    for pos, seq in zip(where, image_sequences(processor, counts)):
        out += list(ids[start:pos]) + seq
        source += list(range(start, pos)) + [-1] * len(seq)
        start = pos + 1
    out, merged = merge_newlines(processor, out + list(ids[start:]))
    source += list(range(start, len(ids)))
    if any(merged):  # a merge replaces two tokens by one: the source of its first, then marked inserted
        kept, j = [], 0
        for m in merged:
            kept.append(-1 if m else source[j])
            j += 2 if m else 1
        source = kept
    src = torch.as_tensor(source, dtype=torch.long)
    inserted = src < 0
    out_pt = []
    for t in per_token:
        e = t[src.clamp(min=0)]
        e[inserted] = 0
        out_pt.append(e)
    return Expanded(torch.as_tensor(out, dtype=torch.long), out_pt, vis["pixel_values"], vis.get("image_grid_thw"))


@dataclass
class Batch:
    input_ids: torch.Tensor            # [B, T]
    attention_mask: torch.Tensor       # [B, T]
    per_token: list[torch.Tensor]      # each [B, T], zero on padding
    pixel_values: torch.Tensor | None
    image_grid_thw: torch.Tensor | None  # Qwen-VL families only
    image_token_id: int | None
    banned_ids: tuple[int, ...] = ()
    # Packed rows (grpo.learner.packing): each sequence's position ids, and True where a sequence begins.
    position_ids: torch.Tensor | None = None
    seq_starts: torch.Tensor | None = None
    # Padded rows whose equal prompts run once (train.share_prompts, grpo.learner.shared_prompt).
    share_prompts: bool = False

    def model_kwargs(self) -> dict:
        if self.position_ids is None:
            kw = {"input_ids": self.input_ids, "attention_mask": self.attention_mask}
        else:  # no mask: the restarts of the position ids separate the sequences
            kw = {"input_ids": self.input_ids, "position_ids": self.position_ids}
        if self.pixel_values is not None:
            kw["pixel_values"] = self.pixel_values
        if self.image_grid_thw is not None:
            kw["image_grid_thw"] = self.image_grid_thw
        if self.image_token_id is not None:
            # Qwen-VL forwards want the token types (0 text, 1 image) next to the ids.
            kw["mm_token_type_ids"] = (self.input_ids == self.image_token_id).long()
        return kw


def collate(processor, seqs: list[Expanded], pad_id: int) -> Batch:
    """Right-pad a list of expanded sequences into one batch; images keep their order of appearance."""
    T = max(len(s.input_ids) for s in seqs)
    B = len(seqs)
    ids = torch.full((B, T), pad_id, dtype=torch.long)
    attn = torch.zeros((B, T), dtype=torch.long)
    n_pt = len(seqs[0].per_token)
    pts = [torch.zeros((B, T), dtype=seqs[0].per_token[k].dtype) for k in range(n_pt)]
    for i, s in enumerate(seqs):
        n = len(s.input_ids)
        ids[i, :n] = s.input_ids
        attn[i, :n] = 1
        for k in range(n_pt):
            pts[k][i, :n] = s.per_token[k]
    pix = [s.pixel_values for s in seqs if s.pixel_values is not None]
    grids = [s.image_grid_thw for s in seqs if s.image_grid_thw is not None]
    return Batch(ids, attn, pts, torch.cat(pix) if pix else None, torch.cat(grids) if grids else None,
                 image_token_id(processor), vision_token_ids(processor))


LOGPROB_CHUNK_TOKENS = 256  # 256 x 151k float32 logits: 156 MB at Qwen3-VL's vocabulary


def token_logprobs(model, batch: Batch, mask: torch.Tensor | None = None, temperature: float = 1.0,
                   chunk_tokens: int = LOGPROB_CHUNK_TOKENS, entropy: bool = False):
    """logprob of token t given the tokens before it, [B, T]; zero where `mask` is 0 and at position 0.

    The vocabulary projection runs on the hidden states at the masked positions only, `chunk_tokens` at a
    time, never as the full [B, T, vocabulary] logits: at a 151k vocabulary one 8k-token sequence's logits
    alone are 2.4 GB in bf16. With gradients each chunk's logits are recomputed in the backward pass
    instead of kept, so the peak is one chunk's, whatever the number of tokens. The policy is the model
    with image and video markers excluded, as the rollout engine samples it (they are banned there: an
    untrained model that emits one would announce an image that does not exist), so they are excluded
    here too; vLLM reports logprobs of that same distribution (logprobs_mode="processed_logprobs").
    With `entropy`, returns (logprobs, entropies): each position's entropy of that distribution too,
    detached, from the same chunks' logits.
    """
    want = (batch.attention_mask if mask is None else mask)[:, 1:].bool()
    if batch.seq_starts is not None:  # a packed sequence's first token does not follow the one before it
        want = want & ~batch.seq_starts[:, 1:]
    head_owner = unwrapped(model)
    head = head_owner.get_output_embeddings()

    scorers = []

    def scorer_for(want, targets, first=None):
        scorers.append(_MaskedLogprobs(head, want, targets, batch.banned_ids, temperature, chunk_tokens,
                                       _softcap(head_owner), first, entropy))
        return scorers[-1]

    if batch.share_prompts:
        from grpo.learner import shared_prompt

        if entropy:
            raise ValueError("entropies with train.share_prompts: not supported (the shared pass scores the rows' "
                             "rest apart); set train.share_prompts: false for algorithm.top_entropy_quantile < 1")
        out = shared_prompt.token_logprobs(model, head_owner, batch, want, scorer_for)
    else:
        # The scorer stands in for the output projection inside the model's own forward, so that FSDP has the
        # projection's weights gathered when it runs, as for the projection itself.
        head_owner.set_output_embeddings(scorer_for(want, batch.input_ids[:, 1:][want]))
        try:
            with _no_softcap(head_owner):
                lp = model(**batch.model_kwargs(), use_cache=False).logits
        finally:
            head_owner.set_output_embeddings(head)
        out = torch.zeros(batch.input_ids.shape, dtype=lp.dtype, device=lp.device)
        out[:, 1:][want] = lp
    if not entropy:
        return out
    ent = torch.zeros_like(out)
    ent[:, 1:][want] = scorers[-1].entropy.to(ent.dtype)
    return out, ent



class _MaskedLogprobs(torch.nn.Module):
    """The output projection and log-softmax of the masked positions, chunk by chunk; returns their logprobs."""

    def __init__(self, head, want, targets, banned, temperature, chunk_tokens, softcap, first=None,
                 entropy: bool = False):
        super().__init__()
        self.head = head
        self.want, self.targets, self.banned = want, targets, list(banned)
        self.temperature, self.chunk, self.softcap = temperature, chunk_tokens, softcap
        self.first = first  # [B, hidden]: the hidden state before each row's first token (a shared prompt's last)
        self.with_entropy, self.entropy = entropy, None  # the entropies of the last forward's positions, detached

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint

        if self.first is not None:
            hidden = torch.cat([self.first[:, None].to(hidden.dtype), hidden], 1)
        picked = hidden[:, :-1][self.want]
        parts = []
        for s in range(0, picked.shape[0], self.chunk):
            h, t = picked[s:s + self.chunk], self.targets[s:s + self.chunk]
            if torch.is_grad_enabled() and h.requires_grad:
                parts.append(checkpoint(self._chunk, h, t, use_reentrant=False))
            else:
                parts.append(self._chunk(h, t))
        out = torch.cat(parts) if parts else picked.new_zeros((0, 2) if self.with_entropy else 0, dtype=torch.float32)
        if not self.with_entropy:
            return out
        # Outside the checkpointed chunks: their recomputation in the backward pass leaves this alone.
        self.entropy = out[:, 1].detach()
        return out[:, 0]

    def _chunk(self, h: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self.head(h).float()
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        logp = policy_logprobs(logits, self.banned, self.temperature)
        lp = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        if not self.with_entropy:
            return lp
        with torch.no_grad():
            entropy = torch.special.entr(logp.exp()).sum(-1)  # entr(0) = 0: banned ids add nothing
        return torch.stack([lp, entropy], -1)


def target_logprobs(logits: torch.Tensor, targets: torch.Tensor, banned=(), temperature: float = 1.0) -> torch.Tensor:
    """[N, vocabulary] float32 logits -> [N]: each target's logprob under the policy (banned ids excluded,
    logits divided by the temperature). Modifies `logits`."""
    return policy_logprobs(logits, banned, temperature).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def policy_logprobs(logits: torch.Tensor, banned=(), temperature: float = 1.0) -> torch.Tensor:
    """[N, vocabulary] float32 logits -> the policy's log-distribution (banned ids at -inf, logits divided by
    the temperature). Modifies `logits`."""
    if banned:
        logits[:, list(banned)] = float("-inf")
    if temperature != 1.0:
        logits = logits / temperature
    return torch.log_softmax(logits, dim=-1)


def logprobs_from_logits(logits: torch.Tensor, batch: Batch, mask: torch.Tensor) -> torch.Tensor:
    """token_logprobs at temperature 1 from the model's full [B, T, vocabulary] logits, for a caller that needs
    the logits themselves too (the maze warm start's supervised loss and accuracy)."""
    want = mask[:, 1:].bool()
    lp = target_logprobs(logits[:, :-1][want].float(), batch.input_ids[:, 1:][want], batch.banned_ids)
    out = torch.zeros(batch.input_ids.shape, dtype=lp.dtype, device=lp.device)
    out[:, 1:][want] = lp
    return out


def _softcap(model) -> float | None:
    # Read where the model's own forward reads it: a causal LM's config (Gemma's); an image-text model's
    # forward (Gemma 3's) caps nothing, whatever its text config says.
    return getattr(model.config, "final_logit_softcapping", None)


@contextlib.contextmanager
def _no_softcap(model):
    """The model's forward would cap what the scorer returns (logprobs) as if it were logits: the scorer caps
    the logits itself, and the forward is told there is nothing to cap."""
    config, cap = model.config, _softcap(model)
    if cap is None:
        yield
        return
    config.final_logit_softcapping = None
    try:
        yield
    finally:
        config.final_logit_softcapping = cap

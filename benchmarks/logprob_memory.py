"""The peak memory of the logprob computation at Qwen3-VL's vocabulary: the full logits against chunks.

    python -m benchmarks.logprob_memory [--tokens 4096] [--generated 2048] [--vocab 151936]

One sequence of `tokens` tokens, `generated` of them sampled (in the loss mask), through a 2-layer text model
with a `vocab`-entry vocabulary and LoRA, forward and backward, each way in a fresh process:
- full: the whole [1, tokens, vocab] logits, then the masked positions picked (the trainer's computation
  before December 2026, kept here as the reference);
- chunked: grpo.learner.forward.token_logprobs (the output projection on the masked positions' hidden states,
  LOGPROB_CHUNK_TOKENS at a time, each chunk's logits recomputed in the backward pass).
Peak memory is the process's resident memory, sampled every millisecond during the computation, less what it
held just before (the model, the inputs). The last line printed is one JSON object, also written to
benchmarks/results/logprob_memory.json: `ratio` is chunked over full, and the two logprobs' largest gap.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from benchmarks._machine import ROOT, PeakRss, write_result

QWEN3_VL_VOCAB = 151936


def one(way: str, tokens: int, generated: int, vocab: int) -> dict:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from grpo.learner import forward
    from grpo.learner.lora import LoraConfig, apply_lora

    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=vocab, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=32, tie_word_embeddings=False)
    model = apply_lora(Qwen3ForCausalLM(config), LoraConfig(rank=8, alpha=16.0))
    ids = torch.randint(0, vocab, (1, tokens), generator=torch.Generator().manual_seed(1))
    mask = (torch.arange(tokens) >= tokens - generated).long()[None]
    batch = forward.Batch(ids, torch.ones_like(ids), [mask], None, None, None)

    def full():
        logits = model(**batch.model_kwargs(), use_cache=False).logits
        return forward.logprobs_from_logits(logits, batch, mask)[:, 1:][mask[:, 1:].bool()]

    def chunked():
        return forward.token_logprobs(model, batch, mask)[:, 1:][mask[:, 1:].bool()]

    run = {"full": full, "chunked": chunked}[way]
    with PeakRss() as rss:
        t0 = time.perf_counter()
        lp = run()
        lp.sum().backward()
        seconds = time.perf_counter() - t0
    return {"way": way, "peak_bytes": rss.grown, "seconds": round(seconds, 3),
            "logprobs": lp.detach().tolist()}


def measure(tokens: int = 4096, generated: int = 2048, vocab: int = QWEN3_VL_VOCAB) -> dict:
    """Both ways, each in a fresh process; the ratio of their peaks and their logprobs' largest gap."""
    rows = {}
    for way in ("full", "chunked"):
        done = subprocess.run([sys.executable, "-m", "benchmarks.logprob_memory", "--one", way, "--tokens",
                               str(tokens), "--generated", str(generated), "--vocab", str(vocab)],
                              cwd=ROOT, capture_output=True, text=True, check=True)
        rows[way] = json.loads(done.stdout.strip().splitlines()[-1])
    gap = max(abs(a - b) for a, b in zip(rows["full"].pop("logprobs"), rows["chunked"].pop("logprobs")))
    mb = lambda way: round(rows[way]["peak_bytes"] / 2**20, 1)  # noqa: E731
    return {"vocab": vocab, "tokens": tokens, "generated": generated, "full_peak_mb": mb("full"),
            "chunked_peak_mb": mb("chunked"), "full_s": rows["full"]["seconds"],
            "chunked_s": rows["chunked"]["seconds"],
            "ratio": round(rows["chunked"]["peak_bytes"] / rows["full"]["peak_bytes"], 4), "logprob_gap_max": gap}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.logprob_memory", description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--generated", type=int, default=2048)
    ap.add_argument("--vocab", type=int, default=QWEN3_VL_VOCAB)
    ap.add_argument("--one", choices=("full", "chunked"), help=argparse.SUPPRESS)  # the child: one way
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(one(args.one, args.tokens, args.generated, args.vocab)))
        return {}
    result = measure(args.tokens, args.generated, args.vocab)
    # Sizes other than the defaults are not the figure the tables show.
    result["quick"] = any(getattr(args, k) != ap.get_default(k) for k in ("tokens", "generated", "vocab"))
    result["headline"] = [{
        "figure": f"logprob computation's peak memory, {args.tokens} tokens ({args.generated} sampled) at a "
                  f"{args.vocab:,}-entry vocabulary, chunked", "value": result["chunked_peak_mb"], "unit": "MB",
        "baseline": result["full_peak_mb"], "baseline_name": "full logits", "ratio": result["ratio"]}]
    write_result("logprob_memory", result)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()

"""The peak memory of the logprob computation at Qwen3-VL's vocabulary: the full logits against chunks.

    python -m benchmarks.logprob_memory [--quick] [--tokens 4096] [--generated 2048] [--vocab 151936]
    python -m benchmarks.logprob_memory [--quick] --model smollm2-135m-instruct

One sequence of `tokens` tokens, `generated` of them sampled (in the loss mask), through a 2-layer text model
with a `vocab`-entry vocabulary and LoRA (or a real model with its own vocabulary, --model), forward and
backward, each way in a fresh process:
- full: the whole [1, tokens, vocab] logits, then the masked positions picked (the trainer's computation
  before December 2026, kept here as the reference);
- chunked: grpo.learner.forward.token_logprobs (the output projection on the masked positions' hidden states,
  LOGPROB_CHUNK_TOKENS at a time, each chunk's logits recomputed in the backward pass).
Peak memory is the process's resident memory, sampled every millisecond during the computation, less what it
held just before (the model, the inputs). The last line printed is one JSON object, also written to
benchmarks/results/logprob_memory.json (logprob_memory-MODEL.json with --model; NAME-quick.json at other sizes
than the defaults): `ratio` is chunked over full, and the two logprobs' largest gap.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from benchmarks._machine import ROOT, PeakRss, bench_model, result_stem, write_result

QWEN3_VL_VOCAB = 151936
SIZES = {"full": {"tokens": 4096, "generated": 2048}, "quick": {"tokens": 2048, "generated": 1024}}


def one(way: str, tokens: int, generated: int, vocab: int, model_path: str | None = None) -> dict:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from grpo.learner import forward
    from grpo.learner.lora import LoraConfig, apply_lora

    torch.manual_seed(0)
    if model_path:
        base = forward.load_model(model_path)
        vocab = base.get_output_embeddings().weight.shape[0]
    else:
        base = Qwen3ForCausalLM(Qwen3Config(vocab_size=vocab, hidden_size=128, intermediate_size=256,
                                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                            head_dim=32, tie_word_embeddings=False))
    model = apply_lora(base, LoraConfig(rank=8, alpha=16.0))
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
    return {"way": way, "vocab": vocab, "peak_bytes": rss.grown, "seconds": round(seconds, 3),
            "logprobs": lp.detach().tolist()}


def measure(tokens: int = 4096, generated: int = 2048, vocab: int = QWEN3_VL_VOCAB,
            model_path: str | None = None) -> dict:
    """Both ways, each in a fresh process; the ratio of their peaks and their logprobs' largest gap. With a
    model folder, its own vocabulary (`vocab` is the 2-layer model's)."""
    rows = {}
    for way in ("full", "chunked"):
        argv = [sys.executable, "-m", "benchmarks.logprob_memory", "--one", way, "--tokens", str(tokens),
                "--generated", str(generated), "--vocab", str(vocab)] + (["--model", model_path] if model_path else [])
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=True)
        rows[way] = json.loads(done.stdout.strip().splitlines()[-1])
    gap = max(abs(a - b) for a, b in zip(rows["full"].pop("logprobs"), rows["chunked"].pop("logprobs")))
    mb = lambda way: round(rows[way]["peak_bytes"] / 2**20, 1)  # noqa: E731
    return {"vocab": rows["full"]["vocab"], "tokens": tokens, "generated": generated, "full_peak_mb": mb("full"),
            "chunked_peak_mb": mb("chunked"), "full_s": rows["full"]["seconds"],
            "chunked_s": rows["chunked"]["seconds"],
            "ratio": round(rows["chunked"]["peak_bytes"] / rows["full"]["peak_bytes"], 4), "logprob_gap_max": gap}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.logprob_memory", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help=f"{SIZES['quick']['tokens']} tokens, "
                                                         f"{SIZES['quick']['generated']} sampled")
    ap.add_argument("--tokens", type=int, help=f"default {SIZES['full']['tokens']}")
    ap.add_argument("--generated", type=int, help=f"default {SIZES['full']['generated']}")
    ap.add_argument("--vocab", type=int, help=f"the 2-layer model's vocabulary (default {QWEN3_VL_VOCAB:,})")
    ap.add_argument("--model", help="a real model instead of the 2-layer one: a name rollout.pretrained knows "
                                    "(smollm2-135m-instruct), a Hub id or a folder; its own vocabulary")
    ap.add_argument("--one", choices=("full", "chunked"), help=argparse.SUPPRESS)  # the child: one way
    args = ap.parse_args(argv)
    sizes = SIZES["quick" if args.quick else "full"]
    tokens, generated = args.tokens or sizes["tokens"], args.generated or sizes["generated"]
    if args.one:  # the child, given a model folder
        print(json.dumps(one(args.one, tokens, generated, args.vocab, args.model)))
        return {}
    if args.model and args.vocab:
        ap.error("--vocab sizes the 2-layer model; a --model has its own vocabulary: give one or the other")
    model = bench_model(args.model) if args.model else None
    result = measure(tokens, generated, args.vocab or QWEN3_VL_VOCAB, model.path if model else None)
    # Sizes other than the defaults are not the figure the tables show.
    result["quick"] = ((tokens, generated) != (SIZES["full"]["tokens"], SIZES["full"]["generated"])
                       or args.vocab not in (None, QWEN3_VL_VOCAB))
    vocab = result["vocab"]
    where = f"on {model.label}, vocabulary {vocab:,}" if model else f"at a {vocab:,}-entry vocabulary"
    result["headline"] = [{
        "figure": f"logprob computation's peak memory, {tokens} tokens ({generated} sampled) {where}, chunked",
        "value": result["chunked_peak_mb"], "unit": "MB", "baseline": result["full_peak_mb"],
        "baseline_name": "full logits", "ratio": result["ratio"]}]
    if model:
        result["model"] = model.record()
    write_result(result_stem("logprob_memory", model), result)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()

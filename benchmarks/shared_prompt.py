"""The update with shared prompts (train.share_prompts) against the padded micro-batch, on GRPO groups.

    python -m benchmarks.shared_prompt [--quick]

Two single-process TrainWorkers on the bench text model (grpo.tools.tiny_models, LoRA r16, 2 threads), one
sharing prompts and one not, take turns in this process on the same batch: 8 prompts x G=8 random completions,
in two shapes:
- "digits": prompts of 24-38 tokens and completions of 32, the single-turn task of benchmarks/vs_trl.py, the
  64 sequences in one micro-batch as there;
- "long_prompt": prompts of 512 tokens and completions of 64, a prompt that carries a document or a problem,
  8 sequences (one group) a micro-batch.
Each case reports the best step of each side after a warm-up step (the machine is shared: the best is the
least disturbed), the tokens each side's forwards ran, and the largest logprob difference between the two
sides on the batch (the same computation: about 1e-6 in float32). The ratio is padded seconds over shared.

The last line printed is one JSON object, also written to benchmarks/results/shared_prompt.json
(shared_prompt-quick.json with --quick).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import random
import time

from benchmarks._machine import ROOT, machine_info, write_result
from rollout import runtime

runtime.configure(ROOT / "runs" / "bench")  # before torch: OMP_WAIT_POLICY is read when OpenMP starts

import torch  # noqa: E402

# micro_batch: sequences a forward. The digits batch runs as one (as in vs_trl); a micro-batch of 64 sequences of
# 576 tokens spends most of its time allocating activations, so the long prompts run a group a micro-batch.
CASES = {"digits": {"prompt": (24, 38), "completion": 32, "micro_batch": 64},
         "long_prompt": {"prompt": (512, 512), "completion": 64, "micro_batch": 8}}
PROMPTS, GROUP = 8, 8


def group_batch(vocab: int, prompt: tuple[int, int], completion: int, seed: int = 0):
    from rollout.trajectory import Segment, Trajectory

    rng = random.Random(seed)
    trajs = []
    for p in range(PROMPTS):
        ids = [rng.randrange(3, vocab) for _ in range(rng.randint(*prompt))]
        for _ in range(GROUP):
            gen = [rng.randrange(3, vocab) for _ in range(completion)]
            mask = [0] * len(ids) + [1] * completion
            trajs.append(Trajectory(task_id=f"p{p}", group_id=p, seed=p, num_turns=1, stop_reason="done",
                                    segments=[Segment(ids + gen, mask, [-1.0 if m else 0.0 for m in mask], [])],
                                    turn_rewards=[0.0], adapter_version=None))
    return trajs, [rng.gauss(0, 1) for _ in trajs]


def run_case(model: str, case: dict, steps: int) -> dict:
    from grpo.learner import forward, shared_prompt
    from grpo.learner.config import TrainConfig
    from grpo.learner.lora import LoraConfig
    from grpo.learner.worker import TrainWorker

    workers = {share: TrainWorker(model, lora=LoraConfig(rank=16, alpha=32.0), cpu_threads=2,
                                  train=TrainConfig(lr=1e-4, micro_batch_size=case["micro_batch"], share_prompts=share))
               for share in (False, True)}
    vocab = forward.tokenizer_of(workers[False].processor).vocab_size
    trajs, adv = group_batch(vocab, case["prompt"], case["completion"])
    seqs = [forward.expand(workers[False].processor, t.segments[0].token_ids, [],
                           [torch.as_tensor(t.segments[0].loss_mask)]) for t in trajs]
    batch = forward.collate(workers[False].processor, seqs, workers[False].pad_id)
    with torch.no_grad():
        lp = {share: forward.token_logprobs(workers[share].model, dataclasses.replace(batch, share_prompts=share),
                                            batch.per_token[0]) for share in (False, True)}
    best = {share: float("inf") for share in workers}
    for k in range(steps + 1):  # the first round warms up
        for share, w in workers.items():
            t = time.perf_counter()
            w.train_step(trajs, adv)
            if k:
                best[share] = min(best[share], time.perf_counter() - t)
    prompts = {shared_prompt.prompt_of(t.segments[0]) for t in trajs}
    tokens = sum(len(t.segments[0].token_ids) for t in trajs)
    return {"sequences": len(trajs), "micro_batch_size": case["micro_batch"], "tokens": tokens,
            "tokens_run_shared": tokens - sum(len(p) for p in prompts) * (GROUP - 1),
            "padded_tokens": int(batch.input_ids.numel()),
            "step_s": {"padded": round(best[False], 4), "shared": round(best[True], 4)},
            "ratio": round(best[False] / best[True], 3),
            "logprob_gap_max": float((lp[True] - lp[False]).abs().max())}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 timed steps a side instead of 5")
    a = ap.parse_args(argv)
    from grpo.tools import tiny_models

    model = str(tiny_models.build("text", ROOT / "runs" / "bench" / "models" / "text-bench", seed=0, preset="bench"))
    torch.set_num_threads(2)
    cases = {name: run_case(model, case, 2 if a.quick else 5) for name, case in CASES.items()}
    result = {"benchmark": "shared_prompt", "quick": a.quick, "model": "tiny_models text preset bench, LoRA r16",
              "batch": f"{PROMPTS} prompts x G={GROUP}", "cases": cases,
              **{f"shared_vs_padded_{name}": c["ratio"] for name, c in cases.items()}}
    result["headline"] = [
        {"figure": f"update seconds, shared prompts against the padded batch ({name}: {c['sequences']} sequences, "
                   f"{c['tokens']} tokens, {c['tokens_run_shared']} run shared)",
         "value": c["step_s"]["shared"], "unit": "s", "baseline": c["step_s"]["padded"],
         "baseline_name": "padded micro-batch", "ratio": c["ratio"]} for name, c in cases.items()]
    write_result("shared_prompt", result, machine_info(peak=False))
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()

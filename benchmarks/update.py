"""Trainer update throughput: 2 FSDP ranks against one plain torch + peft process, on the same cores.

    python -m benchmarks.update [--quick] [--kind vl|text] [--preset bench] [--work runs/bench]
    python -m benchmarks.update [--quick] --model smollm2-135m-instruct

Measured in one run, on the same batch:
- single: a plain loop (forward.expand/collate/token_logprobs, grpo.algo.loss, AdamW on the LoRA weights) in
  this process, at its best thread count (1 or 2 OpenMP threads);
- fsdp: TrainWorker ranks, one thread each, in 2 processes (torch multiprocessing, gloo), FSDP2-sharded;
- the step's FLOPs, counted by torch's FlopCounterMode on the single loop, and the peak of a large fp32
  matmul on the same cores.
The contenders take turns, step by step, while the others idle, and each reports its best step (the
machine is shared: the best is the least disturbed; the JSON records the load average around the run).
Then packing_and_precision: packed rows against padded micro-batches on sequences of 32 to 2048 tokens
(`packed_vs_padded_skewed`, and bf16 and activation checkpointing beside them), the maze step's update
against the trainer before issue 21 (`maze_train_time_ratio`: today's padded recipe over the old one, both at
the old one's algorithm settings; `maze_packed_vs_baseline`), and the logprob computation's peak memory at a
151k vocabulary (`logprob_peak_memory_ratio`, chunked over full logits).
On a real model (--model: a name rollout.pretrained knows, a Hub id or a folder) the run is the first
comparison and its MFU, on that model's own batch; the rest stays the bench model's.
The last line printed is one JSON object, also written to benchmarks/results/update.json (update-quick.json
with --quick; update-MODEL.json with --model) with the machine (benchmarks/_machine.py).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import time
from pathlib import Path

from benchmarks._machine import RESULTS, ROOT, bench_model, machine_info, matmul_peak, peaks, result_stem, write_result
from benchmarks._update_side import BASELINE, BASELINE_ALGORITHM, contender, maze_recipe, race, skewed_batch
from rollout import runtime

runtime.configure(ROOT / "runs" / "bench")  # before torch: OMP_WAIT_POLICY is read when OpenMP starts

import torch  # noqa: E402

MODES = {
    # sequences per batch, tokens per sequence, micro-batch size, timed steps
    "quick": dict(sequences=8, length=384, micro_batch_size=4, steps=3),
    "full": dict(sequences=8, length=512, micro_batch_size=8, steps=3),
}
# On a real model (--model), one sequence a micro-batch: SmolLM2-135M's 30 layers at 4 x 384 tokens held 5.6 GB
# in each of the three processes here, more than this machine has beside other work.
MODEL_MODES = {
    "quick": dict(sequences=4, length=256, micro_batch_size=1, steps=2),
    "full": dict(sequences=8, length=512, micro_batch_size=1, steps=3),
}
LORA_RANK = 32


def make_batch(processor, sequences: int, length: int, seed: int = 0):
    """Multi-turn episodes of about `length` tokens: an image prompt, then 24 sampled tokens and a short
    text observation per turn (about half the tokens are generated)."""
    from PIL import Image

    from envs.base import Observation
    from rollout.conversation import ChatFormat
    from rollout.trajectory import Segment, Trajectory

    chat = ChatFormat(processor)
    rng = random.Random(seed)
    special = set(chat.tok.all_special_ids) | chat.vision_ids
    ordinary = [i for i in range(len(chat.tok)) if i not in special]
    vl = chat.image_token_id is not None
    trajs = []
    for e in range(sequences):
        images = [Image.new("RGB", (64, 64), (rng.randrange(256), 255, 255))] if vl else []
        ids = chat.prompt_ids(Observation(text=f"episode {e}: reach the red square", images=images))
        mask = [0] * len(ids)
        while len(ids) < length:
            gen = [rng.choice(ordinary) for _ in range(24)]
            suffix = chat.observation_ids(Observation(text="You moved right. Turns left: 7"), gen)
            ids, mask = ids + gen + suffix, mask + [1] * len(gen) + [0] * len(suffix)
        ids, mask = ids[:length], mask[:length]
        lps = [-rng.uniform(0.1, 5.0) if m else 0.0 for m in mask]
        trajs.append(Trajectory(task_id=str(e), group_id=e // 4, seed=e, segments=[Segment(ids, mask, lps, images)],
                                turn_rewards=[0.0], num_turns=1, stop_reason="done", adapter_version=None))
    advantages = [rng.uniform(-1, 1) for _ in range(sequences)]
    return trajs, advantages


class PlainLoop:
    """The single process: a plain torch + peft loop, without any of the trainer's machinery."""

    def __init__(self, model_path: str, batch, advantages, micro_batch_size: int):
        from grpo.algo.config import AlgorithmConfig
        from grpo.learner import forward
        from grpo.learner.lora import LoraConfig, apply_lora

        torch.manual_seed(0)
        self.model = apply_lora(forward.load_model(model_path), LoraConfig(rank=LORA_RANK, alpha=2 * LORA_RANK))
        self.model.train()
        self.processor = forward.load_processor(model_path)
        self.pad = forward.tokenizer_of(self.processor).pad_token_id
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(self.params, lr=1e-5)
        self.algo = AlgorithmConfig()
        self.segs = [(s, a) for t, a in zip(batch, advantages) for s in t.segments]
        self.micro_batch_size = micro_batch_size

    def step(self) -> int:
        from grpo.algo.loss import loss_normalizer, policy_loss
        from grpo.learner import forward

        seqs = [forward.expand(self.processor, s.token_ids, s.images,
                               [torch.tensor(s.loss_mask), torch.tensor(s.sampler_logprobs)]) for s, _ in self.segs]
        norm = loss_normalizer([q.per_token[0][None] for q in seqs], self.algo)
        tokens, size = 0, self.micro_batch_size
        for k in range(0, len(seqs), size):
            b = forward.collate(self.processor, seqs[k:k + size], self.pad)
            mask = b.per_token[0]
            lp = forward.token_logprobs(self.model, b, mask)
            adv = torch.tensor([a for _, a in self.segs[k:k + size]])
            policy_loss(lp, lp.detach(), adv, mask, self.algo, norm, sampler_logprobs=b.per_token[1]).loss.backward()
            tokens += int(b.attention_mask.sum())
        torch.nn.utils.clip_grad_norm_(self.params, 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return tokens

    def count_flops(self) -> int:
        from torch.utils.flop_counter import FlopCounterMode

        with FlopCounterMode(display=False) as counter:
            self.step()
        return counter.get_total_flops()


def _rank(rank: int, world_size: int, port: int, model_path: str, cfg: dict, commands, results) -> None:
    from grpo.learner import dist
    from grpo.learner.config import TrainConfig
    from grpo.learner.lora import LoraConfig
    from grpo.learner.worker import TrainWorker

    worker = TrainWorker(model_path, lora=LoraConfig(rank=LORA_RANK, alpha=2 * LORA_RANK),
                         train=TrainConfig(micro_batch_size=cfg["micro_batch_size"]), rank=rank,
                         world_size=world_size, cpu_threads=1)
    worker.setup("127.0.0.1", port)
    batch, advantages = make_batch(worker.processor, cfg["sequences"], cfg["length"])
    results.put(("ready", rank))
    while commands.get() == "step":
        dist.barrier()
        t = time.perf_counter()
        worker.train_step(batch, advantages)
        if rank == 0:
            results.put(("step_s", time.perf_counter() - t))
    worker.close()


class FsdpRanks:
    """TrainWorker ranks in their own processes (torch multiprocessing, gloo), idle between steps, so
    that their steps can alternate with the single process's under the same load."""

    def __init__(self, model_path: str, cfg: dict, world_size: int = 2):
        import torch.multiprocessing as mp

        from grpo.learner.dist import free_port

        ctx = mp.get_context("spawn")
        self.commands = [ctx.Queue() for _ in range(world_size)]
        self.results = ctx.Queue()
        port = free_port()
        self.procs = [ctx.Process(target=_rank, args=(r, world_size, port, model_path, cfg, self.commands[r],
                                                      self.results)) for r in range(world_size)]
        for p in self.procs:
            p.start()
        for _ in range(world_size):
            self._get("ready")

    def _get(self, kind: str):
        got, value = self.results.get(timeout=900)
        if got != kind:
            raise RuntimeError(f"expected {kind!r} from an FSDP rank, got {got!r}")
        return value

    def step(self) -> float:
        for q in self.commands:
            q.put("step")
        return self._get("step_s")

    def close(self) -> None:
        for q in self.commands:
            q.put("stop")
        for p in self.procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
        if any(p.exitcode for p in self.procs):
            raise RuntimeError(f"an FSDP rank failed: exit codes {[p.exitcode for p in self.procs]}")


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a small batch and few steps (about 2 minutes)")
    ap.add_argument("--kind", choices=("vl", "text"), default="vl")
    ap.add_argument("--preset", default="bench", help="a grpo.tools.tiny_models preset")
    ap.add_argument("--model", help="a real model instead of the preset: a name rollout.pretrained knows "
                                    "(smollm2-135m-instruct), a Hub id or a folder; FSDP against the plain loop and "
                                    "the MFU only")
    ap.add_argument("--work", default=str(ROOT / "runs" / "bench"))
    ap.add_argument("--out", help="the result file (default: benchmarks/results/update.json; NAME-quick.json for "
                                  "a quick run)")
    a = ap.parse_args(argv)
    from grpo.learner import forward
    from grpo.tools import tiny_models

    mode = "quick" if a.quick else "full"
    cfg = (MODEL_MODES if a.model else MODES)[mode]
    model = bench_model(a.model) if a.model else None
    model_path = model.path if model else str(tiny_models.build(a.kind, Path(a.work) / "models" /
                                                                f"{a.kind}-{a.preset}", preset=a.preset))
    batch, advantages = make_batch(forward.load_processor(model_path), cfg["sequences"], cfg["length"])

    ranks = FsdpRanks(model_path, cfg)
    try:
        loop = PlainLoop(model_path, batch, advantages, cfg["micro_batch_size"])
        torch.set_num_threads(1)
        flops = loop.count_flops()
        load_before = os.getloadavg()[0]
        single = {1: [], 2: []}
        fsdp_times = []
        ranks.step()  # warm-ups
        for threads in single:
            torch.set_num_threads(threads)
            loop.step()
        # Round robin, so that a change in the machine's load hits every contender alike.
        for _ in range(cfg["steps"]):
            for threads in single:
                torch.set_num_threads(threads)
                t = time.perf_counter()
                tokens = loop.step()
                single[threads].append(time.perf_counter() - t)
            fsdp_times.append(ranks.step())
        torch.set_num_threads(1)
        one_thread = matmul_peak()
        torch.set_num_threads(2)
        machine = machine_info(peak=False)
        machine["matmul_peak"] = {"device": "cpu", **peaks()}
        # The ceiling is the better of one and two threads, as the loop ran with both.
        peak = max(one_thread, machine["matmul_peak"]["fp32_gflops"] * 1e9)
        load_after = os.getloadavg()[0]
    finally:
        ranks.close()

    threads, single_s = min(((t, min(v)) for t, v in single.items()), key=lambda x: x[1])
    fsdp_s = min(fsdp_times)
    fsdp_tps, single_tps = tokens / fsdp_s, tokens / single_s
    achieved = flops / fsdp_s
    params = sum(p.numel() for p in loop.model.parameters())
    trained = {"trainable_params": sum(p.numel() for p in loop.params), "lora_rank": LORA_RANK, "dtype": "float32"}
    result = {
        "benchmark": "update", "quick": a.quick,
        "model": {**model.record(), **trained} if model else {"kind": a.kind, "preset": a.preset, "params": params,
                                                              **trained},
        "batch": {"sequences": cfg["sequences"], "tokens_per_sequence": cfg["length"], "tokens": tokens,
                  "micro_batch_size": cfg["micro_batch_size"], "timed_steps": cfg["steps"]},
        "fsdp_ranks": 2, "fsdp_step_s": round(fsdp_s, 4),
        "single_threads": threads, "single_step_s": round(single_s, 4),
        "single_step_s_by_threads": {t: round(min(v), 4) for t, v in single.items()},
        "fsdp_tokens_per_s": round(fsdp_tps, 1),
        "single_tokens_per_s": round(single_tps, 1),
        "ratio": round(fsdp_tps / single_tps, 3),
        "flops_per_step": flops,
        "achieved_flops_per_s": round(achieved),
        "matmul_peak_flops_per_s": round(peak),
        "mfu_vs_matmul_peak": round(achieved / peak, 3),
        # Other processes on the machine during the run (1-minute load average; 2 cores here).
        "load_average": [round(load_before, 2), round(load_after, 2)],
    }
    result["headline"] = [
        {"figure": f"update tokens/s, FSDP2 on 2 ranks "
                   f"({model.label if model else f'bench Qwen3-VL, {params / 1e6:.1f}M params'}, LoRA r{LORA_RANK})",
         "value": result["fsdp_tokens_per_s"], "unit": "tokens/s", "baseline": result["single_tokens_per_s"],
         "baseline_name": "plain torch + peft loop", "ratio": result["ratio"]},
        {"figure": "update MFU (FSDP2 step vs fp32 matmul peak)", "value": result["mfu_vs_matmul_peak"],
         "baseline_name": f"peak {peak / 1e9:.0f} GFLOP/s"},
    ]
    if not model:  # the packing, maze and memory comparisons are the bench model's
        result.update(packing_and_precision(a.quick, model_path, Path(a.work)))
        result["headline"] += [
            {"figure": "update tokens/s, packed rows against padded micro-batches (sequences of 32-2048 tokens)",
             "value": result["skewed"]["tokens_per_s"]["packed_beside_padded"], "unit": "tokens/s",
             "baseline": result["skewed"]["tokens_per_s"]["padded"], "baseline_name": "padded, 8 a micro-batch",
             "ratio": result["packed_vs_padded_skewed"]},
            {"figure": f"maze step's update ({result['maze']['segments']} turns), seconds, against the trainer before "
                       "issue 21, both with old logprobs from the trainer", "value": result["maze"]["step_s"]["padded"],
             "unit": "s",
             "baseline": result["maze"]["step_s"]["baseline_beside_padded"], "baseline_name": f"commit {BASELINE}",
             "ratio": result["maze_train_time_ratio"]},
            {"figure": "logprob computation's peak memory at a 151,936-entry vocabulary, chunked against full logits",
             "value": result["logprob_memory"]["chunked_peak_mb"], "unit": "MB",
             "baseline": result["logprob_memory"]["full_peak_mb"], "baseline_name": "full logits",
             "ratio": result["logprob_peak_memory_ratio"]},
        ]
    out = Path(a.out or RESULTS / f"{result_stem('update', model)}.json")
    write_result(out.stem, result, machine, out.parent)
    print(json.dumps(result))
    return result


def packing_and_precision(quick: bool, model_path: str, work: Path) -> dict:
    """Side by side in child processes taking turns (benchmarks/_update_side.py), best step each:
    - skewed: 16 sequences of 32 to 2048 tokens on the bench model, padded micro-batches of 8 against packed
      rows of 4096 tokens, and packed in bfloat16 and with activation checkpointing;
    - maze: a maze step's batch (benchmarks/_maze_batch.py; 16 episodes with --quick, 128 as `make maze`) with
      the maze recipe's train settings and BASELINE's algorithm (BASELINE_ALGORITHM) on every side, on the
      trainer before issue 21 (BASELINE), today's padded one (the recipe's) and packed rows of 16384 tokens;
    then the logprob computation's peak memory at Qwen3-VL's vocabulary (benchmarks/logprob_memory.py) and, in
    this process, what bfloat16 and activation checkpointing change in the numbers."""
    from benchmarks import logprob_memory
    from examples.maze import maze_config

    steps = 1 if quick else 2
    packed = {"tokens_per_micro_batch": 4096}
    # In pairs: with all four processes up at once the padded one's steps took 2.8x as long as beside one
    # other (20.6 s against 7.2-7.5 s, measured here), so each ratio comes from its own pair.
    pairs = {"padded": {"micro_batch_size": 8}, "packed_bf16": {**packed, "dtype": "bfloat16"},
             "packed_checkpointing": {**packed, "activation_checkpointing": True}}
    skewed, pair_ratio = {}, {}
    for name, train in pairs.items():
        best, ready = race({name: contender(f"skewed-{name}", model_path, "skewed", train, 16, work),
                            "packed": contender("skewed-packed", model_path, "skewed", packed, 16, work)}, steps)
        skewed[name], skewed[f"packed_beside_{name}"] = best[name], best["packed"]
        pair_ratio[name] = best[name] / best["packed"]
    maze_model, episodes = str(maze_config.WARMSTART), 16 if quick else 128
    maze_train = maze_recipe()
    maze_s, maze_ratio, trainers = {}, {}, {}
    for name, train in {"padded": maze_train, "packed": {**maze_train, "tokens_per_micro_batch": 16384}}.items():
        best, maze_ready = race({"baseline": contender("maze-baseline", maze_model, "maze", maze_train, episodes,
                                                       work, baseline=True),
                                 name: contender(f"maze-{name}", maze_model, "maze", train, episodes, work,
                                                 algorithm=BASELINE_ALGORITHM)}, steps)
        maze_s[name], maze_s[f"baseline_beside_{name}"] = best[name], best["baseline"]
        maze_ratio[name] = best[name] / best["baseline"]
        trainers.update({k: v["trainer"] for k, v in maze_ready.items()})
    skew_tokens = ready["packed"]["tokens"]
    memory = logprob_memory.measure(tokens=2048 if quick else 4096, generated=1024 if quick else 2048)
    return {
        "skewed": {"tokens": skew_tokens, "step_s": _rounded(skewed),
                   "tokens_per_s": {k: round(skew_tokens / v, 1) for k, v in skewed.items()}},
        "packed_vs_padded_skewed": round(pair_ratio["padded"], 3),
        "bf16_vs_fp32_packed_skewed": round(1 / pair_ratio["packed_bf16"], 3),
        "checkpointing_vs_not_packed_skewed": round(1 / pair_ratio["packed_checkpointing"], 3),
        "maze": {"episodes": episodes, "segments": maze_ready["baseline"]["segments"], "step_s": _rounded(maze_s),
                 "baseline": BASELINE, "trainers": trainers,
                 "recipe": {"train": maze_train, "algorithm": BASELINE_ALGORITHM}},
        "maze_train_time_ratio": round(maze_ratio["padded"], 3),
        "maze_packed_vs_baseline": round(maze_ratio["packed"], 3),
        "logprob_memory": memory, "logprob_peak_memory_ratio": memory["ratio"],
        "precision": precision_gaps(model_path),
    }


def precision_gaps(model_path: str) -> dict:
    """Trainer logprobs in bfloat16 against float32 on the same sequences (max and mean absolute gap over the
    sampled tokens), and the adapter after one step with and without activation checkpointing (max gap)."""
    from grpo.learner import forward
    from grpo.learner.config import TrainConfig
    from grpo.learner.lora import LoraConfig
    from grpo.learner.worker import TrainWorker

    processor = forward.load_processor(model_path)
    trajs, advantages = skewed_batch(processor, 6, seed=1)
    workers = {name: TrainWorker(model_path, lora=LoraConfig(rank=LORA_RANK, alpha=2 * LORA_RANK), cpu_threads=2,
                                 train=TrainConfig(lr=1e-3, tokens_per_micro_batch=4096, **kw))
               for name, kw in {"fp32": {}, "bf16": {"dtype": "bfloat16"},
                                "checkpointing": {"activation_checkpointing": True}}.items()}
    seqs = [forward.expand(processor, s.token_ids, s.images, [torch.tensor(s.loss_mask)]) for t in trajs
            for s in t.segments]
    lps = {}
    for name in ("fp32", "bf16"):
        batch = forward.collate(processor, seqs, forward.tokenizer_of(processor).pad_token_id)
        with torch.no_grad():
            lps[name] = forward.token_logprobs(workers[name].model, batch, batch.per_token[0])
    gap = (lps["bf16"] - lps["fp32"]).abs()[batch.per_token[0].bool()]
    for name in ("fp32", "checkpointing"):
        workers[name].train_step(trajs, advantages)
    a, b = workers["fp32"].gather_adapter(), workers["checkpointing"].gather_adapter()
    return {"bf16_logprob_gap_max": float(gap.max()), "bf16_logprob_gap_mean": float(gap.mean()),
            "checkpointing_adapter_gap_max": max(float((a[k] - b[k]).abs().max()) for k in a)}


def _rounded(times: dict) -> dict:
    return {k: round(v, 3) for k, v in times.items()}


if __name__ == "__main__":
    main()

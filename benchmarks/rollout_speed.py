"""Rollout throughput: the multi-turn worker against plain `LLM.generate` replaying its exact engine calls.

    python -m benchmarks.rollout_speed [--quick] [--model smollm2-135m-instruct|PATH]

The worker runs maze episodes on the tiny Qwen3-VL (lockstep: all live episodes in one engine batch per turn);
on a text model (--model), the reasoning example's step instead: its arithmetic prompts through the model's
chat template, one reply each, at examples/reasoning/cpu.yaml's temperature, reply limit, tasks a step and
group size. Every batch it submits is recorded, then replayed through the same vLLM engine with nothing else
around it: same prompt ids, same images, same adapter, and as many tokens per request as the worker got
(ignore_eos, so the budgets match).
Both sides alternate, best-of-N each, in one process: `ratio` = worker / raw is the bookkeeping overhead.
The last line printed is one JSON object; it is also written, with the machine, to
benchmarks/results/rollout.json (rollout-quick.json with --quick; rollout-MODEL.json with --model).
"""
from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks._machine import ROOT, bench_model, machine_info, result_stem, write_result

REASONING = ROOT / "examples" / "reasoning" / "cpu.yaml"


@dataclass
class Workload:
    name: str       # the episodes', in the figure
    worker: str     # the worker's kind, in the figure
    tasks: list     # rollout.worker.Task, each run `group` times
    group: int
    config: object  # rollout.worker.RolloutConfig


def maze(quick: bool) -> Workload:
    from rollout.worker import RolloutConfig, Task

    tasks_n, group, max_turns = (8, 4, 8) if quick else (8, 8, 10)
    options = {"size": 9, "max_turns": max_turns}
    return Workload("maze", "multi-turn worker", [Task("maze", 2_000_000 + i, options) for i in range(tasks_n)],
                    group, RolloutConfig(temperature=1.0, max_tokens_per_turn=12, history="none"))


def reasoning(quick: bool) -> Workload:
    """The reasoning example's rollout step, read from its config (half its group with --quick)."""
    import grpo
    from rollout.worker import Task

    config = grpo.RunConfig.from_yaml(REASONING)
    options = dict(config.env.options, data=str(ROOT / config.env.options["data"]))
    group = config.algorithm.group_size // 2 if quick else config.algorithm.group_size
    # Seeds past the dataset's rows cycle through it, as the trainer's draw does.
    tasks = [Task(config.env.name, 2_000_000 + i, options) for i in range(config.tasks_per_step)]
    return Workload("reasoning-example", "single-turn worker", tasks, group, config.rollout)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a small batch (about a minute)")
    ap.add_argument("--model", help="a name rollout.pretrained knows (smollm2-135m-instruct), a Hub id or a model "
                                    "folder; a text model runs the reasoning example's prompts (default: the tiny "
                                    "Qwen3-VL on the maze)")
    ap.add_argument("--run-dir", default=str(ROOT / "runs" / "bench-rollout"))
    ap.add_argument("--repeats", type=int, default=None, help="alternating worker/raw rounds (best of each)")
    a = ap.parse_args(argv)

    from rollout import runtime

    run_dir = Path(a.run_dir).resolve()
    runtime.configure(run_dir)
    import torch

    # Before vLLM starts: in-process, it binds this process's OpenMP threads for itself.
    machine = machine_info()

    from grpo.learner import forward, lora
    from grpo.tools import tiny_models
    from rollout.engine import EngineConfig, vllm_prompts
    from rollout.worker import RolloutWorker
    from sync import AdapterStore

    repeats = a.repeats or 2
    model = bench_model(a.model) if a.model else None
    model_path = model.path if model else str(tiny_models.build("vl", run_dir / "models" / "tiny-vl", seed=0))
    vl = "vision_config" in json.loads((Path(model_path) / "config.json").read_text())
    work = maze(a.quick) if vl else reasoning(a.quick)
    tasks, group, cfg = work.tasks, work.group, work.config
    store = AdapterStore(run_dir / "store", keep_last=1)
    peft_model = lora.apply_lora(forward.load_model(model_path), lora.LoraConfig(rank=8, alpha=16.0))
    # A real model's replies stay its own (their lengths, their end) under a small adapter; a random-weight model
    # has none to keep.
    lora.randomize_adapter(peft_model, seed=5, scale=0.02 if model else 0.5)
    version = store.publish(lora.adapter_tensors(peft_model), lora.adapter_config(peft_model))

    worker = RolloutWorker(EngineConfig(model=model_path, max_lora_rank=8, max_model_len=2048),
                           store_root=str(store.root), worker_id="bench")
    worker.sync_adapter(version)

    # The worker's engine batches, as it made them: a batch is what it submitted while nothing was in flight
    # (lockstep, the default schedule: one batch a turn), each request with the tokens it got.
    calls, pending = [], {}
    submit, step = worker.engine.submit, worker.engine.step

    def recording_submit(request, sampling, use_adapter=True):
        if not worker.engine.in_flight:
            calls.append(([], sampling, []))
        key = submit(request, sampling, use_adapter)
        pending[key] = (calls[-1], len(calls[-1][0]))
        calls[-1][0].append(request)
        calls[-1][2].append(None)
        return key

    def recording_step():
        done = step()
        for key, gen in done.items():
            (_, _, lengths), i = pending.pop(key)
            lengths[i] = len(gen.token_ids)
        return done

    worker.engine.submit, worker.engine.step = recording_submit, recording_step
    worker.rollout(tasks[:2], 2, cfg)  # warm-up: vLLM's first calls are several times slower

    from rollout.hotload import HotLoader

    # A merged engine (the CPU default) serves the adapter from its weights: no LoRA request to replay.
    lora_request = None if worker.engine.cfg.merged else HotLoader.request(worker.engine.adapters.current)
    llm = worker.engine.llm

    def replay(recorded, **extra) -> tuple[float, int]:
        # The worker just ran these prompts: without a reset the replay would find them in the prefix cache.
        llm.reset_prefix_cache()
        t0, tokens = time.perf_counter(), 0
        for requests, sampling, lengths in recorded:
            prompts = vllm_prompts(requests)
            # The worker's own sampling parameters; only the budget is pinned to what each request produced.
            params = [worker.engine.sampling_params(sampling, max_tokens=n, min_tokens=n, ignore_eos=True, **extra)
                      for n in lengths]
            outs = llm.generate(prompts, params, lora_request=lora_request, use_tqdm=False)
            tokens += sum(len(o.outputs[0].token_ids) for o in outs)
        return time.perf_counter() - t0, tokens

    worker_runs, raw_runs, unbanned_runs, trajs, stats = [], [], [], None, None
    for _ in range(repeats):
        calls.clear()
        llm.reset_prefix_cache()
        trajs, stats = worker.rollout(tasks, group, cfg)
        worker_runs.append(stats.generated_tokens / stats.wall_s)
        recorded = list(calls)
        raw_s, raw_tokens = replay(recorded)
        assert raw_tokens == stats.generated_tokens, (raw_tokens, stats.generated_tokens)
        raw_runs.append(raw_tokens / raw_s)
        # What banning the image markers costs inside vLLM (a logits processor on every step); a text model has
        # none to ban.
        if worker.engine.banned_ids:
            free_s, free_tokens = replay(recorded, logit_bias=None)
            unbanned_runs.append(free_tokens / free_s)

    # Parity on what the worker produced: the trainer's forward against vLLM's sampled logprobs.
    processor = worker.processor
    peft_model.eval()
    diffs = []
    segments = [s for t in trajs for s in t.segments]
    for i in range(0, len(segments), 16):
        seqs = [forward.expand(processor, s.token_ids, s.images,
                               [torch.tensor(s.loss_mask), torch.tensor(s.sampler_logprobs)])
                for s in segments[i:i + 16]]
        batch = forward.collate(processor, seqs, forward.tokenizer_of(processor).pad_token_id)
        with torch.no_grad():
            # At the temperature vLLM sampled at: its logprobs are of that distribution.
            lp = forward.token_logprobs(peft_model, batch, mask=batch.per_token[0], temperature=cfg.temperature)
        m = batch.per_token[0].bool()
        diffs.append((lp[m] - batch.per_token[1][m]).abs().max().item())

    best_worker, best_raw = max(worker_runs), max(raw_runs)
    result = {
        "benchmark": "rollout", "quick": a.quick, "model": model.record() if model else "tiny-vl",
        "workload": work.name, "episodes": stats.episodes, "turns": stats.turns, "engine_calls": stats.engine_calls,
        "generated_tokens": stats.generated_tokens, "prompt_tokens": stats.prompt_tokens,
        "worker_tokens_per_s": round(best_worker, 1), "raw_tokens_per_s": round(best_raw, 1),
        "ratio": round(best_worker / best_raw, 3),
        "worker_runs": [round(x, 1) for x in worker_runs], "raw_runs": [round(x, 1) for x in raw_runs],
        "raw_without_token_ban_tokens_per_s": round(max(unbanned_runs), 1) if unbanned_runs else None,
        "logprob_max_abs_diff": max(diffs),
        "device": runtime.device(),
        # Other processes on the machine at the end of the run (1-minute load average).
        "load_average": round(os.getloadavg()[0], 2),
    }
    result["headline"] = [
        {"figure": f"rollout tokens/s, {work.worker} ({stats.episodes} {work.name} episodes, "
                   f"{model.label if model else 'tiny Qwen3-VL'}, LoRA r8)",
         "value": result["worker_tokens_per_s"], "unit": "tokens/s", "baseline": result["raw_tokens_per_s"],
         "baseline_name": "LLM.generate replaying its calls", "ratio": result["ratio"]},
        {"figure": "trainer-vs-vLLM logprob max abs diff (rollout)", "value": result["logprob_max_abs_diff"]},
    ]
    write_result(result_stem("rollout", model), result, machine)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()

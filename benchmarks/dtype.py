"""bfloat16 against float32 on this CPU: does bf16 pay, and what does it cost in logprob parity?

    python -m benchmarks.dtype [--quick]

On the bench Qwen3-VL (16M params), in one run:
- matmul peaks, fp32 and bf16 (benchmarks/_machine.py): whether the CPU has a bf16 path (AMX-BF16) at all;
- update: the project's TrainWorker (rank-32 LoRA) loaded in float32 and in bfloat16, steps taking turns,
  best step each: tokens/s and the ratio;
- rollout: the project's Engine (vLLM, adapter as the engine serves it by default) in float32 and in
  bfloat16 on the same requests, both engines in this process and their calls taking turns: generated
  tokens/s, best of the rounds each;
- parity: the tokens the bf16 engine sampled, scored by the trainer's forward (transformers + peft, same
  adapter) in float32 and in bfloat16, against the engine's own logprobs; the fp32 engine against the
  fp32 trainer as the reference gap.
The last line printed is one JSON object, also written to benchmarks/results/dtype.json with the machine.
"""
from __future__ import annotations

import argparse
import gc
import json
import time
from pathlib import Path

from benchmarks._machine import ROOT, machine_info, write_result

MODES = {"full": dict(requests=32, tokens=64, sequences=8, length=512, steps=3, rollout_rounds=3),
         "quick": dict(requests=8, tokens=16, sequences=4, length=128, steps=1, rollout_rounds=2)}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--run-dir", default=str(ROOT / "runs" / "bench-dtype"))
    a = ap.parse_args(argv)
    from rollout import runtime

    run_dir = Path(a.run_dir).resolve()
    runtime.configure(run_dir)
    import torch

    from benchmarks.update import make_batch
    from envs.base import Observation
    from grpo.learner import forward, lora
    from grpo.learner.config import TrainConfig
    from grpo.learner.worker import TrainWorker
    from grpo.tools import tiny_models
    from rollout.conversation import ChatFormat
    from rollout.engine import Engine, EngineConfig, Request, Sampling
    from sync import AdapterStore

    cfg = MODES["quick" if a.quick else "full"]
    machine = machine_info()  # before vLLM binds this process's threads
    model_path = str(tiny_models.build("vl", run_dir / "models" / "vl-bench", preset="bench"))
    settings = lora.LoraConfig(rank=32, alpha=64.0)

    # Update: both dtypes in this process, steps taking turns.
    workers = {d: TrainWorker(model_path, lora=settings, train=TrainConfig(micro_batch_size=cfg["sequences"]), dtype=d)
               for d in ("float32", "bfloat16")}
    batch, advantages = make_batch(workers["float32"].processor, cfg["sequences"], cfg["length"])
    steps = {d: [] for d in workers}
    for w in workers.values():
        w.train_step(batch, advantages)  # warm-up
    for _ in range(cfg["steps"]):
        for d, w in workers.items():
            t = time.perf_counter()
            w.train_step(batch, advantages)
            steps[d].append(time.perf_counter() - t)
    tokens = cfg["sequences"] * cfg["length"]
    update = {d: round(tokens / min(s), 1) for d, s in steps.items()}
    for w in workers.values():
        w.close()
    del workers

    # One adapter for the engines and the trainer's scoring.
    peft_model = lora.apply_lora(forward.load_model(model_path), settings)
    lora.randomize_adapter(peft_model, seed=3, scale=0.05)
    store = AdapterStore(run_dir / "store", keep_last=1)
    version = store.publish(lora.adapter_tensors(peft_model), lora.adapter_config(peft_model))
    processor = forward.load_processor(model_path)
    chat = ChatFormat(processor)
    prompts = [chat.prompt_ids(Observation(text=f"Maze {i}: describe the walls, then move."))
               for i in range(cfg["requests"])]
    sampling = Sampling(temperature=1.0, max_tokens=cfg["tokens"])

    # Both engines in this process, generate calls taking turns (best of the rounds each).
    engines = {d: Engine(EngineConfig(model=model_path, dtype=d, max_lora_rank=32, max_model_len=1024))
               for d in ("float32", "bfloat16")}
    requests = [Request(p) for p in prompts]
    rollout, samples = {d: 0.0 for d in engines}, {}
    try:
        for engine in engines.values():
            engine.load_adapter(version, store.latest().path)
            engine.generate(requests[:2], sampling)  # warm-up
        for _ in range(cfg["rollout_rounds"]):
            for d, engine in engines.items():
                engine.llm.reset_prefix_cache()
                t = time.perf_counter()
                samples[d] = engine.generate(requests, sampling)
                tokens_per_s = sum(len(g.token_ids) for g in samples[d]) / (time.perf_counter() - t)
                rollout[d] = max(rollout[d], round(tokens_per_s, 1))
    finally:
        engines = None
        gc.collect()

    def gap(gens, dtype) -> dict:
        model = peft_model.to(getattr(torch, dtype)).eval()
        pad = forward.tokenizer_of(processor).pad_token_id
        diffs = []
        for prompt, g in zip(prompts, gens):
            mask = torch.tensor([0] * len(prompt) + [1] * len(g.token_ids))
            seq = forward.expand(processor, prompt + g.token_ids, [], [mask])
            b = forward.collate(processor, [seq], pad)
            with torch.no_grad():
                lp = forward.token_logprobs(model, b, b.per_token[0])[0][mask.bool()]
            diffs.append((lp.float() - torch.tensor(g.logprobs)).abs())
        d = torch.cat(diffs)
        return {"max_abs": float(d.max()), "mean_abs": float(d.mean())}

    parity = {"fp32_engine_vs_fp32_trainer": gap(samples["float32"], "float32"),
              "bf16_engine_vs_fp32_trainer": gap(samples["bfloat16"], "float32"),
              "bf16_engine_vs_bf16_trainer": gap(samples["bfloat16"], "bfloat16")}
    peaks = machine["matmul_peak"]
    result = {
        "benchmark": "dtype", "quick": a.quick,
        "model": "bench Qwen3-VL, LoRA r32",
        "matmul_bf16_over_fp32": peaks["bf16_over_fp32"],
        "update_tokens_per_s": update, "update_bf16_over_fp32": round(update["bfloat16"] / update["float32"], 3),
        "rollout_tokens_per_s": rollout, "rollout_bf16_over_fp32": round(rollout["bfloat16"] / rollout["float32"], 3),
        "logprob_gap": parity,
        "workload": cfg,
    }
    result["headline"] = [
        {"figure": "update tokens/s in bf16 (fp32 baseline)", "value": update["bfloat16"], "unit": "tokens/s",
         "baseline": update["float32"], "baseline_name": "fp32", "ratio": result["update_bf16_over_fp32"]},
        {"figure": "rollout tokens/s in bf16 (fp32 baseline)", "value": rollout["bfloat16"], "unit": "tokens/s",
         "baseline": rollout["float32"], "baseline_name": "fp32", "ratio": result["rollout_bf16_over_fp32"]},
        {"figure": "logprob gap, bf16 engine vs fp32 trainer (max abs)",
         "value": parity["bf16_engine_vs_fp32_trainer"]["max_abs"],
         "baseline": parity["fp32_engine_vs_fp32_trainer"]["max_abs"], "baseline_name": "fp32 engine"},
    ]
    write_result("dtype", result, machine)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()

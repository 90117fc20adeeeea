"""One generate call of the step benchmarks' batch: raw vLLM with the engine's exact sampling settings against
Hugging Face `generate`, taking turns in one process. The floor under a step's rollout on this machine.

    python -m benchmarks.generate_vs_hf [--preset tiny|bench] [--repeats 5]

Both sides: the 8 digits prompts x 8 samples, up to 32 new tokens, temperature 1, float32, the same model
with the same rank-16 LoRA adapter (vLLM: merged into its weights as the engine serves it on the CPU, and as
a LoRA request, and merged without the engine's ban on image markers; HF: the peft model, as TRL's HF mode
runs it, and merged). The last line printed is one
JSON object of medians (the first call of each side is left out: warm-up), also written to
benchmarks/results/generate_vs_hf-PRESET.json.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from benchmarks._machine import ROOT, write_result
from rollout import runtime


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--work", default=str(ROOT / "runs" / "generate_vs_hf"))
    a = ap.parse_args(argv)
    work = Path(a.work).resolve()
    runtime.configure(work, runtime.shared_cache_dir(work))
    # vLLM in-process drops the process to one thread unless told otherwise; both sides get every core, as
    # the rollout worker's engine does (grpo.driver.rollout_pool) and TRL's process does.
    os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))
    import torch

    from benchmarks._single_turn import PROMPTS
    from grpo.learner import forward, lora
    from grpo.tools import tiny_models
    from rollout.conversation import ChatFormat
    from rollout.engine import Engine, EngineConfig, Request, Sampling, vllm_prompts
    from sync import AdapterStore

    model_dir = tiny_models.build("text", work / "models" / f"text-{a.preset}", seed=0, preset=a.preset)
    peft_model = lora.apply_lora(forward.load_model(model_dir), lora.LoraConfig(rank=16, alpha=32.0)).eval()
    lora.randomize_adapter(peft_model, seed=3, scale=0.05)
    store = AdapterStore(work / f"store-{a.preset}")
    version = store.publish(lora.adapter_tensors(peft_model), lora.adapter_config(peft_model))
    path = store.verify(version).path
    processor = forward.load_processor(model_dir)
    chat = ChatFormat(processor)
    from envs.base import Observation

    prompts = [chat.prompt_ids(Observation(text=p)) for p in PROMPTS for _ in range(8)]
    sampling = Sampling(1.0, 1.0, 32)
    engines = {}
    for merged in (True, False):
        engines[merged] = Engine(EngineConfig(model=str(model_dir), max_model_len=512, max_lora_rank=16,
                                              merge_adapter=merged))
        engines[merged].load_adapter(version, path)

    tok = forward.tokenizer_of(processor)
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in prompts])
    mask = (torch.arange(width)[None] >= torch.tensor([width - len(p) for p in prompts])[:, None]).long()
    merged_hf = lora.apply_lora(forward.load_model(model_dir), lora.LoraConfig(rank=16, alpha=32.0))
    merged_hf.load_state_dict(peft_model.state_dict())
    merged_hf = merged_hf.merge_and_unload().eval()

    def hf(model):
        def call():
            with torch.no_grad():
                out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_p=1.0,
                                     top_k=0, max_new_tokens=32, pad_token_id=tok.pad_token_id)
            new = out[:, width:]
            return int(((new != tok.pad_token_id)).sum())
        return call

    def vllm(engine):
        def call():
            return sum(len(g.token_ids) for g in engine.generate([Request(p) for p in prompts], sampling))
        return call

    def vllm_no_ban(engine):
        # The engine's settings less the image-marker ban (a logits processor on every decode step).
        params = engine.sampling_params(sampling, logit_bias=None)
        prompts_v = vllm_prompts([Request(p) for p in prompts])

        def call():
            engine.adapters.serve(True)
            outs = engine.llm.generate(prompts_v, params, use_tqdm=False)
            return sum(len(o.outputs[0].token_ids) for o in outs)
        return call

    sides = {"vllm_merged": vllm(engines[True]), "vllm_merged_no_ban": vllm_no_ban(engines[True]),
             "vllm_lora": vllm(engines[False]),
             "hf_peft": hf(peft_model), "hf_merged": hf(merged_hf)}
    times: dict = {k: [] for k in sides}
    tokens: dict = {k: [] for k in sides}
    for _ in range(a.repeats + 1):
        for name, call in sides.items():
            t = time.perf_counter()
            n = call()
            times[name].append(time.perf_counter() - t)
            tokens[name].append(n)
    result = {"benchmark": "generate_vs_hf", "quick": a.repeats < ap.get_default("repeats"), "preset": a.preset,
              "requests": len(prompts), "max_tokens": 32,
              "threads": torch.get_num_threads(), "load_average": round(os.getloadavg()[0], 2),
              "seconds_median": {k: round(statistics.median(v[1:]), 4) for k, v in times.items()},
              "tokens_median": {k: statistics.median(v[1:]) for k, v in tokens.items()},
              "seconds_all": {k: [round(x, 3) for x in v] for k, v in times.items()}}
    write_result(f"generate_vs_hf-{a.preset}", result)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()

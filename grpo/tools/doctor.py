"""Proves the stack on this machine: the first thing to run on a new one.

    grpo doctor [--json] [--model PATH] [--run-dir runs/doctor]     (grpo.cli; `make doctor`)

Starts vLLM with LoRA on a vision-language model (the tiny Qwen3-VL unless --model is given), generates
from an image prompt with a published adapter and compares vLLM's per-token logprobs with transformers +
peft's for the same adapter; then publishes a second version, hot-loads it under a new LoRA name and id and
checks that vLLM now serves the new adapter, also on a prompt longer than one KV-cache block that the old
version already put in the prefix cache. With --model DIR (any local model folder, text or vision) it also
runs the support matrix of grpo.tools.model_check on it (merged and LoRA serving, a GRPO step, the published
adapter, the chat template's multi-turn ids) and says whether that model is supported. Exits 1 with what is
wrong and how to fix it when a check fails.
"""
from __future__ import annotations

import argparse
import importlib
import json
import platform
import sys
import time
from pathlib import Path

from grpo.tools.model_check import TOLERANCE  # one bar for the doctor and the matrix

PACKAGES = ("torch", "vllm", "transformers", "peft", "ray")


def versions() -> dict:
    found = {}
    for name in PACKAGES:
        try:
            found[name] = importlib.import_module(name).__version__
        except Exception as e:  # any import failure is a finding to report, not a crash
            found[name] = f"IMPORT FAILED: {type(e).__name__}: {e}"
    return found


def _hf_logprobs(model_path, adapter_path, processor, prompt_ids, images, gen_ids) -> list[float]:
    """transformers + peft's logprobs of `gen_ids` after the prompt, for the adapter at `adapter_path`."""
    import torch
    from peft import PeftModel

    from grpo.learner import forward

    base = forward.load_model(model_path)
    model = PeftModel.from_pretrained(base, adapter_path).eval()
    ids = list(prompt_ids) + list(gen_ids)
    mask = torch.tensor([0] * len(prompt_ids) + [1] * len(gen_ids))
    seq = forward.expand(processor, ids, images, [mask])
    tok = forward.tokenizer_of(processor)
    batch = forward.collate(processor, [seq], tok.pad_token_id)
    with torch.no_grad():
        lp = forward.token_logprobs(model, batch, mask=batch.per_token[0])
    return lp[0][batch.per_token[0][0].bool()].tolist()


def _max_diff(a: list[float], b: list[float]) -> float:
    if len(a) != len(b) or not a:
        return float("inf")
    return max(abs(x - y) for x, y in zip(a, b))


def _image_prompt(processor, text: str, image_count: int) -> list[int]:
    from grpo.learner import forward

    content = [{"type": "image"}] * image_count + [{"type": "text", "text": text}]
    rendered = processor.apply_chat_template([{"role": "user", "content": content}],
                                             add_generation_prompt=True, tokenize=False)
    return forward.tokenizer_of(processor)(rendered, add_special_tokens=False)["input_ids"]


def run(model_path: str | None, run_dir: Path, log) -> dict:
    from rollout import runtime

    runtime.configure(run_dir)
    report: dict = {"python": platform.python_version(), "versions": versions()}
    failed = [k for k, v in report["versions"].items() if str(v).startswith("IMPORT FAILED")]
    if failed:
        report["problems"] = [f"{k} does not import ({report['versions'][k]}): run `make install` (it "
                              "rebuilds .venv for this machine) and use .venv/bin/python" for k in failed]
        return report
    import torch

    report["device"] = runtime.device()
    report["torch_threads"] = torch.get_num_threads()
    log(f"versions: {report['versions']}  device: {report['device']}")

    from envs import make
    from grpo.learner import forward, lora
    from grpo.tools import tiny_models
    from rollout.engine import Engine, EngineConfig, Sampling
    from sync import AdapterStore

    if model_path is None:
        t = time.perf_counter()
        model_path = str(tiny_models.build("vl", run_dir / "models" / "tiny-vl", seed=0))
        log(f"tiny Qwen3-VL ready in {time.perf_counter() - t:.1f} s: {model_path}")
    forward.check_model_dir(model_path)
    report["model"] = str(model_path)
    processor = forward.load_processor(model_path)
    if forward.image_token_id(processor) is None:
        # A text model: there is no image path to prove; the matrix (main, --model) checks it.
        report["problems"] = []
        return report

    settings = lora.LoraConfig(rank=8, alpha=16.0)
    store = AdapterStore(run_dir / "store", keep_last=2)

    def publish(seed: int) -> int:
        peft_model = lora.apply_lora(forward.load_model(model_path), settings)
        lora.randomize_adapter(peft_model, seed)
        return store.publish(lora.adapter_tensors(peft_model), lora.adapter_config(peft_model))

    v1 = publish(seed=1)
    t = time.perf_counter()
    engine = Engine(EngineConfig(model=str(model_path), max_lora_rank=settings.rank, max_model_len=2048))
    report["engine_start_s"] = round(time.perf_counter() - t, 2)
    report["kv_block_size"] = engine.block_size
    engine.load_adapter(v1, store.verify(v1).path)
    log(f"vLLM started in {report['engine_start_s']} s (KV block {engine.block_size} tokens), adapter v{v1} loaded")

    image = make("maze").reset(seed=0).images[0]
    prompt = _image_prompt(processor, "Where is the blue circle?", 1)
    greedy = Sampling.greedy(max_tokens=16)
    gen = engine.generate([engine_request(prompt, [image])], greedy)[0]
    hf = _hf_logprobs(model_path, store.verify(v1).path, processor, prompt, [image], gen.token_ids)
    report["generated_tokens"] = len(gen.token_ids)
    report["logprob_max_abs_diff"] = _max_diff(gen.logprobs, hf)
    log(f"image prompt, {len(gen.token_ids)} greedy tokens: max |vLLM - transformers+peft| logprob = "
        f"{report['logprob_max_abs_diff']:.2e}")

    # Longer than one KV block, so the prefix cache holds full blocks computed with v1 when v2 arrives.
    long_text = "Describe every wall of this maze, row by row, then find the path. " * (
        engine.block_size // 8 + 4)
    long_prompt = _image_prompt(processor, long_text, 1)
    old = engine.generate([engine_request(long_prompt, [image])], greedy)[0]
    v2 = publish(seed=2)
    loaded = engine.load_adapter(v2, store.verify(v2).path)
    new = engine.generate([engine_request(long_prompt, [image])], greedy)[0]
    hf_new = _hf_logprobs(model_path, store.verify(v2).path, processor, long_prompt, [image], new.token_ids)
    hf_old = _hf_logprobs(model_path, store.verify(v1).path, processor, long_prompt, [image], new.token_ids)
    diff_new = _max_diff(new.logprobs, hf_new)
    # The check has teeth only if the two adapters are told apart far beyond the parity tolerance.
    diff_old = _max_diff(new.logprobs, hf_old)
    report["hotload"] = {
        "prompt_tokens": old.expanded_prompt_len, "lora_name": loaded.name, "lora_id": loaded.lora_id,
        "loaded_lora_ids": sorted(engine.adapters.loaded_ids()),
        "logprob_max_abs_diff": diff_new, "diff_to_previous_adapter": diff_old,
    }
    report["hotload_ok"] = bool(diff_new <= TOLERANCE and diff_old > 10 * TOLERANCE
                                and report["hotload"]["loaded_lora_ids"] == [loaded.lora_id])
    report["logprob_max_abs_diff"] = max(report["logprob_max_abs_diff"], diff_new)
    log(f"hot-load v{v1} -> v{v2} as {loaded.name} (id {loaded.lora_id}), prompt of "
        f"{report['hotload']['prompt_tokens']} tokens: max diff to the new adapter {diff_new:.2e}, to the "
        f"previous one {diff_old:.2e}")

    problems = []
    if report["logprob_max_abs_diff"] > TOLERANCE:
        problems.append(
            f"vLLM's logprobs differ from transformers+peft's by {report['logprob_max_abs_diff']:.2e} "
            f"(> {TOLERANCE}): check that vllm and transformers are the pinned versions (`make install`), "
            "and that the model runs in float32 on the CPU")
    if not report["hotload_ok"]:
        problems.append(
            "hot-loading a new adapter version did not switch vLLM to it "
            f"({report['hotload']}): a stale adapter or stale prefix-cache blocks are served; every version "
            "needs a new LoRA name and id (rollout.hotload.HotLoader)")
    report["problems"] = problems
    return report


def engine_request(prompt_ids, images):
    from rollout.engine import Request

    return Request(prompt_ids=list(prompt_ids), images=list(images))


def _matrix(model_path: str, run_dir: Path, log) -> dict:
    """The support matrix on a user's model folder, check by check."""
    from grpo.tools import model_check

    result = model_check.check_model(model_path, run_dir / "matrix", log)
    f = result["figures"]
    for name, ok in result["checks"].items():
        log(f"{'PASS' if ok else 'FAIL'} {name}" + ("" if ok else f": {model_check.FIXES[name]}"))
    if "gap_merged" in f:
        log(f"max |vLLM - transformers+peft| logprob: merged {f['gap_merged']:.2e}, LoRA {f['gap_lora']:.2e}; "
            f"re-rendering the conversation gives the same ids: {f['rerender_same']}")
        log(f"float32 floor: the trainer is {f['float32_floor']:.2e} and vLLM {f['vllm_vs_float64']:.2e} from "
            f"float64 arithmetic; the bar is {f['bar']:.2e} (max of {model_check.TOLERANCE} and "
            f"{model_check.FLOOR_FACTOR} x the trainer's floor)")
    log(f"{model_path} ({f.get('architecture', '?')}) is " + (
        "supported: every check passes" if result["ok"] else "NOT supported: see the failed checks"))
    return result


def main(argv: list[str] | None = None, prog: str = "grpo doctor") -> int:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="end with one JSON object on the last line")
    ap.add_argument("--model", help="a local model folder to check for support (default: build the tiny Qwen3-VL "
                    "and prove the stack on it)")
    ap.add_argument("--run-dir", default="runs/doctor", help="where models, adapters and caches go")
    a = ap.parse_args(argv)
    run_dir = Path(a.run_dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)

    def log(msg: str) -> None:
        print(f"[doctor] {msg}", file=sys.stderr if a.json else sys.stdout, flush=True)

    t = time.perf_counter()
    try:
        report = run(a.model, run_dir, log)
        if a.model and not report.get("problems"):
            report["matrix"] = _matrix(a.model, run_dir, log)
            report["problems"] = report["matrix"]["problems"]
    except (FileNotFoundError, ValueError) as e:
        report = {"problems": [str(e)]}
    report["wall_s"] = round(time.perf_counter() - t, 1)
    report["ok"] = not report.get("problems") and bool(report.get("hotload_ok") or report.get("matrix", {}).get("ok"))
    for p in report.get("problems", []):
        log(f"PROBLEM: {p}")
    log("all checks passed" if report["ok"] else "FAILED")
    if a.json:
        print(json.dumps(report))
    return 0 if report["ok"] else 1

"""The GPU measurement (benchmarks/gpu.sh runs it): Qwen3-VL-8B's architecture, randomly initialised, on one GPU.

    python -m benchmarks.gpu_bench [--dry-run] [--work runs/gpu-bench] [--out benchmarks/results/gpu.json]

No network and no weights to download: the model is built from the published architecture below, with
random weights, saved once with save_pretrained in bfloat16 (about 17 GB), then, in one run:
1. rollout: the project's RolloutWorker (CUDA vLLM through rollout.Engine, rank-32 LoRA adapter) plays
   maze episodes, all live episodes in one engine call per turn; generated tokens/s;
2. sleep / wake: vLLM's level-1 sleep (what the colocated trainer does every step) and the wake-up;
3. update: a TrainWorker (bf16, LoRA rank 32 on q/k/v/o/gate/up/down) trains on those trajectories;
   tokens/s, FLOPs of a step counted by torch's FlopCounterMode, MFU against the bf16 matmul peak
   measured in the same run;
4. sync: publish of the rank-32 adapter (sync.AdapterStore) and its hot-load into the engine, against the
   bare safetensors.save_file + add_lora of the same tensors.
Each phase rewrites the JSON as it finishes, so a run cut short keeps what it measured.

--dry-run builds the configs and the model on the meta device (no CUDA, no weights), checks them against
the published values and the LoRA shapes, and prints the plan as one JSON object.

Where the values come from: Qwen/Qwen3-VL-8B-Instruct's published config.json (its "text_config" and
"vision_config"), copied here because it cannot be downloaded on the machine this runs on. Token ids
(bos/eos/pad, image, video, vision start/end) are the published ones too; the tokenizer is a stand-in
(one word-level token per id, the published special tokens at their ids), since Qwen's tokenizer cannot
be downloaded either: it changes prompt lengths in tokens, not the model's compute per token.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from benchmarks._machine import ROOT, machine_info, matmul_peak, write_result

# Qwen/Qwen3-VL-8B-Instruct config.json, "text_config" (published values).
TEXT_CONFIG = dict(
    hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
    num_key_value_heads=8, head_dim=128, vocab_size=151936, max_position_embeddings=262144,
    rms_norm_eps=1e-6, hidden_act="silu", attention_bias=False, tie_word_embeddings=False,
    rope_parameters={"rope_type": "default", "rope_theta": 5_000_000.0, "mrope_section": [24, 20, 20],
                     "mrope_interleaved": True},
    bos_token_id=151643, eos_token_id=151645, pad_token_id=151643,
)
# Same file, "vision_config" (published values).
VISION_CONFIG = dict(
    depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16, patch_size=16, spatial_merge_size=2,
    temporal_patch_size=2, out_hidden_size=4096, num_position_embeddings=2304, in_channels=3,
    hidden_act="gelu_pytorch_tanh", deepstack_visual_indexes=[8, 16, 24],
)
# Same file, top level (published values).
TOKEN_IDS = dict(image_token_id=151655, video_token_id=151656, vision_start_token_id=151652,
                 vision_end_token_id=151653)
SPECIAL_TOKENS = {151643: "<|endoftext|>", 151644: "<|im_start|>", 151645: "<|im_end|>",
                  151652: "<|vision_start|>", 151653: "<|vision_end|>", 151655: "<|image_pad|>",
                  151656: "<|video_pad|>"}
LORA_RANK = 32
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# The workload: maze episodes as examples/maze/qwen3_vl_8b.yaml plays them (32 px blocks: 81 image tokens).
WORKLOAD = dict(tasks=16, group_size=8, max_turns=6, max_tokens_per_turn=32, maze_size=9, cell_px=32,
                train_steps=3, micro_batch_size=8, sync_versions=4, gpu_memory_utilization=0.45,
                max_model_len=4096)


def model_config():
    from transformers import Qwen3VLConfig

    config = Qwen3VLConfig(text_config=dict(TEXT_CONFIG), vision_config=dict(VISION_CONFIG),
                           tie_word_embeddings=False, **TOKEN_IDS)
    config.architectures = ["Qwen3VLForConditionalGeneration"]
    return config


def lora_shapes(config) -> dict[str, tuple[int, int]]:
    """(in, out) features of every LoRA target of one decoder layer, from the config alone."""
    t = config.text_config
    q, kv = t.num_attention_heads * t.head_dim, t.num_key_value_heads * t.head_dim
    h, i = t.hidden_size, t.intermediate_size
    return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}


VL_LAYERS = "base_model.model.model.language_model.layers"  # peft's prefix of Qwen3-VL's decoder layers
TEXT_LAYERS = "base_model.model.model.layers"  # and of a Qwen3 text model's


def adapter_modules(config, layers_prefix: str = VL_LAYERS) -> dict[str, tuple[int, int]]:
    """peft's name of every LoRA-wrapped module of the language model -> its (in, out) features."""
    modules = {}
    for layer in range(config.text_config.num_hidden_layers):
        for name, shape in lora_shapes(config).items():
            group = "self_attn" if name in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            modules[f"{layers_prefix}.{layer}.{group}.{name}"] = shape
    return modules


def adapter_tensors(config, rank: int = LORA_RANK, seed: int = 0, layers_prefix: str = VL_LAYERS) -> dict:
    """Random rank-`rank` LoRA tensors (fp32, as peft keeps them) under peft's saved key names."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for prefix, (fan_in, fan_out) in adapter_modules(config, layers_prefix).items():
        tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, fan_in, generator=gen) * 0.01
        tensors[f"{prefix}.lora_B.weight"] = torch.randn(fan_out, rank, generator=gen) * 0.01
    return tensors


def build_tokenizer(vocab_size: int):
    """One word-level token per id (t0, t1, ...) and the published special tokens at their ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from grpo.tools.tiny_models import CHAT_TEMPLATE

    vocab = {SPECIAL_TOKENS.get(i, f"t{i}"): i for i in range(vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(list(SPECIAL_TOKENS.values()))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", unk_token="t0",
        chat_template=CHAT_TEMPLATE,
        extra_special_tokens={"image_token": "<|image_pad|>", "video_token": "<|video_pad|>",
                              "vision_bos_token": "<|vision_start|>", "vision_eos_token": "<|vision_end|>"})


def build_processor(tokenizer):
    from transformers import Qwen3VLProcessor
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    from grpo.tools.tiny_models import CHAT_TEMPLATE

    # Qwen3-VL's published preprocessor values: 16 px patches, 2 x 2 merge, 2 frames, mean/std 0.5.
    common = dict(patch_size=16, temporal_patch_size=2, merge_size=2, image_mean=[0.5] * 3, image_std=[0.5] * 3,
                  size={"shortest_edge": 64 * 64, "longest_edge": 1024 * 1024})
    return Qwen3VLProcessor(image_processor=Qwen2VLImageProcessor(**common),
                            video_processor=Qwen3VLVideoProcessor(**common), tokenizer=tokenizer,
                            chat_template=CHAT_TEMPLATE)


def meta_model(config):
    import torch
    from transformers import Qwen3VLForConditionalGeneration

    with torch.device("meta"):
        return Qwen3VLForConditionalGeneration(config)


def plan(config, model=None) -> dict:
    """What the run will do and the sizes it implies, checked against the config (no CUDA needed)."""
    model = model if model is not None else meta_model(config)
    params = sum(p.numel() for p in model.parameters())
    text = sum(p.numel() for n, p in model.named_parameters() if ".language_model." in n or "lm_head" in n)
    # The modules peft will wrap (its names: "base_model.model." + the model's), as the adapter keys name them.
    found = {"base_model.model." + name: (m.in_features, m.out_features) for name, m in model.named_modules()
             if name.rsplit(".", 1)[-1] in LORA_TARGETS and ".language_model.layers." in name}
    expected = adapter_modules(config)
    if found != expected:
        wrong = sorted(set(found.items()) ^ set(expected.items()))[:4]
        raise AssertionError(f"the model's LoRA targets differ from the shape arithmetic, e.g. {wrong}")
    shapes = lora_shapes(config)
    layers = config.text_config.num_hidden_layers
    lora_params = layers * sum(LORA_RANK * (i + o) for i, o in shapes.values())
    w = WORKLOAD
    return {
        "model": "Qwen3-VL-8B architecture, random weights (Qwen/Qwen3-VL-8B-Instruct config.json values)",
        "params": params, "text_params": text, "vision_params": params - text,
        "bf16_weights_gib": round(params * 2 / 2**30, 2),
        "lora": {"rank": LORA_RANK, "targets": list(LORA_TARGETS), "layers": layers, "params": lora_params,
                 "fp32_mib": round(lora_params * 4 / 2**20, 1), "shapes_in_out": shapes},
        "lora_modules": len(found),
        "workload": w,
        "episodes": w["tasks"] * w["group_size"],
        "max_generated_tokens": w["tasks"] * w["group_size"] * w["max_turns"] * w["max_tokens_per_turn"],
        # Forward FLOPs per token of the language model's matmuls (2 x params); training runs about 2x that
        # again (the input gradients; frozen base weights need no weight gradient).
        "forward_gflop_per_token": round(2 * text / 1e9, 2),
        "phases": ["build+save bf16 model", "rollout (RolloutWorker, CUDA vLLM, LoRA r32)", "sleep/wake",
                   "update (TrainWorker bf16, FlopCounterMode, bf16 matmul peak)", "publish + hot-load vs bare"],
    }


def check_prompt(processor) -> dict:
    """The first maze prompt through the stand-in tokenizer and processor, as the rollout builds it."""
    from envs.maze import MazeEnv
    from grpo.learner import forward
    from rollout.conversation import ChatFormat

    obs = MazeEnv(size=WORKLOAD["maze_size"], cell_px=WORKLOAD["cell_px"], max_turns=WORKLOAD["max_turns"]).reset(0)
    chat = ChatFormat(processor)
    ids = chat.prompt_ids(obs)
    expanded = forward.expand(processor, ids, obs.images)
    image_tokens = int((expanded.input_ids == TOKEN_IDS["image_token_id"]).sum())
    blocks = WORKLOAD["maze_size"] ** 2
    if image_tokens != blocks:
        raise AssertionError(f"a {WORKLOAD['maze_size']} x {WORKLOAD['maze_size']} maze at {WORKLOAD['cell_px']} px "
                             f"should give one image token per block ({blocks}), got {image_tokens}")
    # An untrained model samples any id of the vocabulary: each must decode.
    chat.action_text([0, 1000, TEXT_CONFIG["vocab_size"] - 1])
    return {"prompt_tokens": len(ids), "image_tokens": image_tokens, "expanded_prompt_tokens": len(expanded.input_ids)}


def build_model(out: Path, config) -> Path:
    """Random bf16 weights initialised on the GPU (seconds, not minutes on the CPU), saved once."""
    import torch
    from transformers import Qwen3VLForConditionalGeneration

    if (out / "gpu_bench_model.json").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Qwen3VLForConditionalGeneration._from_config(config, dtype=torch.bfloat16)
    model.generation_config.eos_token_id = TEXT_CONFIG["eos_token_id"]
    model.generation_config.pad_token_id = TEXT_CONFIG["pad_token_id"]
    model.save_pretrained(out, safe_serialization=True, max_shard_size="5GB")
    tokenizer = build_tokenizer(TEXT_CONFIG["vocab_size"])
    tokenizer.save_pretrained(out)
    build_processor(tokenizer).save_pretrained(out)
    del model
    torch.cuda.empty_cache()
    (out / "gpu_bench_model.json").write_text(json.dumps({"config": "Qwen3-VL-8B", "seed": 0}))
    return out


def run(work: Path, out: Path) -> dict:
    from rollout import runtime

    runtime.configure(work)
    import safetensors.torch
    import torch
    from torch.utils.flop_counter import FlopCounterMode
    from vllm.lora.request import LoRARequest

    from grpo.learner import lora
    from grpo.learner.config import TrainConfig
    from grpo.learner.worker import TrainWorker
    from rollout.engine import EngineConfig
    from rollout.worker import RolloutConfig, RolloutWorker, Task
    from sync import AdapterStore
    from sync.store import ADAPTER_FILE, CONFIG_FILE

    if not torch.cuda.is_available():
        raise SystemExit("gpu_bench: no CUDA device visible; on a CPU machine run --dry-run")
    w = WORKLOAD
    # Quick until its last phase is done: a run cut short leaves a partial result the tables must not read.
    result = {"benchmark": "gpu", "quick": True, "workload": w, "machine": machine_info(peak=False)}
    peak = matmul_peak("bfloat16", "cuda")
    result["bf16_matmul_peak_tflops"] = round(peak / 1e12, 1)

    def save() -> None:
        write_result(out.stem, result, result["machine"], out.parent)

    t = time.perf_counter()
    config = model_config()
    model_path = str(build_model(work / "model", config))
    result["build_s"] = round(time.perf_counter() - t, 1)
    save()

    store = AdapterStore(work / "store", keep_last=2)
    t = time.perf_counter()
    trainer = TrainWorker(model_path, lora=lora.LoraConfig(rank=LORA_RANK, alpha=2.0 * LORA_RANK),
                          train=TrainConfig(micro_batch_size=w["micro_batch_size"], lr=1e-5), dtype="bfloat16")
    result["trainer_start_s"] = round(time.perf_counter() - t, 1)
    version = trainer.publish(str(store.root))
    t = time.perf_counter()
    worker = RolloutWorker(EngineConfig(model=model_path, dtype="bfloat16", max_lora_rank=LORA_RANK,
                                        max_model_len=w["max_model_len"],
                                        gpu_memory_utilization=w["gpu_memory_utilization"]),
                           store_root=str(store.root), worker_id="gpu-bench")
    result["engine_start_s"] = round(time.perf_counter() - t, 1)
    worker.sync_adapter(version)
    save()

    options = {"size": w["maze_size"], "cell_px": w["cell_px"], "max_turns": w["max_turns"]}
    cfg = RolloutConfig(temperature=1.0, max_tokens_per_turn=w["max_tokens_per_turn"], history="text")
    tasks = [Task("maze", 3_000_000 + i, options) for i in range(w["tasks"])]
    worker.rollout(tasks[:2], 2, cfg)  # warm-up
    runs, trajs = [], None
    for _ in range(2):
        trajs, stats = worker.rollout(tasks, w["group_size"], cfg)
        runs.append({"generated_tokens": stats.generated_tokens, "prompt_tokens": stats.prompt_tokens,
                     "engine_calls": stats.engine_calls, "wall_s": round(stats.wall_s, 3),
                     "tokens_per_s": round(stats.generated_tokens / stats.wall_s, 1)})
    result["rollout"] = {"episodes": len(trajs), "runs": runs,
                         "tokens_per_s": max(r["tokens_per_s"] for r in runs)}
    save()

    sleeps, wakes = [], []
    for _ in range(3):
        t = time.perf_counter()
        worker.sleep()
        sleeps.append(time.perf_counter() - t)
        t = time.perf_counter()
        worker.wake_up()
        wakes.append(time.perf_counter() - t)
    result["sleep_s"], result["wake_s"] = round(min(sleeps), 3), round(min(wakes), 3)
    save()

    advantages = [(-1.0) ** i for i in range(len(trajs))]
    worker.sleep()
    steps = []
    with FlopCounterMode(display=False) as counter:
        trainer.train_step(trajs, advantages)  # also the warm-up
    flops = counter.get_total_flops()
    for _ in range(w["train_steps"]):
        torch.cuda.synchronize()
        t = time.perf_counter()
        metrics = trainer.train_step(trajs, advantages)
        torch.cuda.synchronize()
        steps.append(time.perf_counter() - t)
    step_s = statistics.median(steps)
    ran_tokens = sum(len(s.token_ids) for tr in trajs for s in tr.segments)
    result["update"] = {
        "step_s": round(step_s, 3), "steps_s": [round(s, 3) for s in steps], "tokens": ran_tokens,
        "tokens_per_s": round(ran_tokens / step_s, 1), "flops_per_step": flops,
        "achieved_tflops": round(flops / step_s / 1e12, 1), "mfu_vs_bf16_matmul_peak": round(flops / step_s / peak, 3),
        "sampler_abs_diff_max": metrics.get("sampler_abs_diff_max"),
        "peak_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 1),
    }
    save()

    worker.wake_up()
    engine = worker.engine.llm.llm_engine
    tensors = trainer.gather_adapter()
    adapter_config = lora.adapter_config(trainer.model)
    config_bytes = (Path(store.latest().path) / CONFIG_FILE).read_bytes()
    publish, hot, bare = [], [], []
    for v in range(w["sync_versions"] + 1):
        t = time.perf_counter()
        version = store.publish(tensors, adapter_config)
        t1 = time.perf_counter()
        worker.sync_adapter(version)
        t2 = time.perf_counter()
        raw = work / "raw" / f"r{v}"
        raw.mkdir(parents=True, exist_ok=True)
        safetensors.torch.save_file(tensors, str(raw / ADAPTER_FILE))
        (raw / CONFIG_FILE).write_bytes(config_bytes)
        request = LoRARequest(f"raw-{v}", 100_000 + v, str(raw))
        engine.add_lora(request)
        engine.remove_lora(request.lora_int_id)
        t3 = time.perf_counter()
        if v:  # version 0 is the warm-up
            publish.append(t1 - t), hot.append(t2 - t), bare.append(t3 - t2)
    median = statistics.median
    result["sync"] = {
        "adapter_mib": round(sum(x.numel() * x.element_size() for x in tensors.values()) / 2**20, 1),
        "publish_ms": round(median(publish) * 1e3, 1),
        "publish_and_hotload_ms": round(median(hot) * 1e3, 1),
        "bare_save_file_add_lora_ms": round(median(bare) * 1e3, 1),
        "ratio": round(median(hot) / median(bare), 3),
    }
    result["headline"] = [
        {"figure": "rollout tokens/s (Qwen3-VL-8B shapes, LoRA r32)", "value": result["rollout"]["tokens_per_s"],
         "unit": "tokens/s"},
        {"figure": "update tokens/s, MFU vs bf16 matmul peak", "value": result["update"]["tokens_per_s"],
         "unit": "tokens/s", "ratio": result["update"]["mfu_vs_bf16_matmul_peak"],
         "baseline_name": f"peak {result['bf16_matmul_peak_tflops']} TFLOP/s"},
        {"figure": "publish + hot-load, rank-32 adapter", "value": result["sync"]["publish_and_hotload_ms"],
         "unit": "ms", "baseline": result["sync"]["bare_save_file_add_lora_ms"],
         "baseline_name": "save_file + add_lora", "ratio": result["sync"]["ratio"]},
        {"figure": "vLLM sleep / wake", "value": result["sleep_s"], "unit": "s",
         "baseline": result["wake_s"], "baseline_name": "wake"},
    ]
    result["quick"] = False
    save()
    worker.shutdown()
    trainer.close()
    return result


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="configs and shapes only, no CUDA; prints the plan")
    ap.add_argument("--work", default=str(ROOT / "runs" / "gpu-bench"))
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "gpu.json"))
    a = ap.parse_args(argv)
    if a.dry_run:
        config = model_config()
        result = {"benchmark": "gpu", "mode": "dry-run", **plan(config)}
        tokenizer = build_tokenizer(TEXT_CONFIG["vocab_size"])
        for i, token in SPECIAL_TOKENS.items():
            if tokenizer.convert_tokens_to_ids(token) != i:
                raise AssertionError(f"the stand-in tokenizer puts {token} at "
                                     f"{tokenizer.convert_tokens_to_ids(token)}, the published config at {i}")
        result["tokenizer_vocab"] = len(tokenizer)
        result["first_prompt"] = check_prompt(build_processor(tokenizer))
    else:
        result = run(Path(a.work).resolve(), Path(a.out))
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()

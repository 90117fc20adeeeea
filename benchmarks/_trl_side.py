"""TRL's side of benchmarks/vs_trl.py: `GRPOTrainer` on the same digits task, model, LoRA and batch as the
engine, paused before every step until the parent says go (benchmarks/_turns.py). Runs in TRL's own venv.

    runs/trl-venv/bin/python -m benchmarks._trl_side --model M --out D --steps N --generate hf|vllm
"""
from __future__ import annotations

import argparse
import os
import time

T0 = time.perf_counter()

from benchmarks._turns import add_workload_args, report, wait_go  # noqa: E402


def cpu_vllm_settings(dtype: str | None = None) -> None:
    """TRL's colocated mode builds `vllm.LLM` for a GPU (a memory fraction, compiled graphs). On the CPU vLLM
    needs a fixed KV cache size and eager mode (docs/design.md, "vLLM on the CPU"): the same settings the
    engine runs with, added to TRL's call and nothing else changed. TRL passes no dtype, so vLLM's "auto" runs
    the float32 checkpoint in bfloat16 on the CPU: this side samples in bf16 (TRL's default), and trains in
    float32. `dtype` given: vLLM runs in it instead (benchmarks/_learning_trl.py samples and scores test
    accuracy in the engine's dtype)."""
    import trl.generation.vllm_generation as gen
    import vllm

    class CpuLLM(vllm.LLM):
        def __init__(self, *args, **kwargs):
            kwargs.pop("gpu_memory_utilization", None)
            kwargs.setdefault("kv_cache_memory_bytes", 512 << 20)
            kwargs["enforce_eager"] = True
            if dtype is not None:
                kwargs["dtype"] = dtype
            super().__init__(*args, **kwargs)

    gen.LLM = CpuLLM

    def sync_weights(self):
        # TRL's colocated sync calls the model's load_weights, which fails on the CPU ("Parameter has no
        # attribute weight_loader": vLLM repacks the linear weights for oneDNN after loading). vLLM's reload
        # path re-runs that repacking; it wants every weight, which TRL's merged iteration yields.
        weights = [(name, p.detach().clone()) for name, p in self._iter_named_params()]
        self.llm.collective_rpc(_reload, args=(weights,))
        self.llm.reset_prefix_cache()

    gen.VLLMGeneration.sync_weights = sync_weights


def _reload(worker, weights) -> None:
    worker.model_runner.reload_weights(weights_iterator=iter(weights))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_workload_args(ap)
    ap.add_argument("--out", required=True)
    ap.add_argument("--generate", choices=["hf", "vllm"], default="hf")
    a = ap.parse_args(argv)

    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from benchmarks._single_turn import PROMPTS, digit_reward
    from grpo.learner.lora import DEFAULT_TARGETS

    if a.generate == "vllm":
        cpu_vllm_settings()
    os.environ.setdefault("WANDB_DISABLED", "true")
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": p}]} for p in PROMPTS[: a.prompts]])
    rewards: list[float] = []

    def digits(completions, **kwargs) -> list[float]:
        out = [digit_reward(c[0]["content"] if isinstance(c, list) else c) for c in completions]
        rewards.extend(out)
        return out

    batch = a.prompts * a.group_size
    if batch % a.micro_batch_size:
        ap.error(f"--micro-batch-size {a.micro_batch_size} must divide the batch of {batch} completions")
    # One generation of the whole batch per optimizer step (TRL's steps_per_generation defaults to the
    # accumulation steps), so no old-logprob pass, as on the engine's side.
    args = GRPOConfig(
        output_dir=a.out, max_steps=a.steps, per_device_train_batch_size=a.micro_batch_size,
        gradient_accumulation_steps=batch // a.micro_batch_size, num_generations=a.group_size,
        max_completion_length=a.max_tokens,
        learning_rate=a.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        max_grad_norm=1.0, beta=0.0, num_iterations=1, epsilon=0.2, epsilon_high=0.28, scale_rewards="group",
        loss_type="dapo", temperature=1.0, top_p=1.0, use_cpu=True, bf16=False, fp16=False, seed=0,
        logging_steps=1, report_to="none", save_strategy="no", dataloader_num_workers=0,
        use_vllm=a.generate == "vllm", vllm_mode="colocate", vllm_max_model_length=512,
        disable_dropout=True)
    generate_s: list[float] = []

    class Turns(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == 0:
                report({"event": "ready", "marks": {"ready_s": time.perf_counter() - T0}})
            wait_go()
            rewards.clear()
            generate_s.clear()
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            report({"event": "step", "step": state.global_step, "step_s": time.perf_counter() - self.t0,
                    "engine_s": sum(generate_s), "mean_reward": sum(rewards) / max(len(rewards), 1),
                    "generated_tokens": trainer.generated_tokens})

    peft = LoraConfig(r=a.lora_rank, lora_alpha=a.lora_alpha, lora_dropout=0.0, bias="none",
                      target_modules=list(DEFAULT_TARGETS), task_type="CAUSAL_LM")
    trainer = GRPOTrainer(model=a.model, reward_funcs=digits, args=args, train_dataset=dataset,
                          peft_config=peft, callbacks=[Turns()])
    trainer.generated_tokens = 0
    single_turn = trainer._generate_single_turn

    def timed(*args, **kwargs):
        t = time.perf_counter()
        out = single_turn(*args, **kwargs)
        generate_s.append(time.perf_counter() - t)
        trainer.generated_tokens = sum(len(c) for c in out[0])  # (completion_ids, logprobs)
        return out

    trainer._generate_single_turn = timed
    torch.manual_seed(0)
    trainer.train()


if __name__ == "__main__":
    main()

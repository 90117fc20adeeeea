"""TRL's side of benchmarks/learning_vs_trl.py: `GRPOTrainer` on the engine's own run config (its task, model,
LoRA, batch, optimizer and schedule), paused between GRPO steps until the parent says go, scoring greedy
test accuracy before training and every few steps. Runs in TRL's own venv (benchmarks/_trl_venv.py).

    runs/trl-venv/bin/python -m benchmarks._learning_trl --settings S.json --out D

S.json (written by the parent): {"config": RunConfig.to_dict() with the model resolved, "dtype" (the engine's),
"train_dtype", "steps", "eval_every", "generate": "vllm" | "hf", "test_seeds", "held_out" (rows training never
draws)}.
"""
from __future__ import annotations

import argparse
import json
import os
import time

T0 = time.perf_counter()

from benchmarks._turns import report, wait_go  # noqa: E402

LOSS_TYPES = {"token_mean": "dapo", "sequence_mean": "grpo", "seq_sum_norm": "dr_grpo"}


def batch_split(prompts: int, group_size: int, updates: int, micro_batch_size: int) -> dict:
    """The engine's batch (prompts x G completions, `updates` optimizer updates over equal mini-batches, each a
    gradient accumulated over micro-batches of at most `micro_batch_size`) in TRL's terms: generation happens
    once every steps_per_generation micro-batches, an update once every gradient_accumulation_steps."""
    batch = prompts * group_size
    if batch % updates:
        raise ValueError(f"train.updates_per_batch={updates} must divide the batch of {batch} completions: TRL "
                         "updates on equal slices of one generation")
    mini = batch // updates
    micro = min(micro_batch_size, mini)
    if mini % micro:
        raise ValueError(f"train.micro_batch_size={micro_batch_size} must divide the mini-batch of {mini} "
                         "completions: TRL accumulates equal micro-batches")
    return {"per_device_train_batch_size": micro, "gradient_accumulation_steps": mini // micro,
            "steps_per_generation": batch // micro}


def grpo_config_kwargs(cfg: dict, steps: int, use_vllm: bool, out: str) -> dict:
    """GRPOConfig's arguments for the engine's RunConfig `cfg` (as to_dict gives it): the same algorithm
    wherever TRL has it. What it cannot hold raises, naming the field, so no run silently compares two
    algorithms; the one difference kept (drop_zero_signal_groups) is listed by the parent."""
    algo, train, rollout = cfg["algorithm"], cfg["train"], cfg["rollout"]
    refused = {"algorithm.baseline": algo["baseline"] != "mean", "algorithm.dual_clip": algo["dual_clip"] is not None,
               "algorithm.tis_cap": algo["tis_cap"] is not None, "algorithm.dynamic_sampling": algo["dynamic_sampling"],
               "algorithm.step_weight": algo["step_weight"] != 0, "rollout.stop": bool(rollout["stop"]),
               "rollout.top_p": rollout["top_p"] != 1.0, "lora.dropout": cfg["lora"]["dropout"] != 0,
               "train.max_grad_norm": train["max_grad_norm"] is None}
    for field, bad in refused.items():
        if bad:
            raise ValueError(f"{field} is set in the run config, and TRL's GRPOTrainer has no such setting here: "
                             "learning_vs_trl compares one algorithm on both sides; leave it at its default")
    if algo["loss_agg"] not in LOSS_TYPES:
        raise ValueError(f"algorithm.loss_agg={algo['loss_agg']!r} has no TRL loss_type: use one of {list(LOSS_TYPES)}")
    split = batch_split(cfg["tasks_per_step"], algo["group_size"], train["updates_per_batch"],
                        train["micro_batch_size"])
    return dict(
        output_dir=out, max_steps=steps * train["updates_per_batch"], **split, num_generations=algo["group_size"],
        max_completion_length=rollout["max_tokens_per_turn"], temperature=rollout["temperature"], top_p=1.0,
        learning_rate=train["lr"], weight_decay=train["weight_decay"], adam_beta1=train["betas"][0],
        adam_beta2=train["betas"][1], adam_epsilon=train["adam_eps"], max_grad_norm=train["max_grad_norm"],
        beta=algo["kl_coef"], num_iterations=1, epsilon=algo["clip_low"], epsilon_high=algo["clip_high"],
        scale_rewards="group" if algo["scale_rewards"] == "group" else "none",
        loss_type=LOSS_TYPES[algo["loss_agg"]], use_cpu=True, bf16=False, fp16=False, seed=cfg["seed"],
        logging_steps=1, report_to="none", save_strategy="no", dataloader_num_workers=0, disable_dropout=True,
        use_vllm=use_vllm, vllm_mode="colocate", vllm_max_model_length=cfg["engine"]["max_model_len"],
        # The engine has no importance-sampling correction on (algorithm.tis_cap null).
        vllm_importance_sampling_correction=False)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--settings", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    s = json.loads(open(a.settings).read())
    cfg, steps, every = s["config"], s["steps"], s["eval_every"]

    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from benchmarks._trl_side import cpu_vllm_settings
    from envs.dataset import DatasetEnv
    from grpo.learner.config import TrainConfig

    use_vllm = s["generate"] == "vllm"
    if use_vllm:
        cpu_vllm_settings(s["dtype"])
    os.environ.setdefault("WANDB_DISABLED", "true")
    env = DatasetEnv(**cfg["env"]["options"])
    system = cfg["rollout"]["system_prompt"]
    held_out = set(s["held_out"])
    train_rows = [{"prompt": messages(env.reset(i), system), "row": i} for i in range(len(env.rows))
                  if i not in held_out]
    rewards: list[float] = []

    def reward(completions, row, **kwargs) -> list[float]:
        # The engine's env scores TRL's replies: the same reward functions, weights and row.
        out = []
        for c, i in zip(completions, row):
            env.reset(i)
            out.append(env.step(c[0]["content"] if isinstance(c, list) else c).reward)
        rewards.extend(out)
        return out

    updates = cfg["train"]["updates_per_batch"]
    schedule = TrainConfig(**cfg["train"])
    args = GRPOConfig(**grpo_config_kwargs(cfg, steps, use_vllm, a.out),
                      model_init_kwargs={"dtype": getattr(torch, s["train_dtype"])})
    evaluate = TestAccuracy(env, s["test_seeds"], cfg["rollout"]["max_tokens_per_turn"], system, use_vllm)

    class Turns(TrainerCallback):
        """One GRPO step = `updates` optimizer steps on one generation: pause before, report after."""

        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step % updates:
                return
            if state.global_step == 0:
                acc, secs = evaluate(trainer)
                report({"event": "ready", "test_accuracy": acc, "eval_s": secs,
                        "marks": {"ready_s": time.perf_counter() - T0}})
            wait_go()
            rewards.clear()
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step % updates:
                return
            step = state.global_step // updates
            record = {"event": "step", "step": step, "step_s": time.perf_counter() - self.t0,
                      "mean_reward": sum(rewards) / max(len(rewards), 1)}
            if step % every == 0 or step == steps:
                record["test_accuracy"], record["eval_s"] = evaluate(trainer)
            report(record)

    peft = LoraConfig(r=cfg["lora"]["rank"], lora_alpha=cfg["lora"]["alpha"], lora_dropout=0.0, bias="none",
                      target_modules=list(cfg["lora"]["target_modules"]), task_type="CAUSAL_LM")
    trainer = GRPOTrainer(model=cfg["model"], reward_funcs=reward, args=args,
                          train_dataset=Dataset.from_list(train_rows), peft_config=peft, callbacks=[Turns()])

    def create_scheduler(num_training_steps, optimizer=None):
        # The engine's schedule (grpo.learner.config.TrainConfig.lr_at): one learning rate a GRPO step, shared by
        # its updates, warmup from lr / warmup_steps; HF's schedulers ramp from 0 and change every update.
        if trainer.lr_scheduler is None:
            trainer.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(
                optimizer or trainer.optimizer, lambda k: schedule.lr_at(k // updates, steps) / schedule.lr)
        return trainer.lr_scheduler

    trainer.create_scheduler = create_scheduler
    torch.manual_seed(cfg["seed"])
    trainer.train()


def messages(obs, system_prompt) -> list[dict]:
    """A training prompt in TRL's conversational form, as the engine's ChatFormat.prompt_ids builds it."""
    given = [dict(m) for m in obs.messages] if obs.messages else [{"role": "user", "content": obs.text}]
    head = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return given if given[0]["role"] == "system" else head + given


class TestAccuracy:
    """Greedy accuracy on the test rows with TRL's policy as it stands, through the path this side generates
    with: its colocated vLLM (the LoRA merged into the weights and pushed, as TRL's own sync does) or HF
    `generate` on the peft model. Prompts and replies go through the engine's rollout.conversation.ChatFormat
    (the model's chat template, the reply decoded from its ids less the end-of-turn token) and are scored by
    the engine's env, so both sides read the same prompts, the same reply text and the same parser."""

    def __init__(self, env, rows: list[int], max_tokens: int, system_prompt, use_vllm: bool):
        self.env, self.rows, self.max_tokens, self.use_vllm = env, rows, max_tokens, use_vllm
        self.system_prompt = system_prompt

    def __call__(self, trainer) -> tuple[float, float]:
        """(accuracy, seconds it took)."""
        from rollout.conversation import ChatFormat

        t = time.perf_counter()
        chat = ChatFormat(trainer.processing_class, self.system_prompt)
        prompts = [chat.prompt_ids(self.env.reset(i)) for i in self.rows]
        generated = self._vllm(trainer, prompts) if self.use_vllm else self._hf(trainer, prompts, chat.eos_ids)
        solved = 0
        for i, ids in zip(self.rows, generated):
            self.env.reset(i)
            solved += bool(self.env.step(chat.action_text(ids)).info["success"])
        return solved / len(self.rows), time.perf_counter() - t

    def _vllm(self, trainer, prompts: list[list[int]]) -> list[list[int]]:
        from vllm import SamplingParams

        vg = trainer.vllm_generation
        vg.sync_weights()  # the policy's current weights; TRL pushes them again before its next generation
        outs = vg.llm.generate([{"prompt_token_ids": p} for p in prompts],
                               SamplingParams(temperature=0.0, max_tokens=self.max_tokens), use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]

    def _hf(self, trainer, prompts: list[list[int]], eos_ids: set[int], chunk: int = 32) -> list[list[int]]:
        import torch

        model, tok = trainer.model, trainer.processing_class
        pad = tok.pad_token_id if tok.pad_token_id is not None else next(iter(eos_ids))
        was_training = model.training
        model.eval()
        out = []
        try:
            for k in range(0, len(prompts), chunk):
                part = prompts[k:k + chunk]
                width = max(len(p) for p in part)
                ids = torch.tensor([[pad] * (width - len(p)) + p for p in part])
                mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in part])
                with torch.no_grad():
                    seqs = model.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                                          max_new_tokens=self.max_tokens, eos_token_id=sorted(eos_ids),
                                          pad_token_id=pad)
                for row in seqs[:, width:].tolist():
                    end = next((j for j, x in enumerate(row) if x in eos_ids), None)
                    out.append(row if end is None else row[:end + 1])
        finally:
            model.train(was_training)
        return out


if __name__ == "__main__":
    main()

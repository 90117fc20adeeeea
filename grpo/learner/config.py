"""The optimiser's and the update loop's settings (grpo.learner.worker), validated when built."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from grpo.algo.config import check_bool, check_choice, check_number, require


@dataclass(frozen=True)
class TrainConfig:
    """AdamW on the LoRA weights, its learning-rate schedule and how a batch is split into passes.

    Steps count `train_step` calls (one rollout batch each). The learning rate changes once per step, so
    the `updates_per_batch` optimizer updates of one batch share it (as verl and OpenRLHF do). The cosine
    schedule runs over the run's `steps`; the trainer scores at the run's one temperature, rollout.temperature.
    """

    lr: float = 1e-5  # the peak learning rate
    weight_decay: float = 0.0  # AdamW's decoupled weight decay
    betas: tuple[float, float] = (0.9, 0.999)  # AdamW's moment decay rates
    adam_eps: float = 1e-8  # AdamW's epsilon
    warmup_steps: int = 0  # linear ramp from lr / warmup_steps to lr over the first steps
    schedule: str = "constant"  # after warmup: "constant" | "cosine" (to min_lr_ratio * lr at the last step)
    min_lr_ratio: float = 0.0  # the cosine schedule's floor, a share of lr
    max_grad_norm: Optional[float] = 1.0  # global L2 norm over all ranks; None: no clipping (norm still logged)
    micro_batch_size: int = 8  # sequences per forward/backward on one rank; does not change the update
    # Packed rows instead: sequences side by side, no padding, up to this many tokens a forward/backward
    # (a longer sequence gets a row of its own); null: padded micro-batches of micro_batch_size sequences.
    tokens_per_micro_batch: Optional[int] = None
    # The sequences of a padded micro-batch that begin with the same prompt (a GRPO group's) run it once,
    # and each its own continuation against the prompt's cached keys and values: the same logprobs and
    # gradient for fewer tokens. Text models with a plain key-value cache (grpo.learner.shared_prompt).
    share_prompts: bool = False
    # The base model's weights in training: "auto" takes the rollout engine's (engine.dtype), so the trainer
    # scores in the precision vLLM samples in. The LoRA weights and the optimizer state stay float32.
    dtype: str = "auto"
    # Recompute each decoder layer's activations in the backward pass instead of keeping them: less memory,
    # about one more forward pass of time.
    activation_checkpointing: bool = False
    updates_per_batch: int = 1  # optimizer updates per batch (mini-batches); > 1 scores old logprobs first
    seed: int = 0  # the adapter's initialisation and the workers' random state

    def __post_init__(self):
        check_number(self, "lr", gt=0, hint="e.g. 1e-5; LoRA often takes 1e-5 to 1e-4")
        check_number(self, "weight_decay", ge=0)
        require(
            self, "betas",
            isinstance(self.betas, (tuple, list)) and len(self.betas) == 2 and all(
                isinstance(b, (int, float)) and not isinstance(b, bool) and math.isfinite(b) and 0 <= b < 1
                for b in self.betas),
            "two numbers in [0, 1), e.g. (0.9, 0.999)",
        )
        check_number(self, "adam_eps", gt=0)
        check_number(self, "warmup_steps", integer=True, ge=0)
        check_choice(self, "schedule", ("constant", "cosine"))
        check_number(self, "min_lr_ratio", ge=0, le=1)
        check_number(self, "max_grad_norm", gt=0, optional=True, hint="e.g. 1.0")
        check_number(self, "micro_batch_size", integer=True, ge=1)
        check_number(self, "updates_per_batch", integer=True, ge=1)
        check_number(self, "tokens_per_micro_batch", integer=True, ge=1, optional=True,
                     hint="e.g. 8192, or null for padded micro-batches of micro_batch_size sequences")
        check_choice(self, "dtype", ("auto", "float32", "bfloat16"))
        require(self, "activation_checkpointing", isinstance(self.activation_checkpointing, bool), "true or false")
        check_bool(self, "share_prompts")
        require(self, "share_prompts", not (self.share_prompts and self.tokens_per_micro_batch is not None),
                f"false with train.tokens_per_micro_batch={self.tokens_per_micro_batch}: shared prompts run in "
                "padded micro-batches; set train.tokens_per_micro_batch: null, or train.share_prompts: false")
        require(self, "share_prompts", not (self.share_prompts and self.activation_checkpointing),
                "false with train.activation_checkpointing: the recomputed layers keep no key-value cache for "
                "the continuations to attend to; turn one of them off")
        check_number(self, "seed", integer=True, ge=0)

    def check_length(self, owner, name: str) -> None:
        """`owner.name`, the number of steps the schedule runs over, suits it: cosine needs more than the warmup."""
        steps = getattr(owner, name)
        require(owner, name, self.schedule != "cosine" or (steps is not None and steps > self.warmup_steps),
            f"an integer > train.warmup_steps ({self.warmup_steps}) with train.schedule='cosine', "
            "which runs over the run's steps")

    def lr_at(self, step: int, total_steps: Optional[int] = None) -> float:
        """The learning rate of step `step` (0-based) of `total_steps` (the schedule's length; cosine only)."""
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        if self.schedule == "constant":
            return self.lr
        progress = min(1.0, (step - self.warmup_steps) / (total_steps - self.warmup_steps))
        ratio = self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
        return self.lr * ratio

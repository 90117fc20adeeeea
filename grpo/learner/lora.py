"""LoRA on the language model through peft, and the adapter's tensors in the form sync.AdapterStore publishes."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from grpo.algo.config import check_number, require

# Projection names of Qwen-family decoder layers. The Qwen-VL vision blocks name theirs qkv, proj and
# linear_fc*, so these names put LoRA on the language model only, which is what vLLM serves adapters for.
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class LoraConfig:
    rank: int = 32  # r of the low-rank update B @ A; vLLM serves adapters up to this rank
    alpha: float = 64.0  # the update is scaled by alpha / rank
    # LoRA dropout: only 0. Old logprobs are scored without it and new ones with it, so the ratio would not
    # be 1 on-policy and its noise would enter the TIS weight and the vLLM mismatch.
    dropout: float = 0.0
    target_modules: tuple[str, ...] = DEFAULT_TARGETS  # names of the linear layers that get an adapter

    def __post_init__(self):
        check_number(self, "rank", integer=True, ge=1)
        check_number(self, "alpha", gt=0)
        check_number(self, "dropout", ge=0, lt=1)
        require(self, "dropout", self.dropout == 0,
                "0 for GRPO: the old logprobs (and vLLM's) are scored without dropout and the new ones with it, "
                "so the ratio is not 1 on-policy and the dropout noise enters the TIS weight and the sampler "
                "mismatch; 0 is the GRPO default in verl and TRL for this reason. Set lora.dropout: 0")
        require(self, "target_modules", len(self.target_modules) > 0 and all(
            isinstance(t, str) and t for t in self.target_modules), "a non-empty list of module names")

    def peft_config(self, exclude: list[str] | None = None):
        from peft import LoraConfig

        return LoraConfig(r=self.rank, lora_alpha=self.alpha, lora_dropout=self.dropout,
                          target_modules=list(self.target_modules), bias="none", exclude_modules=exclude)


def apply_lora(model, settings: LoraConfig):
    """Wrap `model` with a fresh adapter; every base weight is frozen, only LoRA weights train."""
    from peft import get_peft_model

    peft_model = get_peft_model(model, settings.peft_config(_outside_language_model(model, settings)))
    trainable = [n for n, p in peft_model.named_parameters() if p.requires_grad]
    if not trainable:
        raise ValueError(
            f"LoRA matched no module of {type(model).__name__}: target_modules={list(settings.target_modules)}; "
            "name the linear layers of the model's decoder (print(model) lists them)")
    return peft_model


def _outside_language_model(model, settings: LoraConfig) -> list[str] | None:
    """Modules the target names also match outside the language model (Qwen2.5-VL's vision MLPs, a CLIP
    tower's attention in LLaVA): vLLM serves adapters on the language model only."""
    inside = {id(m) for m in model.get_decoder().modules()}
    names = [n for n, m in model.named_modules()
             if n.rsplit(".", 1)[-1] in settings.target_modules and id(m) not in inside]
    return names or None


def adapter_tensors(peft_model) -> dict[str, torch.Tensor]:
    """A snapshot of the adapter's weights under peft's saved key names, on the CPU (what `save_pretrained`
    writes). Cloned: on the CPU `.to("cpu")` returns the live parameter, which the next step would change."""
    from peft import get_peft_model_state_dict

    return {k: v.detach().to("cpu").clone().contiguous() for k, v in get_peft_model_state_dict(peft_model).items()}


def adapter_config(peft_model) -> dict:
    return peft_model.peft_config["default"].to_dict()


def randomize_adapter(peft_model, seed: int, scale: float = 0.5) -> None:
    """Give lora_B non-zero values (peft starts it at zero, which makes every adapter equal to the base)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(peft_model.named_parameters()):
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * scale)

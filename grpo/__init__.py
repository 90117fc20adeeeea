"""grpo: GRPO for multi-turn RL post-training of language and vision-language models.

`import grpo` stays light: the trainer, Ray and vLLM load when first used.
"""
from grpo.config import AlgorithmConfig, ConfigError
from grpo.lora import LoraSettings
from grpo.run_config import RunConfig
from grpo.train_config import TrainConfig

Config = RunConfig

__all__ = ["AlgorithmConfig", "Config", "ConfigError", "LoraSettings", "RunConfig", "TrainConfig", "Trainer"]


def __getattr__(name):
    if name == "Trainer":
        from grpo.trainer import Trainer

        return Trainer
    if name == "tiny_models":
        import importlib

        return importlib.import_module("grpo.tiny_models")
    raise AttributeError(f"module 'grpo' has no attribute {name!r}")

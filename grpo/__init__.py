"""grpo: GRPO for multi-turn RL post-training of language and vision-language models.

`import grpo` stays light: the trainer, Ray and vLLM load when first used.
"""
from grpo.algo.config import AlgorithmConfig, ConfigError
from grpo.config import RunConfig
from grpo.driver.callbacks import Callback, Stop
from grpo.learner.config import TrainConfig
from grpo.learner.lora import LoraConfig

__all__ = ["AlgorithmConfig", "Callback", "ConfigError", "LoraConfig", "RunConfig", "Stop", "TrainConfig", "Trainer"]


def __getattr__(name):
    if name == "Trainer":
        from grpo.driver.trainer import Trainer

        return Trainer
    if name == "tools":
        # `grpo.tools.tiny_models.build(...)` without an import of its own, as in the README's example.
        import importlib

        importlib.import_module("grpo.tools.tiny_models")
        return importlib.import_module("grpo.tools")
    raise AttributeError(f"module 'grpo' has no attribute {name!r}")

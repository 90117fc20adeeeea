"""vLLM inspects a model's class in a fresh Python process, which imports vLLM all over again, whenever its
cache folder lacks the answer: every new cache folder. The engine hands vLLM the class, imported in its own
process (rollout.engine.register_in_process), so an engine in a new folder never starts that process."""
import gc
import json

import pytest

from rollout.engine import Engine, EngineConfig


@pytest.mark.slow
@pytest.mark.parametrize("model", ["tiny_text", "tiny_vl"])
def test_an_engine_in_a_cold_cache_never_inspects_its_model_in_another_process(model, request, monkeypatch):
    from vllm import ModelRegistry
    from vllm.model_executor.models import registry

    path = request.getfixturevalue(model)
    (arch,) = json.loads((path / "config.json").read_text())["architectures"]
    entry = ModelRegistry.models[arch]
    lazy = entry if hasattr(entry, "module_name") else registry._LazyRegisteredModel(
        entry.model_cls.__module__, entry.model_cls.__name__)
    monkeypatch.setitem(ModelRegistry.models, arch, lazy)  # as a fresh process has it: registered by name

    def another_process(fn):
        raise AssertionError("vLLM inspected the model class in a subprocess")

    # A cold cache, and no subprocess allowed: the engine starts only if the class was handed over.
    monkeypatch.setattr(registry._LazyRegisteredModel, "_load_modelinfo_from_cache", lambda self, h: None)
    monkeypatch.setattr(registry, "_run_in_subprocess", another_process)
    engine = Engine(EngineConfig(model=str(path), enable_lora=False, max_model_len=512))
    try:
        assert not hasattr(ModelRegistry.models[arch], "module_name")  # now registered as the class itself
        assert ModelRegistry.models[arch].model_cls is lazy.load_model_cls()
    finally:
        del engine
        gc.collect()

"""Hot-loading published adapter versions into a running vLLM engine.

Every version gets a LoRA name and an int id never used before in this engine. vLLM keys its prefix cache
and its loaded-adapter table by those: reusing a name (or an id) with new weights on disk serves stale KV
blocks or stale weights (measured here; vLLM issue 42125). Versions this loader replaced are unloaded.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class LoadedAdapter:
    version: int
    name: str
    lora_id: int
    path: str


class HotLoader:
    """Owns the LoRA slots of one engine. `engine` is vLLM's `LLMEngine` (`LLM.llm_engine`)."""

    def __init__(self, engine, prefix: str = "grpo"):
        self._engine = engine
        self._prefix = prefix
        self._ids = itertools.count(1)
        self.current: LoadedAdapter | None = None

    def load(self, version: int, path: str | Path) -> LoadedAdapter:
        """Make `version` the adapter this engine serves; a no-op if it already is."""
        if self.current is not None and self.current.version == version:
            return self.current
        path = checked_adapter_dir(version, path)
        lora_id = next(self._ids)
        loaded = LoadedAdapter(version, f"{self._prefix}-v{version:06d}-{lora_id}", lora_id, path)
        if not self._engine.add_lora(self.request(loaded)):
            raise RuntimeError(f"vLLM refused to load adapter version {version} from {path}")
        previous, self.current = self.current, loaded
        if previous is not None:
            self._engine.remove_lora(previous.lora_id)
        return loaded

    @staticmethod
    def request(adapter: LoadedAdapter | None):
        if adapter is None:
            return None
        from vllm.lora.request import LoRARequest

        return LoRARequest(adapter.name, adapter.lora_id, adapter.path)

    def loaded_ids(self) -> set[int]:
        return set(self._engine.list_loras())


def checked_adapter_dir(version: int, path: str | Path) -> str:
    """The absolute folder of a published adapter version; refused before vLLM sees a folder without one."""
    path = str(Path(path).resolve())
    if not (Path(path) / "adapter_config.json").is_file():
        raise FileNotFoundError(
            f"adapter version {version} at {path} has no adapter_config.json: publish it with "
            "sync.AdapterStore.publish before hot-loading")
    return path

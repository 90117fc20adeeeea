"""Serving a published adapter version merged into the engine's weights instead of as a LoRA.

vLLM's CPU backend decodes a LoRA request at about a third of the base model's speed (the punica ops run
per token); with W + scaling * B @ A written into the weights the engine decodes at the base model's speed.
The file on shared storage stays the adapter: only what the engine holds changes. This is what TRL's
colocated vLLM mode does (peft's merge_adapter, then vLLM's load_weights).

Every version is merged into the pristine base weights, read once from the model folder, never into the
previous merge, so errors do not accumulate. Merging changes what the same token ids compute, so the prefix
cache is reset after every load (the same staleness rule as for LoRA names: vLLM issue 42125).
"""
from __future__ import annotations

import itertools
import json
from pathlib import Path

from rollout.hotload import LoadedAdapter, checked_adapter_dir

_PEFT_PREFIX = "base_model.model."


class MergedLoader:
    """Same interface as HotLoader: `load(version, path)`, `current`; `llm` is vLLM's `LLM`."""

    def __init__(self, llm, model_dir: str | Path):
        self._llm = llm
        self._model_dir = str(Path(model_dir).resolve())
        self._ids = itertools.count(1)
        self.current: LoadedAdapter | None = None
        self._served: int | None = None  # the version the weights hold now; None: the base model

    def load(self, version: int, path: str | Path) -> LoadedAdapter:
        """Make `version` the adapter this engine serves; a no-op if it already is."""
        if self.current is not None and self.current.version == version:
            return self.current
        path = checked_adapter_dir(version, path)
        self._llm.collective_rpc(_merge_into_worker, args=(self._model_dir, path))
        self._llm.reset_prefix_cache()
        # The reload empties the runner's encoder cache; the scheduler would still count the old image
        # embeddings as cached and the next request with a seen image fails ("Encoder cache miss").
        self._llm.llm_engine.reset_encoder_cache()
        lora_id = next(self._ids)
        self.current = LoadedAdapter(version, f"merged-v{version:06d}-{lora_id}", lora_id, path)
        self._served = version
        return self.current

    def loaded_ids(self) -> set[int]:
        """The id of the version merged in now: vLLM itself holds no LoRA in this mode."""
        return {self.current.lora_id} if self.current is not None else set()

    def serve(self, use_adapter: bool) -> None:
        """Put the merged adapter (or the plain base model) into the weights before a generate call."""
        want = self.current.version if (use_adapter and self.current is not None) else None
        if want == self._served:
            return
        adapter = self.current.path if want is not None else None
        self._llm.collective_rpc(_merge_into_worker, args=(self._model_dir, adapter))
        self._llm.reset_prefix_cache()
        self._llm.llm_engine.reset_encoder_cache()
        self._served = want


def merged_weights(base: dict, adapter: dict, config: dict) -> dict:
    """{checkpoint weight name: base + scaling * B @ A} for every module the adapter targets.

    `base` holds the checkpoint's tensors by name, `adapter` the peft adapter's tensors by their saved keys
    (`base_model.model.<module>.lora_A.weight`), `config` its adapter_config.json. The product is taken in
    float32 and cast to the base weight's dtype.
    """
    import torch

    if config.get("use_dora"):
        raise ValueError("a DoRA adapter cannot be merged by this loader: serve it as a LoRA (merge_adapter=False)")
    if config.get("fan_in_fan_out"):
        raise ValueError("fan_in_fan_out adapters (Conv1D layers) are not supported by the merged loader")
    rank = config["r"]
    alpha = config.get("lora_alpha", rank)
    scaling = alpha / rank ** 0.5 if config.get("use_rslora") else alpha / rank
    out = {}
    for key, a in adapter.items():
        if not key.endswith(".lora_A.weight"):
            continue
        module = key[: -len(".lora_A.weight")]
        module = module[len(_PEFT_PREFIX):] if module.startswith(_PEFT_PREFIX) else module
        name = module + ".weight"
        if name not in base:
            raise KeyError(f"the adapter targets {module!r} but the model has no weight {name!r}")
        b = adapter[key[: -len(".lora_A.weight")] + ".lora_B.weight"]
        w = base[name]
        delta = b.to(device=w.device, dtype=torch.float32) @ a.to(device=w.device, dtype=torch.float32)
        out[name] = (w.to(torch.float32) + scaling * delta).to(w.dtype)
    return out


def _merge_into_worker(worker, model_dir: str, adapter_dir: str | None) -> int:
    """Runs inside vLLM's worker: reload the model's weights as base + the adapter (or the base alone).

    vLLM's reload path, not `load_weights`: on the CPU the linear layers repack their weights for oneDNN
    after loading and drop the originals, so only a reload that re-runs that processing can change them. It
    wants every weight of the model, so the whole checkpoint is kept (in host memory, read once)."""
    from safetensors.torch import load_file

    base = getattr(worker, "_grpo_base_weights", None)
    if base is None:
        base = worker._grpo_base_weights = _read_checkpoint(model_dir)
    weights = dict(base)
    if adapter_dir is not None:
        config = json.loads((Path(adapter_dir) / "adapter_config.json").read_text())
        adapter = load_file(str(Path(adapter_dir) / "adapter_model.safetensors"))
        weights.update(merged_weights(base, adapter, config))
    worker.model_runner.reload_weights(weights_iterator=iter(weights.items()))
    return len(weights)


def _read_checkpoint(model_dir: str) -> dict:
    from safetensors.torch import load_file

    found = {}
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        found.update(load_file(str(f)))
    return found

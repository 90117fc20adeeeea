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

    def _wanted(self, use_adapter: bool) -> int | None:
        """The version a request with `use_adapter` needs in the weights; None: the base model."""
        return self.current.version if (use_adapter and self.current is not None) else None

    def serves(self, use_adapter: bool) -> bool:
        """Whether the weights hold now what a request with `use_adapter` needs."""
        return self._served == self._wanted(use_adapter)

    def serve(self, use_adapter: bool) -> None:
        """Put the merged adapter (or the plain base model) into the weights before a generate call."""
        want = self._wanted(use_adapter)
        if want == self._served:
            return
        adapter = self.current.path if want is not None else None
        self._llm.collective_rpc(_merge_into_worker, args=(self._model_dir, adapter))
        self._llm.reset_prefix_cache()
        self._llm.llm_engine.reset_encoder_cache()
        self._served = want


def merged_weights(base: dict, adapter: dict, config: dict, dtype, rename=None) -> dict:
    """{checkpoint weight name: merged tensor} for every weight the adapter changes, in `dtype`.

    `base` holds the checkpoint's tensors by name, `adapter` the peft adapter's tensors by their saved keys
    (`base_model.model.<module>.lora_A.weight`), `config` its adapter_config.json, `dtype` the dtype the engine
    holds its weights in. A LoRA module becomes W + scaling * B @ A (its bias + scaling * the lora_B bias with
    `lora_bias`), with rank and alpha per module from rank_pattern / alpha_pattern as peft resolves them; a
    module of `modules_to_save` becomes the adapter's copy. The sum is taken in float32 and cast to `dtype`,
    never to the checkpoint's: the update of an early step (~1e-5) is below a bf16 weight's resolution, and a
    bf16 checkpoint served in float32 must carry it as the trainer's float32 forward does. `rename` maps a
    module's weight name as the model names it in memory (the adapter's names) to the checkpoint's, where
    transformers saves them differently (Qwen2-VL, LLaVA).
    """
    import torch

    for field, why in (("use_dora", "a DoRA adapter"), ("fan_in_fan_out", "a fan_in_fan_out adapter (Conv1D layers)"),
                       ("trainable_token_indices", "an adapter with trainable tokens"),
                       ("layer_replication", "an adapter with layer_replication")):
        if config.get(field):
            raise ValueError(f"{why} ({field} in adapter_config.json) cannot be merged by this loader: serve it "
                             "as a LoRA (engine.merge_adapter: false)")
    out = {}
    for key, a in adapter.items():
        if not key.endswith(".lora_A.weight"):
            continue
        module = _module_name(key[: -len(".lora_A.weight")])
        if rename is not None and module + ".weight" not in base:
            module = rename(module + ".weight")[: -len(".weight")]
        name = module + ".weight"
        if name not in base:
            raise KeyError(f"the adapter targets {module!r} but the model has no weight {name!r}")
        prefix = key[: -len(".lora_A.weight")]
        b = adapter[prefix + ".lora_B.weight"]
        scaling = _scaling(config, module)
        w = base[name]
        delta = b.to(device=w.device, dtype=torch.float32) @ a.to(device=w.device, dtype=torch.float32)
        out[name] = (w.to(torch.float32) + scaling * delta).to(dtype)
        if prefix + ".lora_B.bias" in adapter:
            bias = base.get(module + ".bias")
            if bias is None:
                raise KeyError(f"the adapter has a lora_B bias for {module!r} (lora_bias) but the model has no "
                               f"{module + '.bias'!r}")
            lora_bias = adapter[prefix + ".lora_B.bias"].to(device=bias.device, dtype=torch.float32)
            out[module + ".bias"] = (bias.to(torch.float32) + scaling * lora_bias).to(dtype)
    saved = tuple(config.get("modules_to_save") or ())
    for key, t in adapter.items():
        if key.endswith((".lora_A.weight", ".lora_B.weight", ".lora_B.bias")):
            continue
        name = _module_name(key)
        if not (saved and _saved_module(name, saved)):
            raise ValueError(f"the adapter holds {key!r}, which is neither a LoRA weight nor a module of "
                             "modules_to_save, so this loader cannot merge it: serve it as a LoRA "
                             "(engine.merge_adapter: false)")
        if name not in base:
            raise KeyError(f"the adapter replaces {name!r} (modules_to_save) but the model has no such weight "
                           "(a tied lm_head shares the embedding's): serve it as a LoRA (engine.merge_adapter: false)")
        out[name] = t.to(dtype)
    return out


def _module_name(key: str) -> str:
    return key[len(_PEFT_PREFIX):] if key.startswith(_PEFT_PREFIX) else key


def _scaling(config: dict, module: str) -> float:
    """peft's scaling of one module: rank and alpha from the first rank_pattern / alpha_pattern key that
    matches the module's name or a dotted suffix of it (peft.utils.other.get_pattern_key), else r and
    lora_alpha."""
    rank = _pattern_value(config.get("rank_pattern") or {}, module, config["r"])
    alpha = _pattern_value(config.get("alpha_pattern") or {}, module, config.get("lora_alpha", config["r"]))
    return alpha / rank ** 0.5 if config.get("use_rslora") else alpha / rank


def _pattern_value(pattern: dict, module: str, default):
    import re

    for key, value in pattern.items():
        if re.match(rf"(.*\.)?({key})$", module):
            return value
    return default


def _saved_module(weight_name: str, modules_to_save: tuple[str, ...]) -> bool:
    """Whether a saved weight belongs to a module of modules_to_save: peft wraps every module whose name
    ends with an entry (peft.utils.other._set_trainable)."""
    module = weight_name.rsplit(".", 1)[0]
    return any(module.endswith(m) for m in modules_to_save)


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
        # The dtype vLLM holds the weights in (float32 on the CPU, whatever the checkpoint's), not the file's.
        weights.update(merged_weights(base, adapter, config, worker.model_config.dtype, _renamer(worker, base)))
    worker.model_runner.reload_weights(weights_iterator=iter(weights.items()))
    return len(weights)


def _renamer(worker, base: dict):
    """In-memory weight name -> checkpoint name, through vLLM's own mapper of the model, which reads both."""
    mapper = getattr(worker.model_runner.get_model(), "hf_to_vllm_mapper", None)
    if mapper is None:
        return None
    by_vllm_name = {mapper.map_name(k): k for k in base}
    by_vllm_name.pop(None, None)
    return lambda name: by_vllm_name.get(mapper.map_name(name), name)


def _read_checkpoint(model_dir: str) -> dict:
    from safetensors.torch import load_file

    found = {}
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        found.update(load_file(str(f)))
    return found

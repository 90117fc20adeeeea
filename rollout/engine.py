"""A thin wrapper around vLLM's offline `LLM`: token ids and images in, sampled ids and their logprobs out.

Prompts go in "compact" form: one image placeholder per image (`<|image_pad|>`, `<image>`,
`<start_of_image>`), which vLLM expands itself, as the family's processor does (handing it ids that are
already expanded makes it expand them again). vLLM reports the expanded ids it actually ran, so a caller
can check them against its own expansion (grpo.learner.forward.expand).
"""
from __future__ import annotations

import gc
import itertools
import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from rollout import runtime
from rollout.checks import check_bool, check_choice, check_number
from rollout.hotload import HotLoader, LoadedAdapter
from rollout.merged import MergedLoader
from rollout.models import check_exact, check_model_dir, vision_token_ids

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class VllmConfig:
    """The vLLM engine's settings a run chooses (its `engine:` section); EngineConfig adds the model, the
    seed and the LoRA rank, which a run states elsewhere (`model`, `seed`, `lora.rank`)."""

    # The engines' and the train ranks' dtype: the trainer scores in the precision vLLM samples in.
    dtype: str = "auto"  # "auto": bfloat16 where the hardware has it, else float32
    max_model_len: int = 4096  # tokens of one episode's context; an episode that fills it ends
    enable_prefix_caching: bool = True  # reuse the KV cache of a shared prompt prefix (a group's episodes)
    max_images_per_prompt: int = 16  # images one context may hold (history "full" keeps every turn's)
    # CPU: vLLM's default memory fraction refuses to start on these machines; a fixed size works.
    kv_cache_memory_bytes: int = 512 << 20
    # GPU: the share of memory vLLM may take while colocated with a trainer rank.
    gpu_memory_utilization: float = 0.4
    max_num_seqs: int = 256  # sequences vLLM decodes at once
    # Serve each adapter version merged into the weights (W + scaling * B @ A) instead of as a LoRA request.
    # None: merged on the CPU, where vLLM decodes a LoRA request at about a third of the base model's speed;
    # a LoRA on the GPU, where the punica kernels cost little and a merge would rewrite every weight per step.
    merge_adapter: bool | None = None

    def __post_init__(self):
        check_choice(self, "dtype", ("auto", "bfloat16", "float16", "float32"))
        check_number(self, "max_model_len", integer=True, ge=64)
        check_bool(self, "enable_prefix_caching")
        check_number(self, "max_images_per_prompt", integer=True, ge=1)
        check_number(self, "kv_cache_memory_bytes", integer=True, ge=1 << 20)
        check_number(self, "gpu_memory_utilization", gt=0, le=1)
        check_number(self, "max_num_seqs", integer=True, ge=1)
        check_choice(self, "merge_adapter", (None, True, False))


@dataclass(frozen=True, kw_only=True)
class EngineConfig(VllmConfig):
    model: str
    enable_lora: bool = True
    max_lora_rank: int = 32
    seed: int = 0

    def __post_init__(self):
        super().__post_init__()
        check_model_dir(self.model)

    @property
    def merged(self) -> bool:
        return self.enable_lora and (self.merge_adapter if self.merge_adapter is not None else not runtime.has_cuda())


@dataclass(frozen=True)
class Sampling:
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 32
    stop: tuple[str, ...] = ()

    @classmethod
    def greedy(cls, max_tokens: int = 32, stop: tuple[str, ...] = ()) -> "Sampling":
        return cls(0.0, 1.0, max_tokens, stop)


@dataclass
class Request:
    prompt_ids: list[int]
    images: list = field(default_factory=list)


@dataclass
class Generation:
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    expanded_prompt_len: int


def register_in_process(model: str | Path) -> None:
    """Hand vLLM the model's class, imported here. Otherwise vLLM inspects it in a fresh Python process, which
    imports vLLM all over again (5-6 s on 2 cores), whenever its cache under VLLM_CACHE_ROOT lacks the answer, as
    a new cache folder always does: a newcomer's first run, a run in a new folder. An engine whose core runs in
    this process (the CPU's in-process engine, rollout/runtime.py) imports the class here anyway to build the
    model, and vLLM reads a class registered as a class in this process. An engine core in its own process
    (GPU) builds the model there: importing the class here would be extra work before CUDA's fork, and
    vLLM's inspection runs once per cache folder."""
    if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") != "0":
        return
    from vllm import ModelRegistry

    config = json.loads((Path(model) / "config.json").read_text())
    for arch in config.get("architectures") or []:
        lazy = ModelRegistry.models.get(arch)
        if lazy is not None and hasattr(lazy, "module_name"):  # registered by name, not yet imported
            ModelRegistry.register_model(arch, lazy.load_model_cls())


class Engine:
    def __init__(self, cfg: EngineConfig):
        with runtime.gc_paused():
            from vllm import LLM

        self.cfg = cfg
        cuda = runtime.has_cuda()
        check_exact(cfg.model, "cuda" if cuda else "cpu")
        dtype = runtime.default_dtype() if cfg.dtype == "auto" else cfg.dtype
        kwargs = dict(
            model=cfg.model, dtype=dtype, max_model_len=cfg.max_model_len, seed=cfg.seed,
            enable_prefix_caching=cfg.enable_prefix_caching, max_num_seqs=cfg.max_num_seqs,
            limit_mm_per_prompt={"image": cfg.max_images_per_prompt},
            # Logprobs of the distribution actually sampled (temperature and banned tokens applied), the
            # one the trainer scores: raw logprobs would disagree whenever the temperature is not 1.
            logprobs_mode="processed_logprobs",
        )
        if cfg.enable_lora and not cfg.merged:
            kwargs.update(enable_lora=True, max_lora_rank=cfg.max_lora_rank, max_loras=2)
        if cuda:
            kwargs.update(gpu_memory_utilization=cfg.gpu_memory_utilization, enable_sleep_mode=True)
        else:
            kwargs.update(kv_cache_memory_bytes=cfg.kv_cache_memory_bytes, enforce_eager=True)
        t0 = time.perf_counter()
        register_in_process(cfg.model)
        # vLLM's start runs gc.collect several times, each scanning every object the imports made (about a
        # second in all for a tiny model, measured): frozen, the collector skips them while the engine starts.
        gc.freeze()
        try:
            self.llm = LLM(**kwargs)
        finally:
            gc.unfreeze()
        self.start_s = time.perf_counter() - t0
        self.tokenizer = self.llm.get_tokenizer()
        # Image and video markers are never sampled: one emitted by an untrained model would announce an
        # image that does not exist. The trainer scores the same restricted distribution (grpo.learner.forward).
        self.banned_ids = vision_token_ids(self.tokenizer)
        self.block_size = self.llm.llm_engine.vllm_config.cache_config.block_size
        self.adapters = None
        if cfg.merged:
            self.adapters = MergedLoader(self.llm, cfg.model)
        elif cfg.enable_lora:
            self.adapters = HotLoader(self.llm.llm_engine)
        self._asleep = False
        self._keys = itertools.count()
        self._params: dict = {}  # Sampling -> its SamplingParams
        self._running: set[str] = set()  # keys of the requests submitted and not yet returned by step

    def load_adapter(self, version: int, path: str | Path) -> LoadedAdapter:
        if self.adapters is None:
            raise RuntimeError("this engine was started with enable_lora=False: it cannot load adapters")
        if self._running and isinstance(self.adapters, MergedLoader):
            raise RuntimeError(f"{self.in_flight} requests are in flight on the merged weights: a new version "
                               "may be merged in only between rollouts")
        return self.adapters.load(version, path)

    @property
    def adapter_version(self) -> int | None:
        if self.adapters is None or self.adapters.current is None:
            return None
        return self.adapters.current.version

    def sampling_params(self, sampling: Sampling, **overrides):
        """vLLM's SamplingParams for `sampling`, as every generate call of this engine uses them."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        kwargs = dict(
            output_kind=RequestOutputKind.FINAL_ONLY,  # a reply comes back whole, once finished
            temperature=sampling.temperature, top_p=sampling.top_p, max_tokens=sampling.max_tokens,
            stop=list(sampling.stop) or None, logprobs=0, skip_special_tokens=False,
            logit_bias={i: -100.0 for i in self.banned_ids} or None,
            # vLLM detokenizes every generated token twice (the text, and the token beside its logprob), about
            # a quarter of a small model's generate call on the CPU. Only stop strings need its text: the
            # reply the env reads is decoded once, from the ids (ChatFormat.action_text).
            detokenize=bool(sampling.stop),
        )
        kwargs.update(overrides)
        return SamplingParams(**kwargs)

    def generate(self, requests: list[Request], sampling: Sampling, use_adapter: bool = True) -> list[Generation]:
        """One batch, all submitted at once and stepped until the last finishes: vLLM schedules them together."""
        keys = [self.submit(r, sampling, use_adapter) for r in requests]
        done: dict[str, Generation] = {}
        while self.in_flight:
            done.update(self.step())
        return [done[k] for k in keys]

    def submit(self, request: Request, sampling: Sampling, use_adapter: bool = True) -> str:
        """Queue one request on the engine without waiting; `step` returns it once sampled. Returns its key."""
        if self._asleep:
            raise RuntimeError("the engine is asleep: call wake_up() before generating")
        lora = None
        if isinstance(self.adapters, MergedLoader):
            # The merged weights serve every request in flight: they may change only when none is.
            if self._running and not self.adapters.serves(use_adapter):
                raise RuntimeError("requests with and without the adapter cannot be in flight together on a "
                                   "merged engine (engine.merge_adapter)")
            self.adapters.serve(use_adapter)
        elif use_adapter and self.adapters is not None:
            lora = HotLoader.request(self.adapters.current)
        (prompt,) = self.llm._preprocess_cmpl(vllm_prompts([request]))
        key = str(next(self._keys))
        # One SamplingParams for every request of a Sampling, as LLM.generate shares one (vLLM clones it).
        params = self._params.get(sampling) or self._params.setdefault(sampling, self.sampling_params(sampling))
        self.llm.llm_engine.add_request(key, prompt, params, lora_request=lora)
        self._running.add(key)
        return key

    def step(self) -> dict[str, Generation]:
        """One engine step over every request in flight: the ones it finished, by key."""
        done = {}
        for out in self.llm.llm_engine.step():
            if not out.finished:
                continue
            o = out.outputs[0]
            ids = list(o.token_ids)
            lps = [step[t].logprob for step, t in zip(o.logprobs, ids)]
            done[out.request_id] = Generation(ids, lps, o.finish_reason or "length", len(out.prompt_token_ids))
            self._running.discard(out.request_id)
        return done

    def abort(self, keys=None) -> None:
        """Drop requests in flight (`keys`, default all: an episode whose group starts over, a failed rollout);
        their outputs never come back."""
        keys = [k for k in (self._running if keys is None else keys) if k in self._running]
        if keys:
            self.llm.llm_engine.abort_request(keys)
            self._running.difference_update(keys)

    @property
    def in_flight(self) -> int:
        return len(self._running)

    def sleep(self) -> None:
        """Free accelerator memory for the trainer between rollouts; a no-op on the CPU."""
        if runtime.has_cuda() and not self._asleep:
            # Level 1 keeps the weights in host memory: the LoRA adapters survive it (level 2 drops them).
            self.llm.sleep(level=1)
            self._asleep = True

    def wake_up(self) -> None:
        if self._asleep:
            self.llm.wake_up()
            self.llm.reset_prefix_cache()
            self._asleep = False


def vllm_prompts(requests: list[Request]) -> list:
    """vLLM's prompt dicts for compact token ids plus their images."""
    from vllm.inputs import TokensPrompt

    prompts = []
    for r in requests:
        p = TokensPrompt(prompt_token_ids=list(r.prompt_ids))
        if r.images:
            p["multi_modal_data"] = {"image": list(r.images)}
        prompts.append(p)
    return prompts

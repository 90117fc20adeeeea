"""A thin wrapper around vLLM's offline `LLM`: token ids and images in, sampled ids and their logprobs out.

Prompts go in "compact" form: one `<|image_pad|>` per image, which vLLM expands to one token per merged
patch itself (handing it ids that are already expanded makes it expand them again). vLLM reports the
expanded ids it actually ran, so a caller can check them against its own expansion.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from rollout import runtime
from rollout.models import check_model_dir, vision_token_ids
from rollout.hotload import HotLoader, LoadedAdapter
from rollout.merged import MergedLoader

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineConfig:
    model: str
    dtype: str = "auto"
    max_model_len: int = 4096
    enable_lora: bool = True
    max_lora_rank: int = 32
    enable_prefix_caching: bool = True
    seed: int = 0
    max_images_per_prompt: int = 16
    # CPU: vLLM's default memory fraction refuses to start on these machines; a fixed size works.
    kv_cache_memory_bytes: int = 512 << 20
    # GPU: the share of memory vLLM may take while colocated with a trainer rank.
    gpu_memory_utilization: float = 0.4
    max_num_seqs: int = 256
    # Serve each adapter version merged into the weights (W + scaling * B @ A) instead of as a LoRA request.
    # None: merged on the CPU, where vLLM decodes a LoRA request at about a third of the base model's speed;
    # a LoRA on the GPU, where the punica kernels cost little and a merge would rewrite every weight per step.
    merge_adapter: bool | None = None

    def __post_init__(self):
        check_model_dir(self.model)
        if self.merge_adapter not in (None, True, False):
            raise ValueError(f"merge_adapter={self.merge_adapter!r}: use True, False or None (merged on the CPU only)")

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
    text: str
    finish_reason: str
    expanded_prompt_len: int


class Engine:
    def __init__(self, cfg: EngineConfig):
        from vllm import LLM

        self.cfg = cfg
        cuda = runtime.has_cuda()
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
        self.llm = LLM(**kwargs)
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

    def load_adapter(self, version: int, path: str | Path) -> LoadedAdapter:
        if self.adapters is None:
            raise RuntimeError("this engine was started with enable_lora=False: it cannot load adapters")
        return self.adapters.load(version, path)

    @property
    def adapter_version(self) -> int | None:
        if self.adapters is None or self.adapters.current is None:
            return None
        return self.adapters.current.version

    def sampling_params(self, sampling: Sampling, **overrides):
        """vLLM's SamplingParams for `sampling`, as every generate call of this engine uses them."""
        from vllm import SamplingParams

        kwargs = dict(
            temperature=sampling.temperature, top_p=sampling.top_p, max_tokens=sampling.max_tokens,
            stop=list(sampling.stop) or None, logprobs=0, skip_special_tokens=False,
            logit_bias={i: -100.0 for i in self.banned_ids} or None,
            # vLLM detokenizes every generated token twice (the text, and the token beside its logprob), about
            # a quarter of a small model's generate call on the CPU; without stop strings to match, one decode
            # of each finished reply (`reply_text`) gives the same text.
            detokenize=bool(sampling.stop),
        )
        kwargs.update(overrides)
        return SamplingParams(**kwargs)

    def generate(self, requests: list[Request], sampling: Sampling, use_adapter: bool = True) -> list[Generation]:
        """One engine call for the whole batch: vLLM schedules all sequences together."""
        if self._asleep:
            raise RuntimeError("the engine is asleep: call wake_up() before generating")
        params = self.sampling_params(sampling)
        prompts = vllm_prompts(requests)
        lora = None
        if isinstance(self.adapters, MergedLoader):
            self.adapters.serve(use_adapter)
        elif use_adapter and self.adapters is not None:
            lora = HotLoader.request(self.adapters.current)
        outs = self.llm.generate(prompts, params, lora_request=lora, use_tqdm=False)
        gens = []
        for out in outs:
            o = out.outputs[0]
            ids = list(o.token_ids)
            lps = [step[t].logprob for step, t in zip(o.logprobs, ids)]
            text = o.text if params.detokenize else self.reply_text(ids, o.finish_reason)
            gens.append(Generation(ids, lps, text, o.finish_reason or "length", len(out.prompt_token_ids)))
        return gens

    def reply_text(self, ids: list[int], finish_reason: str | None) -> str:
        """The text vLLM's detokenizer would give: a reply ended by an end-of-sequence or stop token leaves that
        token out of its text (vLLM's include_stop_str_in_output=False), one cut at max_tokens keeps all."""
        if finish_reason == "stop" and ids:
            ids = ids[:-1]
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

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

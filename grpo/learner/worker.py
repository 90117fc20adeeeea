"""The trainer: LoRA on a frozen base model, sharded with FSDP2 over ranks, one GRPO update per batch.

`TrainWorker` is one rank, a plain class: use it in-process with world_size=1 (nothing to shard, no
process group) or as a Ray actor per rank; grpo.driver.train_group starts `world_size` such actors and
forms their process group (gloo on CPU, NCCL on GPU).

Every rank receives the whole batch and deals itself its share of the segments by the same rule, so the
batch-level loss normaliser, the number of forward passes per rank (FSDP's collectives need the same
count on every rank) and the data of each rank follow from the batch alone, with no exchange of metadata.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import time
from typing import Any, Sequence

import torch

from grpo.algo.config import AlgorithmConfig, check_number
from grpo.algo.loss import LossOutput, loss_normalizer, merge_metrics, policy_loss
from grpo.learner import checkpoint, dist, forward, packing, shared_prompt
from grpo.learner.config import TrainConfig
from grpo.learner.lora import LoraConfig, adapter_config, adapter_tensors, apply_lora
from grpo.learner.plan import Plan, micro_batches, shard, split, token_rows
from grpo.learner.tokens import Item, token_advantages, trained_masks
from grpo.learner.vision_cache import VisionCache
from rollout import runtime

_REFERENCE = "reference"  # the adapter name of the frozen copy of the starting adapter: the KL reference


class TrainWorker:
    """One trainer rank. With world_size > 1 call `setup(master_addr, master_port)` on every rank, at
    the same time, before training (`TrainGroup` does); with world_size=1 the constructor does it."""

    def __init__(self, model_path: str, *, lora: LoraConfig | None = None,
                 algorithm: AlgorithmConfig | None = None, train: TrainConfig | None = None,
                 temperature: float = 1.0, total_steps: int | None = None,
                 adapter_path: str | None = None, rank: int = 0, world_size: int = 1, dtype: str = "auto",
                 cpu_threads: int | None = None):
        if not (isinstance(world_size, int) and world_size >= 1 and isinstance(rank, int) and 0 <= rank < world_size):
            raise ValueError(f"rank must be in [0, world_size) with world_size >= 1, got rank={rank}, "
                             f"world_size={world_size}")
        self.lora = lora or LoraConfig()
        self.algorithm = algorithm or AlgorithmConfig()
        self.train = train or TrainConfig()
        # Logits are divided by the temperature vLLM sampled at before scoring; the schedule runs over total_steps.
        self.temperature, self.total_steps = temperature, total_steps
        check_number(self, "temperature", gt=0, hint="the sampling temperature, rollout.temperature")
        self.train.check_length(self, "total_steps")
        self.rank, self.world_size = rank, world_size
        self.device = torch.device(runtime.device())
        runtime.keep_freed_memory()  # a step's activations reuse the last step's memory (docs/memory.md)
        if self.device.type == "cpu":
            # One OpenMP thread per rank: more threads than cores per process thrash (docs/design.md, "Threads"). A
            # single rank takes every core: Ray starts a 1-CPU actor with one thread, and the rollout engine idles
            # while the trainer runs.
            cores = len(os.sched_getaffinity(0))  # the cores this process may run on (a pinned node has fewer)
            threads = cpu_threads if cpu_threads is not None else (1 if world_size > 1 else cores)
            torch.set_num_threads(threads)
        if self.train.dtype != "auto":
            dtype = self.train.dtype
        dtype_name = runtime.default_dtype() if dtype == "auto" else dtype
        # Same seed on every rank: each initialises the adapter identically before FSDP keeps its shard.
        torch.manual_seed(self.train.seed)
        base = forward.load_model(model_path, dtype=getattr(torch, dtype_name))
        if adapter_path is not None:
            from peft import PeftConfig, PeftModel

            # The adapter's own lora_dropout (SFT often trains with 0.05) would make the trainer's logprobs
            # noisy against the old ones and vLLM's: the run's lora.dropout (0, LoraConfig) replaces it.
            config = PeftConfig.from_pretrained(adapter_path)
            config.lora_dropout = self.lora.dropout
            self.model = PeftModel.from_pretrained(base, adapter_path, is_trainable=True, config=config)
            if self.algorithm.kl_coef > 0:
                # The KL reference is the starting policy, not the base model before SFT: the same adapter
                # once more, frozen, beside the trained one (no second model in memory).
                self.model.load_adapter(adapter_path, adapter_name=_REFERENCE, is_trainable=False)
        else:
            self.model = apply_lora(base, self.lora)
        self.model.to(self.device)
        if self.train.tokens_per_micro_batch is not None:
            packing.prepare(self.model)
        if self.train.share_prompts:
            shared_prompt.prepare(self.model)
        if self.train.activation_checkpointing:
            base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.processor = forward.load_processor(model_path)
        self._image_tokens: dict[tuple, int] = {}  # image size -> its tokens as the model runs it
        self._vision = VisionCache(self.model)
        self.pad_id = forward.tokenizer_of(self.processor).pad_token_id
        self.step = 0  # train_step calls so far
        self.adapter_version: int | None = None  # the last version this trainer published
        self.optimizer, self._fsdp = None, False
        if world_size == 1:
            self.setup()

    # ------------------------------------------------------------------------------------------- setup
    def rendezvous_address(self) -> tuple[str, int]:
        """Rank 0's node address and a port free there, for every rank's `setup`."""
        return dist.node_address(), dist.free_port()

    def setup(self, master_addr: str | None = None, master_port: int | None = None) -> None:
        if self.optimizer is not None:
            raise RuntimeError("setup() already ran on this worker")
        if self.world_size > 1:
            if master_addr is None or master_port is None:
                raise ValueError("world_size > 1 needs master_addr and master_port (rank 0's rendezvous_address())")
            dist.init_process_group(self.rank, self.world_size, master_addr, master_port)
            self._shard()
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        t = self.train
        self.optimizer = torch.optim.AdamW(self.params, lr=t.lr_at(0, self.total_steps), betas=tuple(t.betas),
                                           eps=t.adam_eps, weight_decay=t.weight_decay)

    def _shard(self) -> None:
        from torch.distributed.fsdp import fully_shard

        # Decoder layers are units of their own; everything else, the vision tower included, stays in the
        # root unit: with vision blocks as units, a rank whose micro-batch has no image skips their
        # collectives and gloo aborts (docs/design.md, "FSDP2").
        for layer in self.model.get_base_model().get_decoder().layers:
            fully_shard(layer)
        fully_shard(self.model)
        self._fsdp = True

    def close(self) -> None:
        dist.destroy()

    # ---------------------------------------------------------------------------------------- training
    def train_step(self, trajectories: Sequence, advantages: Sequence[float] | torch.Tensor) -> dict[str, float]:
        """One batch: `updates_per_batch` optimizer updates over mini-batches of its segments.

        `advantages[i]` applies to every generated token of `trajectories[i]`: one number, or a list with
        one number per turn (step-level advantages) that applies to that turn's reply. Call it
        on every rank with the same whole batch. Returns metrics reduced over ranks (identical on each):
        loss (mean over updates), clip_fraction, ratio_mean, kl (with kl_coef > 0), sampler_abs_diff and
        sampler_abs_diff_max (trainer vs vLLM logprobs of the sampled tokens: the alarm for a silent sync
        failure), grad_norm (before clipping, mean over updates), lr, tokens_per_s (all tokens the model
        ran), generated_tokens, sequences, updates, step; and those of the loss_type, importance sampling and
        masks in use (docs/algorithms.md).
        """
        self._require_setup()
        t0 = time.perf_counter()
        advantages = advantages.tolist() if torch.is_tensor(advantages) else list(advantages)
        if len(advantages) != len(trajectories):
            raise ValueError(f"{len(trajectories)} trajectories but {len(advantages)} advantages: one per trajectory")
        items = []
        for e, (traj, a) in enumerate(zip(trajectories, advantages)):
            masks = trained_masks(traj, self.algorithm.mask_truncated)
            trained = sum(int(m.sum()) for m in masks)
            # A segment with no trained token (none generated, or every reply cut at the limit) adds nothing.
            items += [Item(seg, adv, m, e, trained) for seg, adv, m in zip(traj.segments, token_advantages(traj, a),
                                                                           masks) if m.any()]
        split_episodes = [trajectories[i].task_id for i in {it.episode for it in items}
                          if sum(it.episode == i for it in items) > 1]
        if self.algorithm.sequence_level and split_episodes:
            name = self.algorithm.sequence_level[0]
            raise ValueError(f"algorithm.{name}={getattr(self.algorithm, name)!r} reads all the tokens of an episode "
                             f"in one forward, but episode {split_episodes[0]} came as several segments (a turn "
                             "each: rollout.history text or none, or an agent's calls that do not continue each "
                             "other); set rollout.history: full, or turn the setting off")
        lr = self.train.lr_at(self.step, self.total_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.step += 1
        if not items:
            # Nothing was generated: no loss to normalise. The step still counts, so the schedule and
            # a resumed run stay aligned with the caller's steps.
            return {"step": float(self.step), "lr": lr, "skipped": 1.0, "updates": 0.0}

        # Mini-batches take whole units: segments, or with a per-episode mean whole episodes (an episode's
        # mean must be complete within one update).
        by_key: dict[int, list[int]] = {}
        for i, item in enumerate(items):
            by_key.setdefault(i if self.algorithm.loss_agg == "token_mean" else item.episode, []).append(i)
        units = list(by_key.values())
        dealt = split(len(units), self.train.updates_per_batch, self.train.seed * 1_000_003 + self.step)
        plans = [self._plan(items, sorted(i for u in part for i in units[u])) for part in dealt]
        expanded = {i: self._expand(items[i]) for plan in plans for mb, _ in plan.schedule() for i in mb}
        # The first update's old logprobs are its own forward's, detached: only the later ones are scored first,
        # and none with old_logprobs "sampler" (every update's old policy is then the sampler's).
        sampler_old = self.algorithm.old_logprobs == "sampler"
        scored = self._score(plans[1:], expanded) if len(plans) > 1 and not sampler_old else None
        outputs, norms, ran_tokens, first = [], [], 0, None
        try:
            for k, plan in enumerate(plans):
                plan_outputs, n_tokens = self._update(plan, items, expanded, scored if k else None)
                outputs, ran_tokens, first = outputs + plan_outputs, ran_tokens + n_tokens, first or plan_outputs
                norms.append(self._last_grad_norm)
        finally:
            self._vision.clear()
        metrics = merge_metrics(outputs, dist.all_reduce)
        if sampler_old:  # the later updates' forwards see weights this batch moved: only the first one's compare
            metrics.update({k: v for k, v in merge_metrics(first, dist.all_reduce).items() if "sampler_abs" in k})
        (ran_tokens,) = dist.all_reduce([float(ran_tokens)])
        # Measured before the release: rss_gb is what the step left resident, heap_free_gb what it had freed.
        rss_gb, peak_rss_gb, heap_free, heap_released = dist.all_reduce(
            [*runtime.resident_memory_gb(), *map(float, runtime.release_freed_memory())], op="max")
        metrics.update({
            # Each rank's loss carries a factor world_size (its normaliser is divided by it, as FSDP averages
            # gradients); the batch loss is their mean, averaged over the updates.
            "loss": metrics["loss"] / self.world_size / len(plans),
            "grad_norm": sum(norms) / len(norms),
            "lr": lr,
            "tokens_per_s": ran_tokens / (time.perf_counter() - t0),
            "sequences": float(len(items)),
            "updates": float(len(plans)),
            "step": float(self.step),
            "skipped": 0.0,
            "rss_gb": rss_gb,
            "peak_rss_gb": peak_rss_gb,
            "heap_free_gb": heap_free / 1e9,
            "heap_released": heap_released,
        })
        return metrics

    def _plan(self, items: list[Item], chunk: list[int]) -> Plan:
        lengths = {i: self._length(items[i].segment) for i in chunk}
        shares, budget = shard(chunk, lengths, self.world_size), self.train.tokens_per_micro_batch
        prompts = {i: shared_prompt.prompt_of(items[i].segment) for i in chunk} if self.train.share_prompts else None
        micro = [micro_batches(s, lengths, self.train.micro_batch_size, prompts) if budget is None else
                 token_rows({i: lengths[i] for i in s}, budget) for s in shares]
        masks = [items[i].mask[None] for i in chunk]
        episodes = len({items[i].episode for i in chunk})
        return Plan(micro=micro[self.rank], passes=max(len(m) for m in micro),
                     normalizer=loss_normalizer(masks, self.algorithm, episodes), filler=chunk[0])

    def _length(self, seg) -> int:
        """The tokens the model runs for a segment, images expanded, without processing its images."""
        extra = 0
        for img in seg.images:
            if img.size not in self._image_tokens:
                self._image_tokens[img.size] = forward.image_length(self.processor, img)
            extra += self._image_tokens[img.size] - 1
        return len(seg.token_ids) + extra

    def _expand(self, item: Item) -> forward.Expanded:
        seg = item.segment
        return forward.expand(self.processor, seg.token_ids, seg.images, [
            item.mask,
            torch.as_tensor(seg.sampler_logprobs, dtype=torch.float32),
            item.advantages,
        ])

    def _batch(self, indices: list[int], expanded: dict, extra: dict | None = None) -> forward.Batch:
        seqs = []
        for i in indices:
            e = expanded[i]
            seqs.append(dataclasses.replace(e, per_token=list(e.per_token) + (list(extra[i]) if extra else [])))
        if self.train.tokens_per_micro_batch is None:
            batch = forward.collate(self.processor, seqs, self.pad_id)
        else:
            batch = packing.pack(self.processor, seqs, self.model)
        move = lambda t: None if t is None else t.to(self.device)  # noqa: E731
        return dataclasses.replace(
            batch, input_ids=move(batch.input_ids), attention_mask=move(batch.attention_mask),
            per_token=[move(t) for t in batch.per_token], pixel_values=move(batch.pixel_values),
            image_grid_thw=move(batch.image_grid_thw), position_ids=move(batch.position_ids),
            seq_starts=move(batch.seq_starts), share_prompts=self.train.share_prompts)

    def _spans(self, batch: forward.Batch, indices: list[int], expanded: dict):
        """(item, row, start, length) of each sequence of a micro-batch, padded or packed."""
        offset = 0
        for row, i in enumerate(indices):
            n = len(expanded[i].input_ids)
            yield (i, row, 0, n) if batch.seq_starts is None else (i, 0, offset, n)
            offset += n

    def _reference(self, batch: forward.Batch, mask: torch.Tensor) -> torch.Tensor | None:
        """The starting policy's logprobs: the frozen copy of the starting adapter, or with a fresh adapter
        (zero update) the base model with the adapter switched off."""
        if self.algorithm.kl_coef == 0:
            return None
        training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad(), self._reference_weights():
                return forward.token_logprobs(self.model, batch, mask, self.temperature)
        finally:
            self.model.train(training)

    @contextlib.contextmanager
    def _reference_weights(self):
        if _REFERENCE not in self.model.peft_config:
            with self.model.disable_adapter():
                yield
            return
        # set_adapter also sets requires_grad (the active adapter trainable, the others frozen): switching
        # back restores the trained adapter's gradients and leaves the reference frozen.
        self.model.set_adapter(_REFERENCE, inference_mode=True)
        try:
            yield
        finally:
            self.model.set_adapter("default")

    def _score(self, plans: list[Plan], expanded: dict) -> dict[int, list[torch.Tensor]]:
        """Logprobs before any update of this batch (and the reference's): the old policy of every
        mini-batch after the first, whose own forward would already see updated weights."""
        self.model.eval()
        scored = {}
        for plan in plans:
            for indices, _ in plan.schedule():
                batch = self._batch(indices, expanded)
                mask = batch.per_token[0]
                with torch.no_grad(), self._vision.micro_batch(tuple(indices)):
                    old = forward.token_logprobs(self.model, batch, mask, self.temperature)
                    ref = self._reference(batch, mask)
                for i, row, start, n in self._spans(batch, indices, expanded):
                    scored[i] = [old[row, start:start + n].cpu()] + ([] if ref is None else
                                                                      [ref[row, start:start + n].cpu()])
        return scored

    def _update(self, plan: Plan, items: list[Item], expanded: dict, scored: dict | None):
        self.model.train()
        schedule = plan.schedule()
        outputs: list[LossOutput] = []
        ran_tokens = 0
        for k, (indices, real) in enumerate(schedule):
            if self._fsdp:
                # Reduce-scatter the accumulated gradients once, after the last micro-batch.
                self.model.set_requires_gradient_sync(k == len(schedule) - 1)
            batch = self._batch(indices, expanded, scored)
            mask, sampler, adv = batch.per_token[0], batch.per_token[1], batch.per_token[2]
            with self._vision.micro_batch(tuple(indices)):
                if scored is None:
                    ref = self._reference(batch, mask)
                else:
                    ref = batch.per_token[4] if len(batch.per_token) > 4 else None
                entropy = None
                if self.algorithm.top_entropy_quantile < 1:
                    logprobs, entropy = forward.token_logprobs(self.model, batch, mask, self.temperature, entropy=True)
                else:
                    logprobs = forward.token_logprobs(self.model, batch, mask, self.temperature)
            old = logprobs.detach() if scored is None else batch.per_token[3]
            if self.algorithm.old_logprobs == "sampler":  # the sampler's are the old policy; the trainer's take
                old, sampler = sampler, old  # their place in |old - sampler|: sampler_abs_diff stays the sync alarm
            # A filler pass only keeps this rank's collectives in step with the others: with no token in its
            # loss mask it has loss 0, no gradient and no weight in the metrics.
            episode_tokens = torch.tensor([float(items[i].episode_tokens) for i in indices])
            if batch.seq_starts is not None:  # per token: a packed row holds several episodes' sequences
                spans = list(self._spans(batch, indices, expanded))
                episode_tokens = torch.cat([torch.full((n,), float(items[i].episode_tokens))
                                            for i, _, _, n in spans])[None]
                episodes = torch.cat([torch.full((n,), items[i].episode) for i, _, _, n in spans])[None]
            else:
                episodes = torch.tensor([items[i].episode for i in indices])[:, None].expand(mask.shape)
            out = policy_loss(logprobs, old, adv, mask if real else torch.zeros_like(mask), self.algorithm,
                              plan.normalizer / self.world_size, ref_logprobs=ref, sampler_logprobs=sampler,
                              sequence_tokens=episode_tokens, sequence_ids=episodes.to(mask.device), entropy=entropy)
            out.loss.backward()
            outputs.append(out)
            if real:
                ran_tokens += int(batch.attention_mask.sum())
        # Summed over ranks, as the gradient norm is: a NaN on any rank stops every rank.
        loss_sum = dist.all_reduce([sum(float(out.loss.detach()) for out in outputs)])[0]
        self._last_grad_norm = self._clip_gradients()
        self._require_finite(loss_sum, self._last_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return outputs, ran_tokens

    def _require_finite(self, loss: float, grad_norm: float) -> None:
        """Refuse an update whose loss or gradient norm is not finite: the adapter would turn NaN, each later too."""
        if math.isfinite(loss) and math.isfinite(grad_norm):
            return
        self.optimizer.zero_grad(set_to_none=True)
        published = "none yet" if self.adapter_version is None else f"v{self.adapter_version}"
        raise FloatingPointError(
            f"train step {self.step}: loss {loss} and gradient norm {grad_norm}; the update was not applied and "
            f"nothing was published, so the last published adapter ({published}) and the last checkpoint are "
            "intact. Look for a non-finite reward or advantage in the batch, or lower train.lr if the loss grew "
            "step by step before this one.")

    def _clip_gradients(self) -> float:
        """The global L2 norm of the LoRA gradients over all ranks; scales them to max_grad_norm if above."""
        from torch.distributed.tensor import DTensor

        grads = [p.grad for p in self.params if p.grad is not None]
        # Under FSDP2 each gradient is a DTensor holding this rank's disjoint shard: the squares of the
        # local shards, summed over ranks, are the squares of the full gradients.
        local = sum((g.to_local() if isinstance(g, DTensor) else g).double().pow(2).sum().item() for g in grads)
        norm = math.sqrt(dist.all_reduce([local])[0])
        limit = self.train.max_grad_norm
        if limit is not None and norm > limit:
            scale = limit / (norm + 1e-6)
            for g in grads:
                g.mul_(scale)
        return norm

    def _require_setup(self) -> None:
        if self.optimizer is None:
            raise RuntimeError("call setup(master_addr, master_port) on every rank before training")

    # ------------------------------------------------------------------------------------- the adapter
    def gather_adapter(self) -> dict[str, torch.Tensor] | None:
        """The full LoRA tensors under peft's saved key names, on the CPU, on rank 0 (None elsewhere);
        collective. The keys equal `lora.adapter_tensors()` of the same model unsharded."""
        self._require_setup()
        if not self._fsdp:
            return adapter_tensors(self.model)
        from peft import get_peft_model_state_dict
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(self.model, options=StateDictOptions(
            full_state_dict=True, cpu_offload=True, ignore_frozen_params=True))
        if self.rank != 0:
            return None
        # peft's own renaming (it drops the adapter name, ".default"), applied to the gathered tensors.
        return {k: v.contiguous() for k, v in get_peft_model_state_dict(self.model, state_dict=full).items()}

    def publish(self, store_root: str) -> int:
        """Gather the adapter, publish it as the store's next version (rank 0 writes); collective. Returns it."""
        from sync import AdapterStore

        tensors = self.gather_adapter()
        version = None
        if self.rank == 0:
            version = AdapterStore(store_root).publish(tensors, adapter_config(self.model))
        self.adapter_version = dist.broadcast_object(version)
        return self.adapter_version

    # ------------------------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, root: str, *, state: dict | None = None, keep_last: int = 2) -> str:
        """Checkpoint LoRA weights, optimizer state, step, adapter version, `state` (anything else the caller
        needs to resume: the data cursor, ...) and each rank's random state; collective. Returns its folder."""
        self._require_setup()
        trainer_state = {"adapter_version": self.adapter_version, "state": state,
                         "train_config": dataclasses.asdict(self.train)}
        return checkpoint.save(root, self.step, self.model, self.optimizer, trainer_state, keep_last).path

    def load_checkpoint(self, root: str) -> dict[str, Any] | None:
        """Resume from the newest kept checkpoint under root that verifies; collective. Returns {"step", "path",
        "adapter_version", "state"} as saved and "skipped" (a line per newer checkpoint that failed
        verification), or None when root holds no checkpoint.
        Publish the adapter again before rolling out: the store may hold versions from after the checkpoint."""
        self._require_setup()
        found = checkpoint.load(root, self.model, self.optimizer)
        if found is None:
            return None
        info, saved = found
        self.step = info.step
        self.adapter_version = saved["adapter_version"]
        # Checkpoints written before December 2026 also hold a "data_cursor": unused, the cursor is in `state`.
        return {"step": info.step, "path": info.path, "adapter_version": saved["adapter_version"],
                "state": saved["state"], "skipped": info.notes()}

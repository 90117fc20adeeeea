"""The driver's handle on the train ranks: `world_size` TrainWorker Ray actors in one process group."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from grpo.algo.config import AlgorithmConfig
from grpo.driver.fault import ActorFault, arm, gather
from grpo.learner import checkpoint
from grpo.learner.config import TrainConfig
from grpo.learner.lora import LoraConfig
from grpo.learner.worker import TrainWorker


@dataclass
class StoredEpisodes:
    """A batch that stays in Ray's object store until the train ranks read it: one ObjectRef a group
    (grpo.driver.rollout_pool.RolloutPool.rollout_stored) and the (group, position) of each episode to train
    on, in order. The driver holds the references, never the token segments and images."""
    groups: list
    picks: list[tuple[int, int]]

    @classmethod
    def of(cls, groups: list, indices: Sequence[int], group_size: int) -> StoredEpisodes:
        """The episodes at `indices` of a batch of `groups`, carrying only the groups they are in."""
        used = sorted({i // group_size for i in indices})
        at = {k: n for n, k in enumerate(used)}
        return cls([groups[k] for k in used], [(at[i // group_size], i % group_size) for i in indices])

    def read(self) -> list:
        """The episodes, in order, read from the object store."""
        import ray

        groups = ray.get(self.groups)
        return [groups[k][j] for k, j in self.picks]


def _train_stored(worker: TrainWorker, episodes: StoredEpisodes, advantages: list) -> dict[str, float]:
    return worker.train_step(episodes.read(), advantages)


class TrainGroup:
    """`world_size` TrainWorker Ray actors in one process group, driven from this process.

    Needs `ray.init` first. Each rank gets a placement-group bundle of `cpus_per_rank` CPUs, the custom
    `resources` given and, when the cluster has GPUs (or `gpus_per_rank` says so), one GPU; PACK keeps the
    ranks on as few nodes as fit. Starting waits at most `start_timeout_s`, every later call at most
    `call_timeout_s`; a rank that died or did not answer raises grpo.driver.fault.ActorFault.
    """

    def __init__(self, model_path: str, world_size: int = 2, *, lora: LoraConfig | None = None,
                 algorithm: AlgorithmConfig | None = None, train: TrainConfig | None = None,
                 temperature: float = 1.0, total_steps: int | None = None,
                 adapter_path: str | None = None, dtype: str = "auto", cpus_per_rank: float = 1,
                 gpus_per_rank: float | None = None, resources: dict | None = None, start_timeout_s: float = 600,
                 call_timeout_s: float = 1800):
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if gpus_per_rank is None:
            gpus_per_rank = 1 if ray.cluster_resources().get("GPU", 0) > 0 else 0
        bundle = {"CPU": cpus_per_rank, **({"GPU": gpus_per_rank} if gpus_per_rank else {}), **(resources or {})}
        self.world_size = world_size
        self.step = 0
        self.call_timeout_s = call_timeout_s
        self.workers: list = []
        self._pg = placement_group([dict(bundle) for _ in range(world_size)], strategy="PACK")
        try:
            ready, _ = ray.wait([self._pg.ready()], timeout=start_timeout_s)
            if not ready:
                raise ActorFault("train ranks", f"no room for {world_size} x {bundle} within {start_timeout_s:g} s "
                                 "(fault.start_timeout_s)")
            actor = ray.remote(TrainWorker)
            self.workers = [
                actor.options(num_cpus=cpus_per_rank, num_gpus=gpus_per_rank, resources=dict(resources or {}),
                              scheduling_strategy=PlacementGroupSchedulingStrategy(self._pg, r)).remote(
                    model_path, lora=lora, algorithm=algorithm, train=train, temperature=temperature,
                    total_steps=total_steps, adapter_path=adapter_path,
                    rank=r, world_size=world_size, dtype=dtype)
                for r in range(world_size)
            ]
            # With one rank the worker sets itself up (no process group to form).
            if world_size > 1:
                addr, port = gather([("train_rank-0", self.workers[0].rendezvous_address.remote())],
                                    start_timeout_s, "starting the train ranks")[0]
                gather(self._named([w.setup.remote(addr, port) for w in self.workers]), start_timeout_s,
                       "forming the train ranks' process group")
            else:
                gather(self._named([self.workers[0].__ray_ready__.remote()]), start_timeout_s,
                       "starting the train rank")
        except BaseException:
            self.shutdown()
            raise

    def _named(self, refs: list) -> list:
        return [(f"train_rank-{r}", ref) for r, ref in enumerate(refs)]

    def _all(self, method: str, *args, **kwargs) -> list:
        return gather(self._named([getattr(w, method).remote(*args, **kwargs) for w in self.workers]),
                      self.call_timeout_s, method)

    def train_step(self, trajectories: Sequence | StoredEpisodes, advantages,
                   faults: Sequence = ()) -> dict[str, float]:
        """One step on every rank, on trajectories or on episodes left in the object store (StoredEpisodes);
        `faults` (injected, grpo.driver.fault) fire in the named ranks during it."""
        import ray

        if torch.is_tensor(advantages):
            advantages = advantages.tolist()
        for f in faults:
            arm(self.workers[f.index], f)
        # One copy in the object store, read by every rank.
        advantages = ray.put(list(advantages))
        if isinstance(trajectories, StoredEpisodes):
            calls = [w.__ray_call__.remote(_train_stored, trajectories, advantages) for w in self.workers]
            metrics = gather(self._named(calls), self.call_timeout_s, "train_step")[0]
        else:
            metrics = self._all("train_step", ray.put(list(trajectories)), advantages)[0]
        self.step = int(metrics["step"])
        return metrics

    def gather_adapter(self) -> dict[str, torch.Tensor]:
        return self._all("gather_adapter")[0]

    def publish(self, store_root: str) -> int:
        return self._all("publish", os.fspath(store_root))[0]

    def save_checkpoint(self, root: str, *, state: dict | None = None, keep_last: int = 2) -> str:
        """As TrainWorker.save_checkpoint, plus this (driver) process's random state."""
        wrapped = {"driver_rng": checkpoint.rng_state(), "state": state}
        return self._all("save_checkpoint", os.fspath(root), state=wrapped, keep_last=keep_last)[0]

    def load_checkpoint(self, root: str) -> dict[str, Any] | None:
        resumed = self._all("load_checkpoint", os.fspath(root))[0]
        if resumed is None:
            return None
        checkpoint.set_rng_state(resumed["state"]["driver_rng"])
        resumed["state"] = resumed["state"]["state"]
        self.step = resumed["step"]
        return resumed

    def shutdown(self) -> None:
        """Kill the actors and free their placement group; safe to call twice."""
        import ray
        from ray.util.placement_group import remove_placement_group

        for w in self.workers:
            ray.kill(w)
        self.workers = []
        if self._pg is not None:
            remove_placement_group(self._pg)
            self._pg = None

"""What a run asks Ray for, against what the cluster has, before anything is placed.

Each train rank is a placement-group bundle (grpo.driver.train_group) and each rollout worker an actor
(grpo.driver.rollout_pool); each asks for one CPU, a share of a GPU and the custom resources of
cluster.train_resources or cluster.rollout_resources. The share is 0.5 colocated (a rank and an engine on each
GPU), 1 not colocated, 0 on a cluster without GPUs. Ray does not refuse an ask the cluster cannot meet: it
waits for room (fault.start_timeout_s, 900 s) and the wait is retried as an actor fault, so `plan` refuses
here instead, in seconds, with the numbers and the fields to change.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

AUTO = "auto"
# cluster.train_ranks "auto" on a cluster without GPUs: two gloo ranks, so FSDP shards on the CPU as the
# default always did.
CPU_RANKS = 2


class ResourceError(ValueError):
    """The run asks for more than the cluster has; the message gives the numbers and the fields to change."""


@dataclass(frozen=True)
class Placement:
    train_ranks: int     # cluster.train_ranks, "auto" resolved
    gpu_share: float     # GPU per train rank and per rollout worker (0: none)
    rank: dict           # what one train rank asks for
    worker: dict         # what one rollout worker asks for
    workers: int         # cluster.rollout_workers

    @property
    def total(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for ask, n in ((self.rank, self.train_ranks), (self.worker, self.workers)):
            for name, amount in ask.items():
                out[name] = out.get(name, 0) + amount * n
        return out


def train_ranks(cluster, gpus: float) -> int:
    """cluster.train_ranks with "auto" resolved: one rank a GPU (colocated: each shares its GPU with an
    engine; not colocated: the GPUs the rollout workers leave), CPU_RANKS without GPUs."""
    if cluster.train_ranks != AUTO:
        return cluster.train_ranks
    if gpus <= 0:
        return CPU_RANKS
    whole = math.floor(gpus)
    return max(1, whole if cluster.colocate else whole - cluster.rollout_workers)


def cpus_to_start(cluster) -> int:
    """CPUs a Ray started here must declare at least (one an actor); "auto" counts CPU_RANKS, as a GPU box
    has more cores than GPUs and `plan` refuses with the numbers where it has not."""
    return cluster.rollout_workers + (CPU_RANKS if cluster.train_ranks == AUTO else cluster.train_ranks)


def plan(cluster, have: Mapping[str, float]) -> Placement:
    """What the run asks for on a cluster with the resources `have` (ray.cluster_resources()); raises
    ResourceError when the sum exceeds them."""
    gpus = float(have.get("GPU", 0))
    share = (0.5 if cluster.colocate else 1.0) if gpus > 0 else 0.0
    gpu = {"GPU": share} if share else {}
    placement = Placement(train_ranks(cluster, gpus), share, {"CPU": 1, **gpu, **cluster.train_resources},
                          {"CPU": 1, **gpu, **cluster.rollout_resources}, cluster.rollout_workers)
    short = {name: (amount, float(have.get(name, 0))) for name, amount in placement.total.items()
             if amount > have.get(name, 0) + 1e-9}
    if short:
        raise ResourceError(_refusal(placement, cluster, have, short))
    return placement


def _refusal(p: Placement, cluster, have: Mapping[str, float], short: dict) -> str:
    gaps = ", ".join(f"{_n(asked)} {name} asked, {_n(there)} there" for name, (asked, there) in short.items())
    where = ("colocated: a rank and an engine on each GPU" if cluster.colocate else "not colocated: a GPU each")
    ranks = _count(p.train_ranks, "train rank") + (" (cluster.train_ranks: auto)" if cluster.train_ranks == AUTO
                                                    else " (cluster.train_ranks)")
    lines = [f"the run asks Ray for more than the cluster has: {gaps}.",
             f"  asked: {ranks} x {_ask(p.rank)} + {_count(p.workers, 'rollout worker')} (cluster.rollout_workers) x "
             f"{_ask(p.worker)}" + (f", {where}" if p.gpu_share else ""),
             f"  the cluster has (ray.cluster_resources()): {_ask({k: have[k] for k in sorted(have) if k in p.total})}",
             "  to change:"]
    for name, (_, there) in short.items():
        lines += [f"  - {fix}" for fix in _fixes(name, there, p, cluster)]
    return "\n".join(lines)


def _fixes(name: str, there: float, p: Placement, cluster) -> list[str]:
    if name == "GPU":
        fit_ranks = math.floor((there - p.workers * p.gpu_share) / p.gpu_share + 1e-9)
        fit_workers = math.floor((there - p.gpu_share) / p.gpu_share + 1e-9)
        out = []
        if fit_ranks >= 1:
            out.append(f"cluster.train_ranks: {fit_ranks}" + (" (or auto: one a GPU)" if cluster.train_ranks != AUTO
                                                              else ""))
        elif fit_workers >= 1:
            out.append(f"cluster.rollout_workers: {fit_workers} and cluster.train_ranks: 1")
        if not cluster.colocate:
            out.append("cluster.colocate: true (a rank and an engine share each GPU; vLLM sleeps while training)")
        return out + [f"or a cluster with {_n(p.total['GPU'])} GPUs"]
    if name == "CPU":
        return [f"cluster.train_ranks + cluster.rollout_workers at most {math.floor(there)} (one CPU each; now "
                f"{p.train_ranks} + {p.workers})", "or nodes with more CPUs (`ray start --num-cpus N`)"]
    users = [f"cluster.{field} ({_n(ask[name])} each)" for field, ask in
             (("train_resources", p.rank), ("rollout_resources", p.worker)) if name in ask]
    return [f"{' and '.join(users)} asks for {name!r}: lower or remove it there, or declare it on the nodes "
            f"(`ray start --resources '{{\"{name}\": {math.ceil(p.total[name])}}}'`)"]


def _ask(resources: Mapping[str, float]) -> str:
    return "{" + ", ".join(f"{k}: {_n(v)}" for k, v in resources.items()) + "}"


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def _n(x: float) -> str:
    return f"{x:g}"

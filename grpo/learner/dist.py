"""The trainer ranks' process group: backend, rendezvous address, and the few collectives it needs.

The device decides the backend (gloo on CPU, NCCL on GPU). Rank 0 picks the rendezvous port on its own
node, since only a process there can tell which ports are free; the driver passes it to every rank.
"""
from __future__ import annotations

import socket
from datetime import timedelta

import torch
import torch.distributed as dist

from rollout import runtime


def backend() -> str:
    return "nccl" if runtime.has_cuda() else "gloo"


def node_address() -> str:
    """This node's address as the other nodes reach it (Ray's view when running inside Ray)."""
    try:
        import ray

        if ray.is_initialized():
            return ray.util.get_node_ip_address()
    except ImportError:
        pass
    return "127.0.0.1"


def free_port() -> int:
    """A TCP port free on this node now. Another process may take it before rank 0 binds it: rare, and
    the group's start then fails loudly (address in use) rather than joining the wrong group."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def init_process_group(rank: int, world_size: int, master_addr: str, master_port: int,
                       timeout_s: float = 600.0) -> None:
    if dist.is_initialized():
        raise RuntimeError(
            "this process already belongs to a process group: run one trainer rank per process "
            "(a Ray actor each), or use world_size=1, which needs no group")
    if runtime.has_cuda():
        torch.cuda.set_device(0)  # a Ray actor sees only its own GPU
    dist.init_process_group(
        backend(), init_method=f"tcp://{master_addr}:{master_port}", rank=rank, world_size=world_size,
        timeout=timedelta(seconds=timeout_s),
    )


def active() -> bool:
    return dist.is_available() and dist.is_initialized()


def barrier() -> None:
    if active():
        dist.barrier()


def all_reduce(values: list[float], op: str = "sum") -> list[float]:
    """Reduce a few floats over all ranks (identity with one rank); float64, so sums of counts stay exact."""
    if not active():
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=runtime.device())
    dist.all_reduce(t, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}[op])
    return t.tolist()


def broadcast_object(obj, src: int = 0):
    if not active():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def destroy() -> None:
    if active():
        dist.destroy_process_group()

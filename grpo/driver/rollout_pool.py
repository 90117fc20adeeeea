"""The driver's handle on the rollout workers: Ray actors, one vLLM engine each, fed slices of a batch.

Every call waits at most `call_timeout_s`; a worker that died or did not answer raises grpo.driver.fault.ActorFault."""
from __future__ import annotations

import contextlib
import dataclasses
import os

from grpo.driver.fault import Fault, arm, gather
from grpo.learner import checkpoint
from rollout.engine import EngineConfig
from rollout.trajectory import RolloutStats, Trajectory, merge_stats
from rollout.worker import RolloutConfig, RolloutWorker, Task


@dataclasses.dataclass
class Submitted:
    """Rollout calls started on the workers and not yet collected: the task slices, each worker's call for
    the episodes' headers, and one ObjectRef a group."""
    slices: list
    calls: list
    groups: list


class RolloutPool:
    def __init__(self, engine_config: EngineConfig, store_root: str, run_dir: str, workers: int = 1,
                 gpus_per_worker: float = 0.0, resources: dict | None = None, call_timeout_s: float = 1800.0,
                 env_names: list[str] | None = None):
        import ray

        import envs

        env_vars = {}
        if not gpus_per_worker:
            # The trainer ranks idle while the engine generates, so the engine gets every core of the node
            # (Ray would otherwise pin a 1-CPU actor to one OpenMP thread).
            env_vars["OMP_NUM_THREADS"] = str(os.cpu_count() or 1)
        actor = ray.remote(RolloutWorker).options(num_cpus=1, num_gpus=gpus_per_worker, resources=dict(resources or {}),
                                                  runtime_env={"env_vars": env_vars})
        self.workers = [actor.remote(engine_config, store_root=store_root, worker_id=f"rollout-{i}",
                                     run_dir=run_dir, env_factories=envs.factories(env_names))
                        for i in range(workers)]
        self.store_root = store_root
        self.call_timeout_s = call_timeout_s

    def ready(self, timeout_s: float) -> None:
        """Wait until every worker has started (placed on a node, engine loaded)."""
        gather([(f"rollout-{i}", w.__ray_ready__.remote()) for i, w in enumerate(self.workers)], timeout_s,
               "starting the rollout workers (fault.start_timeout_s)")

    def _all(self, method: str, *args) -> list:
        return gather([(f"rollout-{i}", getattr(w, method).remote(*args)) for i, w in enumerate(self.workers)],
                      self.call_timeout_s, method)

    def sync_adapter(self, version: int) -> None:
        served = self._all("sync_adapter", version)
        if any(v != version for v in served):
            raise RuntimeError(f"rollout workers serve adapter versions {served}, expected {version}")

    def rng_states(self) -> list:
        """Each worker's random state, which its engine samples from (vLLM's sampler draws from the process's
        torch generator when requests carry no seed of their own)."""
        return gather([(f"rollout-{i}", w.__ray_call__.remote(_get_rng)) for i, w in enumerate(self.workers)],
                      self.call_timeout_s, "rng_states")

    def set_rng_states(self, states: list) -> None:
        calls = [(f"rollout-{i}", w.__ray_call__.remote(_set_rng, state))
                 for i, (w, state) in enumerate(zip(self.workers, states))]
        gather(calls, self.call_timeout_s, "set_rng_states")

    def sleep(self) -> None:
        self._all("sleep")

    def wake_up(self) -> None:
        self._all("wake_up")

    def rollout(self, tasks: list[Task], group_size: int, config: RolloutConfig, greedy: bool = False,
                faults: list[Fault] = ()) -> tuple[list[Trajectory], RolloutStats]:
        """Tasks split into contiguous slices, one per worker; group ids renumbered batch-wide. `faults`
        (injected, grpo.driver.fault) fire in the named workers during this call."""
        trajs, _, stats = self.collect(self.submit(tasks, group_size, config, greedy, faults))
        return trajs, stats

    def submit(self, tasks: list[Task], group_size: int, config: RolloutConfig, greedy: bool = False,
               faults: list[Fault] = ()) -> "Submitted":
        """rollout's calls, started without waiting: `collect` waits for them."""
        for f in faults:
            arm(self.workers[f.index], f)
        slices = split(tasks, len(self.workers))
        calls = [(f"rollout-{i}", w.rollout.remote(part, group_size, config, greedy))
                 for i, (w, (_, part)) in enumerate(zip(self.workers, slices)) if part]
        return Submitted(slices, calls, [])

    def rollout_stored(self, tasks: list[Task], group_size: int, config: RolloutConfig,
                       faults: list[Fault] = ()) -> tuple[list[Trajectory], list, RolloutStats]:
        """As rollout, but the episodes' token segments and images never enter this process: each group's
        episodes come back as one Ray object (a return of the worker's call, so this process owns it and it
        outlives the worker) that the train ranks read. Returns the episodes without their segments (what
        advantages, checks and metrics read), one ObjectRef a group in batch order, and the stats."""
        return self.collect(self.submit_stored(tasks, group_size, config, faults))

    def submit_stored(self, tasks: list[Task], group_size: int, config: RolloutConfig,
                      faults: list[Fault] = ()) -> "Submitted":
        """rollout_stored's calls, started without waiting: `collect` waits for them. Each worker runs its calls
        one after another, in the order they were made, so a rollout submitted before a hot-load samples with
        the version served before it."""
        for f in faults:
            arm(self.workers[f.index], f)
        slices = split(tasks, len(self.workers))
        calls, groups = [], []
        for i, (w, (_, part)) in enumerate(zip(self.workers, slices)):
            if part:
                refs = w.__ray_call__.options(num_returns=1 + len(part)).remote(
                    _rollout_stored, part, group_size, config)
                calls.append((f"rollout-{i}", refs[0]))
                groups.extend(refs[1:])
        return Submitted(slices, calls, groups)

    def collect(self, submitted: "Submitted") -> tuple[list[Trajectory], list, RolloutStats]:
        """Wait for submitted rollouts (at most call_timeout_s from now): the episodes (without segments when
        submitted by submit_stored), the group refs (none from submit) and the stats."""
        headers, stats = _batch_wide(submitted.slices, gather(submitted.calls, self.call_timeout_s, "rollout"))
        return headers, submitted.groups, stats

    def shutdown(self) -> None:
        """Kill the workers, alive, hung or dead, and drop their adapter leases (a killed worker cannot release
        its own); safe to call twice."""
        import ray

        from sync import AdapterStore

        store = AdapterStore(self.store_root)
        for i, w in enumerate(self.workers):
            ray.kill(w)
            # On storage that just failed (full, read-only) the lease stays and expires (lease_ttl_s); the
            # error that stopped the run is the one to report, not this one.
            with contextlib.suppress(OSError):
                store.release(f"rollout-{i}")
        self.workers = []


def _batch_wide(slices: list[tuple[int, list[Task]]], results: list) -> tuple[list[Trajectory], RolloutStats]:
    """The workers' (episodes, stats) results as one batch: group ids renumbered batch-wide, stats merged."""
    trajs: list[Trajectory] = []
    for offset, (chunk, _) in zip([offset for offset, part in slices if part], results):
        for t in chunk:
            t.group_id += offset
        trajs.extend(chunk)
    return trajs, merge_stats([s for _, s in results])


def _rollout_stored(worker: RolloutWorker, tasks: list[Task], group_size: int, config: RolloutConfig) -> tuple:
    trajs, stats = worker.rollout(tasks, group_size, config)
    headers = [dataclasses.replace(t, segments=[]) for t in trajs]
    return ((headers, stats), *(trajs[k * group_size:(k + 1) * group_size] for k in range(len(tasks))))


def fetch(groups: list, headers: list[Trajectory], indices: list[int]) -> list[Trajectory]:
    """The whole episodes at `indices` of a batch that rollout_stored returned, read from the object store
    (only the groups that hold them), with the batch-wide group ids of their headers."""
    from grpo.driver.train_group import StoredEpisodes  # here: a rollout worker unpickles this module too

    out = StoredEpisodes.of(groups, indices, len(headers) // len(groups)).read()
    for i, traj in zip(indices, out):
        traj.group_id = headers[i].group_id
    return out


def _get_rng(_worker) -> dict:
    return checkpoint.rng_state()


def _set_rng(_worker, state: dict) -> None:
    checkpoint.set_rng_state(state)


def split(tasks: list[Task], n: int) -> list[tuple[int, list[Task]]]:
    """`n` contiguous slices of `tasks`, one per worker, each with the index of its first task (a slice is
    empty when there are fewer tasks than workers)."""
    bounds = [len(tasks) * k // n for k in range(n + 1)]
    return [(bounds[k], tasks[bounds[k]:bounds[k + 1]]) for k in range(n)]

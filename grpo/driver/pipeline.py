"""Rollouts ahead of the trainer: with pipeline.max_staleness k, the rollouts of the next k steps run while the
trainer trains (docs/pipeline.md).

Each step's rollout is submitted up to k steps before the step trains on it, with the adapter served at that
moment. A worker runs its calls one after another in the order they were made, so the hot-load that follows a
publish takes effect for the rollouts submitted after it, and each episode samples every turn with one version:
the one served when its rollout call began. An episode never spans a hot-load, because a worker loads a new
version only between its rollout calls (on the CPU the served version is merged into the weights and cannot
change under a request in flight), and one version an episode keeps its importance correction per token exact.

Which groups a step trains on: every group of the step's own rollout call, the tasks it drew, whatever their
lengths. None is left out for finishing late, so the pipeline adds no bias towards short episodes (each step
logs the mean turns of the groups it trained on against all groups it sampled); the price is that a step's
rollout waits for its longest episode.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass


@dataclass
class Ticket:
    """One step's rollout in flight: the version it samples with and the task cursor before its tasks."""
    step: int
    submitted: object  # rollout_pool.Submitted
    version: int
    cursor_before: int


class Pipeline:
    def __init__(self, max_staleness: int):
        self.k = max_staleness
        self.queue: deque[Ticket] = deque()
        self.version_step: dict[int, int] = {}  # adapter version -> the step whose update produced it

    def published(self, version: int, step: int) -> None:
        self.version_step[version] = step

    def fill(self, pool, sampler, step: int, last_step: int, tasks: int, group_size: int, config, version: int,
             faults) -> None:
        """Submit the rollouts of steps `step` .. `step` + k not yet submitted (none past `last_step`);
        `faults(step)`: the injected faults that step's rollout arms."""
        nxt = self.queue[-1].step + 1 if self.queue else step
        while nxt <= min(step + self.k, last_step):
            before = sampler.cursor
            submitted = pool.submit_stored(sampler.take(tasks), group_size, config, faults=faults(nxt))
            self.queue.append(Ticket(nxt, submitted, version, before))
            nxt += 1

    def take(self, pool, step: int) -> tuple:
        """The step's rollout, waited for: (ticket, episodes without segments, group refs, stats, seconds the
        trainer waited)."""
        ticket = self.queue.popleft()
        if ticket.step != step:
            raise RuntimeError(f"the pipeline holds the rollout of step {ticket.step}, but step {step} asked")
        t = time.perf_counter()
        headers, groups, stats = pool.collect(ticket.submitted)
        waited = time.perf_counter() - t
        stale = self.staleness(ticket, step)
        if stale > self.k:
            raise RuntimeError(f"step {step} got a rollout sampled with adapter v{ticket.version}, "
                               f"{stale} updates old (pipeline.max_staleness={self.k})")
        return ticket, headers, groups, stats, waited

    def staleness(self, ticket: Ticket, step: int) -> int:
        """Updates between the adapter the rollout sampled with and the weights step `step` trains. No group is
        ever older than k: the pipeline never submits further ahead, so none has to be dropped."""
        return (step - 1) - self.version_step[ticket.version]

    def cursor(self, sampler) -> int:
        """The task cursor a checkpoint saves: before the first rollout still in flight, whose tasks a resumed
        run draws again."""
        return self.queue[0].cursor_before if self.queue else sampler.cursor


def check_versions(trajs, expected: int) -> None:
    # The alarm for the worst silent failure: rollouts quietly sampling another adapter than the one served.
    used = {t.adapter_version for t in trajs}
    if used != {expected}:
        raise RuntimeError(f"rollouts used adapter versions {sorted(used, key=str)}, expected {expected}: "
                           "the hot-load after the last publish did not take effect")


def pipeline_record(pipeline: Pipeline, staleness: int, groups: int, wait_s: float, trajs, kept: list[int]) -> dict:
    """The step's pipeline metrics: groups trained by staleness, the trainer's wait for the rollout, the
    rollouts in flight, and mean turns of the trained groups against all sampled (the length bias)."""
    mean = lambda xs: sum(xs) / len(xs) if xs else None  # noqa: E731
    return {"staleness": {str(staleness): groups}, "staleness_max": staleness, "trainer_wait_s": wait_s,
            "rollouts_in_flight": len(pipeline.queue),
            "mean_turns_trained": mean([trajs[i].num_turns for i in kept]),
            "mean_turns_sampled": mean([t.num_turns for t in trajs])}

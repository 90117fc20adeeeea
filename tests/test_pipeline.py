"""pipeline.max_staleness: rollouts ahead of the trainer, their staleness bound, the configs refused, and a run
with k = 1 that heals from a killed rollout worker and a killed train rank."""
import json
from types import SimpleNamespace

import pytest
from test_recovery import _check_finished_run, _config

import grpo
from grpo.algo.config import ConfigError
from grpo.driver.pipeline import Pipeline
from grpo.driver.state import TaskSampler


def test_configs_that_cannot_work_are_refused_with_the_fields_named(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    base = dict(model=str(tmp_path), pipeline={"max_staleness": 1})
    with pytest.raises(ConfigError, match=r"cluster\.colocate=True .*max_staleness=1.*devices of their own"):
        grpo.RunConfig(**base, algorithm={"tis_cap": 2.0})
    with pytest.raises(ConfigError, match=r"algorithm\.tis_cap=None .*old_logprobs: sampler"):
        grpo.RunConfig(**base, cluster={"colocate": False})
    with pytest.raises(ConfigError, match=r"algorithm\.dynamic_sampling=True"):
        grpo.RunConfig(**base, cluster={"colocate": False}, algorithm={
            "tis_cap": 2.0, "dynamic_sampling": True, "drop_zero_signal_groups": True})
    with pytest.raises(ConfigError, match=r"max_staleness=-1"):
        grpo.RunConfig(model=str(tmp_path), pipeline={"max_staleness": -1})
    ok = grpo.RunConfig(**base, cluster={"colocate": False}, algorithm={"old_logprobs": "sampler"})
    assert ok.pipeline.max_staleness == 1


class _Pool:
    """Records the order of the calls a worker would run them in; a rollout samples with the version served."""

    def __init__(self):
        self.served, self.log = 1, []

    def submit_stored(self, tasks, group_size, config, faults=()):
        self.log.append(("rollout", [t.seed for t in tasks]))
        return SimpleNamespace(version=self.served, seeds=[t.seed for t in tasks])

    def collect(self, submitted):
        return [SimpleNamespace(adapter_version=submitted.version)], ["ref"], None


@pytest.mark.parametrize("k", [0, 1, 2])
def test_rollouts_run_k_steps_ahead_and_never_older_than_k(k):
    pool, sampler, pipe = _Pool(), TaskSampler("maze", {}, 100), Pipeline(k)
    pipe.published(1, 0)
    seen = []
    for step in range(1, 7):
        pipe.fill(pool, sampler, step, 6, 2, 4, None, pool.served, lambda s: ())
        ticket, headers, *_ = pipe.take(pool, step)
        seen.append(pipe.staleness(ticket, step))
        assert headers[0].adapter_version == ticket.version
        # A checkpoint now resumes with the tasks of the first rollout still in flight.
        assert pipe.cursor(sampler) == 2 * step
        pool.served += 1  # this step's publish and hot-load
        pipe.published(pool.served, step)
    # The first k steps use the first version; from then on each trains on episodes exactly k updates old.
    assert seen == [min(s, k) for s in range(6)]
    assert [seeds for _, seeds in pool.log] == [[100 + 2 * s, 101 + 2 * s] for s in range(6)]


def test_a_rollout_older_than_the_bound_stops_the_step():
    pool, sampler, pipe = _Pool(), TaskSampler("maze", {}, 0), Pipeline(1)
    pipe.published(1, 0)
    pipe.fill(pool, sampler, 1, 5, 2, 4, None, 1, lambda s: ())
    pipe.take(pool, 1)
    pipe.published(1, -1)  # as if v1 were one update older than it is: step 2's rollout, sampled with it, is too old
    with pytest.raises(RuntimeError, match=r"adapter v1, 2 updates old \(pipeline.max_staleness=1\)"):
        pipe.take(pool, 2)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_k1_heals_from_a_killed_rollout_worker_and_train_rank(tmp_path, tiny_vl):
    out = tmp_path / "run"
    cfg = _config(tiny_vl, out, steps=4, checkpoint={"every": 1, "keep": 2}, pipeline={"max_staleness": 1},
                  cluster={"train_ranks": 2, "colocate": False}, algorithm={"group_size": 2, "tis_cap": 2.0},
                  fault={"inject": ["kill:rollout@step=2", "kill:train_rank=1@step=3"], "call_timeout_s": 60})
    grpo.Trainer(cfg).fit()
    events = _check_finished_run(out, 4, ["rollout-0", "train_rank-1"])
    assert all("ActorDiedError" in e["cause"] for e in events)
    steps = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in steps if "event" not in r]
    for r in steps:
        (stale,) = r["pipeline"]["staleness"]
        assert int(stale) <= 1 and r["pipeline"]["staleness"][stale] == 2
        assert r["pipeline"]["mean_turns_trained"] == r["pipeline"]["mean_turns_sampled"]
    # Straight after a start or a restart the first rollout is on-policy; the one after it ran ahead.
    assert steps[0]["pipeline"]["staleness"] == {"0": 2}
    assert any(r["pipeline"]["staleness"] == {"1": 2} for r in steps)

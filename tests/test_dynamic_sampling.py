"""Dynamic sampling (DAPO): a step draws new tasks until `tasks_per_step` groups carry signal, up to a cap."""
from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest

from grpo.algo.advantages import next_draw
from grpo.algo.config import AlgorithmConfig, ConfigError
from grpo.driver.fault import InjectionPlan
from grpo.driver.pipeline import Pipeline
from grpo.driver.state import TaskSampler
from grpo.driver.train_group import StoredEpisodes
from grpo.driver.trainer import Trainer
from rollout.trajectory import RolloutStats, merge_stats


@pytest.mark.parametrize("wanted, with_signal, drawn, cap, expected", [
    (16, 16, 16, 64, 0),     # full at once
    (16, 20, 32, 64, 0),     # more than enough
    (16, 8, 16, 64, 16),     # half had signal: 8 more need 16 more draws
    (16, 1, 16, 64, 48),     # 1 in 16: 15 more would need 240 draws; the cap leaves 48
    (16, 0, 16, 64, 48),     # none yet: the rest of the cap at once
    (16, 12, 16, 64, 6),     # 3 in 4: 4 more need 5.33, so 6
    (16, 3, 64, 64, 0),      # the cap is reached: train on what was found
    (4, 3, 4, 16, 2),        # 3 in 4: 1 more needs 1.33, so 2
])
def test_next_draw_on_hand_computed_cases(wanted, with_signal, drawn, cap, expected):
    assert next_draw(wanted, with_signal, drawn, cap) == expected


def test_dynamic_sampling_needs_dropped_zero_signal_groups():
    with pytest.raises(ConfigError, match="drop_zero_signal_groups: true"):
        AlgorithmConfig(dynamic_sampling=True)
    with pytest.raises(ConfigError, match="max_draw_factor"):
        AlgorithmConfig(dynamic_sampling=True, drop_zero_signal_groups=True, max_draw_factor=0)


def _stats(episodes: int, wall_s: float) -> RolloutStats:
    return RolloutStats(episodes=episodes, turns=2 * episodes, generated_tokens=10 * episodes, prompt_tokens=0,
                        engine_calls=2, wall_s=wall_s, engine_s=wall_s / 2, success_rate=0.5, mean_reward=0.5,
                        mean_turns=2.0, parse_errors=1, stop_reasons={"done": episodes}, env_s=1.0)


def test_draws_in_sequence_add_their_times_and_workers_in_parallel_take_the_slowest():
    parts = [_stats(8, 10.0), _stats(24, 30.0)]
    seq, par = merge_stats(parts, sequential=True), merge_stats(parts)
    assert (seq.wall_s, seq.engine_s, seq.env_s) == (40.0, 20.0, 2.0)
    assert (par.wall_s, par.engine_s, par.env_s) == (30.0, 15.0, 1.0)
    assert seq.episodes == par.episodes == 32 and seq.stop_reasons == {"done": 32} and seq.parse_errors == 2


class _Pool:
    """Stands in for the rollout workers: each task's group gets the rewards `table` gives its seed."""

    def __init__(self, table):
        self.table, self.calls = table, []

    def rollout_stored(self, tasks, group_size, config, faults=()):
        self.calls.append([t.seed for t in tasks])
        trajs = [SimpleNamespace(reward=r, group_id=k, adapter_version=3, seed=t.seed, num_turns=2, truncated=[])
                 for k, t in enumerate(tasks) for r in self.table(t.seed)]
        return trajs, [f"ref-{t.seed}" for t in tasks], _stats(len(trajs), 1.0)

    def submit_stored(self, tasks, group_size, config, faults=()):  # the step's own draw, through the pipeline
        return self.rollout_stored(tasks, group_size, config, faults)

    def collect(self, submitted):
        return submitted


def _driver(dynamic: bool, tasks_per_step: int = 4, factor: int = 4):
    algo = AlgorithmConfig(group_size=2, drop_zero_signal_groups=True, dynamic_sampling=dynamic,
                           max_draw_factor=factor, scale_rewards="none")
    cfg = SimpleNamespace(algorithm=algo, group_size=2, tasks_per_step=tasks_per_step, rollout=None, steps=1)
    pipeline = Pipeline(0)
    pipeline.published(3, 0)
    return SimpleNamespace(config=cfg, state=SimpleNamespace(version=3), pipeline=pipeline,
                           callbacks=SimpleNamespace(phase=lambda *_: contextlib.nullcontext()))


def _sample(driver, pool, offset=100):
    driver.pool, sampler = pool, TaskSampler("maze", {}, offset)
    return Trainer._sample(driver, 1, sampler, InjectionPlan(())), sampler


def test_a_step_draws_until_its_batch_is_full_of_groups_with_signal():
    # Seeds 100-103: only 101 has mixed rewards; from 104 on every third seed does.
    mixed = lambda seed: [1.0, 0.0] if seed == 101 or (seed >= 104 and seed % 3 == 0) else [1.0, 1.0]  # noqa: E731
    pool = _Pool(mixed)
    (trajs, groups, stats, adv, kept, credit), sampler = _sample(_driver(True), pool)
    # 1 of 4 with signal: 3 more need 12 draws (104-115: 105, 108, 111, 114 are mixed); the first 3 are kept.
    assert pool.calls == [[100, 101, 102, 103], list(range(104, 116))]
    assert sampler.cursor == 16 and len(trajs) == 32
    assert [t.group_id for t in trajs] == [k for k in range(16) for _ in range(2)]
    assert groups == [f"ref-{seed}" for seed in range(100, 116)]  # one object a group, in the episodes' order
    assert sorted({trajs[i].seed for i in kept}) == [101, 105, 108, 111]
    assert all(adv[i] != 0 for i in kept)
    assert stats["groups_drawn"] == 16 and stats["groups_trained"] == 4 and stats["draw_rounds"] == 2
    assert stats["draws_per_kept_group"] == 4.0 and stats["episodes"] == 32 and stats["wall_s"] == 2.0
    assert credit["zero_signal_groups"] == 11


def test_a_step_stops_at_its_cap_and_trains_on_what_it_found():
    pool = _Pool(lambda seed: [1.0, 0.0] if seed == 102 else [0.0, 0.0])
    (trajs, _, stats, _, kept, _), sampler = _sample(_driver(True, factor=3), pool)
    assert pool.calls == [[100, 101, 102, 103], list(range(104, 112))] and sampler.cursor == 12
    assert [trajs[i].seed for i in kept] == [102, 102]
    assert stats["groups_drawn"] == 12 and stats["groups_trained"] == 1 and stats["draws_per_kept_group"] == 12.0


def test_without_dynamic_sampling_a_step_draws_once():
    pool = _Pool(lambda seed: [1.0, 1.0])
    (trajs, _, stats, _, kept, _), sampler = _sample(_driver(False), pool)
    assert pool.calls == [[100, 101, 102, 103]] and kept == [] and sampler.cursor == 4
    assert stats["groups_trained"] == 0 and stats["draws_per_kept_group"] is None


def test_stored_episodes_carry_only_the_groups_they_train_on():
    stored = StoredEpisodes.of(["g0", "g1", "g2", "g3"], [2, 3, 6, 7], group_size=2)
    assert stored.groups == ["g1", "g3"] and stored.picks == [(0, 0), (0, 1), (1, 0), (1, 1)]

"""What a run asks Ray for against what the cluster has (grpo/driver/resources.py): "auto" train ranks, the
refusal's numbers and fixes on hand-computed clusters, the bundled configs on the machines they are for, and a
real Ray cluster that declares one GPU refusing the 1.5 GPUs of two ranks and an engine in seconds."""
import time
from pathlib import Path

import pytest

import grpo
from grpo.algo.config import ConfigError
from grpo.config import ClusterConfig, RunConfig
from grpo.driver import resources
from grpo.driver.preflight import check_faults
from grpo.driver.resources import ResourceError, plan

ROOT = Path(__file__).resolve().parents[1]


def test_auto_train_ranks_resolve_from_the_clusters_gpus():
    # No GPU: two gloo ranks, as the default ran before "auto".
    cpu = plan(ClusterConfig(), {"CPU": 3})
    assert (cpu.train_ranks, cpu.gpu_share, cpu.total) == (2, 0.0, {"CPU": 3})
    # One GPU, colocated: one rank and one engine at 0.5 each, the whole GPU.
    one = plan(ClusterConfig(), {"CPU": 16, "GPU": 1})
    assert (one.train_ranks, one.rank, one.worker, one.total) == (
        1, {"CPU": 1, "GPU": 0.5}, {"CPU": 1, "GPU": 0.5}, {"CPU": 2, "GPU": 1.0})
    # Eight GPUs: a rank on each (8 x 0.5) and the engine beside rank 0 (0.5): 4.5 of 8.
    assert plan(ClusterConfig(), {"CPU": 64, "GPU": 8}).total == {"CPU": 9, "GPU": 4.5}
    # Not colocated: the GPUs the 2 engines leave, a whole one each: 6 ranks.
    apart = plan(ClusterConfig(colocate=False, rollout_workers=2), {"CPU": 64, "GPU": 8})
    assert (apart.train_ranks, apart.total["GPU"]) == (6, 8.0)
    # A number is a number: no resolving.
    assert resources.train_ranks(ClusterConfig(train_ranks=3), 8) == 3
    # Ray started here declares at least one CPU an actor ("auto" counting its CPU ranks).
    assert resources.cpus_to_start(ClusterConfig()) == 3
    assert resources.cpus_to_start(ClusterConfig(train_ranks=4, rollout_workers=2)) == 6


def test_train_ranks_is_a_count_or_auto():
    for bad in (0, "two", 1.5, None):
        with pytest.raises(ConfigError, match=r"ClusterConfig\.train_ranks.*or 'auto'"):
            ClusterConfig(train_ranks=bad)


def test_two_ranks_and_an_engine_on_one_gpu_are_refused_with_the_numbers_and_the_fix():
    with pytest.raises(ResourceError) as refused:
        plan(ClusterConfig(train_ranks=2), {"CPU": 16, "GPU": 1})
    message = str(refused.value)
    assert message.startswith("the run asks Ray for more than the cluster has: 1.5 GPU asked, 1 there.")
    assert "2 train ranks (cluster.train_ranks) x {CPU: 1, GPU: 0.5} + 1 rollout worker (cluster.rollout_workers)" \
           " x {CPU: 1, GPU: 0.5}" in message
    assert "the cluster has (ray.cluster_resources()): {CPU: 16, GPU: 1}" in message
    # (1 GPU - 1 engine x 0.5) / 0.5 = 1 rank fits.
    assert "- cluster.train_ranks: 1 (or auto: one a GPU)" in message


@pytest.mark.parametrize("cluster, have, says", [
    # Not colocated on one GPU: an engine and a rank need a GPU each, 2.
    (ClusterConfig(colocate=False), {"CPU": 16, "GPU": 1},
     ["2 GPU asked, 1 there", "- cluster.colocate: true", "- or a cluster with 2 GPUs"]),
    # 3 engines + 1 rank at 0.5 = 2 GPUs on 1: no rank count fits, (1 - 0.5) / 0.5 = 1 engine does.
    (ClusterConfig(train_ranks=1, rollout_workers=3), {"CPU": 16, "GPU": 1},
     ["2 GPU asked, 1 there", "- cluster.rollout_workers: 1 and cluster.train_ranks: 1"]),
    # A joined cluster of 4 CPUs: 4 ranks + 2 workers, one CPU each, is 6.
    (ClusterConfig(train_ranks=4, rollout_workers=2), {"CPU": 4},
     ["6 CPU asked, 4 there", "- cluster.train_ranks + cluster.rollout_workers at most 4 (one CPU each; now 4 + 2)"]),
    # A custom resource the nodes declare once, asked by each of the 2 ranks.
    (ClusterConfig(train_resources={"trainer": 1}), {"CPU": 8, "trainer": 1},
     ["2 trainer asked, 1 there", "cluster.train_resources (1 each) asks for 'trainer'",
      """ray start --resources '{"trainer": 2}'"""]),
])
def test_each_shortage_names_its_numbers_and_fields(cluster, have, says):
    with pytest.raises(ResourceError) as refused:
        plan(cluster, have)
    for part in says:
        assert part in str(refused.value)


def test_the_bundled_configs_fit_the_machines_they_are_for():
    # The CPU examples on a local Ray of this machine's 2 cores (it declares at least the actors' CPUs).
    for path in sorted(ROOT.glob("examples/*/cpu.yaml")):
        cluster = RunConfig.from_yaml(path).cluster
        assert plan(cluster, {"CPU": max(2, resources.cpus_to_start(cluster))}).gpu_share == 0, path
    # The 8B maze config: 6 ranks and 6 engines colocated, 6 GPUs; refused on 4 with the count that fits (2).
    cluster = RunConfig.from_yaml(ROOT / "examples/maze/qwen3_vl_8b.yaml").cluster
    assert plan(cluster, {"CPU": 48, "GPU": 6}).total["GPU"] == 6
    with pytest.raises(ResourceError, match=r"6 GPU asked, 4 there[\s\S]*cluster\.train_ranks: 2"):
        plan(cluster, {"CPU": 48, "GPU": 4})


def test_a_train_rank_fault_under_auto_is_checked_once_the_count_is_known():
    cfg = RunConfig(model="m", steps=3, fault={"inject": ["kill:train_rank=1@step=1"]})
    check_faults(cfg, None)  # before Ray: "auto" is no count yet
    check_faults(cfg, 2)
    with pytest.raises(ConfigError, match="index below 1"):
        check_faults(cfg, 1)  # one GPU resolves "auto" to one rank: rank 1 never exists


@pytest.mark.slow
def test_a_real_cluster_with_one_gpu_refuses_two_ranks_and_an_engine_in_seconds(tmp_path, tiny_vl):
    import shutil
    import tempfile

    import ray

    cfg = RunConfig(model=str(tiny_vl), output_dir=str(tmp_path / "run"), steps=1, algorithm={"group_size": 2},
                    cluster={"train_ranks": 2})
    ray_tmp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # Ray's socket paths must stay short
    # A GPU declared, none there: the ask is compared with what Ray says, and nothing is placed.
    ray.init(num_cpus=2, num_gpus=1, _temp_dir=ray_tmp, include_dashboard=False, log_to_driver=False)
    try:
        t0 = time.monotonic()
        with pytest.raises(ResourceError, match=r"1\.5 GPU asked, 1 there[\s\S]*cluster\.train_ranks: 1"):
            grpo.Trainer(cfg).fit()
        assert time.monotonic() - t0 < 30
        assert ray.util.placement_group_table() == {}  # nothing was placed
    finally:
        ray.shutdown()
        shutil.rmtree(ray_tmp, ignore_errors=True)
    # Refused before config.yaml was written: the folder holds no run to resume.
    assert not (tmp_path / "run" / "config.yaml").exists()

"""MetricsSink: metrics.jsonl, Prometheus, W&B (the curves drawn from metrics.jsonl: tests/test_curves.py)."""
# ------------------------------------------------------------------------------------------- MetricsSink
import json
import os
import socket
import sys
import urllib.request

import pytest

from grpo.algo.config import ConfigError
from grpo.config import MetricsConfig, WandbConfig
from grpo.report.metrics import MetricsSink, json_safe, prometheus_name
from grpo.report.wandb_sink import resolve_mode


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _strict_loads(line: str):
    def refuse(constant):
        raise ValueError(f"not strict JSON: {constant}")

    return json.loads(line, parse_constant=refuse)


def _scrape(port: int) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}


def test_metrics_jsonl_is_strict_json(tmp_path):
    sink = MetricsSink(tmp_path, tensorboard=False)
    sink.log({"step": 1, "train": {"kl": float("nan"), "loss": 0.5, "norms": [1.0, float("inf")]},
              "rollout": {"mean_reward": -float("inf")}})
    sink.close()
    (line,) = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert _strict_loads(line) == {"step": 1, "train": {"kl": None, "loss": 0.5, "norms": [1.0, None]},
                                   "rollout": {"mean_reward": None}}
    assert json_safe({"a": (float("nan"), 2)}) == {"a": [None, 2]}


def test_prometheus_names():
    assert prometheus_name("rollout/success_rate") == "grpo_rollout_success_rate"
    assert prometheus_name("time/step_s") == "grpo_time_step_s"
    assert prometheus_name("rollout/stop_reasons/max-tokens") == "grpo_rollout_stop_reasons_max_tokens"


def test_prometheus_gauges_and_restart_events(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    port = _free_port()
    sink = MetricsSink(tmp_path, tensorboard=True, prometheus_port=port)
    assert _scrape(port)["grpo_restarts_total"] == 0.0
    sink.log({"step": 2, "adapter_version": 3, "rollout": {"success_rate": 0.25}, "train": {"kl": float("nan")}})
    sink.log({"event": "restart", "step": 3, "cause": "ActorDiedError", "actor": "rollout-0", "recovery_s": 41.2})
    sink.log({"event": "restart", "step": 5, "cause": "GetTimeoutError", "actor": "train-1", "recovery_s": 12.0})
    scraped = _scrape(port)
    # Events count; they do not move the step gauges, nor become gauges themselves.
    assert scraped["grpo_restarts_total"] == 2.0
    assert scraped["grpo_step"] == 2.0 and scraped["grpo_adapter_version"] == 3.0
    assert scraped["grpo_rollout_success_rate"] == 0.25
    assert "grpo_train_kl" not in scraped and "grpo_recovery_s" not in scraped
    sink.close()
    with pytest.raises(OSError):  # the endpoint is gone with the sink
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)

    events = EventAccumulator(str(tmp_path / "tensorboard")).Reload()
    assert [(e.step, e.value) for e in events.Scalars("restarts")] == [(3, 1.0), (5, 2.0)]
    assert [(e.step, e.value) for e in events.Scalars("rollout/success_rate")] == [(2, 0.25)]
    assert "step" in events.Tags()["scalars"] and "recovery_s" not in events.Tags()["scalars"]

    # A resumed run (same folder, new process) keeps counting the restarts metrics.jsonl holds.
    resumed = MetricsSink(tmp_path, tensorboard=False, prometheus_port=port)
    assert _scrape(port)["grpo_restarts_total"] == 2.0
    resumed.close()
    assert [r.get("event") for r in map(_strict_loads, (tmp_path / "metrics.jsonl").read_text().splitlines())] \
        == [None, "restart", "restart"]


def test_busy_prometheus_port_names_the_setting(tmp_path):
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        with pytest.raises(OSError, match=r"metrics.prometheus_port=\d+: cannot serve"):
            MetricsSink(tmp_path, tensorboard=False, prometheus_port=busy.getsockname()[1])


def test_wandb_settings_validate():
    assert WandbConfig(project="maze").mode == "auto"
    with pytest.raises(ConfigError, match=r"WandbConfig.project=''"):
        WandbConfig()
    with pytest.raises(ConfigError, match=r"WandbConfig.mode='cloud'.*'auto', 'online', 'offline'"):
        WandbConfig(project="maze", mode="cloud")
    with pytest.raises(ConfigError, match=r"WandbConfig.tags"):
        WandbConfig(project="maze", tags=[1])
    with pytest.raises(ConfigError, match=r"WandbConfig.projekt.*known fields"):
        MetricsConfig(wandb={"projekt": "maze"})
    with pytest.raises(ConfigError, match=r"MetricsConfig.wandb='maze'"):
        MetricsConfig(wandb="maze")
    assert MetricsConfig().wandb is None


def test_wandb_missing_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # what importlib sees when wandb is not installed
    with pytest.raises(ConfigError, match=r"MetricsConfig.wandb=.*pip install 'grpo\[wandb\]'"):
        MetricsConfig(wandb={"project": "maze"})


def test_wandb_auto_mode_goes_offline_without_key_or_network(tmp_path):
    assert resolve_mode("offline", {})[0] == "offline"
    assert resolve_mode("online", {})[0] == "online"
    no_netrc = {"NETRC": str(tmp_path / "none")}
    mode, why = resolve_mode("auto", no_netrc)
    assert mode == "offline" and "WANDB_API_KEY" in why
    closed = _free_port()
    mode, why = resolve_mode("auto", {**no_netrc, "WANDB_API_KEY": "k", "WANDB_BASE_URL": f"http://127.0.0.1:{closed}"})
    assert mode == "offline" and f"127.0.0.1:{closed} is not reachable" in why
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        url = f"http://127.0.0.1:{server.getsockname()[1]}"
        assert resolve_mode("auto", {**no_netrc, "WANDB_API_KEY": "k", "WANDB_BASE_URL": url})[0] == "online"
        (tmp_path / "netrc").write_text("machine 127.0.0.1 login user password k\n")
        assert resolve_mode("auto", {"NETRC": str(tmp_path / "netrc"), "WANDB_BASE_URL": url})[0] == "online"


def test_wandb_offline_run_stays_in_the_run_folder(tmp_path, monkeypatch):
    import wandb  # the `test` extra installs it, as the `wandb` extra does

    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for var in ("WANDB_API_KEY", "WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR",
                "WANDB_ARTIFACT_DIR", "NETRC"):
        monkeypatch.delenv(var, raising=False)
    # wandb's own switch as well as the sink's choice: nothing in this test may reach the W&B servers.
    monkeypatch.setenv("WANDB_MODE", "offline")
    run = tmp_path / "run"
    run.mkdir()
    settings = MetricsConfig(wandb={"project": "grpo-test", "tags": ["cpu"]}).wandb
    sink = MetricsSink(run, tensorboard=False, wandb=settings, run_config={"steps": 2})
    assert sink._wandb.mode == "offline"  # no API key here
    sink.log({"step": 1, "rollout": {"success_rate": 0.25}})
    sink.log({"event": "restart", "step": 1, "cause": "ActorDiedError"})
    sink.log({"step": 2, "rollout": {"success_rate": 0.5}, "train": {"kl": float("nan")}})
    summary = dict(sink._wandb.run.summary)
    assert summary["rollout/success_rate"] == 0.5 and summary["restarts"] == 1 and "train/kl" not in summary
    sink.close()
    assert wandb.run is None

    (offline,) = (run / "wandb").glob("offline-run-*")
    run_id = (run / "wandb" / "run_id").read_text().strip()
    assert offline.name.endswith(run_id)
    logged = (offline / f"run-{run_id}.wandb").read_bytes()  # what `wandb sync` uploads
    assert b"rollout/success_rate" in logged and b"restarts" in logged
    assert not any(home.iterdir())
    assert "WANDB_DIR" not in os.environ

"""The Grafana dashboard shipped in the package, against a real Prometheus server scraping a real run: every
panel's query, sent to Prometheus's HTTP API the way Grafana sends it, returns data."""
import importlib.resources
import json
import re
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request

import pytest

import grpo
from grpo.report.metrics import MetricsSink

STEPS = 2


def _dashboard() -> dict:
    return json.loads((importlib.resources.files("grpo.report") / "dashboards" / "grpo.json").read_text())


def _targets(dashboard: dict):
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            yield panel["title"], target


def _variables(dashboard: dict) -> dict:
    return {v["name"]: v for v in dashboard["templating"]["list"]}


def _resolve(expr: str, dashboard: dict) -> str:
    """Grafana's substitution of the dashboard's variables, with every variable at its "All" value."""
    variables = _variables(dashboard)
    return re.sub(r"\$(\w+)", lambda m: variables[m.group(1)]["allValue"], expr)


def test_dashboard_is_an_importable_grafana_dashboard():
    dashboard = _dashboard()
    variables = _variables(dashboard)
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells = set()
    for p in panels:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        area = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not area & cells, f"panel {p['title']!r} overlaps another"
        cells |= area
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    for title, target in _targets(dashboard):
        used = set(re.findall(r"\$(\w+)", target["expr"]))
        assert used <= set(variables), f"{title}: {target['expr']} uses an undefined variable"
        assert target["expr"].startswith("grpo_"), f"{title}: {target['expr']}"
    titles = " ".join(p["title"].lower() for p in panels)
    for topic in ("success", "reward", "step time", "tokens per second", "mismatch", "adapter version",
                  "restarts", "kl", "clip fraction"):
        assert topic in titles, topic


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _api(port: int, path: str, **params) -> dict:
    url = f"http://127.0.0.1:{port}/api/v1/{path}?{urllib.parse.urlencode(params, doseq=True)}"
    reply = json.loads(urllib.request.urlopen(url, timeout=10).read())
    assert reply["status"] == "success", reply
    return reply["data"]


def _wait(check, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{what} after {seconds} s")


def _last_step_scraped(port: int) -> bool:
    return any(float(s["value"][1]) >= STEPS for s in _api(port, "query", query="grpo_step")["result"])


@pytest.mark.slow
def test_every_panel_has_data_from_a_real_run(tmp_path, tiny_vl, monkeypatch):
    binary = shutil.which("prometheus")
    assert binary, "prometheus is not on PATH: `make prometheus` installs Debian's package (make test does it first)"
    metrics_port, prom_port = _free_port(), _free_port()
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, scrape_timeout: 1s}\n"
        f"scrape_configs: [{{job_name: grpo, static_configs: [{{targets: ['127.0.0.1:{metrics_port}']}}]}}]\n")
    log = (tmp_path / "prometheus.log").open("w")
    server = subprocess.Popen([binary, f"--config.file={tmp_path / 'prometheus.yml'}",
                               f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                               f"--web.listen-address=127.0.0.1:{prom_port}"], stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait(lambda: urllib.request.urlopen(f"http://127.0.0.1:{prom_port}/-/ready", timeout=2).status == 200,
              60, "Prometheus not ready")
        # The trainer serves /metrics only while it runs: keep the endpoint up until Prometheus has scraped
        # the last step (the instant query sees only series whose target is still up).
        # An error raised here would skip the trainer's Ray shutdown: it is kept and asserted after fit().
        close, late = MetricsSink.close, []

        def close_after_the_last_scrape(sink):
            try:
                _wait(lambda: _last_step_scraped(prom_port), 60, "Prometheus never scraped the last step")
            except TimeoutError as e:
                late.append(e)
            close(sink)

        monkeypatch.setattr(MetricsSink, "close", close_after_the_last_scrape)
        start = time.time()
        grpo.Trainer(grpo.RunConfig(
            model=str(tiny_vl), output_dir=str(tmp_path / "run"), steps=STEPS, tasks_per_step=2,
            env={"name": "maze", "options": {"size": 7, "max_turns": 4}},
            # The importance weight and the entropy selection on, for their panels.
            algorithm={"group_size": 4, "kl_coef": 0.001, "tis_cap": 2.0, "top_entropy_quantile": 0.8},
            lora={"rank": 8, "alpha": 16.0},
            train={"lr": 1e-3, "micro_batch_size": 16},
            rollout={"max_tokens_per_turn": 10, "history": "none"}, engine={"max_model_len": 2048},
            eval={"seeds": "0-1", "every": 1}, checkpoint={"every": 10}, cluster={"train_ranks": 2},
            metrics={"prometheus_port": metrics_port, "tensorboard": False, "plots": False})).fit()
        assert not late, late
        window = {"start": start - 5, "end": time.time() + 1, "step": 1}

        dashboard = _dashboard()
        for title, target in _targets(dashboard):
            expr = _resolve(target["expr"], dashboard)
            series = _api(prom_port, "query_range", query=expr, **window)["result"]
            assert series and all(s["values"] for s in series), f"panel {title!r}: {expr} returned no data"
        steps = _api(prom_port, "query_range", query="grpo_step", **window)["result"][0]["values"]
        assert max(float(v) for _, v in steps) == STEPS
        # The dashboard's run picker: Grafana's label_values(metric, label) is this label query.
        picker = _variables(dashboard)["instance"]["definition"]
        metric, label = re.fullmatch(r"label_values\((\w+), (\w+)\)", picker).groups()
        assert _api(prom_port, f"label/{label}/values", **{"match[]": metric, "start": window["start"]}) \
            == [f"127.0.0.1:{metrics_port}"]
    finally:
        server.terminate()
        server.wait(timeout=60)
        log.close()

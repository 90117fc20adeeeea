"""Weights & Biases logging for MetricsSink, optional: wandb is imported only when `metrics.wandb` is set.

Everything W&B writes stays in the run folder (RUN/wandb/: runs, settings, caches), never under the home
folder. A machine without network or without an API key logs offline there; `wandb sync` uploads it later.
The W&B run id is kept in RUN/wandb/run_id, so a resumed run continues the same W&B run.
"""
from __future__ import annotations

import netrc
import os
import socket
import sys
import uuid
from pathlib import Path
from urllib.parse import urlparse

DEFAULT_BASE_URL = "https://api.wandb.ai"


def resolve_mode(mode: str, env: dict, timeout_s: float = 3.0) -> tuple[str, str]:
    """The mode to run in and why: "online" or "offline" as asked; "auto" is online only when an API key is
    configured (WANDB_API_KEY, or `wandb login`'s entry in the netrc file) and the W&B server accepts a
    connection within timeout_s, since wandb online with no network retries for minutes."""
    if mode != "auto":
        return mode, f"metrics.wandb.mode={mode}"
    url = urlparse(env.get("WANDB_BASE_URL") or DEFAULT_BASE_URL)
    host = url.hostname or ""
    if not (env.get("WANDB_API_KEY") or _netrc_has(env.get("NETRC") or os.path.expanduser("~/.netrc"), host)):
        return "offline", "no W&B API key (set WANDB_API_KEY or run `wandb login`)"
    port = url.port or (80 if url.scheme == "http" else 443)
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as e:
        return "offline", f"{host}:{port} is not reachable ({e})"
    return "online", f"API key set and {host}:{port} reachable"


def _netrc_has(path: str, host: str) -> bool:
    try:
        return netrc.netrc(path).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


class WandbSink:
    def __init__(self, settings, run_dir: Path, run_config: dict | None = None):
        root = Path(run_dir).resolve() / "wandb"
        root.mkdir(parents=True, exist_ok=True)
        # wandb otherwise keeps settings, caches and artifacts under the home folder. A user's own setting wins;
        # ours are taken back at close, so that the next run in this process gets its own folder.
        folders = {"WANDB_DIR": root.parent, "WANDB_CONFIG_DIR": root / "config", "WANDB_CACHE_DIR": root / "cache",
                   "WANDB_DATA_DIR": root / "data", "WANDB_ARTIFACT_DIR": root / "artifacts"}
        self._env_set = [var for var in folders if var not in os.environ]
        os.environ.update({var: str(folders[var]) for var in self._env_set})
        mode, why = resolve_mode(settings.mode, dict(os.environ))
        id_file = root / "run_id"
        run_id = id_file.read_text().strip() if id_file.is_file() else uuid.uuid4().hex[:8]
        id_file.write_text(run_id + "\n")
        import wandb

        self._wandb = wandb
        try:
            self.run = wandb.init(project=settings.project, entity=settings.entity,
                                  name=settings.name or Path(run_dir).resolve().name, group=settings.group,
                                  tags=list(settings.tags) or None, config=run_config, dir=str(root.parent),
                                  mode=mode, id=run_id, resume="allow")
        except BaseException:
            self._restore_env()
            raise
        self.mode = mode
        where = f"offline in {self.run.dir}; upload it with `wandb sync {Path(self.run.dir).parent}`" \
            if mode == "offline" else self.run.url
        print(f"[grpo] W&B {mode} ({why}): {where}", file=sys.stderr)

    def log(self, values: dict, step: int) -> None:
        # Committed now, so the W&B view is not a step behind the run.
        self.run.log(values, step=step, commit=True)

    def event(self, values: dict) -> None:
        # W&B drops rows at steps it already committed: an event joins the next step's row.
        self.run.log(values, commit=False)

    def close(self) -> None:
        self.run.finish()
        # wandb's background service process: stop it with the run, not at interpreter exit.
        self._wandb.teardown()
        self._restore_env()

    def _restore_env(self) -> None:
        for var in self._env_set:
            os.environ.pop(var, None)

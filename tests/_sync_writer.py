"""Fork server for the crash test in test_sync_store.py: writers that the test kills with SIGKILL.

Importing torch costs seconds, so this process imports it once and forks one writer per trial. It never
runs a torch op itself (forking after OpenMP has started threads can hang the child).

Protocol, one JSON line per trial on stdin:
{"root": ..., "journal": ..., "seed": <int>, "pause": null | "manifest" | "collect"}.
The writer prints "pid <n>", then publishes content(seed), content(seed + 1), ... in a loop, appending
"intent <seed>" to the journal before each publish and "done <version> <seed>" after it. With "pause",
it prints "paused <stage>" and sleeps at that stage of its first publish: "manifest" is after the version
folder is renamed into place and before the manifest names it, "collect" after the manifest is written
and before old folders are removed. When the writer dies, this server prints "exit <wait status>".
Closing stdin ends the server.
"""

import json
import os
import sys
import time
import traceback

import torch

from sync import store as store_module
from sync.store import AdapterStore

LAYERS = 4
RANK = 32
WIDTH = 4096
CONFIG = {"peft_type": "LORA", "r": RANK, "lora_alpha": 64, "target_modules": ["q_proj", "v_proj"]}


def content(seed: int) -> dict[str, torch.Tensor]:
    """The tensors a writer publishes for seed (< 2**17): 8 MiB, each element set by seed and position."""
    row = torch.arange(WIDTH, dtype=torch.float32)
    tensors = {}
    for layer in range(LAYERS):
        for proj in ("q_proj", "v_proj"):
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{proj}"
            base = float(seed * 64 + layer * 2 + (proj == "v_proj"))  # exact in float32
            tensors[f"{prefix}.lora_A.weight"] = (row + base).expand(RANK, WIDTH).contiguous()
            tensors[f"{prefix}.lora_B.weight"] = (row - base).expand(RANK, WIDTH).t().contiguous()
    return tensors


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _pause(stage: str, original):
    def paused(*args, **kwargs):
        _say(f"paused {stage}")
        time.sleep(600)
        return original(*args, **kwargs)
    return paused


def _write_journal(fd: int, line: str) -> None:
    os.write(fd, (line + "\n").encode())  # one unbuffered append: it survives SIGKILL


def writer(root: str, journal: str, seed: int, pause: str | None) -> None:
    torch.set_num_threads(1)
    _say(f"pid {os.getpid()}")
    if pause == "manifest":
        store_module.write_manifest = _pause(pause, store_module.write_manifest)
    elif pause == "collect":
        AdapterStore._remove_unreferenced = _pause(pause, AdapterStore._remove_unreferenced)
    store = AdapterStore(root, keep_last=2)
    fd = os.open(journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    while True:
        _write_journal(fd, f"intent {seed}")
        version = store.publish(content(seed), CONFIG)
        _write_journal(fd, f"done {version} {seed}")
        seed += 1


def serve() -> None:
    _say("ready")
    for line in sys.stdin:
        trial = json.loads(line)
        pid = os.fork()
        if pid == 0:
            try:
                writer(trial["root"], trial["journal"], trial["seed"], trial["pause"])
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stderr.flush()
                os._exit(1)  # a writer runs until it is killed: getting here is a failure
        _, status = os.waitpid(pid, 0)
        _say(f"exit {status}")


if __name__ == "__main__":
    serve()

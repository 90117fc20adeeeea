"""A disk that fills at any write of a run, on real tmpfs mounts: the run stops with one [grpo] line naming the
write (exit status 74) and no traceback, and the last checkpoint and the last published adapter from before it
verify. A checkpoint the run refuses is one line too (exit status 65). Needs root, for mount."""
import errno
import inspect
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from grpo.driver import storage
from grpo.learner import checkpoint
from sync import AdapterCorruptError, AdapterStore

# The README's own example env, made small: the script below runs in a process of its own, so that what reaches
# stderr and the exit status are what a user sees.
_SCRIPT_TEMPLATE = '''
import json, os, sys
import envs, grpo

class Guess(envs.Env):
    def reset(self, seed):
        self.target, self.turn = seed % 10, 0
        return envs.Observation("Guess my number, 0 to 9. Reply with one digit.")
    def step(self, action):
        self.turn, guess = self.turn + 1, next((int(c) for c in action if c in "0123456789"), -1)
        won = guess == self.target
        return envs.StepResult(envs.Observation("Correct!" if won else "No."), float(won), won or self.turn == 2,
                               {"success": won})

envs.register("guess", Guess)

{fill}
class FillAt(grpo.Callback):
    """Fills `folder` where the site's write comes next: after `phase` of `step`, or at that step's end."""
    def __init__(self, folder, hook, step):
        self.folder, self.hook, self.step = folder, hook, step
    def on_phase_end(self, trainer, phase, seconds):
        if phase == self.hook and trainer._step == self.step:
            _fill(self.folder)
    def on_step_end(self, trainer, record):
        if self.hook == "step_end" and record["step"] == self.step:
            # A callback's own figures, more than the page the last line may leave free in metrics.jsonl and
            # in TensorBoard's file: the line must need space the disk no longer has.
            record["pad"] = {f"k{i}": float(i) for i in range(600)}
            _fill(self.folder)
    def on_eval(self, trainer, label, result):
        if self.hook == label:
            _fill(self.folder)

def config(out):
    return grpo.RunConfig(
        model=os.environ["MODEL"], env="guess", output_dir=out, steps=2, tasks_per_step=2,
        algorithm={"group_size": 2}, lora={"rank": 4, "alpha": 8.0}, rollout={"max_tokens_per_turn": 4},
        engine={"max_model_len": 256}, eval={"seeds": "100-101", "every": 0}, checkpoint={"every": 1, "keep": 2},
        cluster={"train_ranks": 1}, metrics={"plots": False, "samples_per_step": 2})

if sys.argv[1] == "cli":  # the grpo command, with this env registered
    from grpo.cli import main
    with open(sys.argv[3], "w") as f:
        f.write(config(sys.argv[2]).to_yaml())
    sys.exit(main(["train", sys.argv[3]]))
import shutil, tempfile
import ray
from grpo.driver.fault import flip_byte
# One Ray for every site's run, in a folder of its own that goes with it.
ray_dir = tempfile.mkdtemp(prefix="grpo-ray-", dir="/tmp")
ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _temp_dir=ray_dir)
try:
    for site, out, folder, hook, step in json.loads(sys.argv[2]):
        if site == "refused":  # a copy of the run in `folder`, every kept checkpoint corrupted
            shutil.copytree(folder, out, ignore=shutil.ignore_patterns("filler"))
            folder = None
            for d in json.load(open(os.path.join(out, "checkpoints", "latest.json")))["kept"]:
                flip_byte(os.path.join(out, "checkpoints", d, "__0_0.distcp"))
        print(f"=== {site}", file=sys.stderr, flush=True)
        callbacks = [FillAt(folder, hook, step)] if folder else []
        try:
            grpo.Trainer(config(out), callbacks=callbacks).fit()
            status = 0
        except SystemExit as e:
            status = e.code
        print(json.dumps({"site": site, "status": status}), flush=True)
finally:
    ray.shutdown()
    shutil.rmtree(ray_dir, ignore_errors=True)
'''


def _fill(folder):
    """Fill the filesystem of `folder` to its last page. Unbuffered: a buffered file would raise ENOSPC once
    more as it closes."""
    fd = os.open(os.path.join(folder, "filler"), os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, bytes(1 << 16))
    except OSError as e:
        assert e.errno == errno.ENOSPC
    finally:
        os.close(fd)


_SCRIPT = _SCRIPT_TEMPLATE.replace("{fill}", "import errno\n" + inspect.getsource(_fill))

# site: (the folder that gets a tmpfs of its own, relative to the run folder, and is filled; the hook that fills
# it; the step whose hook it is; what the line says was being written; what it says is kept)
_SITES = {
    "adapter": ("store", "train", 2, "writing an adapter version", (1, 2)),
    "checkpoint": ("checkpoints", "step_end", 2, "writing a checkpoint", (1, 3)),
    "metrics": (".", "step_end", 2, "writing the metrics", (1, 3)),
    "tensorboard": ("tensorboard", "step_end", 2, "writing TensorBoard's events", (1, 3)),
    # samples.jsonl's first lines: later ones may fit in the page its last line left free.
    "samples": (".", "hotload", 1, "writing the samples", (None, 2)),
    "summary": (".", "after", None, "writing the summary", (2, 3)),
}


def _mount(path: Path, megabytes: int) -> None:
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={megabytes}m", "tmpfs", str(path)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"mounting a tmpfs needs root (CAP_SYS_ADMIN): {done.stderr.strip()}")


def _unmount_all(paths: list[Path]) -> None:
    for path in reversed(paths):  # the nested ones first
        subprocess.run(["umount", str(path)], capture_output=True)


def _env(session_dir: Path, model: Path) -> dict:
    # Every run's caches in one folder off the tmpfs mounts: only the run's own writes meet the full disk.
    return {**os.environ, "MODEL": str(model), "GRPO_CACHE_DIR": str(session_dir / "disk-full-cache")}


def _stop_lines(err: str, start: str) -> list[str]:
    return [x for x in err.splitlines() if x.startswith(start)]


def _kept(run: Path) -> tuple:
    """The step of the last checkpoint and the last published adapter version, each verified by the run's own
    readers (None: none yet)."""
    info = checkpoint.latest(run / "checkpoints")
    adapter = AdapterStore(run / "store").latest_verified()
    return (info.step if info else None, adapter.version if adapter else None)


def test_the_failed_write_is_found_inside_a_checkpoint_exception_behind_ray():
    from ray.exceptions import RayTaskError
    from torch.distributed.checkpoint.api import CheckpointException, _wrap_exception

    try:
        raise OSError(errno.ENOSPC, "No space left on device", "/r/checkpoints/step_00000002-ab/__0_0.distcp")
    except OSError as e:
        full = e
    # What DCP raises in every rank (each rank's failure in `failures`), and Ray's copy of it in the driver.
    dcp = CheckpointException("save failed", {0: _wrap_exception(full)})
    assert storage.storage_error(RayTaskError("TrainWorker.save_checkpoint", "tb", dcp).as_instanceof_cause()) is full
    # A constructor's error reaches the driver as text only.
    from ray.exceptions import ActorDiedError

    died = ActorDiedError(RayTaskError("RolloutWorker.__init__", "Traceback ...\nOSError: [Errno 28] No space left "
                                       "on device: '/r/store/adapters/readers/w.json'", OSError()))
    assert storage.storage_error(RuntimeError("could not start")) is None
    try:
        raise RuntimeError("rollout-0 could not start") from died
    except RuntimeError as e:
        found = storage.storage_error(e)
    assert (found.errno, found.filename) == (errno.ENOSPC, "/r/store/adapters/readers/w.json")
    assert storage.what(found.filename) == "a rollout worker's adapter lease"
    # The store's background fsync that failed, raised by the next publish in train rank 0 and pickled by Ray
    # (which drops __cause__): a failed write, not a refused store.
    from sync import AdapterStoreError

    durable = AdapterStoreError("making the last adapter version durable failed")
    durable.failed = full
    assert storage.storage_error(pickle.loads(pickle.dumps(durable))).filename == full.filename


def test_a_refused_file_is_one_line_and_the_traceback_comes_on_request(capsys, monkeypatch):
    from ray.exceptions import RayTaskError

    corrupt = AdapterCorruptError(3, "/r/store/adapters/v000003/adapter_model.safetensors", "aa", "bb", "/r/m.json")
    try:
        raise RayTaskError("RolloutWorker.sync_adapter", "Traceback ...", corrupt).as_instanceof_cause()
    except RayTaskError as e:
        wrapped = e
    monkeypatch.delenv(storage.TRACEBACK_ENV, raising=False)
    assert storage.report(wrapped, "in step 3", lambda: "unused") == storage.REFUSED_EXIT
    err = capsys.readouterr().err
    assert err == f"[grpo] refused in step 3: {corrupt}\n" and "Traceback" not in err
    assert storage.report(ValueError("a bug"), "in step 3", lambda: "unused") is None
    monkeypatch.setenv(storage.TRACEBACK_ENV, "1")
    assert storage.report(wrapped, "in step 3", lambda: "unused") == storage.REFUSED_EXIT
    err = capsys.readouterr().err
    assert err.startswith("Traceback") and err.splitlines()[-1].startswith("[grpo] refused in step 3: ")


def test_a_full_disk_at_the_config_write_stops_the_grpo_command_with_one_line(tmp_path, tiny_text, session_dir):
    run = tmp_path / "run"
    _mount(run, 1)
    try:
        (run / "run.lock").write_text("1 host\n")  # left by an earlier run: its page is reused, none is needed
        _fill(run)
        script = tmp_path / "train.py"
        script.write_text(_SCRIPT)
        done = subprocess.run([sys.executable, str(script), "cli", str(run), str(tmp_path / "run.yaml")],
                              capture_output=True, text=True, env=_env(session_dir, tiny_text), timeout=300)
        assert done.returncode == storage.STORAGE_EXIT, done.stderr
        lines = _stop_lines(done.stderr, "[grpo]")
        assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
        assert lines[0].startswith(f"[grpo] storage failed while starting: No space left on device (ENOSPC) writing "
                                   f"the run's config {run}/.tmp-config.yaml-")
        assert "no checkpoint yet; last published adapter: none yet" in lines[0]
        assert not (run / "config.yaml").exists()  # never a torn config
    finally:
        _unmount_all([run])


@pytest.mark.slow
def test_a_full_disk_at_every_write_site_stops_the_run_with_one_line_and_keeps_what_was_written(
        tmp_path, tiny_text, session_dir):
    mounts, plan = [], []
    try:
        for site, (folder, hook, step, _, _) in _SITES.items():
            run = tmp_path / site
            _mount(run, 16)
            mounts.append(run)
            if folder != ".":
                _mount(run / folder, 16)
                mounts.append(run / folder)
            plan.append((site, str(run), str(run / folder), hook, step))
        # A copy of the summary's finished run, its checkpoints both corrupted: the run refuses to resume.
        plan.append(("refused", str(tmp_path / "refused"), str(tmp_path / "summary"), None, None))
        script = tmp_path / "sites.py"
        script.write_text(_SCRIPT)
        done = subprocess.run([sys.executable, str(script), "sites", json.dumps(plan)], capture_output=True,
                              text=True, env=_env(session_dir, tiny_text), timeout=1200)
        assert done.returncode == 0, done.stderr[-5000:]
        statuses = {r["site"]: r["status"] for r in map(json.loads, done.stdout.splitlines()[-len(plan):])}
        parts = dict(p.split("\n", 1) for p in done.stderr.split("=== ")[1:])
        assert "Traceback" not in done.stderr, done.stderr[-5000:]
        for site, (folder, _, _, writing, kept) in _SITES.items():
            run, err = tmp_path / site, parts[site]
            assert statuses[site] == storage.STORAGE_EXIT, (site, err)
            lines = _stop_lines(err, "[grpo] storage failed")
            assert len(lines) == 1 and _stop_lines(err, "[grpo]")[-1] == lines[0], (site, err)
            assert f": No space left on device (ENOSPC) {writing} {(run / folder).resolve()}" in lines[0], lines[0]
            ckpt, adapter = kept
            said = (f"last checkpoint: step {ckpt} at {run}/checkpoints/step_" if ckpt else "no checkpoint yet")
            assert said in lines[0] and f"last published adapter: v{adapter} (verified)" in lines[0], lines[0]
            assert _kept(run) == kept, site
            # Every line of the run's JSONL files is whole: a resumed run reads them.
            for name in ("metrics.jsonl", "samples.jsonl"):
                if (run / name).exists():
                    [json.loads(x) for x in (run / name).read_text().splitlines()]
        err = parts["refused"]
        assert statuses["refused"] == storage.REFUSED_EXIT, err
        lines = _stop_lines(err, "[grpo] refused")
        assert len(lines) == 1 and lines[0].startswith(f"[grpo] refused while starting: no checkpoint under "
                                                       f"{tmp_path / 'refused' / 'checkpoints'} verifies: "), err
        assert "__0_0.distcp fails its sha256" in lines[0] and "Restore one of them" in lines[0]
    finally:
        _unmount_all(mounts)

"""Storage faults on real filesystems: a run whose disk turns read-only in the middle of a step, on 2 train ranks,
stops with one [grpo] line and a non-zero exit, loses nothing it wrote before, and resumes once the storage is
fixed. A disk that fills at the same write (and at every other write site) is tests/test_disk_full.py's: a full
disk here too ran the same stop again (80 s of the suite on the 2-core EPYC) for the same line and kept files."""
import errno
import json
import subprocess
from pathlib import Path

import pytest

import grpo
from grpo.driver import storage
from grpo.driver.fault import ActorFault
from grpo.learner import checkpoint
from sync import AdapterStore


def test_the_failed_write_is_found_behind_rays_wrapping_and_described():
    from ray.exceptions import RayTaskError

    full = OSError(errno.ENOSPC, "No space left on device", "/data/run/store/adapters/.tmp-v3/a.safetensors")
    # What Ray raises in the driver is an OSError too, with the errno and without the file name.
    wrapped = RayTaskError("TrainWorker.publish", "traceback text", full).as_instanceof_cause()
    assert isinstance(wrapped, OSError) and wrapped.filename is None
    try:
        try:
            raise wrapped
        except RayTaskError as e:
            raise RuntimeError("the step failed") from e
    except RuntimeError as outer:
        assert storage.storage_error(outer) is full
    assert storage.storage_error(ValueError("a bug")) is None
    assert storage.storage_error(ActorFault("rollout-0", "ActorDiedError during rollout")) is None  # a text cause
    assert storage.storage_error(FileNotFoundError(errno.ENOENT, "gone", "/x")) is None  # a bug as often as not
    line = storage.describe(full, "in step 3", "last checkpoint: step 2 at /c; last published adapter: v3 (verified)")
    assert line.startswith("[grpo] storage failed in step 3: No space left on device (ENOSPC) writing an adapter "
                           "version /data/run/store/adapters/.tmp-v3/a.safetensors; ")
    assert " MiB free of " in line and line.endswith(
        "there; last checkpoint: step 2 at /c; last published adapter: v3 (verified); fix: free space on that "
        "filesystem, or set output_dir to one with room, then run the same command to resume")


def _mount_tmpfs(path: Path, megabytes: int) -> None:
    path.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={megabytes}m", "tmpfs", str(path)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"mounting a tmpfs needs root (CAP_SYS_ADMIN): {done.stderr.strip()}")


class _BreakStorage(grpo.Callback):
    """Breaks the disk after the train phase of `step`: the publish that follows writes to broken storage."""

    def __init__(self, step: int, breaks):
        self.step, self.breaks = step, breaks

    def on_phase_end(self, trainer, phase, seconds):
        if phase == "train" and trainer.state.step == self.step - 1:
            self.breaks()


def _read_only(disk: Path) -> None:
    # A read-only view of the folder over itself: remounting the tmpfs read-only would wait for the files
    # the run holds open for writing.
    subprocess.run(["mount", "--bind", str(disk), str(disk)], check=True)
    subprocess.run(["mount", "-o", "remount,bind,ro", str(disk)], check=True)


def _config(model, out):
    return grpo.RunConfig(
        model=str(model), output_dir=str(out), steps=3, tasks_per_step=2,
        env={"name": "maze", "options": {"size": 7, "max_turns": 3}}, algorithm={"group_size": 2},
        lora={"rank": 8, "alpha": 16.0}, train={"lr": 1e-3, "micro_batch_size": 16},
        rollout={"max_tokens_per_turn": 10, "history": "none"}, engine={"max_model_len": 2048},
        eval={"seeds": "0-1", "every": 0}, checkpoint={"every": 1, "keep": 2}, cluster={"train_ranks": 2},
        metrics={"plots": False, "tensorboard": False})


@pytest.mark.slow
def test_read_only_storage_mid_step_stops_the_run_with_one_line_and_loses_nothing(tmp_path, tiny_vl, capfd):
    disk = tmp_path / "disk"
    _mount_tmpfs(disk, 16)
    try:
        with pytest.raises(SystemExit) as stopped:
            grpo.Trainer(_config(tiny_vl, disk), callbacks=[_BreakStorage(2, lambda: _read_only(disk))]).fit()
        assert stopped.value.code == storage.STORAGE_EXIT
        err = capfd.readouterr().err
        lines = [x for x in err.splitlines() if x.startswith("[grpo] storage failed")]
        assert len(lines) == 1 and lines[0].startswith(
            f"[grpo] storage failed in step 2: Read-only file system (EROFS) writing an adapter version {disk}/store/")
        assert "last checkpoint: step 1 at" in lines[0] and "last published adapter: v2 (verified)" in lines[0]
        assert "Traceback" not in err
        # What step 1 wrote is intact: its checkpoint and the adapter it published verify.
        assert checkpoint.latest(disk / "checkpoints").step == 1
        assert AdapterStore(disk / "store").latest_verified().version == 2
        assert [json.loads(x)["step"] for x in (disk / "metrics.jsonl").read_text().splitlines()] == [1]

        # The storage fixed, the same command resumes from step 1 and finishes.
        subprocess.run(["umount", str(disk)], check=True)  # the read-only view goes, the tmpfs stays
        summary = grpo.Trainer(_config(tiny_vl, disk)).fit()
        assert summary["steps"] == 3 and "[grpo] resumed from" in capfd.readouterr().err
    finally:
        while subprocess.run(["umount", str(disk)], capture_output=True).returncode == 0:
            pass  # the read-only view, if left, then the tmpfs

"""`model:` as a Hub id (rollout.models.resolve_model): found in the user's own Hugging Face cache, a real cache
layout built offline (the end-to-end run from an id is tests/test_export.py's), and a missing id refused in one
line naming the command that fetches it."""
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grpo.cli import main
from rollout.models import is_hub_id, resolve_model

ROOT = Path(__file__).resolve().parents[1]


def hub_cache(hf_home: Path, repo_id: str, model_dir: Path) -> Path:
    """`model_dir` stored as huggingface_hub stores a download of `repo_id` under $HF_HOME/hub: each file a blob
    named by its hash, a snapshot folder of relative links to the blobs named by the commit, and refs/main
    naming that commit. Returns the snapshot folder."""
    repo = hf_home / "hub" / f"models--{repo_id.replace('/', '--')}"
    commit = hashlib.sha1(repo_id.encode()).hexdigest()
    snapshot = repo / "snapshots" / commit
    for f in sorted(p for p in model_dir.rglob("*") if p.is_file()):
        blob = repo / "blobs" / hashlib.sha256(f.read_bytes()).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, blob)
        link = snapshot / f.relative_to(model_dir)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return snapshot


def test_hub_ids_are_org_slash_name_and_nothing_else():
    assert is_hub_id("Qwen/Qwen2.5-0.5B-Instruct") and is_hub_id("HuggingFaceTB/SmolLM2-135M-Instruct")
    for spec in ("runs/models/tiny-text", "/abs/org/name", "./org", "gpt2", "org/", "/name", "a--b/c", "a/b..c",
                 "org/name/extra", "org name/x"):
        assert not is_hub_id(spec), spec


def test_an_id_resolves_to_its_snapshot_in_the_users_cache(tmp_path, tiny_text, monkeypatch, capsys):
    import huggingface_hub

    snapshot = hub_cache(tmp_path / "hf", "tiny-org/tiny-text", tiny_text)
    # This process imported huggingface_hub long ago: its cache folder, which $HF_HOME sets at import, set here.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    assert resolve_model("tiny-org/tiny-text") == snapshot
    from transformers import AutoConfig

    assert AutoConfig.from_pretrained(snapshot).model_type == AutoConfig.from_pretrained(tiny_text).model_type
    # The dry run finds it in the cache, and says what to do about an id that is not there.
    config = tmp_path / "run.yaml"
    config.write_text("steps: 1\n")
    for model, found in (("tiny-org/tiny-text", True), ("tiny-org/elsewhere", False)):
        assert main(["train", str(config), "--model", model, "--dry-run"]) == 0
        out, err = capsys.readouterr()
        assert json.loads(out.strip().splitlines()[-1])["model_found"] is found
        assert ("`hf download tiny-org/elsewhere` does it now" in err) is not found
    # A local folder is itself, even when its relative path looks like an id.
    monkeypatch.chdir(tmp_path)
    shutil.copytree(tiny_text, tmp_path / "tiny-org" / "tiny-text")
    assert resolve_model("tiny-org/tiny-text") == Path("tiny-org/tiny-text")
    with pytest.raises(ValueError, match="no config.json"):
        resolve_model(tmp_path / "hf")  # check_model_dir's errors stay


def test_a_missing_id_fails_in_seconds_with_one_line(tmp_path, tiny_text):
    config = tmp_path / "run.yaml"
    config.write_text(f"output_dir: {tmp_path / 'run'}\nsteps: 1\n")
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "grpo", "train", str(config), "--model", "no-org/no-model"],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    took = time.monotonic() - t0
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert "'no-org/no-model'" in lines[0] and "`hf download no-org/no-model`" in lines[0]
    assert str(tmp_path / "hf" / "hub") in lines[0] and "HF_HUB_OFFLINE" in lines[0]
    assert took < 10, took
    assert not (tmp_path / "run").exists()

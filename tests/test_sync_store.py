"""The adapter store (sync/store.py): round trip, peft loading, crash safety, corruption, GC, versioning."""

import enum
import importlib.util
import json
import logging
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import safetensors.torch
import torch

from sync import (
    ADAPTER_FILE,
    CONFIG_FILE,
    AdapterCorruptError,
    AdapterNotFoundError,
    AdapterStore,
    AdapterStoreError,
    AdapterVersionConflictError,
)

WRITER = Path(__file__).with_name("_sync_writer.py")
CONFIG = {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]}


def lora(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        f"base_model.model.model.layers.{i}.self_attn.{p}.lora_{ab}.weight": torch.randn(shape, generator=g)
        for i in range(2) for p in ("q_proj", "v_proj") for ab, shape in (("A", (4, 16)), ("B", (16, 4)))
    }


def assert_same_tensors(actual: dict, expected: dict) -> None:
    assert actual.keys() == expected.keys()
    for key, tensor in expected.items():
        assert actual[key].dtype == tensor.dtype, key
        assert torch.equal(actual[key], tensor), key


def read_version(store: AdapterStore, version: int) -> tuple[dict, dict]:
    """A version's tensors and config, read as peft and vLLM read them, once verify() has passed."""
    path = Path(store.verify(version).path)
    return safetensors.torch.load_file(path / ADAPTER_FILE), json.loads((path / CONFIG_FILE).read_text())


def version_folders(root: Path) -> set[int]:
    return {int(p.name[1:]) for p in (root / "adapters").iterdir() if p.name.startswith("v")}


def temp_entries(root: Path) -> list[str]:
    return [p.name for p in (root / "adapters").iterdir() if p.name.startswith(".tmp-")]


class Kind(enum.Enum):
    LORA = "LORA"


def test_round_trip(tmp_path):
    store = AdapterStore(tmp_path)
    assert store.latest() is None and store.latest_verified() is None and store.versions() == []
    buffer = torch.arange(64, dtype=torch.float32)
    tensors = {
        "m.layers.0.q_proj.lora_A.weight": torch.randn(4, 16),
        "m.layers.0.q_proj.lora_B.weight": torch.randn(4, 16).t(),  # not contiguous
        "m.layers.0.v_proj.lora_A.weight": torch.randn(4, 16, dtype=torch.bfloat16),
        "m.layers.0.v_proj.lora_B.weight": buffer[8:24].view(4, 4),  # a view into a larger buffer
    }
    config = {"peft_type": Kind.LORA, "r": 4, "target_modules": {"v_proj", "q_proj"}, "layers": (0, 1),
              "rank_pattern": {}, "nested": {"a": None, "b": 1.5}}

    assert store.publish(tensors, config) == 1
    latest = store.latest()
    assert (latest.version, latest.name, latest.path) == (1, "v000001", str(tmp_path / "adapters" / "v000001"))
    assert sorted(os.listdir(latest.path)) == ["adapter_config.json", "adapter_model.safetensors"]
    assert store.verify(1) == latest and store.latest_verified() == latest

    expected_config = {"peft_type": "LORA", "r": 4, "target_modules": ["q_proj", "v_proj"], "layers": [0, 1],
                       "rank_pattern": {}, "nested": {"a": None, "b": 1.5}}
    loaded, loaded_config = read_version(store, 1)
    assert_same_tensors(loaded, tensors)
    assert loaded_config == expected_config
    # The files themselves are what peft and vLLM read.
    assert_same_tensors(safetensors.torch.load_file(os.path.join(latest.path, "adapter_model.safetensors")), tensors)
    assert json.loads(Path(latest.path, "adapter_config.json").read_text()) == expected_config

    assert store.publish(lora(1), CONFIG) == 2
    assert [v.version for v in store.versions()] == [1, 2]
    assert_same_tensors(read_version(store, 2)[0], lora(1))
    assert_same_tensors(read_version(store, 1)[0], tensors)


def test_publish_refuses_what_peft_or_vllm_could_not_load(tmp_path):
    store = AdapterStore(tmp_path)
    with pytest.raises(ValueError, match=r"'\.default'"):
        store.publish({"m.q_proj.lora_A.default.weight": torch.zeros(2, 2)}, CONFIG)
    with pytest.raises(ValueError, match="peft_type"):
        store.publish(lora(0), {"r": 4})
    with pytest.raises(TypeError, match=r"config\['init'\] is of type object"):
        store.publish(lora(0), {**CONFIG, "init": object()})
    with pytest.raises(ValueError, match="no tensors"):
        store.publish({}, CONFIG)
    assert store.latest() is None


def test_peft_loads_a_published_adapter(tmp_path):
    from peft import LoraConfig, PeftModel, get_peft_model, get_peft_model_state_dict
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    base = AutoModelForCausalLM.from_config(config)
    base_state = {k: v.clone() for k, v in base.state_dict().items()}
    # init_lora_weights=False makes B nonzero, so an adapter that failed to load would change the logits.
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                            init_lora_weights=False, task_type="CAUSAL_LM"))
    published = get_peft_model_state_dict(model)
    store = AdapterStore(tmp_path)
    version = store.publish(published, model.peft_config["default"].to_dict())

    fresh = AutoModelForCausalLM.from_config(config)
    fresh.load_state_dict(base_state)
    loaded = PeftModel.from_pretrained(fresh, store.latest().path)
    assert_same_tensors(get_peft_model_state_dict(loaded), published)
    assert loaded.peft_config["default"].target_modules == {"q_proj", "v_proj"}
    ids = torch.randint(0, 128, (2, 12))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)
    assert version == 1


def test_corrupt_file_is_refused_and_the_previous_version_used(tmp_path, caplog):
    store = AdapterStore(tmp_path)
    store.publish(lora(1), CONFIG)
    store.publish(lora(2), CONFIG)
    weights = tmp_path / "adapters" / "v000002" / "adapter_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-100:-90] = bytes(b ^ 0xFF for b in data[-100:-90])  # tensor data, so the header still parses
    weights.write_bytes(bytes(data))

    with pytest.raises(AdapterCorruptError) as refused:
        store.verify(2)
    error = refused.value
    assert (error.version, error.file) == (2, str(weights))
    assert error.expected == store.latest().sha256["adapter_model.safetensors"] != error.actual
    for part in ("version 2", str(weights), error.expected, error.actual, "latest_verified()"):
        assert part in str(error)

    with caplog.at_level(logging.WARNING, logger="sync.store"):
        fallback = store.latest_verified()
    assert fallback.version == 1
    assert_same_tensors(read_version(store, fallback.version)[0], lora(1))
    assert "skipping adapter version 2" in caplog.text and "using adapter version 1" in caplog.text
    assert store.acquire("rollout-0").version == 1

    (tmp_path / "adapters" / "v000001" / "adapter_config.json").write_text("{}")
    with pytest.raises(AdapterStoreError, match="no adapter version .* verifies"):
        store.latest_verified()
    # The next publish supersedes the corrupt versions.
    store.publish(lora(3), CONFIG)
    assert store.latest_verified().version == 3


def test_garbage_collection(tmp_path):
    store = AdapterStore(tmp_path, keep_last=2, lease_ttl_s=60)
    store.publish(lora(1), CONFIG)
    store.mark_in_use("rollout-0", 1)
    for seed in range(2, 6):
        store.publish(lora(seed), CONFIG)
    assert version_folders(tmp_path) == {1, 4, 5}  # the last two, and the one a reader still uses
    assert [v.version for v in store.versions()] == [1, 4, 5]
    assert_same_tensors(read_version(store, 1)[0], lora(1))

    assert store.acquire("rollout-0").version == 5  # the reader moves on: version 1 is free
    store.publish(lora(6), CONFIG)
    assert version_folders(tmp_path) == {5, 6}

    # A lease not refreshed within lease_ttl_s (a reader that died) stops protecting its version.
    store.mark_in_use("rollout-1", 5)
    lease = tmp_path / "adapters" / "readers" / "rollout-1.json"
    lease.write_text(json.dumps({**json.loads(lease.read_text()), "time": time.time() - 120}))
    store.release("rollout-0")
    store.publish(lora(7), CONFIG)
    assert version_folders(tmp_path) == {6, 7}

    # A killed writer's temporary folder and manifest never count as versions, and the next publish removes them.
    partial = tmp_path / "adapters" / ".tmp-v000008-12345-deadbeef"
    partial.mkdir()
    (partial / "adapter_model.safetensors").write_bytes(b"truncated")
    (tmp_path / "adapters" / ".tmp-manifest.json-12345-deadbeef").write_text("{")
    assert store.latest().version == 7
    store.publish(lora(8), CONFIG)
    assert temp_entries(tmp_path) == []
    assert version_folders(tmp_path) == {7, 8}

    # keep_last=1 keeps only the latest.
    AdapterStore(tmp_path, keep_last=1).publish(lora(9), CONFIG)
    assert version_folders(tmp_path) == {9}
    assert_same_tensors(read_version(store, 9)[0], lora(9))

    with pytest.raises(AdapterNotFoundError, match="version 4 is not in"):
        store.mark_in_use("rollout-0", 4)
    with pytest.raises(ValueError, match="reader_id"):
        store.mark_in_use("../escape", 9)
    with pytest.raises(AdapterNotFoundError, match="garbage-collected"):
        read_version(store, 8)


def test_versions_increase_across_restarts_and_explicit_versions(tmp_path):
    AdapterStore(tmp_path).publish(lora(1), CONFIG)
    AdapterStore(tmp_path).publish(lora(2), CONFIG)
    store = AdapterStore(tmp_path)
    assert store.publish(lora(3), CONFIG) == 3

    # A writer killed between renaming v4 into place and updating the manifest: v4 is invisible and
    # its number is not reused.
    shutil.copytree(tmp_path / "adapters" / "v000003", tmp_path / "adapters" / "v000004")
    assert store.latest().version == 3
    assert AdapterStore(tmp_path).publish(lora(5), CONFIG) == 5
    assert 4 not in version_folders(tmp_path)

    # A resumed trainer republishing a version it already published with the same weights: a no-op.
    assert store.publish(lora(5), CONFIG, version=5) == 5
    assert store.latest().version == 5
    with pytest.raises(AdapterVersionConflictError, match="version 5 already exists .* next free number \\(6\\)"):
        store.publish(lora(99), CONFIG, version=5)
    with pytest.raises(AdapterVersionConflictError, match="older than the latest version 5"):
        store.publish(lora(99), CONFIG, version=4)
    with pytest.raises(ValueError, match="start at 1"):
        store.publish(lora(99), CONFIG, version=0)
    assert_same_tensors(read_version(store, 5)[0], lora(5))

    # An explicit version may skip ahead, and replaces a folder the manifest never named.
    shutil.copytree(tmp_path / "adapters" / "v000005", tmp_path / "adapters" / "v000008")
    assert store.publish(lora(8), CONFIG, version=8) == 8
    assert_same_tensors(read_version(store, 8)[0], lora(8))
    assert AdapterStore(tmp_path).publish(lora(9), CONFIG) == 9


# ------------------------------------------------------------------------------------- killed writers


def _load_writer_module():
    spec = importlib.util.spec_from_file_location("_sync_writer", WRITER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _read_line(server: subprocess.Popen, errors: Path, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    line = b""
    while not line.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([server.stdout], [], [], remaining)[0]:
            raise AssertionError(f"writer server silent for {timeout} s; its stderr:\n{errors.read_text()}")
        byte = server.stdout.read(1)
        if not byte:
            raise AssertionError(f"writer server exited; its stderr:\n{errors.read_text()}")
        line += byte
    return line.decode().strip()


def _journal(path: Path) -> tuple[dict[int, int], int | None]:
    """Versions the writers finished (version -> seed), and the seed of the publish in flight, if any."""
    done, pending = {}, None
    for line in path.read_text().splitlines() if path.exists() else []:
        kind, *values = line.split()
        if kind == "intent":
            pending = int(values[0])
        else:
            done[int(values[0])] = int(values[1])
            pending = None
    return done, pending


def test_killed_writer_never_exposes_a_bad_version(tmp_path):
    """SIGKILL a writer at random points of publish (and, deterministically, between the version folder's
    rename and the manifest update, and before garbage collection): the store must always return the
    previous good version or the new complete one, and the next publish must succeed."""
    writer = _load_writer_module()
    root, journal, errors = tmp_path / "store", tmp_path / "journal", tmp_path / "writer.err"
    rng = random.Random(20240607)
    pauses = [None] * 24
    for position, stage in ((5, "manifest"), (11, "collect"), (17, "manifest")):
        pauses.insert(position, stage)

    store = AdapterStore(root, keep_last=2)
    seeds: dict[int, int] = {}  # version -> seed of its content, for every version folder ever seen
    latest_seen = 0
    with open(errors, "wb") as stderr:
        server = subprocess.Popen([sys.executable, str(WRITER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=stderr, bufsize=0)
    pid = None
    try:
        assert _read_line(server, errors) == "ready"
        for trial, pause in enumerate(pauses):
            command = {"root": str(root), "journal": str(journal), "seed": 1000 * (trial + 1), "pause": pause}
            server.stdin.write((json.dumps(command) + "\n").encode())
            pid = int(_read_line(server, errors).removeprefix("pid "))
            if pause:
                assert _read_line(server, errors) == f"paused {pause}"
            else:
                time.sleep(rng.uniform(0, 0.35))
            os.kill(pid, signal.SIGKILL)
            status = int(_read_line(server, errors).removeprefix("exit "))
            pid = None
            assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, errors.read_text()

            done, pending = _journal(journal)
            for version, seed in done.items():
                assert seeds.setdefault(version, seed) == seed, f"version {version} was reused"
            # Only the publish in flight can have left a version without its "done" line: in the
            # manifest (killed after the manifest update) or only on disk (killed before it).
            unaccounted = (version_folders(root) | {v.version for v in store.versions()}) - seeds.keys()
            assert len(unaccounted) <= 1 and (not unaccounted or pending is not None), (trial, unaccounted)
            seeds.update(dict.fromkeys(unaccounted, pending))

            latest = store.latest()
            if latest is None:
                assert not done
                continue
            assert latest.version >= latest_seen, "the latest version went backwards"
            latest_seen = latest.version
            for info in store.versions():
                assert_same_tensors(read_version(store, info.version)[0], writer.content(seeds[info.version]))
            # Every folder named like a version is complete, whether or not the manifest names it.
            for version in version_folders(root):
                files = root / "adapters" / f"v{version:06d}"
                assert sorted(os.listdir(files)) == ["adapter_config.json", "adapter_model.safetensors"]
                assert_same_tensors(safetensors.torch.load_file(files / "adapter_model.safetensors"),
                                    writer.content(seeds[version]))
            if pause == "manifest":
                assert latest.version < max(version_folders(root)), "the renamed folder should not be visible yet"
            if pause == "collect":
                assert latest.version == max(version_folders(root)) and len(store.versions()) == 2
    finally:
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
        server.stdin.close()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()

    assert len(done) >= 10, f"writers finished too few publishes between kills: {sorted(done)}"
    final = store.publish(writer.content(99_000), writer.CONFIG)
    assert final > latest_seen
    assert_same_tensors(read_version(store, final)[0], writer.content(99_000))
    assert temp_entries(root) == []
    assert version_folders(root) == {v.version for v in store.versions()}


def test_streamed_file_is_plain_safetensors_and_verify_hashes_once(tmp_path, monkeypatch):
    import hashlib

    from sync import store as store_module

    store = AdapterStore(tmp_path)
    tensors = {**lora(1), "m.extra.lora_A.weight": torch.randn(3, 5, dtype=torch.bfloat16),
               "m.empty.lora_B.weight": torch.zeros(0, 4)}
    info = store.verify(store.publish(tensors, CONFIG))
    weights = Path(info.path) / "adapter_model.safetensors"
    # The digest recorded while writing is the file's; safetensors itself reads the file and its metadata.
    assert info.sha256["adapter_model.safetensors"] == hashlib.sha256(weights.read_bytes()).hexdigest()
    assert_same_tensors(safetensors.torch.load_file(weights), tensors)
    with safetensors.safe_open(weights, framework="pt") as f:
        assert f.metadata() == {"format": "pt"}

    hashed = []
    real = store_module.sha256_file
    monkeypatch.setattr(store_module, "sha256_file", lambda path: hashed.append(path) or real(path))
    store.verify(1)
    assert hashed.count(str(weights)) == 1  # changed less than a second before the first verify: hashed again
    monkeypatch.setattr(store_module, "_RACY_NS", -10**18)  # as if the files were written long ago
    store.verify(1)
    store.verify(1)
    assert hashed.count(str(weights)) == 2 and len(hashed) == 4  # both files once more, then remembered
    weights.write_bytes(weights.read_bytes() + b"\0")  # changed: hashed again, and refused
    with pytest.raises(AdapterCorruptError):
        store.verify(1)
    assert hashed.count(str(weights)) == 3 and len(hashed) == 5


def test_republishing_a_torn_version_rewrites_it(tmp_path):
    # A power cut before the background fsync can leave the newest version's file torn while the manifest
    # names it; the trainer resuming from its checkpoint republishes the same number with the same bytes.
    store = AdapterStore(tmp_path)
    store.publish(lora(1), CONFIG)
    assert store.publish(lora(2), CONFIG) == 2
    store.wait_durable()
    weights = tmp_path / "adapters" / "v000002" / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(AdapterCorruptError):
        store.verify(2)
    assert store.publish(lora(2), CONFIG, version=2) == 2
    assert_same_tensors(read_version(store, 2)[0], lora(2))
    assert store.publish(lora(2), CONFIG, version=2) == 2  # intact now: a no-op


def test_disk_use_stays_bounded_over_a_hundred_publishes(tmp_path):
    # A reader that moves on with every version, as a rollout worker does: the folder holds keep_last versions,
    # and the manifest names only those.
    store = AdapterStore(tmp_path, keep_last=3)
    sizes = []
    for seed in range(100):
        store.publish(lora(seed), CONFIG)
        store.acquire("rollout-0")
        sizes.append(sum(f.stat().st_size for f in (tmp_path / "adapters").rglob("*") if f.is_file()))
    assert len(version_folders(tmp_path)) == 3
    one_version = sum(f.stat().st_size for f in (tmp_path / "adapters" / "v000100").iterdir())
    assert max(sizes[3:]) < 3 * one_version + 4096, (max(sizes[3:]), one_version)
    assert max(sizes[3:]) - min(sizes[3:]) < 2048  # no growth beyond the versions kept

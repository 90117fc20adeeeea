"""Versioned LoRA adapters on shared storage: the trainer publishes, rollout workers read.

Layout under the root (the file format is sync/format.py):

    adapters/
      manifest.json                 the latest version; per version its creation time and each file's sha256
      v000001/                      a complete version, what PeftModel.from_pretrained and vLLM's LoRARequest read
        adapter_model.safetensors
        adapter_config.json
      readers/<reader_id>.json      a lease: the version one reader still loads from disk
      .tmp-*                        work in progress, or what a killed process left; never a version

The manifest is the commit point: a version exists when the manifest names it. A version folder appears
only by renaming a complete temporary folder, and the manifest is replaced by rename after that, so a
reader that goes through the manifest never sees a half-written version, wherever a writer is killed.
A folder the manifest does not name (the writer was killed between the two renames) is invisible to
readers and removed by the next publish.

Durability (a machine that loses power) is made in the background: publish returns once the version is
visible, and a writer thread fsyncs its files, the folder, the manifest and the directory; the next
publish on the same root waits for it. So every version but the newest is durable before the next one is
written. A newest version torn by a power cut fails its sha256 (taken from the bytes as they were
written) and readers walk back to the one before it (latest_verified()); republishing it from a
checkpoint rewrites it.

One writer per root (trainer rank 0); any number of readers on any node that shares the path.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Mapping

import torch

from .atomic import atomic_write, fsync_dir, fsync_file, remove_temp_entries, remove_tree, temp_name, write_new_file
from .format import (
    ADAPTER_FILE,
    CONFIG_FILE,
    MANIFEST_FILE,
    VERSION_DIR,
    AdapterCorruptError,
    AdapterNotFoundError,
    AdapterStoreError,
    AdapterVersion,
    AdapterVersionConflictError,
    Manifest,
    check_version,
    read_manifest,
    safetensors_buffers,
    serialize_config,
    sha256_buffers,
    sha256_file,
    version_name,
    write_manifest,
)

logger = logging.getLogger(__name__)

__all__ = ["ADAPTER_FILE", "CONFIG_FILE", "AdapterCorruptError", "AdapterNotFoundError", "AdapterStore",
           "AdapterStoreError", "AdapterVersion", "AdapterVersionConflictError"]

_READER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_ACQUIRE_TRIES = 3
_DIGEST_CACHE = 64  # files whose digest verify() remembers (a few per version)
_RACY_NS = 1_000_000_000  # how old a file's last change must be for its digest to be remembered


@dataclass
class _Pending:
    thread: threading.Thread | None = None
    error: BaseException | None = None


# adapters folder -> the background fsyncs of its last published version. Per process, not per
# AdapterStore: trainers make a new AdapterStore per publish.
_PENDING: dict[str, _Pending] = {}


class AdapterStore:
    """Versioned adapters under root/adapters; see the module docstring for the layout and guarantees.

    keep_last: how many of the newest versions garbage collection keeps besides those readers lease.
    lease_ttl_s: a lease not refreshed for this long no longer protects its version, so a reader that
    died without release() does not pin it forever; None keeps leases until released.
    """

    def __init__(self, root: str | os.PathLike, keep_last: int = 3, lease_ttl_s: float | None = 24 * 3600):
        if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1:
            raise ValueError(f"keep_last must be an int >= 1 (the latest version is always kept), got {keep_last!r}")
        if lease_ttl_s is not None and lease_ttl_s <= 0:
            raise ValueError(f"lease_ttl_s must be positive or None (leases never expire), got {lease_ttl_s!r}")
        self.root = os.path.abspath(os.fspath(root))
        self.adapters_dir = os.path.join(self.root, "adapters")
        self.readers_dir = os.path.join(self.adapters_dir, "readers")
        self.manifest_path = os.path.join(self.adapters_dir, MANIFEST_FILE)
        self.keep_last = keep_last
        self.lease_ttl_s = lease_ttl_s
        self._digests: dict[str, tuple[tuple, str]] = {}  # path -> (file identity, sha256) verified before

    # ----------------------------------------------------------------------------------------- writer

    def publish(self, tensors: Mapping[str, torch.Tensor], config: Mapping[str, Any], *,
                version: int | None = None) -> int:
        """Write a new version, make it the latest, then garbage-collect; returns its number.

        tensors: the full LoRA state dict with peft's key names (get_peft_model_state_dict, or FSDP's
        gathered dict with ".default" dropped); written contiguous, on CPU. config:
        peft_model.peft_config["default"].to_dict() (sets become sorted lists, enums their values).
        version: the number to publish under, for a trainer resuming from a checkpoint; None takes the
        next free one. Republishing an existing version with identical files is a no-op; anything that
        would overwrite a version or go behind the latest raises AdapterVersionConflictError.
        Garbage collection keeps the newest keep_last versions and every version a reader leases.
        """
        # The tensors' own memory, never one serialised copy: each file is hashed while it is written.
        files = {ADAPTER_FILE: safetensors_buffers(tensors), CONFIG_FILE: [serialize_config(config)]}

        self.wait_durable()
        self._make_dirs()
        leftovers = remove_temp_entries(self.adapters_dir)
        if leftovers:
            logger.info("removed leftovers of an interrupted writer in %s: %s", self.adapters_dir, ", ".join(leftovers))
        manifest = read_manifest(self.manifest_path)
        if version is None:
            version = max([manifest.latest or 0, *self._folder_versions()]) + 1
        elif self._already_published(check_version(version), manifest, files):
            return version

        folder = self._version_dir(version)
        if os.path.lexists(folder):
            # Not named by the manifest, or named with these very digests but torn (_already_published):
            # no reader can be serving it.
            remove_tree(folder)
        tmp = os.path.join(self.adapters_dir, temp_name(os.path.basename(folder)))
        os.mkdir(tmp)
        digests = {}
        for name, buffers in files.items():
            digest = hashlib.sha256()
            write_new_file(os.path.join(tmp, name), buffers, digest, durable=False)
            digests[name] = digest.hexdigest()
        os.rename(tmp, folder)

        versions = {**manifest.versions, version: {"created": time.time(), "sha256": digests}}
        keep = set(sorted(versions)[-self.keep_last:]) | self._leased_versions()
        kept = {v: e for v, e in versions.items() if v in keep}
        write_manifest(self.manifest_path, Manifest(version, kept), durable=False)
        pending = _Pending()
        pending.thread = threading.Thread(target=self._make_durable, args=(folder, pending), daemon=False,
                                          name=f"adapter-store-durable-v{version}")
        _PENDING[self.adapters_dir] = pending
        pending.thread.start()
        # Collected now, before the manifest that drops them is durable: should a power cut bring back the
        # previous manifest, readers walk back past its missing versions (latest_verified()).
        self._remove_unreferenced(set(kept))
        size = sum(memoryview(b).nbytes for b in files[ADAPTER_FILE])
        logger.info("published adapter version %d in %s (%.1f MB)", version, folder, size / 2**20)
        return version

    def wait_durable(self) -> None:
        """Wait until the last version published on this root (by any AdapterStore of this process) is
        fsynced; raises AdapterStoreError if that failed. publish() calls it first."""
        pending = _PENDING.pop(self.adapters_dir, None)
        if pending is None:
            return
        pending.thread.join()
        if pending.error is not None:
            error = AdapterStoreError(
                f"making the last adapter version in {self.adapters_dir} durable failed ({pending.error!r}): "
                f"check the storage, then publish again")
            # An attribute survives the pickling that carries an actor's error to the driver (__cause__ does
            # not): the driver finds the failed write in it.
            error.failed = pending.error
            raise error from pending.error

    def _make_durable(self, folder: str, pending: "_Pending") -> None:
        try:
            for name in (ADAPTER_FILE, CONFIG_FILE):
                fsync_file(os.path.join(folder, name))
            fsync_dir(folder)
            fsync_file(self.manifest_path)  # only this writer replaces it, and not before this thread ends
            fsync_dir(self.adapters_dir)
        except BaseException as e:  # raised by the next publish (wait_durable)
            pending.error = e

    def _already_published(self, version: int, manifest: Manifest, files: dict[str, list]) -> bool:
        free = max([manifest.latest or 0, *self._folder_versions()]) + 1
        fix = (f"Publish without version= to take the next free number ({free}) and keep that number in "
               f"the trainer's state; numbers are never reused because readers cache adapters by number.")
        if version in manifest.versions:
            recorded = manifest.versions[version]["sha256"]
            digests = {name: sha256_buffers(buffers) for name, buffers in files.items()}
            if recorded == digests:
                info = self._describe(manifest, version)
                try:
                    for name, expected in recorded.items():
                        self._check_digest(info, name, expected, sha256_file(self._file(info, name)))
                except (AdapterCorruptError, FileNotFoundError) as e:
                    # Torn by a power cut before it was durable: written again, same number, same bytes.
                    logger.warning("adapter version %d is in the manifest but its files do not verify (%s): "
                                   "writing it again", version, e)
                    return False
                logger.info("adapter version %d is already published with identical files", version)
                return True
            differ = "; ".join(f"{name}: sha256 {recorded.get(name)} there, {digest} now"
                               for name, digest in digests.items() if recorded.get(name) != digest)
            raise AdapterVersionConflictError(
                f"adapter version {version} already exists in {self.adapters_dir} with different files "
                f"({differ}): a previous run went past the checkpoint being resumed. {fix}")
        if manifest.latest is not None and version < manifest.latest:
            raise AdapterVersionConflictError(
                f"adapter version {version} is older than the latest version {manifest.latest} in "
                f"{self.adapters_dir}, and versions only increase. {fix}")
        return False

    def _remove_unreferenced(self, kept: set[int]) -> None:
        # Leases are read again after the manifest that drops a version has landed: a reader leases before
        # it checks the manifest (mark_in_use), so it either sees the version gone or its lease is seen here.
        leased = self._leased_versions()
        removed = []
        for version in sorted(self._folder_versions()):
            if version not in kept and version not in leased:
                remove_tree(self._version_dir(version))
                removed.append(version)
        if removed:
            logger.info("garbage-collected adapter versions %s in %s", removed, self.adapters_dir)

    # ----------------------------------------------------------------------------------------- readers

    def latest(self) -> AdapterVersion | None:
        """The latest version the manifest names, unverified (cheap); None before the first publish."""
        manifest = read_manifest(self.manifest_path)
        return None if manifest.latest is None else self._describe(manifest, manifest.latest)

    def versions(self) -> list[AdapterVersion]:
        """Every version the manifest names, oldest first."""
        manifest = read_manifest(self.manifest_path)
        return [self._describe(manifest, v) for v in sorted(manifest.versions)]

    def verify(self, version: int) -> AdapterVersion:
        """Hash the version's files against the manifest; raises AdapterCorruptError or AdapterNotFoundError.

        Each file is hashed once while it stays the same file: a second verify of an unchanged file (same
        inode, size, mtime and ctime; any write changes ctime) reuses the first one's digest. A file changed
        less than a second before it was hashed is hashed again next time (a second write could land in
        the same timestamp tick and leave ctime unchanged).
        """
        info = self._describe(read_manifest(self.manifest_path), version)
        for name, expected in info.sha256.items():
            self._check_digest(info, name, expected, self._file_digest(info, name))
        return info

    def _file_digest(self, info: AdapterVersion, name: str) -> str:
        path = self._file(info, name)
        try:
            st = os.stat(path)
            identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
            cached = self._digests.get(path)
            if cached is not None and cached[0] == identity:
                return cached[1]
            hashed_at = time.time_ns()
            digest = sha256_file(path)
        except FileNotFoundError as e:
            raise self._vanished(info, name) from e
        if hashed_at - st.st_ctime_ns > _RACY_NS:
            self._digests[path] = (identity, digest)
        while len(self._digests) > _DIGEST_CACHE:
            self._digests.pop(next(iter(self._digests)))
        return digest

    def latest_verified(self) -> AdapterVersion | None:
        """The newest version whose files verify, walking back past corrupt or vanished ones (logged).

        None before the first publish. Raises AdapterStoreError when versions exist and none verifies,
        so that a caller never silently falls back to the base model. Hashes the files: call it when
        latest() has moved, not on every step.
        """
        candidates = self.versions()
        problems = []
        for info in reversed(candidates):
            try:
                self.verify(info.version)
            except (AdapterCorruptError, AdapterNotFoundError) as e:
                logger.warning("skipping adapter version %d: %s", info.version, e)
                problems.append(f"  v{info.version}: {e}")
                continue
            if problems:
                logger.warning("using adapter version %d instead of the latest %d, which failed verification",
                               info.version, candidates[-1].version)
            return info
        if not candidates:
            return None
        raise AdapterStoreError(
            f"no adapter version in {self.adapters_dir} verifies; keep the adapter already loaded and have "
            f"the trainer publish again:\n" + "\n".join(problems))

    def mark_in_use(self, reader_id: str, version: int) -> None:
        """Lease version to reader_id (replacing its previous lease) so garbage collection keeps it.

        Mark a version before loading it from disk. The lease moves off the version the reader served
        before: vLLM keeps a loaded adapter in memory, so its files are no longer needed. Raises
        AdapterNotFoundError when the version was collected before the lease landed: take
        latest_verified() again.
        """
        version = check_version(version)
        lease = {"reader": reader_id, "version": version, "time": time.time(),
                 "host": socket.gethostname(), "pid": os.getpid()}
        os.makedirs(self.readers_dir, exist_ok=True)
        # Atomic but not fsynced: a lease matters only while its reader lives, and a crash that loses the
        # lease ends the reader too (the reader also holds the version in memory once loaded).
        atomic_write(self._lease_path(reader_id), (json.dumps(lease) + "\n").encode(), durable=False)
        if version not in read_manifest(self.manifest_path).versions:
            raise AdapterNotFoundError(
                f"adapter version {version} is not in {self.manifest_path} (never published, or "
                f"garbage-collected before reader {reader_id!r} leased it): take latest_verified() again")

    def acquire(self, reader_id: str) -> AdapterVersion | None:
        """The newest version that verifies, leased to reader_id; None before the first publish."""
        for _ in range(_ACQUIRE_TRIES):
            info = self.latest_verified()
            if info is None:
                return None
            try:
                self.mark_in_use(reader_id, info.version)
                return info
            except AdapterNotFoundError:
                continue  # collected while it was being verified: newer versions exist, take one of them
        raise AdapterStoreError(
            f"reader {reader_id!r} could not lease a version in {_ACQUIRE_TRIES} tries: versions in "
            f"{self.adapters_dir} are collected faster than they verify; raise keep_last (now {self.keep_last})")

    def readers(self) -> list[str]:
        """The reader ids that hold a lease now, expired or not."""
        try:
            return sorted(e.name[:-len(".json")] for e in os.scandir(self.readers_dir) if _is_lease(e.name))
        except FileNotFoundError:
            return []

    def release(self, reader_id: str) -> None:
        """Drop reader_id's lease (a rollout worker that shuts down)."""
        try:
            os.unlink(self._lease_path(reader_id))
        except FileNotFoundError:
            pass

    # ----------------------------------------------------------------------------------------- internals

    def _make_dirs(self) -> None:
        for path in (self.root, self.adapters_dir, self.readers_dir):
            if not os.path.isdir(path):
                os.makedirs(path, exist_ok=True)
                fsync_dir(os.path.dirname(path))

    def _version_dir(self, version: int) -> str:
        return os.path.join(self.adapters_dir, version_name(version))

    def _lease_path(self, reader_id: str) -> str:
        if not isinstance(reader_id, str) or not _READER_ID.fullmatch(reader_id):
            raise ValueError(
                f"reader_id {reader_id!r} must be 1-128 letters, digits, '.', '_' or '-' (it names a file "
                f"under {self.readers_dir}), e.g. f'rollout-{{rank}}'; keep it stable across restarts")
        return os.path.join(self.readers_dir, reader_id + ".json")

    def _folder_versions(self) -> set[int]:
        try:
            entries = list(os.scandir(self.adapters_dir))
        except FileNotFoundError:
            return set()
        return {int(m.group(1)) for e in entries
                if (m := VERSION_DIR.fullmatch(e.name)) and e.is_dir(follow_symlinks=False)}

    def _leased_versions(self) -> set[int]:
        now = time.time()
        leased = set()
        for reader in self.readers():
            path = self._lease_path(reader)
            try:
                with open(path, "rb") as f:
                    lease = json.loads(f.read())
                version, stamped = int(lease["version"]), float(lease["time"])
            except FileNotFoundError:
                continue  # released meanwhile
            except (OSError, ValueError, KeyError, TypeError) as e:
                logger.warning("ignoring unreadable reader lease %s (%s); the reader rewrites it on its next "
                               "mark_in_use, or delete it", path, e)
                continue
            if self.lease_ttl_s is None or now - stamped <= self.lease_ttl_s:
                leased.add(version)
        return leased

    def _describe(self, manifest: Manifest, version: int) -> AdapterVersion:
        entry = manifest.versions.get(version)
        if entry is None:
            raise AdapterNotFoundError(
                f"adapter version {version} is not in {self.manifest_path} (versions there: "
                f"{sorted(manifest.versions)}): it was never published or was garbage-collected; "
                f"take latest_verified()")
        return AdapterVersion(version, self._version_dir(version), dict(entry["sha256"]), entry["created"])

    def _file(self, info: AdapterVersion, name: str) -> str:
        return os.path.join(info.path, name)

    def _check_digest(self, info: AdapterVersion, name: str, expected: str, actual: str) -> None:
        if actual != expected:
            raise AdapterCorruptError(info.version, self._file(info, name), expected, actual, self.manifest_path)

    def _vanished(self, info: AdapterVersion, name: str) -> AdapterNotFoundError:
        return AdapterNotFoundError(
            f"adapter version {info.version} is in {self.manifest_path} but {self._file(info, name)} is "
            f"missing: it was garbage-collected meanwhile, or deleted by hand; take latest_verified()")


def _is_lease(name: str) -> bool:
    return name.endswith(".json") and _READER_ID.fullmatch(name[: -len(".json")]) is not None


"""The adapter store's on-disk format: file names, the manifest, version numbers, and the bytes of a version.

What a version folder holds is exactly what PeftModel.from_pretrained and vLLM's LoRARequest read: a plain
safetensors file (written here straight from the tensors' memory, no serialised copy) and peft's JSON config.
The manifest (manifest.json) names every version with its creation time and each file's sha256; store.py
owns when it is written and read, this module what it says.
"""

from __future__ import annotations

import enum
import hashlib
import json
import mmap
import operator
import os
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, NamedTuple

import torch

from .atomic import atomic_write

ADAPTER_FILE = "adapter_model.safetensors"
CONFIG_FILE = "adapter_config.json"
MANIFEST_FILE = "manifest.json"
_MANIFEST_FORMAT = 1
VERSION_DIR = re.compile(r"v(\d{6,})")

# FSDP's gathered state dict names LoRA weights with peft's adapter name ("lora_A.default.weight");
# peft and vLLM expect it dropped, and peft silently skips keys it does not recognise.
_ADAPTER_NAME_IN_KEY = re.compile(r"\.lora_[A-Za-z_]+\.default(\.|$)")


class AdapterStoreError(Exception):
    """A problem with the adapter store; the message names it and what to do."""


class AdapterCorruptError(AdapterStoreError):
    """A version's file does not match the sha256 the manifest recorded when it was published."""

    def __init__(self, version: int, file: str, expected: str, actual: str, manifest: str):
        self.version, self.file, self.expected, self.actual, self.manifest = version, file, expected, actual, manifest
        super().__init__(
            f"adapter version {version} is corrupt: {file} has sha256 {actual}, but {manifest} recorded "
            f"{expected} when it was published. The version is refused: keep serving the previous one "
            f"(AdapterStore.latest_verified() returns the newest version that verifies); the trainer's "
            f"next publish supersedes it. If this repeats, check the storage that holds {file}."
        )

    def __reduce__(self):
        # Raised in a rollout worker and re-raised in the driver: it must unpickle with its fields.
        return type(self), (self.version, self.file, self.expected, self.actual, self.manifest)


class AdapterNotFoundError(AdapterStoreError, LookupError):
    """The version is not in the manifest, or its files are gone (garbage-collected meanwhile)."""


class AdapterVersionConflictError(AdapterStoreError):
    """An explicit version number that would overwrite or go behind what the store already holds."""


@dataclass(frozen=True)
class AdapterVersion:
    """One published version, as the manifest records it."""

    version: int
    path: str  # the folder to give PeftModel.from_pretrained or vLLM's LoRARequest
    sha256: Mapping[str, str] = field(hash=False)  # file name -> hex digest
    created: float  # time.time() when it was published

    @property
    def name(self) -> str:
        """A name unique to this version ("v000042"): hot-loading needs a new name per version."""
        return os.path.basename(self.path)


class Manifest(NamedTuple):
    latest: int | None
    versions: dict[int, dict[str, Any]]  # version -> {"created": float, "sha256": {file: digest}}


def write_manifest(path: str, manifest: Manifest, durable: bool = True) -> None:
    document = {
        "format": _MANIFEST_FORMAT,
        "latest": manifest.latest,
        "versions": {version_name(v): entry for v, entry in sorted(manifest.versions.items())},
    }
    atomic_write(path, (json.dumps(document, indent=2) + "\n").encode(), durable=durable)


def read_manifest(path: str) -> Manifest:
    """The manifest at path; an empty one when the file does not exist (nothing published yet)."""
    try:
        with open(path, "rb") as f:
            document = json.loads(f.read())
    except FileNotFoundError:
        return Manifest(None, {})
    except ValueError as e:
        raise _bad_manifest(path, e) from e
    if not isinstance(document, dict) or document.get("format") != _MANIFEST_FORMAT:
        raise _bad_manifest(path, f"expected format {_MANIFEST_FORMAT}, got "
                                  f"{document.get('format') if isinstance(document, dict) else document!r}")
    try:
        versions = {int(VERSION_DIR.fullmatch(k).group(1)): v for k, v in document["versions"].items()}
        latest = document["latest"]
    except (KeyError, AttributeError, TypeError) as e:
        raise _bad_manifest(path, e) from e
    if (latest is None) != (not versions) or (versions and latest != max(versions)):
        raise _bad_manifest(path, f"latest is {latest} but the versions are {sorted(versions)}")
    return Manifest(latest, versions)


def _bad_manifest(path: str, problem: object) -> AdapterStoreError:
    return AdapterStoreError(
        f"{path} is not a valid adapter manifest ({problem}). Only this store writes it, "
        f"always by atomic rename, so something else changed it: restore it, or move {os.path.dirname(path)} "
        f"aside and publish again")


def version_name(version: int) -> str:
    return f"v{version:06d}"


def check_version(version: object) -> int:
    if isinstance(version, bool):
        raise TypeError(f"an adapter version is an int >= 1, got {version!r}")
    number = operator.index(version)
    if number < 1:
        raise ValueError(f"adapter versions start at 1 (vLLM LoRA ids must be positive), got {number}")
    return number


def sha256_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size:
            # Hashed straight from the page cache: no copy into a read buffer.
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                digest.update(mapped)
    return digest.hexdigest()



# safetensors' names for torch dtypes (the format's spec); the file is written here without a serialised copy.
_SAFETENSORS_DTYPES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
    torch.bool: "BOOL", torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2",
}


def safetensors_buffers(tensors: Mapping[str, torch.Tensor]) -> list[memoryview]:
    """A safetensors file as buffers to write in order: its header, then each tensor's own memory.

    The layout is the format's (an 8-byte little-endian header length, a JSON header padded with spaces to
    8 bytes, the tensors' bytes back to back); tensors go largest element first, so each starts aligned.
    """
    if not tensors:
        raise ValueError("publish() got no tensors: pass the LoRA state dict (peft's get_peft_model_state_dict)")
    prepared = {}
    for key, tensor in tensors.items():
        if not isinstance(key, str) or not isinstance(tensor, torch.Tensor):
            raise TypeError(f"publish() takes a dict of str -> torch.Tensor, got {key!r}: {type(tensor).__name__}")
        if _ADAPTER_NAME_IN_KEY.search(key):
            raise ValueError(
                f"tensor key {key!r} carries peft's adapter name '.default': peft and vLLM expect it dropped "
                f"(as get_peft_model_state_dict does), e.g. '...lora_A.weight'; peft would skip such keys silently")
        if tensor.dtype not in _SAFETENSORS_DTYPES:
            raise TypeError(f"tensor {key!r} has dtype {tensor.dtype}, which safetensors cannot hold: convert it to "
                            f"one of {sorted(str(d) for d in _SAFETENSORS_DTYPES)}")
        prepared[key] = tensor.detach().to("cpu").contiguous()
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset, data = 0, []
    for key in sorted(prepared, key=lambda k: (-prepared[k].element_size(), k)):
        tensor = prepared[key]
        # A view of exactly this tensor's bytes (a view into a larger buffer included), no copy.
        raw = memoryview(tensor.reshape(-1).view(torch.uint8).numpy())
        header[key] = {"dtype": _SAFETENSORS_DTYPES[tensor.dtype], "shape": list(tensor.shape),
                       "data_offsets": [offset, offset + raw.nbytes]}
        offset += raw.nbytes
        data.append(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return [memoryview(len(text).to_bytes(8, "little") + text), *data]


def sha256_buffers(buffers: list) -> str:
    digest = hashlib.sha256()
    for buffer in buffers:
        digest.update(buffer)
    return digest.hexdigest()


def serialize_config(config: Mapping[str, Any]) -> bytes:
    if not isinstance(config, Mapping) or "peft_type" not in config:
        raise ValueError("publish() needs the peft adapter config with its 'peft_type' (what "
                         "peft_model.peft_config['default'].to_dict() returns): PeftModel and vLLM read it")
    return (json.dumps(_jsonable(config, "config"), indent=2, sort_keys=True) + "\n").encode()


def _jsonable(value: Any, where: str) -> Any:
    if isinstance(value, enum.Enum):
        value = value.value
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            key = key.value if isinstance(key, enum.Enum) else key
            if not isinstance(key, str):
                raise TypeError(f"{where} has the key {key!r}; JSON keys are strings, convert it")
            out[key] = _jsonable(item, f"{where}[{key!r}]")
        return out
    if isinstance(value, (set, frozenset)):
        # Any fixed order will do, as long as the same set always gives the same bytes (and sha256).
        return sorted((_jsonable(item, where) for item in value), key=lambda item: json.dumps(item, sort_keys=True))
    if isinstance(value, (list, tuple)):
        return [_jsonable(item, f"{where}[{i}]") for i, item in enumerate(value)]
    raise TypeError(f"{where} is of type {type(value).__name__}, which JSON cannot hold: convert it to plain values "
                    f"(peft_model.peft_config['default'].to_dict() gives a dict this store can write)")

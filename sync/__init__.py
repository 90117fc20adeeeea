"""Adapter store: versioned LoRA adapters on shared storage, published by the trainer, read by rollout workers.

Storage only (no vLLM, nothing of rollout or grpo): store.py publishes, verifies, leases and collects
versions; format.py is what a version and the manifest look like on disk; atomic.py the crash-safe file
operations both rest on.
"""

from .format import (
    ADAPTER_FILE,
    CONFIG_FILE,
    AdapterCorruptError,
    AdapterNotFoundError,
    AdapterStoreError,
    AdapterVersion,
    AdapterVersionConflictError,
)
from .store import AdapterStore

__all__ = [
    "ADAPTER_FILE",
    "CONFIG_FILE",
    "AdapterCorruptError",
    "AdapterNotFoundError",
    "AdapterStore",
    "AdapterStoreError",
    "AdapterVersion",
    "AdapterVersionConflictError",
]

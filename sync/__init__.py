"""Adapter store: versioned LoRA adapters on shared storage, published by the trainer, read by rollout workers."""

from .store import (
    AdapterCorruptError,
    AdapterNotFoundError,
    AdapterStore,
    AdapterStoreError,
    AdapterVersion,
    AdapterVersionConflictError,
)

__all__ = [
    "AdapterCorruptError",
    "AdapterNotFoundError",
    "AdapterStore",
    "AdapterStoreError",
    "AdapterVersion",
    "AdapterVersionConflictError",
]

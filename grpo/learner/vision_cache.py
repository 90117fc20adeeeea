"""The frozen vision tower's output, computed once per micro-batch of a train step.

A step runs a micro-batch's forward more than once: scored before the updates (updates_per_batch > 1), again in
its update, and for the KL reference. The vision tower carries no adapter and no gradient, so its output for
the same images is the same each time: it is computed at the micro-batch's first forward, reused by the
others and dropped when the step ends. On a maze step (660 turns, one image each) the vision tower was
6.4 s of the 10.2 s of forwards before this cache. A model whose vision tower trains (an adapter loaded with
vision modules) is not cached.
"""
from __future__ import annotations

import contextlib

import torch

from grpo.learner.forward import unwrapped


class VisionCache:
    def __init__(self, model):
        inner = getattr(unwrapped(model), "model", None)
        tower = getattr(inner, "visual", None)
        self.enabled = tower is not None and hasattr(inner, "get_image_features") and not any(
            p.requires_grad for p in tower.parameters())
        self._key, self._calls, self._store = None, 0, {}
        if self.enabled:
            original = inner.get_image_features

            def features(*args, **kwargs):
                if self._key is None:
                    return original(*args, **kwargs)
                # A forward may call it more than once (images, then video frames): each call is its own entry.
                key, self._calls = (self._key, self._calls), self._calls + 1
                if key not in self._store:
                    with torch.no_grad():
                        self._store[key] = original(*args, **kwargs)
                return self._store[key]

            inner.get_image_features = features

    @contextlib.contextmanager
    def micro_batch(self, key: tuple):
        """The forwards inside share the vision output of micro-batch `key` (its items' indices)."""
        self._key, self._calls = key, 0
        try:
            yield
        finally:
            self._key = None

    def clear(self) -> None:
        self._store = {}

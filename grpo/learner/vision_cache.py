"""The frozen vision tower's output, computed once per micro-batch of a train step.

A step runs a micro-batch's forward more than once: scored before the updates (updates_per_batch > 1), again in
its update, and for the KL reference. The vision tower carries no adapter and no gradient, so its output for
the same images is the same each time: it is computed at the micro-batch's first forward, reused by the
others and dropped when the step ends. On a maze step (660 turns, one image each) the vision tower was
6.4 s of the 10.2 s of forwards before this cache. A model whose vision tower trains (an adapter loaded with
vision modules) is not cached.

The tower also runs once per distinct image of a micro-batch: an image whose pixels and grid equal an earlier
one's gets that one's output. Episodes of a group start from the same observation and often pass the same
states again: in a maze step's batch 9 images in 10 repeat one seen before (2552 turns, 264 distinct images).
Qwen's vision towers attend within each image, so an image's output does not depend on the others beside it.
"""
from __future__ import annotations

import contextlib
import hashlib

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

            def features(pixel_values, grid_thw=None, **kwargs):
                if self._key is None:
                    return original(pixel_values, grid_thw, **kwargs)
                # A forward may call it more than once (images, then video frames): each call is its own entry.
                key, self._calls = (self._key, self._calls), self._calls + 1
                if key not in self._store:
                    with torch.no_grad():
                        self._store[key] = once_per_image(original, pixel_values, grid_thw, **kwargs)
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


def once_per_image(tower, pixel_values, grid_thw, **kwargs):
    """`tower(pixel_values, grid_thw)` run on the distinct images only, its per-image outputs (the image
    embeddings, and the deepstack levels of Qwen3-VL) put back in the order of all of them. The attributes that
    cover the tower's patches whole, unsplit, are set to None: a forward reads only the per-image ones."""
    if grid_thw is None or len(grid_thw) < 2:
        return tower(pixel_values, grid_thw, **kwargs)
    images = torch.split(pixel_values, grid_thw.prod(-1).tolist())
    slots: dict = {}  # (grid, pixel digest) -> its place among the distinct images
    distinct, slot = [], []  # each distinct image's first index; each image's place among the distinct
    for i, (x, g) in enumerate(zip(images, grid_thw.cpu())):
        key = (tuple(g.tolist()), hashlib.sha1(x.cpu().contiguous().view(torch.uint8).numpy()).digest())
        if key not in slots:
            slots[key] = len(distinct)
            distinct.append(i)
        slot.append(slots[key])
    if len(distinct) == len(images):
        return tower(pixel_values, grid_thw, **kwargs)
    out = tower(torch.cat([images[i] for i in distinct]), grid_thw[distinct], **kwargs)
    out.pooler_output = tuple(out.pooler_output[k] for k in slot)
    if getattr(out, "deepstack_features", None) is not None:
        out.deepstack_features = [tuple(level[k] for k in slot) for level in out.deepstack_features]
    for whole in ("last_hidden_state", "hidden_states", "attentions"):
        if hasattr(out, whole):
            setattr(out, whole, None)
    return out

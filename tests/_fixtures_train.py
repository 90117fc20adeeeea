"""Shared fixtures and helpers of the trainer and checkpoint tests (import them into a test module)."""
from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from PIL import Image, ImageDraw

from grpo.tools import tiny_models
from rollout.conversation import ChatFormat
from rollout.trajectory import Segment, Trajectory
from envs.base import Observation

@pytest.fixture(scope="session")
def vl_model(tmp_path_factory) -> str:
    """The tiny Qwen3-VL's folder, as a string (what a user passes)."""
    return str(tiny_models.build("vl", tmp_path_factory.mktemp("models") / "tiny-vl", seed=0))


def image(seed: int, size: int = 64) -> Image.Image:
    rng = random.Random(seed)
    img = Image.new("RGB", (size, size), (255, 255, 255))
    draw = ImageDraw.Draw(img)
    for _ in range(4):
        x, y = rng.randrange(size - 8), rng.randrange(size - 8)
        draw.rectangle((x, y, x + 8, y + 8), fill=tuple(rng.randrange(256) for _ in range(3)))
    return img


def trajectories(processor, count: int, seed: int = 0, turns: int = 2, images: bool = True) -> list[Trajectory]:
    """Multi-turn trajectories of random "sampled" tokens: one segment per episode, of varied lengths, an
    image per observation (or none), random sampler logprobs. Episode i % 3 == 2 has no image at all."""
    chat = ChatFormat(processor)
    tok = chat.tok
    rng = random.Random(seed)
    special = set(tok.all_special_ids) | chat.vision_ids
    ordinary = [i for i in range(len(tok)) if i not in special]
    out = []
    for e in range(count):
        with_images = images and e % 3 != 2
        obs = Observation(text=f"episode {e}", images=[image(seed * 1000 + e)] if with_images else [])
        ids = chat.prompt_ids(obs)
        mask, imgs = [0] * len(ids), list(obs.images)
        for t in range(turns):
            gen = [rng.choice(ordinary) for _ in range(rng.randint(2, 9))]
            ids, mask = ids + gen, mask + [1] * len(gen)
            if t < turns - 1:
                nxt = Observation(text=f"turn {t}", images=[image(seed * 1000 + e + 100 * (t + 1))] if with_images else [])
                suffix = chat.observation_ids(nxt, gen)
                ids, mask, imgs = ids + suffix, mask + [0] * len(suffix), imgs + list(nxt.images)
        lps = [-rng.uniform(0.5, 8.0) if m else 0.0 for m in mask]
        out.append(Trajectory(task_id=f"t{e // 2}", group_id=e // 2, seed=e, segments=[Segment(ids, mask, lps, imgs)],
                              turn_rewards=[float(e % 2)], num_turns=turns, stop_reason="done", adapter_version=None))
    return out


def advantages(count: int, seed: int = 0) -> list[float]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(count, generator=g).tolist()


def max_abs_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


def dir_listing(path: Path) -> list[str]:
    return sorted(p.name for p in Path(path).iterdir())

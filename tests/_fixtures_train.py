"""Shared fixtures and helpers of the trainer and checkpoint tests (import them into a test module)."""
from __future__ import annotations

import io
import random
from pathlib import Path

import torch
from PIL import Image, ImageDraw
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from envs.base import Observation
from rollout.conversation import ChatFormat
from rollout.trajectory import Segment, Trajectory


def image(seed: int, size: int = 64) -> Image.Image:
    rng = random.Random(seed)
    img = Image.new("RGB", (size, size), (255, 255, 255))
    draw = ImageDraw.Draw(img)
    for _ in range(4):
        x, y = rng.randrange(size - 8), rng.randrange(size - 8)
        draw.rectangle((x, y, x + 8, y + 8), fill=tuple(rng.randrange(256) for _ in range(3)))
    return img


def chat_and_ordinary(processor) -> tuple[ChatFormat, list[int]]:
    """The processor's chat format and its ordinary token ids (no special or vision token): random "samples"."""
    chat = ChatFormat(processor)
    special = set(chat.tok.all_special_ids) | chat.vision_ids
    return chat, [i for i in range(len(chat.tok)) if i not in special]


def trajectories(processor, count: int, seed: int = 0, turns: int = 2, images: bool = True) -> list[Trajectory]:
    """Multi-turn trajectories of random "sampled" tokens: one segment per episode, of varied lengths, an
    image per observation (or none), random sampler logprobs. Episode i % 3 == 2 has no image at all."""
    chat, ordinary = chat_and_ordinary(processor)
    rng = random.Random(seed)
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
                shown = [image(seed * 1000 + e + 100 * (t + 1))] if with_images else []
                nxt = Observation(text=f"turn {t}", images=shown)
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


def saved_state(path) -> dict:
    """What a checkpoint folder holds, as full tensors whatever the ranks held: {"model": LoRA weights,
    "optim": optimizer state, "step"}. Comparing two runs' checkpoints compares their training state."""
    buf = io.BytesIO()
    dcp_to_torch_save(path, buf)  # reads DCP's files in this process, no process group
    buf.seek(0)
    state = torch.load(buf, weights_only=False)
    state["step"] = torch.load(Path(path) / "trainer.pt", weights_only=False)["step"]
    return state


def assert_same_state(a, b, where: str = "") -> None:
    """Nested dicts and lists of tensors and plain values, equal bit for bit."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            assert_same_state(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_state(x, y, f"{where}/{i}")
    elif torch.is_tensor(a):
        assert torch.equal(a, b), where
    else:
        assert a == b, where

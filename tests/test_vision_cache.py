"""The vision tower runs once per distinct image of a micro-batch (grpo/learner/vision_cache.py): a batch whose
images repeat trains as it does with every image run through the tower."""
import pytest
import torch
from _fixtures_train import advantages, image, max_abs_diff, trajectories

from grpo.algo.config import AlgorithmConfig
from grpo.learner import forward, vision_cache
from grpo.learner.config import TrainConfig
from grpo.learner.worker import TrainWorker


def tower_images(worker: TrainWorker, monkeypatch) -> list[int]:
    """The number of images in each call of `worker`'s vision tower, recorded from now on."""
    visual, seen = forward.unwrapped(worker.model).model.visual, []
    run = visual.forward

    def spy(pixel_values, grid_thw=None, **kwargs):
        seen.append(len(grid_thw))
        return run(pixel_values, grid_thw=grid_thw, **kwargs)

    monkeypatch.setattr(visual, "forward", spy)
    return seen


@pytest.mark.slow
def test_repeated_images_run_the_tower_once_and_train_the_same(tiny_vl, monkeypatch):
    # lr = eps = 1: the update is about the gradient itself (test_train_worker.comparable); KL adds a reference pass.
    config = dict(algorithm=AlgorithmConfig(kl_coef=0.1),
                  train=TrainConfig(lr=1.0, adam_eps=1.0, max_grad_norm=0.5, micro_batch_size=6, updates_per_batch=2))
    once, every = TrainWorker(tiny_vl, **config), TrainWorker(tiny_vl, **config)
    batch, adv = trajectories(once.processor, 6, seed=3), advantages(6, seed=3)
    # Episode 1 sees episode 0's images and episode 4 episode 3's (same sizes, so the same tokens).
    for src, dst in ((0, 1), (3, 4)):
        batch[dst].segments[0].images = list(batch[src].segments[0].images)
    images = sum(len(t.segments[0].images) for t in batch)
    assert images == 8
    seen_once, seen_every = tower_images(once, monkeypatch), tower_images(every, monkeypatch)
    a = once.train_step(batch, adv)
    with monkeypatch.context() as m:
        m.setattr(vision_cache, "once_per_image", lambda tower, pixels, grid, **kw: tower(pixels, grid, **kw))
        b = every.train_step(batch, adv)
    # The same calls (one per micro-batch and pass), each on the distinct images only: fewer where images repeat.
    assert len(seen_once) == len(seen_every) and all(o <= e for o, e in zip(seen_once, seen_every))
    assert sum(seen_once) < sum(seen_every)
    assert max_abs_diff(once.gather_adapter(), every.gather_adapter()) <= 1e-6
    for key in ("loss", "kl", "sampler_abs_diff", "ratio_mean"):
        assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-7), key


def test_each_image_gets_the_output_it_gets_in_a_full_run(tiny_vl):
    worker = TrainWorker(tiny_vl)
    inner = forward.unwrapped(worker.model).model
    pictures = [image(1), image(2), image(1), image(3, size=96), image(2)]
    pixels = worker.processor.image_processor(images=pictures, return_tensors="pt")
    args = (pixels["pixel_values"], pixels["image_grid_thw"])
    with torch.no_grad():
        full = inner.get_image_features(*args, return_dict=True)
        once = vision_cache.once_per_image(inner.get_image_features, *args, return_dict=True)
    assert len(once.pooler_output) == len(full.pooler_output) == 5
    for a, b in zip(once.pooler_output, full.pooler_output):
        assert a.shape == b.shape and torch.allclose(a, b, atol=1e-6, rtol=0)
    levels = full.deepstack_features  # Qwen3-VL: the tower's outputs at other depths as well
    assert levels
    assert len(once.deepstack_features) == len(levels)
    for got, want in zip(once.deepstack_features, levels):
        assert all(torch.allclose(a, b, atol=1e-6, rtol=0) for a, b in zip(got, want))
    assert once.last_hidden_state is None  # covered the distinct images only: not handed on

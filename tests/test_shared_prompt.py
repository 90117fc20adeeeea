"""Shared prompts (train.share_prompts): logprobs and gradients equal to the padded batch's, the prompts run once,
and the settings and models it cannot serve refused."""
from __future__ import annotations

import dataclasses
import random

import pytest
import torch
from _fixtures_train import chat_and_ordinary
from test_logprobs import assert_equal_passes, lora_model, value_and_grads

from envs.base import Observation
from grpo.algo.config import ConfigError
from grpo.learner import forward, plan, shared_prompt
from grpo.learner.config import TrainConfig
from grpo.learner.worker import TrainWorker
from grpo.tools import families
from rollout.trajectory import Segment, Trajectory

# Families whose text model shared prompts refuse, and why.
REFUSED = {"gemma3": "sliding-window layers"}


def group_trajectories(processor, tasks: int, group: int, seed: int = 0) -> list[Trajectory]:
    """`tasks` prompts x `group` replies of 1-12 random tokens; every third reply is followed by a feedback turn
    and a second reply (unscored tokens between scored ones)."""
    chat, ordinary = chat_and_ordinary(processor)
    rng = random.Random(seed)
    out = []
    for t in range(tasks):
        prompt = chat.prompt_ids(Observation(text=f"task {t}: " + "word " * (3 * t)))
        for g in range(group):
            ids, mask = list(prompt), [0] * len(prompt)
            gen = [rng.choice(ordinary) for _ in range(rng.randint(1, 12))]
            ids, mask = ids + gen, mask + [1] * len(gen)
            if (t * group + g) % 3 == 0:
                suffix = chat.observation_ids(Observation(text="again"), gen)
                more = [rng.choice(ordinary) for _ in range(rng.randint(1, 5))]
                ids, mask = ids + suffix + more, mask + [0] * len(suffix) + [1] * len(more)
            lps = [-rng.uniform(0.5, 8.0) if m else 0.0 for m in mask]
            out.append(Trajectory(task_id=f"t{t}", group_id=t, seed=t, segments=[Segment(ids, mask, lps, [])],
                                  turn_rewards=[float(g % 2)], num_turns=1, stop_reason="done",
                                  adapter_version=None))
    return out


def padded_batch(processor, trajs, filler: bool = True):
    seqs = [forward.expand(processor, s.token_ids, s.images, [torch.as_tensor(s.loss_mask)])
            for t in trajs for s in t.segments]
    if filler:  # a row with no scored token, as a rank's filler pass has
        seqs.append(dataclasses.replace(seqs[0], per_token=[torch.zeros_like(seqs[0].per_token[0])]))
    return forward.collate(processor, seqs, forward.tokenizer_of(processor).pad_token_id)


def test_shared_prompts_give_the_padded_batchs_logprobs_and_gradients(tiny_text, monkeypatch):
    processor = forward.load_processor(tiny_text)
    model = lora_model(forward.load_model(tiny_text))
    padded = padded_batch(processor, group_trajectories(processor, tasks=3, group=4))
    shared = dataclasses.replace(padded, share_prompts=True)
    mask = padded.per_token[0]
    runs = []  # (batch rows, tokens) of each forward the shared pass makes
    inner = type(model).forward

    def spy(self, *args, **kw):
        runs.append(tuple(kw["input_ids"].shape))
        return inner(self, *args, **kw)

    ref, ref_g = value_and_grads(model, lambda: forward.token_logprobs(model, padded, mask, 0.7))
    monkeypatch.setattr(type(model), "forward", spy)
    got, got_g = value_and_grads(model, lambda: forward.token_logprobs(model, shared, mask, 0.7))
    # The 3 prompts (the filler row's whole sequence is a prompt of its own) run once, then the 13 continuations.
    assert [rows for rows, _ in runs] == [4, 13]
    assert runs[1][1] < padded.input_ids.shape[1]
    assert_equal_passes(ref, ref_g, got, got_g)
    assert bool((got[~mask.bool()] == 0).all())
    assert type(model.get_base_model().get_output_embeddings()).__name__ == "Linear"  # put back


def test_the_trainer_with_shared_prompts_makes_the_same_update(tiny_text):
    processor = forward.load_processor(tiny_text)
    trajs = group_trajectories(processor, tasks=2, group=4, seed=3)
    adv = [(-1.0) ** i * (1 + i / 8) for i in range(len(trajs))]
    after = {}
    for share in (False, True):
        # lr = adam_eps = 1: the first Adam update is about the gradient itself (test_train_worker.comparable).
        worker = TrainWorker(tiny_text, train=TrainConfig(lr=1.0, adam_eps=1.0, micro_batch_size=3,
                                                          share_prompts=share))
        metrics = worker.train_step(trajs, adv)
        after[share] = (metrics, worker.gather_adapter())
    (m0, a0), (m1, a1) = after[False], after[True]
    assert max(float((a0[k] - a1[k]).abs().max()) for k in a0) <= 1e-5
    for name in ("loss", "grad_norm", "sampler_abs_diff_max", "generated_tokens"):
        assert m1[name] == pytest.approx(m0[name], rel=1e-5, abs=1e-7), name


def test_models_and_settings_it_cannot_serve_are_refused(tiny_vl):
    with pytest.raises(ValueError, match="train.share_prompts supports text models.*image-text model"):
        shared_prompt.prepare(forward.load_model(tiny_vl))
    with pytest.raises(ConfigError, match=r"TrainConfig.share_prompts=True .*tokens_per_micro_batch=4096"):
        TrainConfig(share_prompts=True, tokens_per_micro_batch=4096)
    with pytest.raises(ConfigError, match=r"TrainConfig.share_prompts=True .*activation_checkpointing"):
        TrainConfig(share_prompts=True, activation_checkpointing=True)
    with pytest.raises(ConfigError, match=r"TrainConfig.share_prompts='yes'"):
        TrainConfig(share_prompts="yes")


def test_micro_batches_keep_the_sequences_of_a_prompt_together():
    lengths = {0: 50, 1: 40, 2: 20, 3: 10, 4: 45}
    prompts = {0: (7,), 1: (8,), 2: (8,), 3: (7,), 4: (8,)}
    assert plan.micro_batches(list(lengths), lengths, 2) == [[0, 4], [1, 2], [3]]
    # Prompt (7,) holds the longest sequence: its group first; within a group, longest first.
    assert plan.micro_batches(list(lengths), lengths, 2, prompts) == [[0, 3], [4, 1], [2]]
    seg = Segment([5, 6, 7, 8, 9], [0, 0, 1, 0, 1], [0.0] * 5, [])
    assert shared_prompt.prompt_of(seg) == (5, 6)


@pytest.mark.parametrize("name", [n for n, f in families.FAMILIES.items() if f.kind == "text"])
def test_every_text_family_shares_prompts_exactly_or_is_refused(name, session_dir):
    # A real chat template's prompts (grpo.tools.families), built in bf16 as real checkpoints ship and trained
    # in float32 as the trainer loads them on the CPU.
    path = families.build(name, session_dir / "models" / f"family-{name}-bf16", dtype="bfloat16")
    processor = forward.load_processor(path)
    model = lora_model(forward.load_model(path))
    try:
        shared_prompt.prepare(model)
    except ValueError as e:
        assert name in REFUSED and REFUSED[name] in str(e)
        return
    assert name not in REFUSED
    padded = padded_batch(processor, group_trajectories(processor, tasks=2, group=3, seed=1))
    mask = padded.per_token[0]
    ref, ref_g = value_and_grads(model, lambda: forward.token_logprobs(model, padded, mask))
    got, got_g = value_and_grads(model, lambda: forward.token_logprobs(
        model, dataclasses.replace(padded, share_prompts=True), mask))
    assert_equal_passes(ref, ref_g, got, got_g)

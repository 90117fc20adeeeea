"""Each algorithm.loss_type, and the masks that need the learner's own forward, through the real TrainWorker on
the tiny text model: two steps with finite losses and a published adapter; the entropies of the chunked
logits pass against the full logits'."""
import math

import pytest
import torch
from _fixtures_train import advantages, trajectories

from grpo.algo.config import AlgorithmConfig
from grpo.learner import forward
from grpo.learner.config import TrainConfig
from grpo.learner.worker import TrainWorker
from sync import AdapterStore


@pytest.fixture(scope="module")
def processor(tiny_text):
    return forward.load_processor(tiny_text)


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo", "gspo", "cispo", "sapo"])
def test_two_steps_of_each_loss_type_train_and_publish(tiny_text, processor, tmp_path, loss_type):
    algo = AlgorithmConfig(loss_type=loss_type, seq_sum_norm_len=32 if loss_type == "dr_grpo" else None)
    worker = TrainWorker(tiny_text, algorithm=algo, train=TrainConfig(lr=1e-3, updates_per_batch=2), total_steps=2)
    store = tmp_path / "store"
    losses = []
    for step in range(2):
        batch = trajectories(processor, 4, seed=step, images=False)
        metrics = worker.train_step(batch, advantages(4, seed=step))
        losses.append(metrics["loss"])
        assert metrics["updates"] == 2.0 and math.isfinite(metrics["grad_norm"]) and metrics["grad_norm"] > 0
        assert worker.publish(str(store)) == step + 1
    assert all(math.isfinite(x) for x in losses), losses
    assert [v.version for v in AdapterStore(str(store)).versions()] == [1, 2]


def test_sequence_masks_and_entropy_selection_through_the_learner(tiny_text, processor):
    algo = AlgorithmConfig(loss_type="gspo", importance_sampling="geometric_mask", tis_cap=1.5,
                           off_policy_mask_threshold=0.5, top_entropy_quantile=0.5, mask_truncated=True)
    worker = TrainWorker(tiny_text, algorithm=algo, train=TrainConfig(lr=1e-3, tokens_per_micro_batch=64))
    batch = trajectories(processor, 4, images=False)
    batch[0].truncated = [True, False]  # its first reply was cut at the limit: no gradient, no weight
    batch[1].truncated = [False, False]
    metrics = worker.train_step(batch, [-1.0, 1.0, -0.5, 0.5])
    # The fixture's sampler logprobs are random draws far from the model's: every sequence leaves the band.
    assert metrics["is_masked_fraction"] == 1.0 and metrics["is_masked_sequences"] == 4
    assert metrics["entropy_masked_fraction"] == pytest.approx(0.5, abs=0.1)
    assert metrics["entropy_trained"] > metrics["entropy"] > 0
    replies = [end - start for runs in batch[0].turn_spans() for start, end in runs]
    assert metrics["generated_tokens"] == sum(t.num_generated for t in batch) - replies[0]
    batch = trajectories(processor, 2, images=False)
    batch[0].segments = batch[0].segments * 2  # an episode in two segments: GSPO's ratio would be wrong
    with pytest.raises(ValueError, match=r"algorithm\.loss_type='gspo' reads all the tokens of an episode"):
        worker.train_step(batch, [1.0, -1.0])


def test_entropies_of_the_chunked_pass_are_the_full_logits(tiny_text, processor):
    model = forward.load_model(tiny_text)
    seqs = [forward.expand(processor, t.segments[0].token_ids, [], [torch.as_tensor(t.segments[0].loss_mask)])
            for t in trajectories(processor, 3, images=False)]
    batch = forward.collate(processor, seqs, forward.tokenizer_of(processor).pad_token_id)
    mask = batch.per_token[0]
    with torch.no_grad():
        lp, ent = forward.token_logprobs(model, batch, mask, temperature=0.7, chunk_tokens=5, entropy=True)
        logits = model(**batch.model_kwargs()).logits.float()
        logp = forward.policy_logprobs(logits.flatten(0, 1), batch.banned_ids, 0.7).view(logits.shape)
    full = -(logp.exp() * torch.where(logp.isinf(), 0.0, logp)).sum(-1)
    want = mask[:, 1:].bool()
    torch.testing.assert_close(ent[:, 1:][want], full[:, :-1][want], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lp, forward.token_logprobs(model, batch, mask, temperature=0.7))
    assert (ent[:, 1:][~want] == 0).all() and ent[:, 1:][want].min() > 0


def test_dry_run_accepts_each_loss_type_and_lists_them_for_another(tmp_path, tiny_text, capsys):
    import json

    import yaml

    from grpo.cli import main

    path = tmp_path / "c.yaml"
    path.write_text(f"model: {tiny_text}\nalgorithm: {{group_size: 4}}\nrollout: {{max_tokens_per_turn: 24}}\n")
    for loss_type in ("grpo", "dr_grpo", "dapo", "gspo", "cispo", "sapo"):
        assert main(["train", str(path), "--algorithm.loss_type", loss_type, "--dry-run"]) == 0, loss_type
        out = capsys.readouterr().out.strip().splitlines()
        assert json.loads(out[-1])["valid"] is True
        algo = yaml.safe_load("\n".join(out[:-1]))["algorithm"]
        assert algo["loss_type"] == loss_type
        if loss_type == "dr_grpo":  # the preset's fields, resolved in what the run keeps
            assert (algo["loss_agg"], algo["scale_rewards"], algo["seq_sum_norm_len"]) == ("seq_sum_norm", "none", 24)
    assert main(["train", str(path), "--algorithm.loss_type", "bnpo", "--dry-run"]) == 2
    assert "one of 'grpo', 'dr_grpo', 'dapo', 'gspo', 'cispo', 'sapo'" in capsys.readouterr().err
    assert main(["train", str(path), "--algorithm.loss_type", "dr_grpo", "--algorithm.loss_agg", "token_mean",
                 "--dry-run"]) == 2
    assert "loss_type='dr_grpo' sets algorithm.loss_agg='seq_sum_norm'" in capsys.readouterr().err

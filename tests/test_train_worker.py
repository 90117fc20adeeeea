"""The trainer (grpo/learner/worker.py): config, micro-batching, mini-batches, FSDP on 2 Ray ranks against one
process, resume on 2 ranks, and the gathered adapter in peft and vLLM."""
import math
import random

import pytest
import torch
from _fixtures_train import advantages, assert_same_state, max_abs_diff, saved_state, trajectories

from grpo.algo.config import AlgorithmConfig, ConfigError
from grpo.algo.loss import merge_metrics
from grpo.driver.train_group import StoredEpisodes, TrainGroup
from grpo.learner import forward
from grpo.learner.config import TrainConfig
from grpo.learner.lora import LoraConfig, apply_lora, randomize_adapter
from grpo.learner.worker import TrainWorker

ALGO = AlgorithmConfig(kl_coef=0.1)
SEQ_MEAN = AlgorithmConfig(kl_coef=0.1, loss_agg="sequence_mean")


def comparable(micro_batch_size: int, **kw) -> TrainConfig:
    """Adam's first update is lr * g / (|g| + eps): with the default eps that is lr * sign(g), which turns
    rounding-level differences in near-zero gradient entries into lr-sized ones. lr = eps = 1 makes the
    update about the gradient itself, so comparing weights compares gradients through the real optimizer
    path. max_grad_norm is below the gradients' norm (about 1.5), so clipping is part of it."""
    return TrainConfig(lr=1.0, adam_eps=1.0, max_grad_norm=0.5, micro_batch_size=micro_batch_size, **kw)


@pytest.fixture(scope="module")
def start_adapter(tiny_vl, tmp_path_factory) -> str:
    """A random adapter: from peft's (B = 0) every lora_A gradient would be zero on the first step."""
    model = apply_lora(forward.load_model(tiny_vl), LoraConfig(rank=4, alpha=8))
    randomize_adapter(model, seed=1, scale=0.1)
    path = tmp_path_factory.mktemp("start-adapter")
    model.save_pretrained(path)
    return str(path)


@pytest.mark.parametrize("field,value", [
    ("lr", 0.0), ("lr", "1e-5"), ("weight_decay", -0.1), ("betas", (0.9,)), ("betas", (0.9, 1.0)),
    ("warmup_steps", 1.5), ("schedule", "linear"), ("max_grad_norm", 0.0),
    ("micro_batch_size", 0), ("updates_per_batch", True), ("seed", -1),
])
def test_bad_config_values_name_the_field(field, value):
    with pytest.raises(ConfigError) as e:
        TrainConfig(**{field: value})
    assert e.value.field == f"TrainConfig.{field}"
    assert repr(value) in str(e.value)


def test_cosine_needs_a_length_beyond_warmup(tiny_vl):
    cosine = TrainConfig(schedule="cosine", warmup_steps=10)
    for steps in (None, 10):
        with pytest.raises(ConfigError, match=r"TrainWorker.total_steps=.*train.warmup_steps \(10\)"):
            TrainWorker(tiny_vl, train=cosine, total_steps=steps)
    with pytest.raises(ConfigError, match=r"TrainWorker.temperature=0"):
        TrainWorker(tiny_vl, temperature=0)


def test_learning_rate_schedule():
    constant = TrainConfig(lr=1.0, warmup_steps=4)
    assert [constant.lr_at(s) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    cosine = TrainConfig(lr=2.0, warmup_steps=2, schedule="cosine", min_lr_ratio=0.5)
    lrs = [cosine.lr_at(s, 6) for s in range(8)]
    assert lrs[:3] == [1.0, 2.0, 2.0]
    assert lrs[4] == pytest.approx(1.5) and lrs[6] == pytest.approx(1.0) and lrs[7] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(lrs[1:], lrs[2:]))


@pytest.mark.parametrize("split, algo, tolerance", [
    (comparable(2), ALGO, 1e-6),  # four padded micro-batches
    (comparable(7, tokens_per_micro_batch=100_000), ALGO, 1e-5),  # one packed row
    (comparable(7, tokens_per_micro_batch=250), ALGO, 1e-5),  # packed rows of at most 250 tokens
    (comparable(7, tokens_per_micro_batch=250), SEQ_MEAN, 1e-5),  # episodes' means across packed rows
    (comparable(2, activation_checkpointing=True), ALGO, 1e-6),
], ids=["padded-4", "packed-1", "packed-250", "packed-250-sequence-mean", "activation-checkpointing"])
def test_micro_batches_do_not_change_the_update(tiny_vl, start_adapter, split, algo, tolerance):
    one = TrainWorker(tiny_vl, algorithm=algo, train=comparable(7), adapter_path=start_adapter)
    four = TrainWorker(tiny_vl, algorithm=algo, train=split, adapter_path=start_adapter)
    before = one.gather_adapter()
    batch, adv = trajectories(one.processor, 7), advantages(7)
    if split.tokens_per_micro_batch == 250:
        lengths = [four._length(s) for t in batch for s in t.segments]
        assert max(lengths) < 250 < sum(lengths)  # several rows, none over the budget
    m1, m4 = one.train_step(batch, adv), four.train_step(batch, adv)
    after = one.gather_adapter()
    assert max_abs_diff(after, four.gather_adapter()) <= tolerance
    assert max_abs_diff(after, before) > 1e-2  # it did train
    assert m1["grad_norm"] > 0.5  # clipped
    for name in ("loss", "grad_norm", "kl", "sampler_abs_diff", "sampler_abs_diff_max", "generated_tokens"):
        assert m1[name] == pytest.approx(m4[name], rel=1e-5, abs=1e-7), name
    assert m1["generated_tokens"] == sum(t.num_generated for t in batch)
    assert m1["kl"] < 1e-7  # the reference is the starting adapter (tests/test_settings_exact.py)


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_updates_per_batch(tiny_vl, start_adapter, packed):
    config = lambda mbs, **kw: comparable(mbs, updates_per_batch=2, **kw)  # noqa: E731
    a = TrainWorker(tiny_vl, algorithm=ALGO, train=config(4), adapter_path=start_adapter)
    b = TrainWorker(tiny_vl, algorithm=ALGO, train=config(1, tokens_per_micro_batch=200) if packed else config(1),
                    adapter_path=start_adapter)
    single = TrainWorker(tiny_vl, algorithm=ALGO, train=comparable(4), adapter_path=start_adapter)
    batch, adv = trajectories(a.processor, 6, seed=3), advantages(6, seed=3)
    ma, _, ms = a.train_step(batch, adv), b.train_step(batch, adv), single.train_step(batch, adv)
    assert ma["updates"] == 2 and ms["updates"] == 1
    assert max_abs_diff(a.gather_adapter(), b.gather_adapter()) <= 1e-6
    # The second mini-batch runs on updated weights against old logprobs scored before the first update.
    assert abs(ma["ratio_mean"] - 1.0) > 1e-3 and ms["ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    # The sync alarm compares vLLM with the weights the batch was sampled from, in both modes.
    assert ma["sampler_abs_diff"] == pytest.approx(ms["sampler_abs_diff"], rel=1e-6)
    assert ma["sampler_abs_diff_max"] == pytest.approx(ms["sampler_abs_diff_max"], rel=1e-6)


def sampled_by(worker: TrainWorker, batch: list, shift: float = 0.0) -> list:
    """`batch` with every segment's sampler logprobs set to the worker's own, before any update, minus `shift`:
    a rollout engine in exact agreement with the trainer (shift 0) or off by `shift` on every token."""
    worker.model.eval()
    with torch.no_grad():
        for traj in batch:
            for seg in traj.segments:
                one = forward.collate(worker.processor, [forward.expand(worker.processor, seg.token_ids, seg.images,
                                                                        [torch.tensor(seg.loss_mask)])], worker.pad_id)
                lp = forward.token_logprobs(worker.model, one, one.per_token[0])[0].tolist()
                seg.sampler_logprobs = [x - shift if m else 0.0 for x, m in zip(lp, seg.loss_mask)]
    return batch


def per_update(worker: TrainWorker, batch: list, adv: list, monkeypatch) -> list[dict]:
    """One train step; the metrics of each of its updates, in order, then the step's."""
    seen, update = [], worker._update

    def spy(*args):
        outputs, tokens = update(*args)
        seen.append(merge_metrics(outputs))
        return outputs, tokens

    monkeypatch.setattr(worker, "_update", spy)
    return seen + [worker.train_step(batch, adv)]


def trainer_and_sampler(tiny_vl, start_adapter) -> tuple[TrainWorker, TrainWorker]:
    """Two workers, old_logprobs "trainer" and "sampler", from the same adapter: two updates per batch, float32."""
    config = comparable(2, updates_per_batch=2, dtype="float32")
    return tuple(TrainWorker(tiny_vl, algorithm=AlgorithmConfig(kl_coef=0.1, old_logprobs=mode), train=config,
                             adapter_path=start_adapter) for mode in ("trainer", "sampler"))


def test_sampler_old_logprobs_match_the_trainers_when_they_agree(tiny_vl, start_adapter, monkeypatch):
    trainer, sampler = trainer_and_sampler(tiny_vl, start_adapter)
    monkeypatch.setattr(sampler, "_score", lambda *a: pytest.fail("old_logprobs 'sampler' needs no scoring pass"))
    before = trainer.gather_adapter()
    batch, adv = sampled_by(trainer, trajectories(trainer.processor, 6, seed=3, images=False)), advantages(6, seed=3)
    mt, ms = per_update(trainer, batch, adv, monkeypatch), per_update(sampler, batch, adv, monkeypatch)
    assert len(mt) == len(ms) == 3
    # Old logprobs scored before the first update, or recorded by a sampler in exact agreement: the same updates.
    step = max_abs_diff(trainer.gather_adapter(), before)
    assert step > 1e-2  # it did train
    assert max_abs_diff(trainer.gather_adapter(), sampler.gather_adapter()) <= 1e-5 * step
    for t, s in zip(mt[:2], ms[:2]):
        assert t["ratio_mean"] == pytest.approx(s["ratio_mean"], abs=1e-6) and t["loss"] == pytest.approx(s["loss"])
    # The first update's forward runs on the weights the batch was sampled from: the sync alarm reads 0. The
    # second's runs on weights the first moved; the step reports the first's, as the trainer mode does.
    assert ms[0]["sampler_abs_diff_max"] <= 1e-5 and ms[0]["clip_fraction"] == 0.0
    assert ms[1]["sampler_abs_diff_max"] > 0.1
    assert ms[2]["sampler_abs_diff_max"] <= 1e-5 and mt[2]["sampler_abs_diff_max"] <= 1e-5


def test_sampler_old_logprobs_clip_against_the_sampler(tiny_vl, start_adapter, monkeypatch):
    # Every sampled token 0.5 less likely to the sampler than to the trainer: against the sampler's logprobs
    # every ratio starts at exp(0.5) = 1.65 > 1 + clip_high, so the tokens of positive advantage are clipped.
    trainer, sampler = trainer_and_sampler(tiny_vl, start_adapter)
    batch = sampled_by(trainer, trajectories(trainer.processor, 6, seed=3, images=False), shift=0.5)
    adv = advantages(6, seed=3)
    mt, ms = per_update(trainer, batch, adv, monkeypatch), per_update(sampler, batch, adv, monkeypatch)
    assert mt[0]["clip_fraction"] == 0.0 and mt[0]["ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    assert ms[0]["clip_fraction"] > 0.1 and ms[0]["ratio_mean"] == pytest.approx(math.exp(0.5), rel=1e-5)
    # The sync alarm sees the shift in both modes.
    assert mt[0]["sampler_abs_diff"] == pytest.approx(0.5, abs=1e-5)
    assert ms[0]["sampler_abs_diff"] == pytest.approx(0.5, abs=1e-5)


def test_batch_without_generated_tokens_is_skipped(tiny_vl):
    worker = TrainWorker(tiny_vl, train=TrainConfig(lr=1.0, warmup_steps=2))
    batch = trajectories(worker.processor, 2, turns=1)
    for traj in batch:
        seg = traj.segments[0]
        seg.loss_mask = [0] * len(seg.loss_mask)
        seg.sampler_logprobs = [0.0] * len(seg.loss_mask)
    before = worker.gather_adapter()
    metrics = worker.train_step(batch, [1.0, -1.0])
    assert metrics["skipped"] == 1.0 and metrics["step"] == 1.0 and metrics["lr"] == 0.5
    assert max_abs_diff(before, worker.gather_adapter()) == 0.0
    with pytest.raises(ValueError, match="one per trajectory"):
        worker.train_step(batch, [1.0])


# ------------------------------------------------------------------------------------- 2 ranks, Ray
@pytest.fixture(scope="module")
def ray_session():
    import shutil
    import tempfile

    import ray

    # Ray's socket paths must fit in 107 bytes: a short folder directly under /tmp, removed at the end.
    ray_tmp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    ray.init(_temp_dir=ray_tmp, include_dashboard=False, num_cpus=2, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()
        shutil.rmtree(ray_tmp, ignore_errors=True)


@pytest.mark.slow
def test_two_ranks_of_packed_rows_match_one_padded_process(ray_session, tiny_vl, start_adapter):
    # Before the module's two_ranks fixture, whose ranks hold both CPUs of the Ray session once started.
    processor = forward.load_processor(tiny_vl)
    batch, adv = trajectories(processor, 7, seed=5), advantages(7, seed=5)
    group = TrainGroup(tiny_vl, 2, algorithm=ALGO, train=comparable(7, tokens_per_micro_batch=200),
                       adapter_path=start_adapter)
    try:
        m2, a2 = group.train_step(batch, adv), group.gather_adapter()
    finally:
        group.shutdown()
    single = TrainWorker(tiny_vl, algorithm=ALGO, train=comparable(7), adapter_path=start_adapter)
    m1 = single.train_step(batch, adv)
    assert max_abs_diff(a2, single.gather_adapter()) <= 1e-5
    for name in ("loss", "grad_norm", "kl", "sampler_abs_diff", "generated_tokens", "sequences"):
        assert m2[name] == pytest.approx(m1[name], rel=1e-5, abs=1e-7), name


@pytest.mark.slow
def test_two_ranks_sharing_prompts_match_one_padded_process(ray_session, tiny_text, tmp_path):
    # Each micro-batch makes two forwards (prompts, then continuations) before its backward, on both ranks,
    # a filler pass included: FSDP's collectives stay in step.
    from test_shared_prompt import group_trajectories

    model = apply_lora(forward.load_model(tiny_text), LoraConfig(rank=4, alpha=8))
    randomize_adapter(model, seed=1, scale=0.1)
    model.save_pretrained(tmp_path)
    batch = group_trajectories(forward.load_processor(tiny_text), tasks=3, group=3, seed=7)
    adv = advantages(len(batch), seed=7)
    group = TrainGroup(tiny_text, 2, algorithm=ALGO, train=comparable(2, share_prompts=True),
                       adapter_path=str(tmp_path))
    try:
        m2, a2 = group.train_step(batch, adv), group.gather_adapter()
    finally:
        group.shutdown()
    single = TrainWorker(tiny_text, algorithm=ALGO, train=comparable(9), adapter_path=str(tmp_path))
    m1 = single.train_step(batch, adv)
    assert max_abs_diff(a2, single.gather_adapter()) <= 1e-5
    for name in ("loss", "grad_norm", "kl", "sampler_abs_diff", "generated_tokens", "sequences"):
        assert m2[name] == pytest.approx(m1[name], rel=1e-5, abs=1e-7), name


@pytest.fixture(scope="module")
def two_ranks(ray_session, tiny_vl, start_adapter, tmp_path_factory):
    """Three steps on 2 FSDP ranks with a checkpoint after the second, one process beside the first step,
    then new ranks that resume from the checkpoint and redo the third step, reading it from Ray's object store
    as the driver hands it over (StoredEpisodes: groups of two, one group left out); those stay up for the tests.
    Seven sequences, three per micro-batch: one rank gets four (two passes), the other three (one pass
    and a zero-weight filler pass that keeps FSDP's collectives in step)."""
    import ray

    root = tmp_path_factory.mktemp("two-ranks")
    processor = forward.load_processor(tiny_vl)
    batches = [(trajectories(processor, 7, seed=s), advantages(7, seed=s)) for s in range(3)]
    run = {"root": root}
    group = TrainGroup(tiny_vl, 2, algorithm=ALGO, train=comparable(3), adapter_path=start_adapter)
    try:
        single = TrainWorker(tiny_vl, algorithm=ALGO, train=comparable(64), adapter_path=start_adapter)
        run["metrics"] = (group.train_step(*batches[0]), single.train_step(*batches[0]))
        run["adapters"] = (group.gather_adapter(), single.gather_adapter())
        group.train_step(*batches[1])
        random.seed(123)
        group.save_checkpoint(root / "ckpt", state={"note": "after two"})
        run["driver_draw"] = random.random()
        group.train_step(*batches[2])
        run["straight"] = saved_state(group.save_checkpoint(root / "straight"))
    finally:
        group.shutdown()
    random.seed(456)
    resumed = TrainGroup(tiny_vl, 2, algorithm=ALGO, train=comparable(3), adapter_path=start_adapter)
    try:
        run["resumed_info"] = resumed.load_checkpoint(root / "ckpt")
        run["resumed_draw"] = random.random()
        trajs, adv = batches[2]
        groups = [ray.put(trajs[k:k + 2]) for k in range(0, 7, 2)] + [ray.put(trajs[:2])]
        resumed.train_step(StoredEpisodes.of(groups, range(7), 2), adv)
        run["resumed"] = saved_state(resumed.save_checkpoint(root / "resumed"))
        run["group"] = resumed
        yield run
    finally:
        resumed.shutdown()


@pytest.mark.slow
def test_two_fsdp_ranks_match_one_process(two_ranks):
    (m2, m1), (a2, a1) = two_ranks["metrics"], two_ranks["adapters"]
    assert a2.keys() == a1.keys()  # peft's key names, no ".default"
    assert all(".default" not in k for k in a2)
    assert max_abs_diff(a2, a1) <= 1e-5
    for name in ("loss", "grad_norm", "kl", "clip_fraction", "sampler_abs_diff", "sampler_abs_diff_max",
                 "generated_tokens", "sequences"):
        assert m2[name] == pytest.approx(m1[name], rel=1e-5, abs=1e-7), name


@pytest.mark.slow
def test_resume_on_new_ranks_is_bitwise(two_ranks):
    info, straight, resumed = two_ranks["resumed_info"], two_ranks["straight"], two_ranks["resumed"]
    assert info["step"] == 2 and info["state"] == {"note": "after two"}
    assert two_ranks["resumed_draw"] == two_ranks["driver_draw"]  # the driver's random state came back
    assert straight["step"] == 3 and straight["model"] and straight["optim"]["state"]
    assert_same_state(straight, resumed)  # the checkpoints after step 3: weights and optimizer state


@pytest.mark.slow
def test_gathered_adapter_serves_in_vllm_and_peft(two_ranks, tiny_vl, tmp_path, monkeypatch):
    import tempfile

    from rollout import runtime

    runtime.configure(tmp_path / "run")
    # vLLM leaves a file:// rendezvous file (vllm_dist_*) in the temp folder: keep it in tmp_path.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    from peft import PeftModel

    from rollout.engine import EngineConfig
    from rollout.worker import RolloutConfig, RolloutWorker, Task
    from sync import AdapterStore

    group, store = two_ranks["group"], tmp_path / "store"
    version = group.publish(store)
    assert version == 1
    worker = RolloutWorker(EngineConfig(model=str(tiny_vl), max_lora_rank=8), store_root=str(store))
    try:
        assert worker.sync_adapter(version) == version
        tasks = [Task("maze", s, {"size": 7, "max_turns": 2}) for s in range(2)]
        batch, _ = worker.rollout(tasks, 2, RolloutConfig(temperature=1.0, max_tokens_per_turn=6, history="full"))
    finally:
        worker.shutdown()
    assert sum(t.num_generated for t in batch) > 0

    # The trainer's own alarm: its logprobs of what vLLM sampled, on the weights it just published.
    metrics = group.train_step(batch, [0.0] * len(batch))
    print(f"sampler_abs_diff_max = {metrics['sampler_abs_diff_max']:.2e}")
    # float32: measured 4.8e-7 here and in peft below, one ulp of a logprob near -5; the bound is 10x that, a few
    # ulps of logprobs near -20.
    assert metrics["sampler_abs_diff_max"] <= 5e-6

    processor = forward.load_processor(tiny_vl)
    base = forward.load_model(tiny_vl)
    peft_model = PeftModel.from_pretrained(base, AdapterStore(store).verify(version).path).eval()
    seqs = [forward.expand(processor, s.token_ids, s.images,
                           [torch.tensor(s.loss_mask), torch.tensor(s.sampler_logprobs)])
            for t in batch for s in t.segments]
    b = forward.collate(processor, seqs, forward.tokenizer_of(processor).pad_token_id)
    mask = b.per_token[0].bool()
    with torch.no_grad():
        lp = forward.token_logprobs(peft_model, b, b.per_token[0])
        with peft_model.disable_adapter():
            base_lp = forward.token_logprobs(peft_model, b, b.per_token[0])
    gap = float((lp[mask] - b.per_token[1][mask]).abs().max())
    print(f"published adapter in peft: max |vLLM - peft| = {gap:.2e} over {int(mask.sum())} tokens")
    assert gap <= 5e-6
    # The check can fail: the base model's logprobs are far from what the adapter sampled.
    assert float((base_lp[mask] - b.per_token[1][mask]).abs().max()) > 1e-2
    assert math.isfinite(metrics["loss"])

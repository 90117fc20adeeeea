"""The multi-turn rollout worker end to end: tiny Qwen3-VL, real vLLM, a real Ray actor, the maze."""
import json
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

from grpo.learner import forward, lora
from rollout.engine import EngineConfig
from rollout.worker import RolloutConfig, RolloutWorker, Task
from sync import AdapterStore

pytestmark = pytest.mark.slow

MAZE = {"size": 7, "max_turns": 5}
G = 4


@pytest.fixture(scope="module")
def ray_rollout(tiny_vl, session_dir):
    import ray

    # Ray's socket paths must stay short: a folder directly under /tmp, removed at the end.
    ray_tmp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    store = AdapterStore(session_dir / "rollout-store")
    model = lora.apply_lora(forward.load_model(tiny_vl), lora.LoraConfig(rank=8, alpha=16.0))
    lora.randomize_adapter(model, seed=3)
    version = store.publish(lora.adapter_tensors(model), lora.adapter_config(model))
    ray.init(num_cpus=2, _temp_dir=ray_tmp, include_dashboard=False, log_to_driver=False)
    try:
        actor = ray.remote(num_cpus=1)(RolloutWorker).remote(
            EngineConfig(model=str(tiny_vl), max_lora_rank=8, max_model_len=2048),
            store_root=str(store.root), worker_id="test-rollout", run_dir=str(session_dir))
        assert ray.get(actor.sync_adapter.remote()) == version
        # The worker leased what it serves, so garbage collection keeps it while vLLM reads the files.
        lease = json.loads((Path(store.readers_dir) / "test-rollout.json").read_text())
        assert lease["version"] == version
        yield ray, actor, model.eval(), version
        ray.kill(actor)
    finally:
        ray.shutdown()
        shutil.rmtree(ray_tmp, ignore_errors=True)


def _rollout(ray, actor, history, greedy=False, tasks=None):
    tasks = tasks or [Task("maze", seed, MAZE) for seed in (1_000_001, 1_000_002)]
    cfg = RolloutConfig(temperature=1.0, max_tokens_per_turn=10, history=history)
    return ray.get(actor.rollout.remote(tasks, 1 if greedy else G, cfg, greedy))


def _trainer_logprobs(processor, model, segments):
    seqs = [forward.expand(processor, s.token_ids, s.images,
                           [torch.tensor(s.loss_mask), torch.tensor(s.sampler_logprobs)]) for s in segments]
    batch = forward.collate(processor, seqs, forward.tokenizer_of(processor).pad_token_id)
    with torch.no_grad():
        lp = forward.token_logprobs(model, batch, mask=batch.per_token[0])
    mask = batch.per_token[0].bool()
    return lp[mask], batch.per_token[1][mask]


def test_a_step_leaves_its_episodes_in_the_object_store_and_the_driver_their_headers(ray_rollout):
    from grpo.driver.rollout_pool import _rollout_stored, fetch
    from grpo.driver.train_group import StoredEpisodes

    ray, actor, _, version = ray_rollout
    tasks = [Task("maze", seed, MAZE) for seed in (1_000_003, 1_000_004)]
    cfg = RolloutConfig(temperature=1.0, max_tokens_per_turn=10, history="none")
    refs = actor.__ray_call__.options(num_returns=3).remote(_rollout_stored, tasks, G, cfg)
    headers, stats = ray.get(refs[0])
    assert stats.episodes == len(headers) == 2 * G and [h.group_id for h in headers] == [0] * G + [1] * G
    assert all(h.segments == [] and h.turn_rewards and h.adapter_version == version for h in headers)
    # The whole episodes, read back from their groups' objects: the headers' episodes with their tokens.
    whole = fetch(refs[1:], headers, list(range(2 * G)))
    assert [(t.seed, t.turn_rewards, t.num_turns) for t in whole] == [(h.seed, h.turn_rewards, h.num_turns)
                                                                     for h in headers]
    assert all(t.segments and t.num_generated > 0 for t in whole)
    stored = StoredEpisodes.of(refs[1:], [G + 1, G + 2], G)
    assert stored.groups == [refs[2]] and stored.picks == [(0, 1), (0, 2)]


@pytest.mark.parametrize("history", ["full", "none"])
def test_trainer_forward_reproduces_vllm_logprobs(ray_rollout, tiny_vl, history):
    ray, actor, model, version = ray_rollout
    trajs, stats = _rollout(ray, actor, history)
    assert len(trajs) == 2 * G and stats.episodes == 2 * G
    assert sorted(t.group_id for t in trajs) == [0] * G + [1] * G
    assert all(t.adapter_version == version for t in trajs)
    # One engine call per turn for the whole batch, never one per episode.
    assert stats.engine_calls == max(t.num_turns for t in trajs)
    segments = [s for t in trajs for s in t.segments]
    if history == "full":
        assert all(len(t.segments) == 1 for t in trajs)
        assert all(len(t.segments[0].images) == t.num_turns for t in trajs)
    else:
        assert all(len(t.segments) == t.num_turns and all(len(s.images) == 1 for s in t.segments) for t in trajs)
    trainer, sampler = _trainer_logprobs(forward.load_processor(tiny_vl), model, segments)
    assert len(trainer) == sum(t.num_generated for t in trajs) > 0
    diff = (trainer - sampler).abs()
    print(f"history={history}: |vLLM - trainer| mean {diff.mean().item():.2e}, max {diff.max().item():.2e} over "
          f"{len(trainer)} tokens")
    # float32, the same figures in two runs: mean 6.9e-7 and max 5.7e-6 (history full), 6.6e-7 and 6.2e-6 (none),
    # a few ulps of the logprobs of 400 sampled tokens; the bounds are 4x the larger.
    assert diff.mean().item() <= 3e-6 and diff.max().item() <= 2.5e-5


def test_loss_mask_covers_exactly_the_sampled_tokens_and_ids_decode_to_the_conversation(ray_rollout, tiny_vl):
    ray, actor, _, _ = ray_rollout
    trajs, _ = _rollout(ray, actor, "full")
    tok = forward.tokenizer_of(forward.load_processor(tiny_vl))
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    import envs

    for t in trajs:
        seg = t.segments[0]
        # Runs of mask 1 are the turns: each decodes to exactly the text the env received.
        turns, run = [], []
        for tid, m in zip(seg.token_ids, seg.loss_mask):
            if m:
                run.append(tid)
            elif run:
                turns.append(run)
                run = []
        if run:
            turns.append(run)
        assert len(turns) == t.num_turns
        assert [seg.token_ids[a:b] for a, b in t.turn_spans()[0]] == turns
        for ids, action in zip(turns, t.actions):
            text_ids = ids[:-1] if ids[-1] == eos else ids
            assert tok.decode(text_ids) == action
        # Replaying the actions on a fresh env gives the observations the decoded conversation holds.
        env = envs.make("maze", **MAZE)
        conversation = tok.decode(seg.token_ids)
        assert env.reset(t.seed).text in conversation
        pos = 0
        assert len(t.turn_states) == t.num_turns
        for action, state in zip(t.actions, t.turn_states):
            assert state == env.position  # the state each turn began in
            result = env.step(action)
            if not result.done:
                found = conversation.find(result.observation.text, pos)
                assert found >= 0
                pos = found
        sampled = [lp for lp, m in zip(seg.sampler_logprobs, seg.loss_mask) if m]
        assert all(lp <= 0 for lp in sampled) and any(lp < 0 for lp in sampled)
        assert all(lp == 0 for lp, m in zip(seg.sampler_logprobs, seg.loss_mask) if not m)


def test_greedy_evaluation_is_deterministic(ray_rollout):
    ray, actor, _, _ = ray_rollout
    tasks = [Task("maze", seed, MAZE) for seed in range(4)]
    first, s1 = _rollout(ray, actor, "none", greedy=True, tasks=tasks)
    second, s2 = _rollout(ray, actor, "none", greedy=True, tasks=tasks)
    assert [s.token_ids for t in first for s in t.segments] == [s.token_ids for t in second for s in t.segments]
    assert s1.success_rate == s2.success_rate


def test_context_limit_ends_episodes_with_a_stop_reason(tiny_vl, session_dir):
    # In-process: a context too small for a second full turn.
    worker = RolloutWorker(EngineConfig(model=str(tiny_vl), enable_lora=False, max_model_len=420),
                           run_dir=str(session_dir))
    try:
        trajs, stats = worker.rollout([Task("maze", 5, {"size": 7, "max_turns": 20})], 2,
                                      RolloutConfig(max_tokens_per_turn=10, history="full"))
        assert stats.stop_reasons == {"context": 2}
        assert all(t.num_turns >= 1 and t.segments and t.num_generated > 0 for t in trajs)
    finally:
        worker.shutdown()


def test_bad_model_folder_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        EngineConfig(model=str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="no config.json"):
        EngineConfig(model=str(tmp_path))

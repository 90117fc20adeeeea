"""`grpo export` (grpo/tools/export.py): the adapter folder, its model card, the merged model and the upload;
and end to end, a run from a Hub id in a Hugging Face cache (offline): trained one step, scored by `grpo eval`,
exported, and both exports loaded in transformers + peft and in vLLM with the run's eval logprobs."""
import dataclasses
import json
import os
from pathlib import Path

import pytest
import torch
from test_hub_model import hub_cache

from grpo.cli import main
from grpo.tools import export as tool
from grpo.tools.model_check import TOLERANCE

ROOT = Path(__file__).resolve().parents[1]
REPO = "tiny-org/tiny-text"


def digit(prompt, completion, row) -> float:
    """The run's reward: 1 for a reply with a digit in it (the tiny random model finds one now and then)."""
    return float(any(c.isdigit() for c in completion))


def test_serving_rank_is_the_smallest_rank_vllm_accepts_above_the_adapters():
    assert [tool.serving_rank(r) for r in (1, 2, 8, 9, 16, 17, 32, 33, 300, 512)] == [
        1, 8, 8, 16, 16, 32, 32, 64, 320, 512]
    with pytest.raises(ValueError, match="--merged"):
        tool.serving_rank(513)


def _publish(store_root: Path, peft_model, versions: int) -> list[int]:
    from grpo.learner.lora import adapter_config, adapter_tensors, randomize_adapter
    from sync import AdapterStore

    out = []
    for seed in range(versions):
        randomize_adapter(peft_model, seed=seed)
        out.append(AdapterStore(store_root).publish(adapter_tensors(peft_model), adapter_config(peft_model)))
    return out


@pytest.fixture
def finished_run(tmp_path, tiny_text):
    """A run folder as the trainer leaves one, its parts written here: config.yaml, 4 published versions of a
    rank-4 adapter of the tiny text model (the store keeps the newest 3), metrics.jsonl's step records (steps
    1-3 published v2-v4), summary.json."""
    from grpo.config import RunConfig
    from grpo.learner.forward import load_model
    from grpo.learner.lora import LoraConfig, apply_lora

    run = tmp_path / "run"
    run.mkdir()
    options = {"data": [{"prompt": "x"}] * 20, "rewards": "test_export:digit"}
    cfg = RunConfig(model=str(tiny_text), output_dir=str(run), steps=3, lora={"rank": 4, "alpha": 8.0},
                    env={"name": "dataset", "options": options}, eval={"seeds": "0-7", "test_seeds": "8-11"})
    (run / "config.yaml").write_text(cfg.to_yaml())
    peft_model = apply_lora(load_model(tiny_text), LoraConfig(rank=4, alpha=8.0))
    assert _publish(run / "store", peft_model, 4) == [1, 2, 3, 4]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (
        {"step": 1, "adapter_version": 2}, {"event": "restart", "step": 1}, {"step": 2, "adapter_version": 3},
        {"step": 3, "adapter_version": 4})))
    (run / "summary.json").write_text(json.dumps({
        "steps": 3, "adapter_version": 4, "eval_before": 0.25, "eval_after": 0.5, "test_before": 0.125,
        "test_after": 0.75, "evals": {"2": {"success_rate": 0.375}}}))
    return run, peft_model


def test_the_step_picks_its_published_version_while_the_store_keeps_it(finished_run):
    run, _ = finished_run
    assert tool.pick(run, None) == (3, 4) and tool.pick(run, 2) == (2, 3) and tool.pick(run, 1) == (1, 2)
    from grpo.learner.lora import adapter_config, adapter_tensors
    from sync import AdapterStore

    peft_model = finished_run[1]
    AdapterStore(run / "store").publish(adapter_tensors(peft_model), adapter_config(peft_model))  # v5: v2 goes
    with pytest.raises(ValueError, match=r"--step 1: its adapter \(v000002\) is no longer in .*exportable: 2-3"):
        tool.pick(run, 1)
    with pytest.raises(ValueError, match="--step 7: .* recorded no such step; its steps: 1-3"):
        tool.pick(run, 7)
    assert tool._spans([1, 2, 3, 7, 9, 10]) == "1-3, 7, 9-10"


def test_export_writes_peft_files_a_card_and_a_merged_model_and_pushes(finished_run, tiny_text, tmp_path,
                                                                        monkeypatch, capsys):
    import huggingface_hub
    from peft import PeftModel

    from grpo.learner.forward import load_model

    run, _ = finished_run
    calls = []
    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", lambda self, repo_id, **kw: calls.append(
        ("create_repo", repo_id, kw)))
    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", lambda self, **kw: calls.append(
        ("upload_folder", sorted(os.listdir(kw["folder_path"])), kw)) or "https://hub/commit/1")
    merged = tmp_path / "merged"
    assert main(["export", str(run), "--step", "2", "--merged", str(merged), "--push-to-hub", "me/tiny-grpo"]) == 0
    done = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    out = run / "export" / "step2"
    assert done == {"adapter": str(out), "merged": str(merged), "step": 2, "version": 3, "base_model": str(tiny_text),
                    "pushed": "https://hub/commit/1"}
    files = ["README.md", "adapter_config.json", "adapter_model.safetensors"]
    assert sorted(os.listdir(out)) == files and not [p for p in os.listdir(run / "export") if p != "step2"]
    source = run / "store" / "adapters" / "v000003"
    assert (out / "adapter_model.safetensors").read_bytes() == (source / "adapter_model.safetensors").read_bytes()
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(tiny_text.resolve()) and config["inference_mode"] is True
    assert calls == [("create_repo", "me/tiny-grpo", {"repo_type": "model", "private": True, "exist_ok": True}),
                     ("upload_folder", files, {"folder_path": str(out), "repo_id": "me/tiny-grpo", "repo_type": "model",
                                               "commit_message": "grpo export: step2"})]

    card = (out / "README.md").read_text()
    assert "base_model:" not in card  # a local folder is no Hub id for the card's metadata
    assert "| test (4 seeds) | 12.5% | not measured |" in card  # step 2 is not the end: only what step 2 measured
    assert "| validation (8 seeds) | 25.0% | 37.5% |" in card and "went on to step 3" in card
    assert f"--enable-lora --max-lora-rank 8 --lora-modules run={out.resolve()}" in card
    assert (run / "config.yaml").read_text().strip() in card

    # The merged model computes what base + adapter computes.
    ids = torch.tensor([[3, 14, 15, 92, 65, 35]])
    with torch.no_grad():
        want = PeftModel.from_pretrained(load_model(tiny_text), out)(ids).logits
        got = load_model(merged)(ids).logits
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    assert (merged / "tokenizer_config.json").is_file()

    # Nothing is overwritten; a corrupt version is refused with one that verifies.
    assert main(["export", str(run), "--step", "2"]) == 2
    assert "exists: remove it" in capsys.readouterr().err
    from grpo.driver.fault import flip_byte

    flip_byte(run / "store" / "adapters" / "v000004" / "adapter_model.safetensors")
    assert main(["export", str(run), "--out", str(tmp_path / "x")]) == 2
    assert "do not match the sha256" in capsys.readouterr().err and not (tmp_path / "x").exists()


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _scored(model, processor, seqs: list[tuple[list[int], list[int]]]) -> list[list[float]]:
    """Transformers' logprobs of each reply's tokens after its prompt, the trainer's way (the policy vLLM
    samples: vision markers excluded)."""
    from grpo.learner import forward

    expanded = [forward.expand(processor, p + r, [], [torch.tensor([0] * len(p) + [1] * len(r))]) for p, r in seqs]
    batch = forward.collate(processor, expanded, forward.tokenizer_of(processor).pad_token_id)
    with torch.no_grad():
        lp = forward.token_logprobs(model, batch, mask=batch.per_token[0])
    return [lp[i][batch.per_token[0][i].bool()].tolist() for i in range(len(seqs))]


def _served(engine_config, prompts: list[list[int]], max_tokens: int, adapter: Path | None = None) -> list:
    """vLLM's greedy replies and their logprobs, from an engine started for this and freed after."""
    import gc

    from rollout.engine import Engine, Request, Sampling

    engine = Engine(engine_config)
    if adapter is not None:
        engine.load_adapter(1, adapter)
    gens = engine.generate([Request(p) for p in prompts], Sampling.greedy(max_tokens))
    del engine
    gc.collect()
    return gens


@pytest.mark.slow
def test_a_run_from_a_hub_id_trains_evaluates_and_exports_what_it_evaluated(tmp_path, tiny_text, monkeypatch,
                                                                           capsys):
    import huggingface_hub

    from grpo.config import RunConfig
    from grpo.learner.forward import load_model, load_processor, tokenizer_of
    from rollout.engine import EngineConfig
    from rollout.worker import RolloutWorker, Task

    hf = tmp_path / "hf"
    snapshot = hub_cache(hf, REPO, tiny_text)
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"Count on from {i}."}) + "\n" for i in range(24)))
    config = tmp_path / "run.yaml"
    config.write_text(json.dumps({
        "output_dir": str(tmp_path / "run"), "tasks_per_step": 2, "algorithm": {"group_size": 4},
        "env": {"name": "dataset", "options": {"data": str(rows), "rewards": {"digit": "test_export:digit"}}},
        "rollout": {"max_tokens_per_turn": 8}, "engine": {"max_model_len": 256},
        "eval": {"seeds": "0-7", "test_seeds": "8-11"}, "cluster": {"train_ranks": 1},
        "metrics": {"tensorboard": False, "plots": False}}))
    run, out, merged = tmp_path / "run", tmp_path / "adapter", tmp_path / "merged"
    # HF_HOME, as the user sets it: this process imported huggingface_hub long ago, so its cache folder (which
    # HF_HOME sets at import) is set too; tests/test_hub_model.py runs a fresh `grpo train` on HF_HOME alone.
    monkeypatch.setenv("HF_HOME", str(hf))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hf / "hub"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]))
    capsys.readouterr()
    # The user's commands, offline (HF_HUB_OFFLINE=1, as make test sets it).
    assert main(["train", str(config), "--model", REPO, "--steps", "1"]) == 0
    assert main(["eval", str(run)]) == 0
    assert main(["export", str(run), "--out", str(out), "--merged", str(merged)]) == 0
    printed = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]

    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 1 and summary["model"] == REPO and RunConfig.from_yaml(run / "config.yaml").model == REPO
    published = run / "store" / "adapters" / f"v{summary['adapter_version']:06d}"
    # The train rank loaded the snapshot folder the driver resolved.
    assert json.loads((published / "adapter_config.json").read_text())["base_model_name_or_path"] == str(snapshot)
    scored = next(p for p in printed if "success_rate" in p)  # grpo eval's last line
    assert scored["success_rate"] == summary["eval_after"] and Path(scored["adapter"]) == published
    evaluated = {e["seed"]: e["turns"][0]["reply"] for e in _lines(Path(scored["episodes_file"]))}
    exported = printed[-1]
    assert exported["adapter"] == str(out) and exported["base_model"] == REPO and exported["step"] == 1
    assert json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"] == REPO
    card = (out / "README.md").read_text()
    assert f"base_model: {REPO}" in card and f"vllm serve {REPO} --enable-lora --max-lora-rank 32" in card
    assert f"| test (4 seeds) | {summary['test_before']:.1%} | {summary['test_after']:.1%} |" in card

    # The run's last eval once more, as grpo eval ran it (its engine, the published adapter served as the run
    # served it): its replies are the recorded ones, and its tokens and logprobs the reference.
    cfg = dataclasses.replace(RunConfig.from_yaml(run / "config.yaml"), model=str(snapshot))
    worker = RolloutWorker(cfg.engine_config())
    try:
        worker.engine.load_adapter(summary["adapter_version"], published)
        trajs, _ = worker.rollout([Task(cfg.env.name, s, cfg.env.options) for s in cfg.eval_seeds], 1, cfg.rollout,
                                  greedy=True)
        tokenizer = tokenizer_of(worker.processor)
    finally:
        worker.shutdown()
    seqs = []
    for t in trajs:
        (start, end), = t.turn_spans()[0]
        ids = t.segments[0].token_ids
        seqs.append((ids[:start], ids[start:end], t.segments[0].sampler_logprobs[start:end]))
        assert tokenizer.decode(ids[start:end], skip_special_tokens=False) == evaluated[t.seed]
    prompts, replies, reference = [s[0] for s in seqs], [s[1] for s in seqs], [s[2] for s in seqs]

    def gap(got: list[list[float]]) -> float:
        return max(abs(a - b) for g, r in zip(got, reference) for a, b in zip(g, r, strict=True))

    gaps = {}
    # vLLM: the exported folder as a LoRA request, max_lora_rank set; the merged folder as a plain model.
    rank = tool.serving_rank(cfg.lora.rank)
    for name, engine, adapter in (
            ("vllm lora", EngineConfig(model=str(snapshot), max_lora_rank=rank, merge_adapter=False,
                                       max_model_len=256), out),
            ("vllm merged", EngineConfig(model=str(merged), enable_lora=False, max_model_len=256), None)):
        gens = _served(engine, prompts, cfg.rollout.max_tokens_per_turn, adapter)
        assert [g.token_ids for g in gens] == replies, name
        gaps[name] = gap([g.logprobs for g in gens])
    # transformers + peft on the exported folder; transformers on the merged folder.
    from peft import PeftModel

    processor = load_processor(snapshot)
    gaps["peft"] = gap(_scored(PeftModel.from_pretrained(load_model(snapshot), out), processor,
                               list(zip(prompts, replies))))
    gaps["transformers merged"] = gap(_scored(load_model(merged), load_processor(merged), list(zip(prompts, replies))))
    print({k: f"{v:.1e}" for k, v in gaps.items()})
    assert max(gaps.values()) <= TOLERANCE, gaps

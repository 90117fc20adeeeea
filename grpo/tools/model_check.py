"""The support matrix of one model folder: does GRPO train exactly what vLLM samples, for this model?

`check_model` rolls out a 3-turn conversation through the model's own chat template as the rollout builds
it (rollout.conversation.ChatFormat), with vLLM serving a random LoRA adapter merged into the weights and,
in a second engine, as a LoRA request, and checks:

- parity: vLLM's logprobs of the sampled tokens equal transformers + peft's (grpo.learner.forward)
- merged_lora: both serving modes match the trainer, for every version below
- hotload: a second published version, hot-loaded, is what vLLM serves (matches v2, differs from v1)
- grpo_step: one TrainWorker step on the v2 trajectory changes the adapter and publishes v3
- published: v3 loads in peft.PeftModel and in vLLM (LoRA request) and the two agree
- chat_ids: each turn's context sent to vLLM is the trajectory's prefix the trainer scores, and vLLM ran
  exactly that many tokens

and reports whether re-rendering the whole conversation with the template gives the same ids as the
turn-by-turn splice (`rerender_same`; Qwen3 drops earlier reasoning, Mistral puts a space before a reply).
docs/models.md is the table of these results for every family of grpo.tools.families:

    python -m grpo.tools.model_check --write docs/models.md [--family NAME ...]
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import re
import sys
import time
from pathlib import Path

# The largest |vLLM - trainer| logprob gap that passes, here and in `grpo doctor` (float32). Measured on the
# 2-core CPU, 2026-12-03: at most 2.4e-6 over every family (qwen2-vl; 9.5e-7 for the text families), 1.9e-6
# and 2.9e-6 in two doctor runs: a few float32 ulps of logprobs of magnitude 8-32. This is 5x the largest; a
# wrong adapter, image or position is off by 1e-2 or more.
TOLERANCE = 1.5e-5
# A real model's logits are large (SmolLM2-135M-Instruct's reach 40), so float32 rounds its logprobs in the
# 5th decimal: there the trainer alone sits up to 1.5e-5 from the same forward computed in float64, half of it
# in the output projection's log-softmax over 49,152 logits (measured 2026-12-03). The bar is then the larger
# of TOLERANCE and FLOOR_FACTOR times that floor, measured on the check's own trajectory: a gap of float32
# rounding in two implementations passes, a wrong weight, adapter or position (1e-2 and more) does not.
FLOOR_FACTOR = 3.0

SYSTEM_PROMPT = "Answer with exactly one action."
OBSERVATIONS = ["You are in a maze. Reach the red square and stop on it.", "You moved right.",
                "There is a wall to the up; you stay where you are."]
REPLIES = ["<think>\nThe target is to the right.\n</think>\n\n('move', 0)", "('move', 1)"]
MAX_TOKENS = 6
CHECKS = ("parity", "merged_lora", "hotload", "grpo_step", "published", "chat_ids")
FIXES = {
    "parity": "vLLM and transformers compute different logprobs for this architecture: check the pinned "
              "versions (`make install`) and serve it in float32 (engine.dtype: float32)",
    "merged_lora": "one serving mode disagrees with the trainer: set engine.merge_adapter to the mode that passes",
    "hotload": "a new adapter version is not what vLLM serves after a hot-load: keep new LoRA names and ids "
               "per version (rollout.hotload) and reset the prefix cache",
    "grpo_step": "the trainer could not take a step on this model: see the error above",
    "published": "the published adapter does not load in peft or vLLM alike: check lora.target_modules against "
                 "the modules vLLM supports LoRA on for this architecture",
    "chat_ids": "the ids sent to vLLM are not the ids the trainer scores: the chat template cannot be spliced "
                "turn by turn (see rollout/conversation.py)",
}


def lora_targets(model) -> tuple[str, ...]:
    """The linear layers of the language model's decoder layers, where vLLM serves LoRA (Phi-3 fuses
    qkv_proj and gate_up_proj; the Qwen and Llama families have them separate): their names, or their full
    paths where a vision tower has linear layers of the same names (Qwen2.5-VL's MLPs, CLIP's attention)."""
    import torch

    layers = {id(m) for m in model.get_decoder().layers.modules()}
    linear = [(n, id(m) in layers) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    names = {n.rsplit(".", 1)[-1] for n, inside in linear if inside}
    if any(n.rsplit(".", 1)[-1] in names for n, inside in linear if not inside):
        return tuple(n for n, inside in linear if inside)
    return tuple(sorted(names))


def _chat(processor, result: dict):
    from rollout.conversation import ChatFormat

    try:
        chat = ChatFormat(processor, SYSTEM_PROMPT)
        chat.observation_ids(_observation(processor, 1), [])
        return chat
    except ValueError as e:
        result["problems"].append(f"a system prompt: {e} (runs without one work)")
        return ChatFormat(processor, None)


def _observation(processor, turn: int):
    from envs import make
    from envs.base import Observation
    from rollout.models import image_token_id

    images = make("maze").reset(seed=turn).images[:1] if image_token_id(processor) is not None else []
    return Observation(text=OBSERVATIONS[turn], images=list(images))


def _rollout(engine, chat) -> dict:
    """A 3-turn trajectory as the rollout builds it: prompt ids, sampled ids, the next observation's ids."""
    from rollout.engine import Request, Sampling

    first = _observation(chat.processor, 0)
    ids, mask, lps, images = chat.prompt_ids(first), [], [], list(first.images)
    mask, lps = [0] * len(ids), [0.0] * len(ids)
    contexts = []
    for turn in range(len(OBSERVATIONS)):
        gen = engine.generate([Request(list(ids), list(images))], Sampling(1.0, 1.0, MAX_TOKENS))[0]
        contexts.append((list(ids), gen.expanded_prompt_len, list(images)))
        ids, mask, lps = ids + gen.token_ids, mask + [1] * len(gen.token_ids), lps + list(gen.logprobs)
        if turn + 1 < len(OBSERVATIONS):
            obs = _observation(chat.processor, turn + 1)
            suffix = chat.observation_ids(obs, gen.token_ids)
            ids, mask, lps = ids + suffix, mask + [0] * len(suffix), lps + [0.0] * len(suffix)
            images += list(obs.images)
    return {"ids": ids, "mask": mask, "lps": lps, "images": images, "contexts": contexts}


def _gap(scorer, adapter: str, processor, traj: dict) -> float:
    """max |vLLM - transformers + peft| over the sampled tokens, with peft's adapter `adapter` active."""
    lp, vllm = _scored(scorer, adapter, processor, traj)
    return float((lp - vllm).abs().max())


def _scored(scorer, adapter: str, processor, traj: dict, exact: bool = False):
    """The sampled tokens' logprobs as the trainer scores them and as vLLM reported them, float64.
    exact: `scorer` is a float64 model, and its logits' log-softmax is taken in float64 too (the trainer's own
    path rounds logits to float32 first)."""
    import torch

    from grpo.learner import forward

    scorer.set_adapter(adapter)
    seq = forward.expand(processor, traj["ids"], traj["images"],
                         [torch.tensor(traj["mask"]), torch.tensor(traj["lps"], dtype=torch.float64)])
    batch = forward.collate(processor, [seq], forward.tokenizer_of(processor).pad_token_id)
    keep = batch.per_token[0].bool()
    with torch.no_grad():
        if exact:
            lp = exact_logprobs(scorer, batch, keep)
        else:
            lp = forward.token_logprobs(scorer, batch, mask=batch.per_token[0])[keep]
    return lp.double(), batch.per_token[1][keep]


def exact_logprobs(model64, batch, keep):
    """The logprobs of the tokens at `keep` (a [B, T] bool mask, never position 0) under `model64`, a float64 model,
    with the log-softmax in float64 too: the exact arithmetic that float32's floor is measured against."""
    from grpo.learner import forward

    kwargs = {k: v.double() if v.is_floating_point() else v for k, v in batch.model_kwargs().items()}
    logits = model64(**kwargs, use_cache=False).logits[:, :-1][keep[:, 1:]]
    return forward.target_logprobs(logits, batch.input_ids[:, 1:][keep[:, 1:]], batch.banned_ids)


def parity_bar(float32_floor: float) -> float:
    """The largest |vLLM - trainer| logprob gap that passes, given the trainer's measured float32 floor."""
    return max(TOLERANCE, FLOOR_FACTOR * float32_floor)


def float32_floor(exact_model, adapter: str, processor, traj: dict, scored) -> dict:
    """How far float32 itself puts the trainer from exact arithmetic on this trajectory: its logprobs
    (`scored`, from _scored) against `exact_model` (the same model and adapters in float64); and vLLM's."""
    exact, vllm = _scored(exact_model, adapter, processor, traj, exact=True)
    return {"trainer_vs_float64": float((scored[0] - exact).abs().max()),
            "vllm_vs_float64": float((vllm - exact).abs().max())}


def _ids_match(traj: dict, processor) -> bool:
    """Each turn's context is a prefix of the trajectory, and vLLM ran it whole (images expanded)."""
    from grpo.learner import forward

    for ids, expanded, images in traj["contexts"]:
        if traj["ids"][:len(ids)] != ids or expanded != len(forward.expand(processor, ids, images).input_ids):
            return False
    return True


def rerender_same(chat) -> bool:
    """Whether the ids spliced turn by turn equal the template's render of the whole conversation."""
    end = chat.close_ids[0] if chat.close_ids and chat.close_ids[0] in chat.eos_ids else chat.tok.eos_token_id
    messages = [{"role": "system", "content": chat.system_prompt}] if chat.system_prompt else []
    ids = chat.prompt_ids(_observation(chat.processor, 0))
    messages.append(chat._user(_observation(chat.processor, 0)))
    for turn, reply in enumerate(REPLIES, start=1):
        gen = chat._ids(reply) + [end]
        obs = _observation(chat.processor, turn)
        ids = ids + gen + chat.observation_ids(obs, gen)
        messages += [{"role": "assistant", "content": reply}, chat._user(obs)]
    return ids == chat._ids(chat._render(messages, True))


def check_model(model_dir, work_dir, log) -> dict:
    """Run the matrix on one model folder; {"checks": {name: bool}, "figures": {...}, "problems": [...]}."""
    import torch
    from peft import PeftModel

    from grpo.algo.config import AlgorithmConfig
    from grpo.learner import forward, lora
    from grpo.learner.worker import TrainWorker
    from rollout.engine import Engine, EngineConfig
    from rollout.trajectory import Segment, Trajectory
    from sync import AdapterStore

    t0 = time.perf_counter()
    work_dir = Path(work_dir)
    result = {"model": str(model_dir), "checks": dict.fromkeys(CHECKS, False), "figures": {}, "problems": []}
    checks, figures = result["checks"], result["figures"]
    stage = "load"
    try:
        processor = forward.load_processor(model_dir)
        chat = _chat(processor, result)
        figures["system_prompt"] = chat.system_prompt is not None
        stage = "chat template"
        figures["rerender_same"] = rerender_same(chat)
        stage = "adapters"
        base = forward.load_model(model_dir)
        figures["architecture"] = type(base).__name__
        settings = lora.LoraConfig(rank=8, alpha=16.0, target_modules=lora_targets(base))
        figures["lora_targets"] = list(settings.target_modules)
        store = AdapterStore(work_dir / "store", keep_last=10)
        trained = lora.apply_lora(base, settings)
        paths = {}
        for name, seed in (("v1", 1), ("v2", 2)):
            lora.randomize_adapter(trained, seed, scale=0.05)
            version = store.publish(lora.adapter_tensors(trained), lora.adapter_config(trained))
            paths[name] = (version, store.verify(version).path)
        del trained, base
        scorer = PeftModel.from_pretrained(forward.load_model(model_dir), paths["v1"][1], adapter_name="v1").eval()
        scorer.load_adapter(paths["v2"][1], adapter_name="v2")
        gaps: dict[str, dict[str, float]] = {"merged": {}, "lora": {}}
        floors: dict[str, dict[str, float]] = {}
        exact_model = None  # the float64 copy with adapter v1, loaded once for both modes' floors
        ids_ok = True
        v2_traj = None
        for mode in ("merged", "lora"):
            stage = f"vLLM ({mode})"
            t = time.perf_counter()
            engine = Engine(EngineConfig(model=str(model_dir), dtype="float32", max_model_len=512,
                                         max_lora_rank=settings.rank, merge_adapter=mode == "merged",
                                         kv_cache_memory_bytes=64 << 20, max_num_seqs=4))
            log(f"{mode} engine started in {time.perf_counter() - t:.1f} s")
            engine.load_adapter(*paths["v1"])
            traj = _rollout(engine, chat)
            scored = _scored(scorer, "v1", processor, traj)
            gaps[mode]["v1"] = float((scored[0] - scored[1]).abs().max())
            stage = f"float64 floor ({mode})"
            if exact_model is None:
                exact_model = PeftModel.from_pretrained(forward.load_model(model_dir, dtype=torch.float64),
                                                        paths["v1"][1], adapter_name="v1").eval()
            floors[mode] = float32_floor(exact_model, "v1", processor, traj, scored)
            ids_ok &= _ids_match(traj, processor)
            stage = f"hot-load ({mode})"
            engine.load_adapter(*paths["v2"])
            traj = _rollout(engine, chat)
            gaps[mode]["v2"] = _gap(scorer, "v2", processor, traj)
            gaps[mode]["v2_vs_v1"] = _gap(scorer, "v1", processor, traj)
            ids_ok &= _ids_match(traj, processor)
            if mode == "merged":
                v2_traj = traj
                stage = "GRPO step"
                worker = TrainWorker(str(model_dir), lora=settings, algorithm=AlgorithmConfig(),
                                     adapter_path=paths["v2"][1], dtype="float32",
                                     cpu_threads=torch.get_num_threads())
                before = worker.gather_adapter()
                sample = Trajectory(task_id="check", group_id=0, seed=0, segments=[Segment(
                    v2_traj["ids"], v2_traj["mask"], v2_traj["lps"], v2_traj["images"])], turn_rewards=[1.0],
                    num_turns=len(OBSERVATIONS), stop_reason="done", adapter_version=paths["v2"][0])
                metrics = worker.train_step([sample], [1.0])
                after = worker.gather_adapter()
                figures["step_change"] = max(float((after[k] - before[k]).abs().max()) for k in after)
                version = worker.publish(str(store.root))
                paths["v3"] = (version, store.verify(version).path)
                checks["grpo_step"] = figures["step_change"] > 0 and math.isfinite(metrics["loss"])
                del worker
                stage = "published adapter in peft"
                scorer.load_adapter(paths["v3"][1], adapter_name="v3")
            else:
                stage = "published adapter in vLLM"
                engine.load_adapter(*paths["v3"])
                traj = _rollout(engine, chat)
                gaps[mode]["v3"] = _gap(scorer, "v3", processor, traj)
                published_gap = gaps[mode]["v3"]
            del engine
            gc.collect()
        figures["float32_floor"] = max(f["trainer_vs_float64"] for f in floors.values())
        figures["vllm_vs_float64"] = max(f["vllm_vs_float64"] for f in floors.values())
        figures["bar"] = bar = parity_bar(figures["float32_floor"])
        figures["gap_merged"] = max(gaps["merged"]["v1"], gaps["merged"]["v2"])
        figures["gap_lora"] = max(gaps["lora"][v] for v in ("v1", "v2", "v3"))
        figures["hotload_diff_to_v1"] = min(gaps["merged"]["v2_vs_v1"], gaps["lora"]["v2_vs_v1"])
        checks["published"] = published_gap <= bar
        checks["parity"] = gaps["merged"]["v1"] <= bar and gaps["lora"]["v1"] <= bar
        checks["merged_lora"] = max(figures["gap_merged"], figures["gap_lora"]) <= bar
        checks["hotload"] = (max(gaps["merged"]["v2"], gaps["lora"]["v2"]) <= bar
                             and figures["hotload_diff_to_v1"] > 10 * bar)
        checks["chat_ids"] = ids_ok
    except Exception as e:  # a model that breaks a stage is a finding of the matrix, reported with the stage
        result["problems"].append(f"{stage}: {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}")
        log(f"FAILED at {stage}: {type(e).__name__}: {e}")
    for name, ok in checks.items():
        if not ok and not any(p.startswith(("load", "adapters")) for p in result["problems"]):
            result["problems"].append(f"{name} failed: {FIXES[name]}")
    result["seconds"] = round(time.perf_counter() - t0, 1)
    result["ok"] = all(checks.values())
    return result


# ------------------------------------------------------------------------------------------ the table
DOC = Path(__file__).resolve().parents[2] / "docs" / "models.md"
BEGIN, END = "<!-- models-table -->", "<!-- /models-table -->"
COLUMNS = ("family", "kind", "architecture", "passes", "gap merged", "gap LoRA", "re-render same",
           "what does not work", "chat template", "seconds")
TIMING = ("seconds",)
FIX = "python -m grpo.tools.model_check --write docs/models.md"


def magnitude(gap) -> str:
    """A gap's order of magnitude, the table's figure: machines differ in the last bits, not in the order."""
    if gap is None:
        return "-"
    return "0" if gap == 0 else f"1e{math.floor(math.log10(gap))}"


def row(family, result: dict) -> dict:
    f = result["figures"]
    fails = [p for p in result["problems"] if not p.startswith(tuple(f"{c} failed" for c in CHECKS))]
    failed = [c for c, ok in result["checks"].items() if not ok]
    return {"family": family.name, "kind": family.kind, "architecture": f.get("architecture", "-"),
            "passes": "all" if not failed else "no: " + ", ".join(failed),
            "gap merged": magnitude(f.get("gap_merged")), "gap LoRA": magnitude(f.get("gap_lora")),
            "re-render same": {True: "yes", False: "no"}.get(f.get("rerender_same"), "-"),
            "what does not work": _cell("; ".join(fails)), "chat template": _cell(family.notes),
            "seconds": f"{result['seconds']:.0f}"}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ") or "-"


def table(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    return "\n".join(lines + ["| " + " | ".join(r[c] for c in COLUMNS) + " |" for r in rows])


def doc_rows(text: str) -> dict[str, dict]:
    """The table's rows in a page, by family."""
    block = text[text.index(BEGIN) + len(BEGIN):text.index(END)]
    rows = {}
    for line in block.strip().splitlines()[2:]:
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip()[1:-1])]
        rows[cells[0]] = dict(zip(COLUMNS, cells))
    return rows


def write(doc: Path, rows: list[dict]) -> None:
    text = doc.read_text()
    new = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: f"{BEGIN}\n{table(rows)}\n{END}", text,
                 flags=re.S)
    doc.write_text(new)


def main(argv: list[str] | None = None) -> int:
    from grpo.tools import families
    from rollout import runtime

    ap = argparse.ArgumentParser(description="Run the support matrix on every family and write the table.")
    ap.add_argument("--family", action="append", help="only these families (default: all)")
    ap.add_argument("--work-dir", default="runs/model_check")
    ap.add_argument("--write", type=Path, help="the page whose table to rewrite, e.g. docs/models.md")
    a = ap.parse_args(argv)
    work = Path(a.work_dir).resolve()
    runtime.configure(work)
    names = a.family or list(families.FAMILIES)
    rows = doc_rows(a.write.read_text()) if a.write and a.write.is_file() and BEGIN in a.write.read_text() else {}
    for name in names:
        fam = families.FAMILIES[name]
        path = families.build(name, work / "models" / name)
        result = check_model(path, work / name, lambda m, n=name: print(f"[{n}] {m}", file=sys.stderr, flush=True))
        rows[name] = row(fam, result)
        print(json.dumps({"family": name, **result}), flush=True)
    if a.write:
        order = [n for n in families.FAMILIES if n in rows]
        write(a.write, [rows[n] for n in order])
    return 0


if __name__ == "__main__":
    sys.exit(main())

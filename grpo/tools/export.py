"""`grpo export`: a run's LoRA adapter as a folder to take home, and optionally the full model with it merged.

    grpo export runs/maze                          # RUN/export/step<N>: the adapter the run ended with
    grpo export runs/maze --step 20 --out DIR      # the adapter step 20 published, while the store keeps it
    grpo export runs/maze --merged DIR             # also the base model with the adapter merged in
    grpo export runs/maze --push-to-hub ORG/NAME   # and upload the adapter folder (your Hugging Face token)

The adapter folder is the run's published version (sync/: adapter_model.safetensors byte for byte, checked
against the sha256 the store recorded at publish) with peft's adapter_config.json naming the base model the
way the run's config did (a Hub id stays an id, so the folder works on another machine), and a README.md model
card: the base model, the run's config, its test and validation figures, and how to load it in peft and vLLM.
The merged folder is peft's `merge_and_unload` saved with the tokenizer (or processor): a plain model for any
loader, in the base checkpoint's dtype.
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

# vLLM's accepted values of max_lora_rank (vllm.config.lora.MaxLoRARanks); its default is 16.
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


@dataclass(frozen=True)
class Exported:
    adapter: Path          # the adapter folder written
    merged: Path | None    # the merged model's folder, when asked for
    step: int              # the step whose adapter it is
    version: int           # the store version it was copied from
    base: str              # the base model as the run's config names it


def serving_rank(rank: int) -> int:
    """The smallest max_lora_rank vLLM accepts that serves a rank-`rank` adapter."""
    for r in VLLM_LORA_RANKS:
        if r >= rank:
            return r
    raise ValueError(f"LoRA rank {rank} is above the largest rank vLLM serves ({VLLM_LORA_RANKS[-1]}): serve the "
                     "merged model instead (grpo export --merged DIR)")


def step_versions(run_dir: Path) -> dict[int, int]:
    """Step -> the adapter version it published, from the run's metrics.jsonl (a replayed step: its last run)."""
    from grpo.report.metrics import read_metrics

    return {int(r["step"]): int(r["adapter_version"]) for r in read_metrics(run_dir / "metrics.jsonl")
            if "event" not in r and "adapter_version" in r}


def pick(run_dir: Path, step: int | None) -> tuple[int, int]:
    """(step, store version) of the adapter to export: `step`'s, or by default the one the run ended with."""
    from sync import AdapterStore

    published = step_versions(run_dir)
    if step is None:
        summary = run_dir / "summary.json"
        if summary.is_file():
            done = json.loads(summary.read_text())
            # The adapter the run tested: with eval.select best, maybe an earlier step's than the last.
            return int((done.get("selected") or {}).get("step", done["steps"])), int(done["adapter_version"])
        if not published:
            raise FileNotFoundError(f"{run_dir} has no completed step (metrics.jsonl records none): nothing to export")
        step = max(published)
    if step not in published:
        raise ValueError(f"--step {step}: {run_dir} recorded no such step; its steps: "
                         f"{_spans(sorted(published)) or 'none'}")
    kept = {v.version for v in AdapterStore(run_dir / "store").versions()}
    if published[step] not in kept:
        still = [s for s, v in sorted(published.items()) if v in kept]
        raise ValueError(f"--step {step}: its adapter (v{published[step]:06d}) is no longer in {run_dir}/store, which "
                         f"keeps the newest versions only; steps still exportable: {_spans(still) or 'none'}")
    return step, published[step]


def export(run_dir: str | Path, step: int | None = None, out: str | Path | None = None,
           merged: str | Path | None = None) -> Exported:
    """Write the adapter folder (and with `merged`, the merged model); refuses folders that already exist."""
    from grpo.config import RunConfig
    from grpo.driver.eval import verified
    from rollout.models import resolve_model
    from sync import ADAPTER_FILE, CONFIG_FILE, AdapterStore
    from sync.atomic import temp_name
    from sync.format import sha256_file

    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise FileNotFoundError(f"{str(run_dir)!r} is not a run folder (no config.yaml): give a run's output_dir")
    cfg = RunConfig.from_yaml(run_dir / "config.yaml")
    base = resolve_model(cfg.model)  # the folder the run trained on (a Hub id: its snapshot)
    step, version = pick(run_dir, step)
    out = Path(out) if out is not None else run_dir / "export" / f"step{step}"
    for folder in (out, merged):
        if folder is not None and Path(folder).exists():
            raise FileExistsError(f"{folder} exists: remove it, or write the export elsewhere (--out, --merged)")
    source = Path(verified(str(run_dir / "store" / "adapters" / f"v{version:06d}")))
    digest = {v.version: v for v in AdapterStore(run_dir / "store").versions()}[version].sha256[ADAPTER_FILE]

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / temp_name(out.name)
    tmp.mkdir()
    try:
        shutil.copyfile(source / ADAPTER_FILE, tmp / ADAPTER_FILE)
        if sha256_file(str(tmp / ADAPTER_FILE)) != digest:  # changed between the check and the copy
            raise OSError(f"{source / ADAPTER_FILE} changed while it was copied: export again")
        config = json.loads((source / CONFIG_FILE).read_text())
        # What peft's save_pretrained writes, with the base named as the run named it, not this machine's path.
        config.update(base_model_name_or_path=base_name(cfg.model), inference_mode=True)
        (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        summary = run_dir / "summary.json"
        vision = "vision_config" in json.loads((base / "config.json").read_text())
        card = model_card(cfg, json.loads(summary.read_text()) if summary.is_file() else None, step, version,
                          digest, (run_dir / "config.yaml").read_text(), out.resolve(), vision)
        (tmp / "README.md").write_text(card)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if merged is not None:
        merge(base, out, Path(merged))
    return Exported(out, Path(merged) if merged is not None else None, step, version, cfg.model)


def base_name(model: str) -> str:
    """The base model as another machine finds it: a Hub id as it is, a local folder as its absolute path."""
    from rollout.models import is_hub_id

    return model if is_hub_id(model) and not Path(model).exists() else str(Path(model).resolve())


def merge(base: Path, adapter: Path, out: Path) -> None:
    """The base model with the adapter merged into its weights (peft's merge_and_unload), saved with its
    tokenizer or processor, in the base checkpoint's dtype; written under a temporary name, then renamed."""
    from peft import PeftModel

    from grpo.learner.forward import load_model, load_processor
    from sync.atomic import temp_name

    full = PeftModel.from_pretrained(load_model(base, dtype="auto"), adapter).merge_and_unload()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / temp_name(out.name)
    try:
        full.save_pretrained(tmp)
        load_processor(base).save_pretrained(tmp)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def push_to_hub(folder: Path, repo: str) -> str:
    """Upload the adapter folder to the Hub repository `repo` (created, private, if missing) with the user's
    token (`hf auth login` or HF_TOKEN); returns the commit's URL."""
    from huggingface_hub import HfApi

    api = HfApi()
    api.create_repo(repo, repo_type="model", private=True, exist_ok=True)
    commit = api.upload_folder(folder_path=str(folder), repo_id=repo, repo_type="model",
                               commit_message=f"grpo export: {folder.name}")
    return str(getattr(commit, "commit_url", commit))


def model_card(cfg, summary: dict | None, step: int, version: int, sha256: str, config_yaml: str,
               folder: Path, vision: bool) -> str:
    """The adapter folder's README.md: what it is, how it scored, how to load and serve it, how it was trained.
    `folder`: where the adapter is written; the serving recipe names the adapter after the run."""
    from rollout.models import is_hub_id

    base, lora = base_name(cfg.model), cfg.lora
    name = Path(cfg.output_dir).name
    # The Hub's card metadata: base_model only for a Hub id (the Hub refuses a path there).
    meta = (f"base_model: {base}\n" if is_hub_id(base) else "") + "library_name: peft\ntags: [grpo, lora]\n"
    auto = "AutoModelForImageTextToText" if vision else "AutoModelForCausalLM"
    rank = serving_rank(lora.rank)
    lines = [
        f"---\n{meta}---\n",
        f"# {name}: a GRPO LoRA adapter for {base}\n",
        f"A LoRA adapter (rank {lora.rank}, alpha {lora.alpha:g}, on {', '.join(lora.target_modules)}) trained "
        f"with GRPO (the grpo engine) on the `{cfg.env.name}` env from `{base}`: the adapter that step {step} of "
        f"the run `{cfg.output_dir}` published (its store version v{version:06d}).\n",
        "## Results\n", *_figures(cfg, summary, step, version), "",
        "## Use it\n",
        "transformers + peft:\n",
        "```python\nfrom peft import PeftModel\nfrom transformers import AutoTokenizer, " + auto,
        f'base = {auto}.from_pretrained("{base}")',
        f'model = PeftModel.from_pretrained(base, "{folder}")  # this folder, or its Hub id once pushed',
        f'tokenizer = AutoTokenizer.from_pretrained("{base}")\n```\n',
        "vLLM, as an OpenAI-compatible server (requests name the adapter as their model):\n",
        f"```\nvllm serve {base} --enable-lora --max-lora-rank {rank} --lora-modules {name}={folder}\n```\n",
        f"`--max-lora-rank` must be at least the adapter's rank ({lora.rank}): vLLM's default is 16, below "
        "grpo's default rank of 32, and it accepts 1, 8, 16, 32, 64, 128, 256, 320, 512. A model with the adapter "
        "merged in needs neither: `grpo export RUN --merged DIR`.\n",
        "## Files\n",
        f"`adapter_model.safetensors`: sha256 `{sha256}`, as the run's store recorded it at publish.\n",
        "## Training config\n",
        "The run's `config.yaml` (`grpo train` reads it as it is):\n",
        f"```yaml\n{config_yaml.rstrip()}\n```\n",
    ]
    return "\n".join(lines)


def _figures(cfg, summary: dict | None, step: int, version: int) -> list[str]:
    """The greedy success rates the run measured: before training and for this adapter, on the test seeds
    (used for nothing else) and the validation seeds."""
    if summary is None:
        return ["The run has not finished (no summary.json): no figures yet."]
    final = int(summary["adapter_version"]) == version
    at_step = (summary.get("evals") or {}).get(str(step)) if not final else None
    rows = []
    for label, seeds, before, after in (
            ("test", cfg.test_seeds, summary.get("test_before"), summary.get("test_after") if final else None),
            ("validation", cfg.eval_seeds, summary.get("eval_before"),
             summary.get("eval_after") if final else (at_step or {}).get("success_rate"))):
        if seeds and before is not None:
            rows.append(f"| {label} ({len(seeds)} seeds) | {before:.1%} | "
                        f"{'not measured' if after is None else format(after, '.1%')} |")
    if not rows:
        return ["The run measured no eval."]
    note = [] if final else [f"\nThe run went on to step {summary['steps']}: figures for this step are those it "
                             "measured at this step."]
    return ["Greedy success rate, one episode a seed:\n", "| seeds | before training | this adapter |",
            "|---|---|---|", *rows, *note]


def _spans(steps: list[int]) -> str:
    """[1, 2, 3, 7] -> "1-3, 7"."""
    out, start = [], None
    for i, s in enumerate(steps):
        start = s if start is None else start
        if i + 1 == len(steps) or steps[i + 1] != s + 1:
            out.append(str(start) if start == s else f"{start}-{s}")
            start = None
    return ", ".join(out)

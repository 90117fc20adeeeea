"""Benchmark infrastructure: the GPU script's dry run, the README table generator, the machine record, the
result files' mode and paths, vs_trl's median over repeats."""
import json
import subprocess
from pathlib import Path

import pytest

from benchmarks import _machine, table

ROOT = Path(__file__).resolve().parents[1]

# Qwen3-VL-8B's language model, by hand from the published config: per decoder layer q and o 4096 x 4096,
# k and v 4096 x 1024, gate/up/down 4096 x 12288, norms 2 x 4096 + 2 x 128; 36 layers; untied embedding
# and head 151936 x 4096 each; the final norm 4096.
LAYER = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 12288 + 2 * 4096 + 2 * 128
TEXT_PARAMS = 36 * LAYER + 2 * 151936 * 4096 + 4096
# Rank-32 LoRA: 32 x (in + out) per target, 7 targets a layer, 36 layers.
LORA_PARAMS = 36 * 32 * ((4096 + 4096) * 2 + (4096 + 1024) * 2 + (4096 + 12288) * 3)


def test_gpu_script_dry_run_checks_the_8b_shapes_without_cuda():
    done = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu.sh"), "--dry-run"], capture_output=True,
                          text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    plan = json.loads(done.stdout.strip().splitlines()[-1])
    assert plan["mode"] == "dry-run"
    assert plan["text_params"] == TEXT_PARAMS == 8_190_735_360
    assert plan["lora"]["params"] == LORA_PARAMS
    assert plan["lora"]["fp32_mib"] == round(LORA_PARAMS * 4 / 2**20, 1) == 333.0
    assert plan["lora_modules"] == 36 * 7
    assert plan["tokenizer_vocab"] == 151936
    assert plan["forward_gflop_per_token"] == round(2 * TEXT_PARAMS / 1e9, 2)
    # A 9 x 9 maze of 32 px blocks through the stand-in tokenizer and processor: one image token per block.
    assert plan["first_prompt"]["image_tokens"] == 81


def test_gpu_script_refuses_to_run_without_a_gpu(tmp_path):
    if subprocess.run(["bash", "-c", "nvidia-smi -L"], capture_output=True).returncode == 0:
        pytest.skip("this machine has a GPU")
    done = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu.sh")], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 2 and "--dry-run" in done.stderr


def _machine_block(date="2026-12-01T15:00:00Z"):
    return {"date": date, "cpu": {"model": "Xeon X", "isa": ["avx2", "avx512f", "amx_bf16"], "cores": 2},
            "gpu": None, "load_average": [3.5, 2.0, 1.0]}


def test_table_rows_from_headlines_and_ratio_fallback(tmp_path):
    (tmp_path / "sync.json").write_text(json.dumps({
        "quick": False, "ratio": 9.9,  # a headline, when there is one, decides the rows
        "headline": [{"figure": "publish + hot-load", "value": 41.24, "unit": "ms", "baseline": 20.5,
                      "baseline_name": "save_file + add_lora", "ratio": 2.0117}],
        "machine": _machine_block()}))
    (tmp_path / "vs_trl.json").write_text(json.dumps({
        "ratio_vs_trl": 1.234, "ratio_vs_trl_large": 0.4567, "quick": False, "machine": _machine_block()}))
    (tmp_path / "sync-quick.json").write_text(json.dumps({"quick": True, "ratio": 5.0, "machine": _machine_block()}))

    assert table.table(tmp_path).splitlines() == [
        *table.HEADER.splitlines(),
        "| sync | publish + hot-load | 41.2 ms | 20.5 ms (save_file + add_lora) | 2.01 | Xeon X, AMX-BF16, 2 cores, "
        "load 3.5 | 2026-12-01 |",
        "| vs_trl | ratio_vs_trl | 1.23 |  |  | Xeon X, AMX-BF16, 2 cores, load 3.5 | 2026-12-01 |",
        "| vs_trl | ratio_vs_trl_large | 0.457 |  |  | Xeon X, AMX-BF16, 2 cores, load 3.5 | 2026-12-01 |",
    ]


def test_number_format():
    assert [table.number(x) for x in (1234.6, 0.012345, 2.4e-6, 1.0, 42, 99.94)] == [
        "1235", "0.0123", "2.4e-06", "1.00", "42", "99.9"]


def test_write_readme_replaces_only_between_markers(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    (results / "update.json").write_text(json.dumps({
        "quick": False,
        "headline": [{"figure": "update tokens/s", "value": 1509.4, "unit": "tokens/s", "baseline": 1382.0,
                      "ratio": 1.092}], "machine": _machine_block()}))
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\nbefore\n{table.BEGIN}\nold table\n{table.END}\nafter\n")
    args = ["--results", str(results), "--readme", str(readme)]
    assert table.main(args + ["--check"]) == 1
    assert table.main(args + ["--write-readme"]) == 0
    assert readme.read_text() == (
        f"# x\n\nbefore\n{table.BEGIN}\n{table.HEADER}\n| update | update tokens/s | 1509 tokens/s | 1382 tokens/s | "
        f"1.09 | Xeon X, AMX-BF16, 2 cores, load 3.5 | 2026-12-01 |\n{table.END}\nafter\n")
    assert table.main(args + ["--check"]) == 0
    readme.write_text("no markers\n")
    with pytest.raises(SystemExit, match="markers"):
        table.main(args + ["--write-readme"])


def test_machine_record(tmp_path):
    cpuinfo = ("processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Test\n"
               "flags\t\t: fpu sse avx2 fma avx512f amx_bf16 amx_tile\n")
    cpu = _machine.cpu_info(cpuinfo)
    assert cpu["model"] == "Intel(R) Xeon(R) Test"
    assert cpu["isa"] == ["avx2", "fma", "avx512f", "amx_tile", "amx_bf16"]
    result = {"benchmark": "x", "quick": False}
    path = _machine.write_result("x", result, machine=_machine_block(), results_dir=tmp_path)
    assert json.loads(path.read_text()) == {"benchmark": "x", "quick": False, "machine": _machine_block()} == result
    info = _machine.machine_info(peak=False)
    assert {"date", "cpu", "gpu", "packages", "load_average"} <= info.keys() and "torch" in info["packages"]


def test_scaling_headline_and_plot(tmp_path):
    from benchmarks import scaling

    result = {"update": {"model": "m", "by_sequence_length": [
        {"tokens_per_sequence": 128, "tokens_per_s": 1000.0}, {"tokens_per_sequence": 1024, "tokens_per_s": 2500.0}]},
        "machine": _machine_block()}
    assert scaling.headline(result) == [{
        "figure": "update tokens/s at tokens per sequence 1024", "value": 2500.0, "unit": "tokens/s",
        "baseline": 1000.0, "baseline_name": "at 128", "ratio": 2.5}]
    scaling.plot(result, tmp_path / "s.png")  # the curves not measured get an empty, titled panel
    assert (tmp_path / "s.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_write_result_refuses_a_result_without_its_mode_and_names_quick_runs(tmp_path):
    with pytest.raises(ValueError, match="quick"):
        _machine.write_result("x", {"benchmark": "x"}, machine=_machine_block(), results_dir=tmp_path)
    with pytest.raises(ValueError, match="quick"):
        _machine.write_result("x", {"quick": "yes"}, machine=_machine_block(), results_dir=tmp_path)
    assert not list(tmp_path.iterdir())
    # A quick run never lands under the full name, whatever name the caller passed; a full run never under -quick.
    assert _machine.write_result("x", {"quick": True}, _machine_block(), tmp_path).name == "x-quick.json"
    assert _machine.write_result("x-quick", {"quick": True}, _machine_block(), tmp_path).name == "x-quick.json"
    assert _machine.write_result("x-quick", {"quick": False}, _machine_block(), tmp_path).name == "x.json"


def test_table_reads_full_runs_by_the_files_own_field(tmp_path):
    def write(name, **fields):
        (tmp_path / f"{name}.json").write_text(json.dumps({**fields, "machine": _machine_block()}))

    write("sync", quick=True, ratio=5.0)  # a quick run under a full name
    write("rollout", ratio=3.0)  # says nothing about its mode
    write("update", quick=False, ratio=1.5)
    assert list(table.load(tmp_path)) == ["update"]
    assert [line.split(" | ")[0] for line in table.table(tmp_path).splitlines()[2:]] == ["| update"]
    assert "sync" not in table.headline(tmp_path) and "update" in table.headline(tmp_path)


def test_result_paths_are_relative_to_the_repository(tmp_path):
    root = _machine.ROOT
    result = {"quick": False, "model": str(root / "runs" / "m"), "runs": [{"dir": str(root / "runs" / "a")}],
              "other": "/elsewhere/model", "sibling": f"{root}-copy/x", "n": 3}
    path = _machine.write_result("paths", result, machine=_machine_block(), results_dir=tmp_path)
    written = json.loads(path.read_text())
    assert written["model"] == "runs/m" and written["runs"] == [{"dir": "runs/a"}]
    assert written["other"] == "/elsewhere/model" and written["sibling"] == f"{root}-copy/x" and written["n"] == 3
    assert f'"{root}/' not in path.read_text()


def _vs_trl_run(engine_s, hf_s, vllm_s):
    """One repeat of one size as run_size writes it, with the ratio it computes (engine over the faster TRL side)."""
    sides = {"engine": engine_s, "trl-hf": hf_s, "trl-vllm": vllm_s}
    faster = min(("trl-hf", "trl-vllm"), key=sides.get)
    return {"model_preset": "bench", "trl_faster_side": faster, "ratio_vs_trl": round(engine_s / sides[faster], 3),
            "sides": {s: {"ready_s": 10.0, "step_s_median": v, "generate_s_median": v / 2,
                          "completion_tokens_per_s": 2048 / v} for s, v in sides.items()}}


def test_vs_trl_median_and_range_over_repeats():
    from benchmarks import vs_trl

    assert vs_trl.spread([0.5, 0.44, 1.15]) == {"median": 0.5, "runs": [0.5, 0.44, 1.15], "range": [0.44, 1.15]}
    assert vs_trl.spread([0.6, 0.4]) == {"median": 0.5, "runs": [0.6, 0.4], "range": [0.4, 0.6]}
    # Ratios: 2.0 / 4.0 = 0.5 (trl-hf faster), 1.8 / 3.0 = 0.6 (trl-vllm faster), 2.2 / 5.0 = 0.44 (trl-hf).
    size = vs_trl.summarize([_vs_trl_run(2.0, 4.0, 4.5), _vs_trl_run(1.8, 3.5, 3.0), _vs_trl_run(2.2, 5.0, 5.5)])
    assert size["ratio_vs_trl"] == 0.5 and size["ratio_vs_trl_runs"] == [0.5, 0.6, 0.44]
    assert size["ratio_vs_trl_range"] == [0.44, 0.6]
    assert size["trl_faster_sides"] == ["trl-hf", "trl-vllm", "trl-hf"]
    engine = size["sides"]["engine"]
    assert engine["step_s_median"] == 2.0 and engine["step_s_range"] == [1.8, 2.2] and engine["repeats"] == 3
    (row,) = vs_trl.headline({"bench": size})
    # The faster TRL side's step in each repeat: 4.0, 3.0, 5.0; their median 4.0.
    assert (row["value"], row["baseline"], row["ratio"], row["ratio_range"]) == (2.0, 4.0, 0.5, [0.44, 0.6])
    assert row["baseline_name"] == "trl-hf or trl-vllm"
    assert table._cells(row) == ("2.00 s", "4.00 s (trl-hf or trl-vllm)", "0.500 (0.440-0.600)")


def test_vs_trl_leaves_a_side_that_stopped_early_out_of_the_medians():
    from benchmarks import vs_trl

    stopped = _vs_trl_run(1.8, 3.5, 3.0)
    stopped["sides"]["trl-vllm"]["step_s_median"] = None  # run_size's mark of a side that did not finish
    stopped.update(trl_faster_side="trl-hf", ratio_vs_trl=round(1.8 / 3.5, 3))
    size = vs_trl.summarize([_vs_trl_run(2.0, 4.0, 4.5), stopped])
    assert size["sides"]["trl-vllm"]["repeats"] == 1 and size["sides"]["trl-vllm"]["step_s_median"] == 4.5


def _model_folder(path: Path, source: dict | None = None) -> Path:
    """A model folder as bench_model reads it: config.json and weights of known shapes (12 + 4 x 6 = 36 params)."""
    import torch
    from safetensors.torch import save_file

    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    save_file({"embed.weight": torch.zeros(3, 4), "layer.weight": torch.zeros(4, 6)}, str(path / "model.safetensors"))
    if source:
        (path / "grpo_source.json").write_text(json.dumps(source))
    return path


def test_bench_model_names_the_result_file_and_counts_the_params(tmp_path, monkeypatch):
    folder = _model_folder(tmp_path / "My Model_v2")
    model = _machine.bench_model(str(folder))
    assert (model.name, model.path, model.params) == ("my-model_v2", str(folder), 36)
    assert model.label == "My Model_v2, 0.0M params"
    assert model.record() == {"name": "my-model_v2", "label": model.label, "path": str(folder), "params": 36}
    # A registry name is the file's name; its figures say the model it was made from.
    monkeypatch.setenv("GRPO_MODELS_DIR", str(tmp_path / "models"))
    _model_folder(tmp_path / "models" / "smollm2-135m-instruct", {"source": "HuggingFaceTB/SmolLM2-135M-Instruct"})
    smol = _machine.bench_model("smollm2-135m-instruct")
    assert (smol.name, smol.label) == ("smollm2-135m-instruct", "SmolLM2-135M-Instruct, 0.0M params")
    assert _machine.result_stem("rollout", None) == "rollout"
    assert _machine.result_stem("rollout", smol) == "rollout-smollm2-135m-instruct"
    stem = _machine.result_stem("rollout", smol)
    for quick, name in ((True, f"{stem}-quick.json"), (False, f"{stem}.json")):
        assert _machine.write_result(stem, {"quick": quick}, _machine_block(), tmp_path).name == name
    with pytest.raises(FileNotFoundError, match="safetensors"):
        _machine.safetensors_params(tmp_path)


def test_real_model_rows_follow_the_bench_models_from_full_runs_only(tmp_path):
    def write(stem, quick, figure, value):
        (tmp_path / f"{stem}.json").write_text(json.dumps({
            "quick": quick, "machine": _machine_block(),
            "headline": [{"figure": figure, "value": value}, {"figure": f"{figure}, second", "value": 1}]}))

    write("rollout-smollm2-135m-instruct", False, "rollout tokens/s, SmolLM2", 81.3)
    write("rollout", False, "rollout tokens/s, tiny", 2967.0)
    write("rollout-smollm2-135m-instruct-quick", True, "quick smoke", 5.0)
    write("scaling", False, "scaling", 2.0)
    write("update-smollm2-135m-instruct", False, "update tokens/s, SmolLM2", 900.0)
    assert [line.split(" | ")[:2] for line in table.table(tmp_path).splitlines()[2:]] == [
        ["| rollout", "rollout tokens/s, tiny"], ["| rollout", "rollout tokens/s, tiny, second"],
        ["| rollout-smollm2-135m-instruct", "rollout tokens/s, SmolLM2"],
        ["| rollout-smollm2-135m-instruct", "rollout tokens/s, SmolLM2, second"],
        ["| scaling", "scaling"], ["| scaling", "scaling, second"],
        ["| update-smollm2-135m-instruct", "update tokens/s, SmolLM2"],
        ["| update-smollm2-135m-instruct", "update tokens/s, SmolLM2, second"]]
    # The README's short table: each result's first row, the real model's beside its benchmark's.
    assert table.headline(tmp_path).splitlines()[2:] == [
        "| rollout | rollout tokens/s, tiny | 2967 |  |  |",
        "| rollout-smollm2-135m-instruct | rollout tokens/s, SmolLM2 | 81.3 |  |  |",
        "| update-smollm2-135m-instruct | update tokens/s, SmolLM2 | 900 |  |  |"]


def test_rollout_on_a_text_model_runs_the_reasoning_examples_step():
    from benchmarks import rollout_speed

    full, quick = rollout_speed.reasoning(quick=False), rollout_speed.reasoning(quick=True)
    # examples/reasoning/cpu.yaml: 8 tasks a step, groups of 8, temperature 0.8, replies up to 48 tokens.
    assert (len(full.tasks), full.group, len(quick.tasks), quick.group) == (8, 8, 8, 4)
    assert (full.config.temperature, full.config.max_tokens_per_turn, full.config.max_turns) == (0.8, 48, 1)
    assert {t.env for t in full.tasks} == {"dataset"} and len({t.seed for t in full.tasks}) == 8
    assert Path(full.tasks[0].options["data"]) == ROOT / "examples" / "reasoning" / "data.jsonl"
    assert full.tasks[0].options["rewards"] == {"correct": "examples.reasoning.tasks:correct"}


def test_learning_block_gives_each_seeds_end_points_and_the_medians(tmp_path):
    def curve(points):
        return [{"wall_s": w, "test_accuracy": a} for w, a in points]

    engine = curve([(50, 0.2), (300, 0.65), (700, 0.7)])
    trl = curve([(30, 0.2), (2000, 0.64)])
    runs = [{"seed": 0, "engine": {"curve": engine, "complete": True}, "trl": {"curve": trl, "complete": True},
             "ratio": {"engine_reach_s": 300, "ratio": 0.15, "reason": None}},
            {"seed": 1, "engine": {"curve": engine[:2], "steps": [{"step": n} for n in (1, 2, 1)], "complete": False},
             "trl": {"curve": trl, "complete": True}, "failed": {"engine": "killed"}}]
    (tmp_path / "learning_vs_trl.json").write_text(json.dumps({
        "quick": False, "runs": runs, "seed_machines": {"0": {"cpu": "EPYC Y", "cores": 2, "date": "2026-12-04T18"}},
        "machine": {"cpu": {"model": "EPYC Y", "cores": 2}, "date": "2026-12-05T01"}, "seeds_finished": [0],
        "time_to_trl_final_ratio": 0.15, "time_to_trl_final_ratio_reason": None, "test_before_engine": 0.2,
        "test_after_engine": 0.7, "test_before_trl": 0.2, "test_after_trl": 0.64}))
    assert table.learning(tmp_path).splitlines()[2:] == [
        "| 0 | EPYC Y, 2 cores, 2026-12-04 | 20.0% -> 70.0% in 700 s | 20.0% -> 64.0% in 2000 s | 300 s | 0.150 |",
        "| 1 | EPYC Y, 2 cores, 2026-12-05 | did not finish (steps 1-2 done) | 20.0% -> 64.0% in 2000 s | not "
        "compared: a side did not finish |  |",
        "| median over seeds 0 |  | 20.0% -> 70.0% | 20.0% -> 64.0% |  | 0.150 |"]
    (tmp_path / "learning_vs_trl.json").unlink()
    assert "No full run" in table.learning(tmp_path)


def test_learning_headline_gives_the_medians_and_each_seeds_ratio(tmp_path):
    runs = [{"seed": 0, "ratio": {"ratio": 0.148}}, {"seed": 1, "ratio": {"ratio": None}},
            {"seed": 2, "ratio": {"ratio": 0.4}}, {"seed": 3}]
    result = {"quick": False, "runs": runs, "steps": 20, "seeds_finished": [0, 1, 2, 3], "time_to_trl_final_ratio": 0.4,
              "time_to_trl_final_ratio_reason": None, "test_before_engine": 0.195, "test_after_engine": 0.6,
              "test_before_trl": 0.195, "test_after_trl": 0.62,
              "seed_machines": {str(s): {"cpu": "EPYC Y", "cores": 2, "date": f"2026-12-0{4 + s // 2}T1"}
                                for s in range(3)}}
    (tmp_path / "learning_vs_trl.json").write_text(json.dumps(result))
    assert table.learning_headline(tmp_path) == (
        "Against TRL's `GRPOTrainer`, same model, task and settings (4 seeds): test accuracy 19.5% -> 60.0% "
        "(engine), 19.5% -> 62.0% (TRL) after 20 steps; the engine reached TRL's final accuracy in 0.400 of TRL's "
        "wall time (0.148, never, 0.400, not compared). 2-core EPYC Y, 2026-12-04, 2026-12-05.")

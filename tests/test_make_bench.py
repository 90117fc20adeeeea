"""`make bench` runs every benchmark whose full result the docs' tables read (benchmarks/table.py)."""
import re
from pathlib import Path

from benchmarks import table
from rollout import pretrained

ROOT = Path(__file__).resolve().parents[1]
# Results named otherwise than the module (and arguments) that writes them.
WRITTEN_BY = {"rollout": "rollout_speed", "sync": "adapter_sync", "generate_vs_hf-tiny": "generate_vs_hf:--preset=tiny",
              "generate_vs_hf-bench": "generate_vs_hf:--preset=bench", "learning_vs_trl": "learning_vs_trl:--resume"}


def written_by(stem: str) -> str:
    """The Makefile entry that writes result `stem`: NAME-MODEL (a real model) comes from NAME:--model=MODEL."""
    for model in pretrained.REGISTRY:
        if stem.endswith(f"-{model}"):
            name = stem.removesuffix(f"-{model}")
            return f"{WRITTEN_BY.get(name, name)}:--model={model}"
    return WRITTEN_BY.get(stem, stem)


def test_real_model_results_are_written_by_their_benchmark_with_the_model():
    assert written_by("rollout-smollm2-135m-instruct") == "rollout_speed:--model=smollm2-135m-instruct"
    assert written_by("update-smollm2-135m-instruct") == "update:--model=smollm2-135m-instruct"
    assert written_by("sync") == "adapter_sync"


def test_make_bench_runs_every_benchmark_the_tables_read():
    makefile = (ROOT / "Makefile").read_text()
    listed = re.search(r"^BENCHMARKS := (.*?)(?<!\\)\n", makefile, re.S | re.M)[1].replace("\\\n", " ").split()
    read = [written_by(name) for name in table.load()]
    assert read and sorted(set(read) - set(listed)) == []
    for entry in listed:  # and nothing that is not a benchmark
        assert (ROOT / "benchmarks" / f"{entry.split(':')[0]}.py").is_file(), entry

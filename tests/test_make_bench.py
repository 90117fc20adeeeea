"""`make bench` runs every benchmark whose full result the docs' tables read (benchmarks/table.py)."""
import re
from pathlib import Path

from benchmarks import table

ROOT = Path(__file__).resolve().parents[1]
# Results named otherwise than the module (and arguments) that writes them.
WRITTEN_BY = {"rollout": "rollout_speed", "sync": "adapter_sync", "generate_vs_hf-tiny": "generate_vs_hf:--preset=tiny",
              "generate_vs_hf-bench": "generate_vs_hf:--preset=bench"}


def test_make_bench_runs_every_benchmark_the_tables_read():
    makefile = (ROOT / "Makefile").read_text()
    listed = re.search(r"^BENCHMARKS := (.*?)(?<!\\)\n", makefile, re.S | re.M)[1].replace("\\\n", " ").split()
    read = [WRITTEN_BY.get(name, name) for name in table.load()]
    assert read and sorted(set(read) - set(listed)) == []
    for entry in listed:  # and nothing that is not a benchmark
        assert (ROOT / "benchmarks" / f"{entry.split(':')[0]}.py").is_file(), entry

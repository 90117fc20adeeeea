"""The README's grpo.Trainer example, run exactly as printed there."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def _snippet() -> str:
    text = README.read_text()
    block = re.search(r"<!-- trainer-example -->\s*```python\n(.*?)```\s*<!-- /trainer-example -->", text, re.S)
    assert block, "README.md lost its marked grpo.Trainer example"
    return block.group(1)


def test_readme_example_is_at_most_15_lines():
    assert len(_snippet().strip().splitlines()) <= 15


@pytest.mark.slow
def test_readme_example_trains_on_a_user_env(tmp_path):
    script = tmp_path / "example.py"
    script.write_text(_snippet())
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    run = tmp_path / "runs" / "guess"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 3
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [1, 2, 3]
    assert all(r["rollout"]["episodes"] == 64 for r in lines)
    assert (run / "store" / "adapters" / f"v{summary['adapter_version']:06d}" / "adapter_model.safetensors").is_file()

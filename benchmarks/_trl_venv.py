"""TRL's own virtual environment for benchmarks/vs_trl.py: TRL is a baseline, never a dependency of the engine.

The venv sees the project's site-packages through a .pth file (torch, transformers, peft, accelerate and
vLLM are shared, so the comparison runs the very same builds and no second torch is downloaded), and pip
adds TRL and the few packages it needs that the project lacks. A constraints file made from the project's
own `pip freeze` keeps pip from replacing any shared package with another version.

    python -m benchmarks._trl_venv [--venv runs/trl-venv]     # prints the venv's python
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import sysconfig
from pathlib import Path

from benchmarks._machine import ROOT

DEFAULT_VENV = ROOT / "runs" / "trl-venv"
# TRL 1.16.0 supports transformers 5.x (it asks for >= 4.56.2); its other requirements that the project
# does not install are pinned here so that every run builds the same baseline.
PACKAGES = ("trl==1.16.0", "datasets==5.2.0")
STAMP = "grpo-trl-venv.json"


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def ensure(venv: Path = DEFAULT_VENV) -> Path:
    """Make the venv once (about a minute with network access); later calls only check the stamp."""
    venv = Path(venv).resolve()
    stamp = venv / STAMP
    want = {"packages": list(PACKAGES), "shared": _site_packages()}
    if stamp.is_file() and json.loads(stamp.read_text()) == want:
        return venv_python(venv)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    py = venv_python(venv)
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    # Appended after the venv's own folder: what pip installs here wins, the project's builds fill the rest.
    (site / "grpo_shared.pth").write_text(_site_packages() + "\n")
    frozen = subprocess.run([sys.executable, "-m", "pip", "freeze", "--exclude-editable"], check=True,
                            capture_output=True, text=True).stdout
    constraints = venv / "constraints.txt"
    constraints.write_text("".join(line + "\n" for line in frozen.splitlines()
                                   if "==" in line and not line.startswith(("trl==", "datasets=="))))
    subprocess.run([str(py), "-m", "pip", "install", "--disable-pip-version-check", "--progress-bar", "off",
                    "-c", str(constraints), *PACKAGES], check=True)
    stamp.write_text(json.dumps(want))
    return py


def _site_packages() -> str:
    return sysconfig.get_paths()["purelib"]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Make the virtual environment TRL's side of vs_trl.py runs in.")
    ap.add_argument("--venv", default=str(DEFAULT_VENV))
    print(ensure(Path(ap.parse_args(argv).venv)))


if __name__ == "__main__":
    main()

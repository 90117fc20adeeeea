#!/usr/bin/env bash
# The GPU measurement, one command on a single-GPU machine with no network (under 8 minutes on an H100/H200):
# a randomly initialised model with Qwen3-VL-8B's architecture, rollout tokens/s on CUDA vLLM, the rank-32
# LoRA update's tokens/s and MFU against the bf16 matmul peak measured in the same run, vLLM sleep/wake,
# publish + hot-load of the rank-32 adapter; one JSON, benchmarks/results/gpu.json (python -m benchmarks.gpu_bench).
#
#   bash benchmarks/gpu.sh              # needs a CUDA GPU and `make install` done (the CUDA vllm)
#   bash benchmarks/gpu.sh --dry-run    # anywhere: configs and shapes only, prints the plan as JSON
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
[ -x "$PYTHON" ] || { echo "gpu.sh: $PYTHON not found: run make install first (or set PYTHON)" >&2; exit 2; }
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false RAY_AUTH_MODE=disabled OMP_WAIT_POLICY=PASSIVE
if [ "${1:-}" = "--dry-run" ]; then
    # No GPU needed, and none used even where there is one.
    CUDA_VISIBLE_DEVICES="" exec "$PYTHON" -m benchmarks.gpu_bench "$@"
fi
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu.sh: no NVIDIA GPU visible (nvidia-smi -L failed); on a CPU machine run: bash benchmarks/gpu.sh --dry-run" >&2
    exit 2
fi
nvidia-smi -L
# The 8-minute budget, enforced: each phase writes the JSON as it finishes, so a cut run keeps what it got.
exec timeout --signal=TERM --kill-after=30 "${GPU_BENCH_TIMEOUT_S:-480}" "$PYTHON" -m benchmarks.gpu_bench "$@"

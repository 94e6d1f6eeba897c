#!/usr/bin/env bash
# The GPU checks of issue 11 in one go (about 7 minutes on an H200; benchmarks/gpu_check.py says what each
# part does): the rtx3060-12gb profile under a 12 GiB allocator cap, the CUDA tests of the sync-free training
# and sampling steps and of the EMA on the CPU against one on the GPU, and the ladder's official reference
# (fp32 with TF32, fused attention, VAE in the loop) beside the strict-fp32 step and every trick, with the
# optimizer and EMA timings. Records: benchmarks/results/<gpu>-gpu-check.json and .md (commit them).
#
#   bash benchmarks/gpu_check.sh
#   GPU_CHECK_DRY_RUN=1 bash benchmarks/gpu_check.sh     # on a CPU: the same code at tiny size, records in runs/
#
# The 12 GB profile needs bitsandbytes (8-bit AdamW). A machine without internet access installs it from a
# wheel carried along (`make gpu-wheels` puts it in .gpu-wheels/, ignored by git): BNB_WHEEL, default the first
# .gpu-wheels/bitsandbytes-*.whl, installed with --no-deps (numpy and torch are there).
# Knobs: PROFILE_STEPS (20), STEPS (3 timed steps per rung), COMPILE (1; 0 is quicker), VAE, PYTHON.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PYTHON=${PYTHON:-python}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true

if ! "$PYTHON" -c "import bitsandbytes" 2>/dev/null; then
  wheel=${BNB_WHEEL:-$(ls .gpu-wheels/bitsandbytes-*.whl 2>/dev/null | head -1)}
  if [ -n "$wheel" ] && [ -f "$wheel" ]; then
    echo "installing $wheel (no dependencies, no index)"
    "$PYTHON" -m pip install --quiet --no-deps --no-index "$wheel" || echo "bitsandbytes did not install"
  else
    echo "bitsandbytes is not installed and no wheel was given: the 12 GB profile will report the error"
  fi
fi

args=()
if [ "${GPU_CHECK_DRY_RUN:-0}" = "1" ]; then args+=(--dry-run); fi
exec "$PYTHON" benchmarks/gpu_check.py "${args[@]}"

#!/usr/bin/env bash
# Issue 16 on a GPU in one go (about 6 minutes on an H200; benchmarks/gpu_speed.py says what each part does):
# the sampler (guided DDPM, bf16: today's eager setting at 16 images a batch, and 64 images a batch with the
# blocks compiled under CUDA graphs) and the training step (the official reference, today's best rung, the
# "fastest" rung: cuDNN attention and the EMA every 4 steps on top, and that at micro-batch 128), with MFU and the
# planner's predicted peak against max_memory_allocated. Records: benchmarks/results/<gpu>-speed.json and .md
# (commit them; chapter 06 prints them).
#
#   bash benchmarks/gpu_speed.sh
#   GPU_SPEED_DRY_RUN=1 bash benchmarks/gpu_speed.sh     # on a CPU: the same code at tiny size, records in runs/
#
# Knobs: RUNGS (official,all-no-ckpt,fastest; also attn-cudnn, attn-flash, ema-every-4, compile-model,
# compile-autotune), BATCHES ("32"), LARGE_BATCH (128; 0 skips), SAMPLE_SETTINGS (eager-b16,cudagraphs-b64; also
# eager-b64, compile-b64, cudagraphs-model-b64), STEPS (4 timed steps a rung), SAMPLE_STEPS (100; the table also
# scales s/image to 250 steps), RUNG_TIMEOUT (150 s a rung; compiled sampler settings get twice that), VAE, PYTHON.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PYTHON=${PYTHON:-python}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true
args=()
if [ "${GPU_SPEED_DRY_RUN:-0}" = "1" ]; then args+=(--dry-run); fi
exec "$PYTHON" benchmarks/gpu_speed.py "${args[@]}"

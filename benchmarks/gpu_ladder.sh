#!/usr/bin/env bash
# DiT-XL/2 on one GPU, measured in one go:
#   * the fast-DiT ladder (baseline fp32 + VAE in the loop, + checkpointing, + mixed precision, + latents,
#     + fused attention, + TF32, + torch.compile, all together) at batch 32 and at batch 256, each rung in a
#     fresh process, with its step time, images/s, MFU and torch.cuda.max_memory_allocated; every speed-up is
#     against the official train.py step as it runs (fp32 with TF32, fused attention, VAE in the loop), and
#     the same step in strict fp32 (TF32 off) is a row of its own;
#   * the memory planner against max_memory_allocated, for every rung and for the planner's own choice of
#     micro-batch and checkpointing for this card (global batch 256);
#   * sampling throughput (250 DDPM steps, classifier-free guidance 4.0, VAE decoder included) and the
#     optimizer/EMA timings behind the low-memory options.
# It prints one table and writes benchmarks/results/<gpu>-dit-xl2.json and .md (commit them: they are the
# GPU table of chapter 06). About 10-15 minutes on an H100; rungs that do not fit show as OOM.
#
#   bash benchmarks/gpu_ladder.sh
#   BATCHES="32" STEPS=5 COMPILE=0 bash benchmarks/gpu_ladder.sh     # quicker
#
# Knobs (environment): BATCHES ("32 256"), STEPS (3 timed steps per rung), COMPILE (1: include the
# torch.compile rungs), VAE (a VAE that loads offline, else a random-init one of the same architecture is
# timed), RUNG_TIMEOUT (seconds per rung, 600), SAMPLE_STEPS (250), OUT (benchmarks/results), PYTHON.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PYTHON=${PYTHON:-python}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true

"$PYTHON" - <<'PY'
import json, os, re, sys, time
from dataclasses import asdict, replace

import torch

from dit_core.measure import bench, memory

# GPU_LADDER_DRY_RUN=1 runs the same script on the CPU with a tiny latent model (to check the script itself).
dry = os.environ.get("GPU_LADDER_DRY_RUN", "0") == "1"
if not (torch.cuda.is_available() or dry):
    sys.exit("gpu_ladder.sh needs a CUDA GPU; on a CPU run e.g. `dit-bench --model DiT-S/2 --batch-size 2`")

batches = [int(b) for b in os.environ.get("BATCHES", "2" if dry else "32 256").split()]
steps = int(os.environ.get("STEPS", "3"))
compile_rungs = os.environ.get("COMPILE", "0" if dry else "1") != "0"
timeout = float(os.environ.get("RUNG_TIMEOUT", "600"))
out_dir = os.environ.get("OUT", "benchmarks/results")
device = "cpu" if dry else "cuda"
gpu = "dry-run-cpu" if dry else torch.cuda.get_device_name(0)
slug = re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-")
total_gib = 24.0 if dry else torch.cuda.get_device_properties(0).total_memory / memory.GIB
bf16 = dry or torch.cuda.is_bf16_supported()
start = time.time()
tiny = dict(depth=2, hidden_size=64, num_heads=4, patch_size=2, input_size=4, in_channels=4, num_classes=1000)
model_spec = dict(model="tiny", image_size=32, shape=tiny) if dry else dict(model="DiT-XL/2", image_size=256)

def save(results, extra, final=False):
    table = bench.format_summary(results, extra)
    for a in results[0].get("activation_check", []):
        if "error" in a:
            table += (f"\nplanner vs bytes autograd saved ({a['precision']}, {a['attention']}, {a['checkpointed']} blocks "
                      f"checkpointed): {a['predicted'] / 2**20:.1f} vs {a['measured'] / 2**20:.1f} MiB/image, {a['error']:+.2%}")
    opt_lines = [f"  {o['what']:<44}" + (f"{o['ms']:>9.1f} ms" if "ms" in o else o.get("status", ""))
                 for o in results[0].get("optimizers", [])]
    table += "\noptimizer step and EMA update (the low-memory options' speed costs):\n" + "\n".join(opt_lines)
    table += f"\n(total wall time {time.time() - start:.0f} s)"
    if final:
        print(table)
    os.makedirs(out_dir, exist_ok=True)
    data = dict(gpu=gpu, gpu_memory_gib=total_gib, results=results, planner_choice=extra, table=table)
    json_path = os.path.join(out_dir, f"{slug}-dit-xl2.json")
    with open(json_path, "w") as f:
        json.dump(data, f, indent=1, default=str)
    with open(os.path.join(out_dir, f"{slug}-dit-xl2.md"), "w") as f:
        f.write(f"# DiT-XL/2 ladder on {gpu}\n\nMeasured by `benchmarks/gpu_ladder.sh` on {time.strftime('%Y-%m-%d')}.\n\n"
                f"```\n{table}\n```\n")
    if final:
        print(f"wrote {json_path} and the .md beside it")


# The planner's own choice at the official global batch 256, measured: for this card, and for smaller cards
# simulated by capping the CUDA allocator (PLAN_CARDS, GiB), each with the same plan as `dit-plan` prints.
def planner_rows(results, extra):
    cards = [total_gib] + ([] if dry else [float(c) for c in os.environ.get("PLAN_CARDS", "24 40 80").split() if float(c) < total_gib])
    for card in cards:
        print(f"== planner for a {card:.0f} GiB card", file=sys.stderr, flush=True)
        row = bench.measure_planned(bench.BenchSpec(**model_spec, steps=steps, device=device), card,
                                    precision="bf16" if bf16 else "fp16", cap=card != total_gib,
                                    max_micro_batch=8 if dry else None, timeout=timeout)
        print("\n".join(row["plan"]["explanation"]), file=sys.stderr, flush=True)
        if row["plan"]["fits"]:
            extra.append(row)
            save(results, extra)


results, extra = [], []
for i, batch in enumerate(batches):
    spec = bench.BenchSpec(**model_spec, batch_size=batch, steps=steps, warmup=1, device=device,
                           vae=os.environ.get("VAE", "stabilityai/sd-vae-ft-ema"), sampler="ddpm",
                           sample_steps=int(os.environ.get("SAMPLE_STEPS", "3" if dry else "250")), cfg_scale=4.0,
                           sample_batch=2 if dry else 16)
    rungs = bench.default_rungs(device, pixel=False, official=True, compile=compile_rungs)
    print(f"== DiT-XL/2, batch {batch}: {', '.join(rungs)}", file=sys.stderr, flush=True)
    results.append(bench.run_benchmark(spec, rungs, isolate=True, sampling=(i == 0), optimizers=(i == 0),
                                       activations=(i == 0), timeout=timeout))
    if i == 0:  # the planner's choices right after the first batch, so that a run cut short has them
        planner_rows(results, extra)
    save(results, extra)  # after each batch, so that a run cut short keeps what it measured

save(results, extra, final=True)
PY

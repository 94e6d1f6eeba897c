"""Closer to the hardware on a GPU (issue 16): the new ladder rungs and the sampler, in one run of about 6 minutes.

``bash benchmarks/gpu_speed.sh`` calls this. Two parts, each rung or sampler setting in its own process with a
time limit, the record written after each, so a run cut short keeps what it measured:

1. **the sampler** (DiT-XL/2, 256 px, 250 DDPM steps, guidance 4.0, bf16; random weights: speed does not depend
   on them): today's setting (eager, 16 images a batch: 0.54 s per image on the H200), then larger batches,
   ``torch.compile`` of the blocks, and the whole model with CUDA graphs (``mode="reduce-overhead"``). Goal:
   0.25 s per image or better.
2. **the training step** (DiT-XL/2, 256 px, bf16, latents, no checkpointing; ``dit_core.measure.bench.rungs``):
   the official reference, today's best rung (``all-no-ckpt``: blocks compiled), and the rungs of issue 16: the whole
   model compiled, cuDNN / flash attention pinned, the EMA every 4 steps, all of them together; at batch 32 and the
   fastest at a larger micro-batch. Each row carries the planner's predicted peak against
   ``torch.cuda.max_memory_allocated`` and the MFU (goal: 50 %, about 700 img/s on the H200).

    python benchmarks/gpu_speed.py                 # on a GPU machine; records in benchmarks/results/
    python benchmarks/gpu_speed.py --dry-run       # on a CPU: the same code at tiny size (records in runs/)
    python benchmarks/gpu_speed.py --parts train --rungs official,fastest --large-batch 0 --record /tmp/train.json

Knobs (environment or flags): RUNGS, BATCHES, SAMPLE_SETTINGS, STEPS, SAMPLE_STEPS, RUNG_TIMEOUT.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def child_env() -> dict:
    """The environment of a part's process: this one's, with the repository put first on ``PYTHONPATH`` and the
    caller's entries kept after it (carried wheels, e.g. bitsandbytes or diffusers installed with ``--target``)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env

#: The sampler settings, in order of importance: (key, sample_batch, compile scope, compile mode).
SAMPLE_SETTINGS = {
    "eager-b16": (16, None, None),
    "cudagraphs-b64": (64, "blocks", "reduce-overhead"),
    "eager-b64": (64, None, None),
    "compile-b64": (64, "blocks", None),
    "cudagraphs-model-b64": (64, "model", "reduce-overhead"),
}
#: Run by default (about 6 minutes in all with the sampler's first two settings); the others by SAMPLE_SETTINGS/RUNGS.
DEFAULT_SAMPLE = ["eager-b16", "cudagraphs-b64"]
TRAIN_RUNGS = ["official", "all-no-ckpt", "fastest"]


def tiny_spec(**kw):
    from dit_core.measure import bench

    tiny = dict(depth=2, hidden_size=64, num_heads=4, patch_size=2, input_size=4, in_channels=4, num_classes=1000)
    return bench.BenchSpec(model="tiny", image_size=32, shape=tiny, device="cpu", vae=None, **kw)


def sampling_child(payload: str) -> int:
    """One sampler setting in this (fresh) process; its row printed as one marked JSON line."""
    from dit_core.measure import bench
    from dit_core.measure.bench.isolate import RESULT_MARK

    data = json.loads(payload)
    try:
        row = bench.measure_sampling(bench.BenchSpec(**data))
    except Exception as err:  # noqa: BLE001 - a failed setting is a row
        row = dict(status=f"error: {type(err).__name__}: {str(err).splitlines()[0][:300]}")
    print(RESULT_MARK + json.dumps(row, default=str), flush=True)
    return 0


def run_sampling(spec, timeout: float) -> dict:
    from dit_core.measure.bench.isolate import RESULT_MARK

    cmd = [sys.executable, __file__, "--child-sampling", json.dumps(asdict(spec))]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO,
                              env=child_env())
    except subprocess.TimeoutExpired:
        return dict(status=f"timeout after {timeout:g} s")
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_MARK):
            return json.loads(line[len(RESULT_MARK):])
    return dict(status=f"error: exit {proc.returncode}: {' | '.join((proc.stderr or '').strip().splitlines()[-3:])[:300]}")


def sampling_table(rows: dict) -> str:
    """s/image as measured and scaled to 250 steps (``~``: the loop's time x 250 / steps; a step costs the same
    at every noise level)."""
    lines = [f"{'sampler setting':<22}{'batch':>6}{'steps':>6}{'s/image':>9}{'@250 steps':>11}{'x today':>9}"
             f"{'warm-up s':>11}  status"]
    base = rows.get("eager-b16", {}).get("s_per_image")
    for key, r in rows.items():
        if "s_per_image" not in r:
            lines.append(f"{key:<22}{'':>6}{'':>6}{'':>9}{'':>11}{'':>9}{'':>11}  {r.get('status')}")
            continue
        ratio = base / r["s_per_image"] if base else float("nan")
        at250 = ("~" if r["steps"] != 250 else "") + f"{r['s_per_image'] * 250 / r['steps']:.3f}"
        lines.append(f"{key:<22}{r['batch']:>6}{r['steps']:>6}{r['s_per_image']:>9.3f}{at250:>11}{ratio:>9.2f}"
                     f"{r.get('warmup_s', float('nan')):>11.1f}  ok ({r['precision']}, {r['sampler']})")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="on the CPU at tiny size (checks the script)")
    ap.add_argument("--out", default=None, help="records folder (default benchmarks/results; dry run: runs/gpu-speed-dry-run)")
    ap.add_argument("--parts", default="sampling,train")
    ap.add_argument("--rungs", default=os.environ.get("RUNGS", ",".join(TRAIN_RUNGS)))
    ap.add_argument("--batches", default=os.environ.get("BATCHES", "32"), help="micro-batches of the training rungs")
    ap.add_argument("--large-batch", type=int, default=int(os.environ.get("LARGE_BATCH", "128")),
                    help="also run the fastest rung at this micro-batch (0: skip)")
    ap.add_argument("--sample-settings", default=os.environ.get("SAMPLE_SETTINGS", ",".join(DEFAULT_SAMPLE)))
    ap.add_argument("--steps", type=int, default=int(os.environ.get("STEPS", "4")))
    ap.add_argument("--sample-steps", type=int, default=int(os.environ.get("SAMPLE_STEPS", "100")),
                    help="DDPM steps timed; the table scales s/image to 250 steps (the cost per step is constant)")
    ap.add_argument("--timeout", type=float, default=float(os.environ.get("RUNG_TIMEOUT", "150")))
    ap.add_argument("--record", default=None,
                    help="write the record to this .json file only (default: <out>/<gpu>-speed.json and .md)")
    ap.add_argument("--child-sampling", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child_sampling:
        return sampling_child(args.child_sampling)

    import torch

    from dit_core.measure import bench
    from dit_core.measure.bench.ladder import add_ratios

    dry = args.dry_run
    if not (dry or torch.cuda.is_available()):
        sys.exit("gpu_speed.py needs a CUDA GPU; --dry-run runs the same code on the CPU at tiny size")
    gpu = "dry-run-cpu" if dry else torch.cuda.get_device_name(0)
    slug = re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-")
    out = Path(args.out or ("runs/gpu-speed-dry-run" if dry else "benchmarks/results"))
    out.mkdir(parents=True, exist_ok=True)
    path = Path(args.record) if args.record else out / f"{slug}-speed.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    record = dict(gpu=gpu, time=time.strftime("%Y-%m-%d %H:%M"), dry_run=dry, torch=torch.__version__,
                  sampling={}, train=[])
    start = time.time()

    def save(final=False):
        parts = [f"# Closer to the hardware on {gpu} (issue 16)", "",
                 f"Measured by `bash benchmarks/gpu_speed.sh` on {record['time']}"
                 f"{' (DRY RUN on a CPU: tiny sizes, no figure means anything)' if dry else ''}; "
                 f"{time.time() - start:.0f} s.", ""]
        if record["sampling"]:
            parts += ["## Sampling: DDPM with guidance 4.0, bf16 (goal: 0.25 s per image at 250 steps)", "", "```",
                      sampling_table(record["sampling"]), "```", ""]
        if record["train"]:
            parts += ["## Training step rungs (goal: 50 % MFU)", "", "```",
                      bench.format_summary(record["train"]), "```", ""]
        record["table"] = "\n".join(parts)
        record["wall_s"] = round(time.time() - start, 1)
        path.write_text(json.dumps(record, indent=1, default=str))
        if not args.record:
            path.with_suffix(".md").write_text(record["table"] + "\n")
        if final:
            print(record["table"])
            print(f"wrote {path}" + ("" if args.record else f" and {path.with_suffix('.md')}"))

    parts = args.parts.split(",")
    if "sampling" in parts:
        for key in [k for k in args.sample_settings.split(",") if k]:
            if key not in SAMPLE_SETTINGS:
                sys.exit(f"unknown sampler setting {key!r}; choose from {', '.join(SAMPLE_SETTINGS)}")
            batch, scope, mode = SAMPLE_SETTINGS[key]
            kw = dict(sampler="ddpm", sample_steps=3 if dry else args.sample_steps, cfg_scale=4.0,
                      sample_batch=2 if dry else batch, sample_compile=scope,
                      sample_compile_mode=None if dry else mode, sample_decode=False, precision="bf16")
            spec = tiny_spec(**kw) if dry else bench.BenchSpec(model="DiT-XL/2", image_size=256, device="cuda", **kw)
            print(f"== sampling: {key}", flush=True)
            record["sampling"][key] = run_sampling(spec, args.timeout * (2 if scope else 1))
            save()
    if "train" in parts:
        rungs = [r for r in args.rungs.split(",") if r]
        if dry:  # no cuDNN attention on a CPU: the flash kernel stands in (PyTorch's CPU kernel)
            from dataclasses import replace

            from dit_core.measure.bench.rungs import as_rung

            rungs = [replace(r, attn_kernel="flash") if r.attn_kernel == "cudnn" else r for r in map(as_rung, rungs)]
        batches = [int(b) for b in args.batches.split()] if not dry else [2]
        for i, batch in enumerate(batches):
            spec = (tiny_spec(batch_size=batch, steps=1, warmup=1) if dry else
                    bench.BenchSpec(model="DiT-XL/2", image_size=256, batch_size=batch, steps=args.steps, warmup=1,
                                    device="cuda", vae=os.environ.get("VAE", "stabilityai/sd-vae-ft-ema")))
            print(f"== training rungs at batch {batch}: {', '.join(getattr(r, 'key', r) for r in rungs)}", flush=True)
            result = None
            for rung in rungs:  # one rung at a time, the record saved after each: a run cut short keeps its rungs
                part = bench.run_benchmark(spec, [rung], isolate=True, sampling=False, optimizers=False,
                                           activations=False, timeout=args.timeout, progress=True)
                if result is None:
                    result = part
                    record["train"].append(result)
                else:
                    result["rows"] += part["rows"]
                add_ratios(result["rows"])  # the speed-ups over the official rung, once it has run
                save()
        if args.large_batch and not dry and "fastest" in rungs:
            spec = bench.BenchSpec(model="DiT-XL/2", image_size=256, batch_size=args.large_batch, steps=args.steps,
                                   warmup=1, device="cuda", vae=None)
            print(f"== the fastest rung at batch {args.large_batch}", flush=True)
            record["train"].append(bench.run_benchmark(spec, ["fastest"], isolate=True, sampling=False,
                                                       optimizers=False, activations=False, timeout=args.timeout,
                                                       progress=True))
            save()
    save(final=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The GPU checks of issue 11 in one run (``bash benchmarks/gpu_check.sh`` calls this): about 7 minutes on an H200.

1. **the 12 GB path**: ``dit-train --config rtx3060-12gb`` (8-bit AdamW, EMA on the CPU, every block
   checkpointed) for a few steps on synthetic latents, the CUDA allocator capped below 12 GiB
   (``benchmarks/gpu_profiles.py``): does the profile fit, at what speed and peak;
2. **the CUDA tests of the hot path and the CPU EMA** (``tests/test_cuda.py``): a training step and a sampling
   step under ``torch.cuda.set_sync_debug_mode("error")``, and the EMA on the CPU (pinned staging) against an
   EMA on the GPU after the same steps;
3. **the honest baseline**: the ladder's reference rung as the official ``train.py`` runs (fp32, TF32, fused
   attention, VAE in the loop), the strict-fp32 step, and every trick but checkpointing, at batch 32 for
   DiT-XL/2, so that "x official" is measured in one run; and the optimizer/EMA timings (``dit-bench
   --optimizers``: AdamW, 8-bit AdamW, the EMA on the CPU with a blocking copy and with pinned staging).

Each part runs in its own process with a time limit, and the record is written after each part, so a run cut
short keeps what it measured: ``benchmarks/results/<gpu>-gpu-check.json`` and ``.md``.

    python benchmarks/gpu_check.py                   # on a GPU machine
    python benchmarks/gpu_check.py --dry-run         # on a CPU: the same code at tiny size (records in runs/)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def run(cmd: list[str], timeout: float) -> dict:
    """A part in its own process: its exit status, wall time and the tail of its output."""
    t0 = time.time()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO,
                              env=dict(os.environ, PYTHONPATH=str(REPO)))
        code, text = proc.returncode, (proc.stdout or "") + (proc.stderr or "")
    except subprocess.TimeoutExpired as err:
        out = err.stdout.decode(errors="replace") if isinstance(err.stdout, bytes) else (err.stdout or "")
        code, text = 124, out + f"\n(timed out after {timeout:g} s)"
    print(text[-3000:], flush=True)
    return dict(returncode=code, wall_s=round(time.time() - t0, 1), tail=text[-4000:])


def ladder_part(dry: bool, steps: int, compile_rungs: bool, timeout: float) -> dict:
    """The official rung, the strict-fp32 one and all tricks but checkpointing, plus the optimizer timings."""
    from dit_core.measure import bench

    if dry:
        tiny = dict(depth=2, hidden_size=64, num_heads=4, patch_size=2, input_size=4, in_channels=4, num_classes=1000)
        spec = bench.BenchSpec(model="tiny", image_size=32, shape=tiny, batch_size=2, steps=1, warmup=1,
                               device="cpu", vae=None)
    else:
        spec = bench.BenchSpec(model="DiT-XL/2", image_size=256, batch_size=32, steps=steps, warmup=1,
                               device="cuda", vae=os.environ.get("VAE", "stabilityai/sd-vae-ft-ema"))
    fast = "all-no-ckpt" if compile_rungs and not dry else "all-no-ckpt-eager"
    rungs = ["official", "official-fp32", fast]
    result = bench.run_benchmark(spec, rungs, isolate=True, sampling=False, optimizers=True, activations=False,
                                 timeout=timeout)
    result["table"] = bench.format_table(result)
    return result


def summary_lines(record: dict) -> list[str]:
    lines = [f"# GPU check of issue 11 on {record['gpu']}", "",
             f"Measured by `bash benchmarks/gpu_check.sh` on {record['time']} "
             f"({'DRY RUN on a CPU: tiny sizes, no figure means anything' if record['dry_run'] else 'one device call'}).",
             ""]
    prof = record.get("profile")
    if prof:
        lines += ["## 1. The 12 GB profile under its cap", "", "```", prof.get("table", prof.get("tail", "")), "```", ""]
    tests = record.get("cuda_tests")
    if tests:
        lines += ["## 2. CUDA tests: sync-free steps, the EMA on the CPU", "",
                  f"`{tests['command']}`: exit status {tests['returncode']}", "", "```",
                  "\n".join(tests["tail"].strip().splitlines()[-12:]), "```", ""]
    ladder = record.get("ladder")
    if ladder:
        lines += ["## 3. The official step (TF32 on, as train.py) and the strict-fp32 step", "", "```",
                  ladder.get("table", ladder.get("status", "")), "```", ""]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="on the CPU, tiny sizes (checks the script)")
    ap.add_argument("--out", default=None, help="records folder (default: benchmarks/results; dry run: runs/)")
    ap.add_argument("--profile-steps", type=int, default=int(os.environ.get("PROFILE_STEPS", "20")))
    ap.add_argument("--bench-steps", type=int, default=int(os.environ.get("STEPS", "3")))
    ap.add_argument("--no-compile", action="store_true", default=os.environ.get("COMPILE", "1") == "0")
    ap.add_argument("--parts", default="profile,tests,ladder")
    args = ap.parse_args()

    import torch

    dry = args.dry_run
    if not (dry or torch.cuda.is_available()):
        sys.exit("gpu_check.py needs a CUDA GPU; --dry-run runs the same code on the CPU at tiny size")
    gpu = "dry-run-cpu" if dry else torch.cuda.get_device_name(0)
    slug = re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-")
    out = Path(args.out or ("runs/gpu-check-dry-run" if dry else "benchmarks/results"))
    out.mkdir(parents=True, exist_ok=True)
    record = dict(gpu=gpu, time=time.strftime("%Y-%m-%d %H:%M"), dry_run=dry, torch=torch.__version__)
    try:
        import bitsandbytes  # noqa: F401

        record["bitsandbytes"] = bitsandbytes.__version__
    except Exception as err:  # noqa: BLE001
        record["bitsandbytes"] = f"not importable ({type(err).__name__}): the 12 GB profile needs it"
    path = out / f"{slug}-gpu-check.json"

    def save():
        path.write_text(json.dumps(record, indent=1, default=str))
        path.with_suffix(".md").write_text("\n".join(summary_lines(record)) + "\n")

    parts = args.parts.split(",")
    start = time.time()
    if "profile" in parts:
        print("== 1. the 12 GB profile under its cap", flush=True)
        json_path = out / f"{slug}-profile-rtx3060-12gb.json"
        cmd = [sys.executable, "benchmarks/gpu_profiles.py", "--profiles", "rtx3060-12gb", "--steps",
               str(2 if dry else args.profile_steps), "--out", "runs/gpu-check/profiles", "--json", str(json_path),
               "--timeout", "300"] + (["--dry-run"] if dry else [])
        result = run(cmd, timeout=420)
        if json_path.exists():
            data = json.loads(json_path.read_text())
            result.update(table=data["table"], rows=data["rows"])
        record["profile"] = dict(result, command=" ".join(cmd[1:]))
        save()
    if "tests" in parts:
        print("== 2. CUDA tests: sync-free training and sampling steps, the EMA on the CPU", flush=True)
        cmd = [sys.executable, "-m", "pytest", "tests/test_cuda.py", "-q", "-rA", "-p", "no:cacheprovider",
               "-k", "synchronisation or ema_on_the_cpu"]
        record["cuda_tests"] = dict(run(cmd, timeout=300), command="pytest " + " ".join(cmd[3:]))
        save()
    if "ladder" in parts:
        print("== 3. the official step, the strict-fp32 step, all tricks; optimizer and EMA timings", flush=True)
        try:
            record["ladder"] = ladder_part(dry, args.bench_steps, not args.no_compile, timeout=300)
        except Exception as err:  # noqa: BLE001 - the record keeps what the other parts measured
            record["ladder"] = dict(status=f"error: {type(err).__name__}: {err}")
        save()
    record["wall_s"] = round(time.time() - start, 1)
    save()
    print("\n".join(summary_lines(record)))
    print(f"wrote {path} and {path.with_suffix('.md')} ({record['wall_s']:.0f} s)")


if __name__ == "__main__":
    main()

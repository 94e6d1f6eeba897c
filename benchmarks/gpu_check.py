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
   --optimizers``: AdamW, 8-bit AdamW, the EMA on the CPU with a blocking copy and with pinned staging);
4. **the EMA update** (``--parts ema``, :func:`ema_part`): DiT-XL/2's EMA on the GPU with the decay as a Python
   number (the fused lerp) and as a device tensor (the trainer's masked update: one lerp per tensor) beside a
   fused form that reads the weight on the device (subtract, multiply by a device scalar, add); and the pinned
   memory of the EMA on the CPU: the staging's packed blocks against one pinned buffer per tensor, as the
   process's resident memory and the pinned allocator's statistics see them.

Parts 1 and 2 run in their own process with a time limit; the record is written after each part, so a run cut
short keeps what it measured: ``benchmarks/results/<gpu>-gpu-check.json`` and ``.md`` (``--record PATH.json``:
that file alone).

    python benchmarks/gpu_check.py                   # on a GPU machine
    python benchmarks/gpu_check.py --parts ema --record /tmp/ema.json
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


def child_env() -> dict:
    """The environment of a part's process: this one's, with the repository put first on ``PYTHONPATH`` and the
    caller's entries kept after it (carried wheels, e.g. bitsandbytes or diffusers installed with ``--target``)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


def run(cmd: list[str], timeout: float) -> dict:
    """A part in its own process: its exit status, wall time and the tail of its output."""
    t0 = time.time()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO,
                              env=child_env())
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


def ema_part(dry: bool, repeats: int = 10) -> dict:
    """DiT-XL/2's EMA update three ways on the GPU (ms per update, fp32 weights), and the pinned memory of an EMA
    kept on the CPU (the staging's blocks, then one pinned buffer per tensor), with the masked update through the
    staging timed. ``dry``: a tiny DiT on the CPU (checks the code; no figure means anything)."""
    import torch

    from dit_core.measure.bench.isolate import rss_bytes
    from dit_core.measure.bench.timings import timed
    from dit_core.models import DiT
    from dit_core.train.ema import HostStaging, create_ema, staging_layout, update_ema

    device = torch.device("cpu" if dry else "cuda")
    size = dict(input_size=4, hidden_size=64, depth=2, num_heads=4) if dry else dict(input_size=32, hidden_size=1152,
                                                                                      depth=28, num_heads=16)
    with torch.device(device):
        model = DiT(patch_size=2, in_channels=4, num_classes=1000, **size)
    ema = create_ema(model)
    params, ema_params = [p.detach() for p in model.parameters()], list(ema.parameters())
    decay = torch.full((), 0.9999, dtype=torch.float64, device=device)  # the trainer's masked decay lives here
    weight = (1 - decay).to(torch.float32)

    def fused_device_scalar():
        diff = torch._foreach_sub(params, ema_params)
        torch._foreach_mul_(diff, weight)  # the Tensor overload: the scalar is read on the device
        torch._foreach_add_(ema_params, diff)

    rows = [dict(what="EMA on the GPU, decay a Python number (fused foreach lerp)",
                 ms=1e3 * timed(lambda: update_ema(ema, model, 0.9999), device, repeats)),
            dict(what="EMA on the GPU, decay a device tensor (list form: one lerp per tensor)",
                 ms=1e3 * timed(lambda: update_ema(ema, model, decay), device, repeats)),
            dict(what="EMA on the GPU, device scalar: sub, mul, add (fused, a temporary copy)",
                 ms=1e3 * timed(fused_device_scalar, device, repeats))]
    layout = staging_layout(list(model.parameters()))
    pinned = {"tensors": len(params), "tensor_bytes": layout["tensor_bytes"], "layout_pinned_bytes": layout["pinned_bytes"],
              "per_tensor_bytes_computed": layout["per_tensor_bytes"]}

    def host_allocated():
        try:
            return int(torch.cuda.host_memory_stats().get("allocated_bytes.current", 0)) if not dry else None
        except Exception:  # noqa: BLE001 - older torch: the resident-memory figure stands alone
            return None

    rss0, host0 = rss_bytes(), host_allocated()
    staging = HostStaging(list(model.parameters()))
    rss1, host1 = rss_bytes(), host_allocated()
    pinned.update(staging_pinned=staging.pinned, staging_blocks=len(staging.blocks),
                  staging_rss_growth=(rss1 - rss0) if rss0 and rss1 else None,
                  staging_host_allocator=(host1 - host0) if host0 is not None and host1 is not None else None)
    ema_cpu = create_ema(model, device="cpu")
    rows.append(dict(what="EMA on the CPU, masked update through the staging (copy + lerp)",
                     ms=1e3 * timed(lambda: update_ema(ema_cpu, model, decay, staging), device, max(2, repeats // 3))))
    if not dry:  # what one pinned buffer per tensor takes, measured the same way
        rss2, host2 = rss_bytes(), host_allocated()
        per_tensor = [torch.empty(p.shape, dtype=p.dtype, pin_memory=True) for p in params]
        rss3, host3 = rss_bytes(), host_allocated()
        pinned.update(per_tensor_rss_growth=(rss3 - rss2) if rss2 and rss3 else None,
                      per_tensor_host_allocator=(host3 - host2) if host2 is not None and host3 is not None else None)
        del per_tensor
    lines = [f"  {r['what']:<76}{r['ms']:>9.2f} ms" for r in rows]
    gb = lambda v: f"{v / 1e9:.3f} GB" if isinstance(v, (int, float)) else "-"
    p = pinned
    lines += [f"  pinned staging of {p['tensors']} tensors ({gb(p['tensor_bytes'])} of weights): layout "
              f"{gb(p['layout_pinned_bytes'])} in {p['staging_blocks']} blocks, pinned={p['staging_pinned']}; "
              f"resident memory +{gb(p['staging_rss_growth'])}, pinned allocator +{gb(p['staging_host_allocator'])}",
              f"  one pinned buffer per tensor: computed {gb(p['per_tensor_bytes_computed'])}; resident memory "
              f"+{gb(p.get('per_tensor_rss_growth'))}, pinned allocator +{gb(p.get('per_tensor_host_allocator'))}"]
    return dict(model="tiny (dry run)" if dry else "DiT-XL/2", rows=rows, pinned=pinned, table="\n".join(lines))


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
    ema = record.get("ema")
    if ema:
        lines += ["## 4. The EMA update and the pinned staging", "", "```", ema.get("table", ema.get("status", "")),
                  "```", ""]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="on the CPU, tiny sizes (checks the script)")
    ap.add_argument("--out", default=None, help="records folder (default: benchmarks/results; dry run: runs/)")
    ap.add_argument("--profile-steps", type=int, default=int(os.environ.get("PROFILE_STEPS", "20")))
    ap.add_argument("--bench-steps", type=int, default=int(os.environ.get("STEPS", "3")))
    ap.add_argument("--no-compile", action="store_true", default=os.environ.get("COMPILE", "1") == "0")
    ap.add_argument("--parts", default="profile,tests,ladder,ema")
    ap.add_argument("--record", default=None,
                    help="write the record to this .json file only (default: <out>/<gpu>-gpu-check.json and .md)")
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
    path = Path(args.record) if args.record else out / f"{slug}-gpu-check.json"
    path.parent.mkdir(parents=True, exist_ok=True)

    def save():
        path.write_text(json.dumps(record, indent=1, default=str))
        if not args.record:
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
    if "ema" in parts:
        print("== 4. the EMA update on the GPU, and the pinned staging of an EMA on the CPU", flush=True)
        try:
            record["ema"] = ema_part(dry)
        except Exception as err:  # noqa: BLE001 - the record keeps what the other parts measured
            record["ema"] = dict(status=f"error: {type(err).__name__}: {err}")
        save()
    record["wall_s"] = round(time.time() - start, 1)
    save()
    print("\n".join(summary_lines(record)))
    print(f"wrote {path}" + ("" if args.record else f" and {path.with_suffix('.md')}") + f" ({record['wall_s']:.0f} s)")


if __name__ == "__main__":
    main()

"""``dit-bench``: time each trick of the fast-DiT ladder on this machine, and sampling.

    dit-bench --model DiT-S/2 --image-size 256 --batch-size 2 --steps 3
    dit-bench --model digits --batch-size 128                # the CPU profile (pixel space)
    dit-bench --model DiT-XL/2 --batch-size 32 --json out.json --optimizers
    dit-bench --rungs official,baseline,all                  # a few rungs only

Every rung runs in a fresh process (``--no-isolate`` to run them in this one), so that its peak memory is
its own. The table says which VAE was timed: the real one when ``--vae`` names weights that load offline,
otherwise a random-init AutoencoderKL of the same architecture, which costs the same.
"""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    from dit_core.measure.bench import RUNGS

    p = argparse.ArgumentParser(prog="dit-bench", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="rungs: " + ", ".join(f"{k} ({r.label})" for k, r in RUNGS.items()))
    p.add_argument("--model", default="DiT-S/2", help="DiT-S/2 ... DiT-XL/2 (latent), or a profile such as digits")
    p.add_argument("--image-size", "--image_size", type=int, default=256, help="image side in pixels (latent models)")
    p.add_argument("--batch-size", "--batch_size", type=int, default=4, help="micro-batch per forward/backward")
    p.add_argument("--grad-accum", "--grad_accum", "--gradient_accumulation_steps", type=int, default=1,
                   help="micro-batches per optimizer step (not for the official rungs)")
    p.add_argument("--steps", type=int, default=3, help="timed steps per rung (the median is reported)")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps first (compilation happens here)")
    p.add_argument("--repeats", type=int, default=1,
                   help="run the ladder this many times in alternating order and pool the steps (busy machines)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1")
    p.add_argument("--precision", default="auto", choices=("auto", "bf16", "fp16"), help="dtype of the amp rungs")
    p.add_argument("--vae", default="stabilityai/sd-vae-ft-ema",
                   help="VAE to time if it loads offline (hub id or folder); 'random' for a random-init one")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: OMP_NUM_THREADS or the usable cores)")
    p.add_argument("--rungs", default=None, help="comma-separated rungs (default: the whole ladder for this device)")
    p.add_argument("--no-official", action="store_true", help="skip the official reference steps (official, official-fp32)")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile rungs (compilation takes minutes on a CPU)")
    p.add_argument("--no-isolate", action="store_true", help="run every rung in this process")
    p.add_argument("--no-sampling", action="store_true", help="skip the sampling measurement")
    p.add_argument("--sample-steps", type=int, default=10)
    p.add_argument("--sampler", default="ddim", choices=("ddim", "ddpm"))
    p.add_argument("--cfg-scale", type=float, default=4.0)
    p.add_argument("--sample-batch", type=int, default=2)
    p.add_argument("--no-decode", action="store_true", help="sampling: skip the VAE decoder")
    p.add_argument("--optimizers", action="store_true", help="also time AdamW variants, 8-bit AdamW and the EMA update")
    p.add_argument("--no-track-tensors", action="store_true", help="CPU: skip the tensor-memory tracking step")
    p.add_argument("--no-activation-check", action="store_true",
                   help="skip the planner's check against the bytes autograd saves")
    p.add_argument("--timeout", type=float, default=None, help="seconds per rung before it is abandoned")
    p.add_argument("--card-gib", default="auto",
                   help="size the ladder (model and batch at which the reference rung fits) for a card of this many GiB; "
                        "auto: the card found; none: run the model and batch given, whatever fits")
    p.add_argument("--json", default=None, help="write the full result (every figure) to this JSON file")
    return p


def _card_gib(value: str):
    """``--card-gib``: "auto", "none" (None: no sizing) or a number of GiB."""
    if value in ("auto", "none"):
        return None if value == "none" else value
    try:
        return float(value)
    except ValueError:
        raise SystemExit(f"dit-bench: --card-gib takes auto, none or a number of GiB, got {value!r}") from None


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from dit_core.measure.bench import BenchSpec, default_rungs, format_table, resolve_spec, run_benchmark, save_result
    from dit_core.runtime import resolve_device, set_threads

    threads = set_threads(args.threads)
    for name in ("batch_size", "grad_accum", "steps", "sample_steps", "sample_batch"):
        if getattr(args, name) < 1:
            raise SystemExit(f"dit-bench: --{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    try:
        spec = resolve_spec(BenchSpec(
            model=args.model, image_size=args.image_size, batch_size=args.batch_size, grad_accum=args.grad_accum,
            steps=args.steps,
            warmup=args.warmup, device=args.device, precision=args.precision,
            vae=None if args.vae in ("random", "none", "") else args.vae, threads=threads,
            track_tensors=not args.no_track_tensors, sample_steps=args.sample_steps, sampler=args.sampler,
            cfg_scale=args.cfg_scale, sample_batch=args.sample_batch, sample_decode=not args.no_decode,
        ))
        device = resolve_device(spec.device)
        rungs = args.rungs.split(",") if args.rungs else default_rungs(
            device.type, spec.pixel, official=not args.no_official and args.grad_accum == 1,
            compile=not args.no_compile)
        result = run_benchmark(spec, rungs, isolate=not args.no_isolate, sampling=not args.no_sampling,
                               optimizers=args.optimizers, timeout=args.timeout,
                               activations=not args.no_activation_check, repeats=args.repeats,
                               card_gib=_card_gib(args.card_gib))
    except ValueError as err:
        print(f"dit-bench: {err}", file=sys.stderr)
        return 2
    print(format_table(result))
    if args.json:
        print(f"wrote {save_result(result, args.json)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

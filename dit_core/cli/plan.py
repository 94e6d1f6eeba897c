"""``dit-plan``: predict the GPU memory of DiT training and choose micro-batch, accumulation, checkpointing.

    dit-plan --model DiT-XL/2 --gpu-memory 24                    # an RTX 3090/4090
    dit-plan --model DiT-XL/2 --gpu-memory rtx3060 --low-memory  # what makes 12 GB work, and its cost
    dit-plan --model DiT-B/2 --gpu-memory 40 --global-batch 256 --precision fp32 --json plan.json

The prediction is the sum of weights, gradients, optimizer state, EMA and activations (derived from the
tensors each DiT block saves for backward; see ``dit_core.measure.memory``), with a margin for the allocator and
the CUDA context. When the setting asked for does not fit, the planner tries the EMA on the CPU, then 8-bit
AdamW, then both. It ends with the ``dit-train`` command that trains the chosen setting, in the trainer's own
keys (``--optimizer``, ``--ema-device``, ``--mixed-precision``, ...): it runs as printed.
"""

from __future__ import annotations

import argparse
import json
import sys


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dit-plan", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="DiT-XL/2", help="DiT-S/2 ... DiT-XL/2, or a profile such as digits")
    p.add_argument("--image-size", "--image_size", type=int, default=256)
    p.add_argument("--gpu-memory", "--gpu-mem", "--gpu_memory", default="24",
                   help="GiB (24, '24GB') or a card name (rtx3060, rtx3090, a100-40gb, a100-80gb, h100, ...)")
    p.add_argument("--global-batch", "--global_batch", "--global-batch-size", type=int, default=256)
    p.add_argument("--precision", "--mixed-precision", "--mixed_precision", default="bf16", choices=("bf16", "fp16", "fp32"))
    p.add_argument("--attn", "--attention", default="sdpa", choices=("sdpa", "math", "xformers"))
    p.add_argument("--optimizer", default="adamw", choices=("adamw", "adamw8bit"))
    p.add_argument("--ema", "--ema-device", "--ema_device", default="device", choices=("device", "same", "cpu", "none"),
                   help="where the EMA weights live: device (= dit-train's same), cpu, none")
    p.add_argument("--vae-in-loop", action="store_true", help="encode images every step (no pre-extracted latents)")
    p.add_argument("--margin", type=float, default=0.10, help="fraction of the card kept free for fragmentation")
    p.add_argument("--reserved-gib", type=float, default=0.75, help="GiB for the CUDA context and workspaces")
    p.add_argument("--low-memory", action="store_true", help="also compare EMA on the CPU and 8-bit AdamW")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    return p


def shape_for(model: str, image_size: int):
    from dit_core.measure.memory import ModelShape

    if model.startswith("DiT-"):
        return ModelShape.from_name(model, image_size)
    from dit_core.measure.bench import profile_shape

    kwargs, _, _ = profile_shape(model)
    return ModelShape(name=model, **kwargs)


def activation_lines(shape, attn: str) -> list[str]:
    from dit_core.measure.memory import activation_bytes

    lines = [f"activations per sample ({attn} attention):   no checkpointing   every block checkpointed"]
    for precision in ("fp32", "bf16"):
        a0 = activation_bytes(shape, precision, attn, 0).per_sample / 2**20
        a1 = activation_bytes(shape, precision, attn, shape.depth).per_sample / 2**20
        lines.append(f"  {precision:<40}{a0:>12.1f} MiB{a1:>20.1f} MiB")
    return lines


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from dit_core.measure.memory import fitting_plan, low_memory_options, train_command

    ema = "device" if args.ema == "same" else args.ema
    try:
        shape = shape_for(args.model, args.image_size)
        result, fallback = fitting_plan(shape, args.gpu_memory, args.global_batch, args.precision, args.attn,
                                        args.optimizer, ema, vae_in_loop=args.vae_in_loop, margin=args.margin,
                                        reserved_gib=args.reserved_gib)
        options = low_memory_options(shape, args.gpu_memory, args.global_batch, args.precision, args.attn) \
            if args.low_memory else None
    except ValueError as err:
        print(f"dit-plan: {err}", file=sys.stderr)
        return 2
    profile = None if args.model.startswith("DiT-") else args.model
    command = train_command(shape, result.setup, args.image_size, profile) if result.fits else None
    if args.json:
        out = dict(result.as_dict(), command=command, fallback=fallback)
        if options is not None:
            out["low_memory_options"] = options
        print(json.dumps(out, indent=1, default=str))
        return 0 if result.fits else 1
    if fallback:
        s = result.setup
        print(f"does not fit with {args.optimizer} and the EMA on the {'GPU' if ema == 'device' else ema}; it fits with "
              f"--optimizer {s.optimizer} --ema-device {'cpu' if s.ema == 'cpu' else 'same'}:\n")
    print("\n".join(result.explanation))
    if not result.fits and ema != "none":
        print("(neither does it with the EMA on the CPU, 8-bit AdamW, or both: a larger card or a smaller model)")
    print()
    print("\n".join(activation_lines(shape, args.attn)))
    if result.fits:
        print()
        print("predicted memory of the chosen setup:")
        print(result.estimate.table())
        print()
        print("other micro-batches that fit (fewest checkpointed blocks for each):")
        for c in result.candidates[:8]:
            print(f"  micro-batch {c['micro_batch']:>4} x {c['grad_accum']:>3}  checkpointed {c['checkpointed']:>3}"
                  f"  peak {c['peak_gib']:>6.2f} GiB  relative time/image {c['relative_time']:.2f}")
        print()
        if command:
            where = "" if profile else " (--latents-path: your dit-extract-latents folder)"
            print(f"train it with{where}:\n  {command}")
        else:
            print("no dit-train command: dit-train trains on pre-extracted latents and always keeps an EMA; "
                  "plan without --vae-in-loop and --ema none for one")
    if options is not None:
        print()
        gib = args.gpu_memory if not str(args.gpu_memory).replace(".", "").isdigit() else f"{args.gpu_memory} GiB"
        print(f"options for a {gib} card:")
        for o in options:
            fit = (f"fits: micro-batch {o['micro_batch']} x {o['grad_accum']}, {o['checkpointed']} blocks "
                   f"checkpointed, peak {o['peak_gib']} GiB") if o["fits"] else "does not fit"
            print(f"  {o['option']:<32} static {o['static_gib']:>6.2f} GiB  {fit}")
            print(f"  {'':<32} cost: {o['cost']}")
    return 0 if result.fits else 1


if __name__ == "__main__":
    sys.exit(main())

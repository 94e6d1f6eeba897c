"""``dit-plan``: predict the GPU memory of DiT training and choose micro-batch, accumulation, checkpointing.

    dit-plan --model DiT-XL/2 --gpu-memory 24                    # an RTX 3090/4090
    dit-plan --model DiT-XL/2 --gpu-memory rtx3060 --low-memory  # what makes 12 GB work, and its cost
    dit-plan --model DiT-B/2 --gpu-memory 40 --global-batch 256 --precision fp32 --json plan.json

The prediction is the sum of weights, gradients, optimizer state, EMA and activations (derived from the
tensors each DiT block saves for backward; see ``dit_core.measure.memory``), with a margin for the allocator and
the CUDA context.
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
    p.add_argument("--ema", default="device", choices=("device", "cpu", "none"), help="where the EMA weights live")
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
    from dit_core.measure.memory import low_memory_options, plan

    try:
        shape = shape_for(args.model, args.image_size)
        result = plan(shape, args.gpu_memory, args.global_batch, args.precision, args.attn, args.optimizer, args.ema,
                      args.vae_in_loop, args.margin, args.reserved_gib)
        options = low_memory_options(shape, args.gpu_memory, args.global_batch, args.precision, args.attn) \
            if args.low_memory else None
    except ValueError as err:
        print(f"dit-plan: {err}", file=sys.stderr)
        return 2
    if args.json:
        out = result.as_dict()
        if options is not None:
            out["low_memory_options"] = options
        print(json.dumps(out, indent=1, default=str))
        return 0 if result.fits else 1
    print("\n".join(result.explanation))
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
    if options is not None:
        print()
        print(f"options for a {args.gpu_memory} card:")
        for o in options:
            fit = (f"fits: micro-batch {o['micro_batch']} x {o['grad_accum']}, {o['checkpointed']} blocks "
                   f"checkpointed, peak {o['peak_gib']} GiB") if o["fits"] else "does not fit"
            print(f"  {o['option']:<32} static {o['static_gib']:>6.2f} GiB  {fit}")
            print(f"  {'':<32} cost: {o['cost']}")
    return 0 if result.fits else 1


if __name__ == "__main__":
    sys.exit(main())

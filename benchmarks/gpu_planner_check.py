"""The memory planner's choice for smaller cards, checked on one large GPU by capping the CUDA allocator.

For each card size (GiB) the planner picks micro-batch, accumulation and checkpointing for DiT-XL/2 at the
official global batch 256 (as ``dit-plan`` prints); the step is then measured in a fresh process whose
allocator is capped at that size (``torch.cuda.set_per_process_memory_fraction``): it must run, and its
``max_memory_allocated`` is compared with the prediction. The fp32 baseline with the VAE encoder in the loop
is also run under the smallest cap, at the largest batch at which the planner fits it there
(``--baseline-batch 0`` for that, the default): on a large card cuDNN takes a convolution workspace that grows
with the free memory, which the planner does not count; under the cap it must fall back to leaner algorithms
and fit, with its peak close to the prediction.

    python benchmarks/gpu_planner_check.py --cards 24 40 80
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from dit_core.measure import bench, memory  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cards", nargs="+", type=float, default=[24, 40, 80])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--baseline-batch", type=int, default=0,
                    help="batch of the capped fp32 baseline with the VAE in the loop: 0 = the largest the planner "
                         "fits in the smallest card, -1 = skip it")
    ap.add_argument("--json", default=None)
    ap.add_argument("--model", default="DiT-XL/2")
    ap.add_argument("--image-size", type=int, default=256)
    ap.add_argument("--device", default="cuda", help="cpu only checks this script (no cap applies there)")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_planner_check.py needs a CUDA GPU; on a CPU, `dit-plan` prints the same plans")
    base = dict(model=args.model, image_size=args.image_size, device=args.device, steps=args.steps)
    rows = [bench.measure_planned(bench.BenchSpec(**base), card, timeout=args.timeout) for card in args.cards]
    if args.baseline_batch >= 0:
        card = min(args.cards)
        spec = bench.BenchSpec(**base, batch_size=args.baseline_batch or 32, memory_limit_gib=card)
        if not args.baseline_batch:  # the planner's size for the card (tensors only: no workspace counted)
            spec = bench.rungs.plan_ladder(spec, ["baseline"], card, "cuda", min_batch=1).spec
        row = bench.measure_rung_isolated(spec, "baseline", args.timeout)
        row["label"] = f"fp32 baseline + VAE, b{spec.batch_size}, {card:g} GiB cap"
        rows.append(dict(row, card_gib=card))
    where = torch.cuda.get_device_name(0) if args.device == "cuda" else args.device
    lines = [f"{args.model}, global batch 256, on {where} with the allocator capped:",
             f"{'':<44}{'img/s':>8}{'MFU':>7}{'peak':>9}{'planned':>9}{'error':>8}  status"]
    for r in rows:
        ok = r.get("status") == "ok"
        lines.append(f"{r['label']:<44}" + (
            f"{r['images_per_s']:>8.1f}{(r.get('mfu') or 0):>7.1%}{r['peak_bytes'] / memory.GIB:>8.2f}G"
            f"{r['planned_peak_bytes'] / memory.GIB:>8.2f}G{r.get('plan_error', 0):>+8.1%}  ok" if ok
            else f"  {r.get('status')}"))
    table = "\n".join(lines)
    print("\n" + table)
    if args.json:
        Path(args.json).write_text(json.dumps(dict(gpu=where, rows=rows, table=table), indent=1, default=str))


if __name__ == "__main__":
    main()

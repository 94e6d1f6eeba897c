"""What an optimizer step costs on the CPU beside the forward and backward pass: fused AdamW against Muon.

Why it matters for the ``small-images`` profile (``optimizer: muon``, dit_core.train.muon): Muon's Newton-Schulz
products cost ~10 m^2 n multiply-adds per m x n matrix and step whatever the batch, so on a small CPU batch they
are a visible share of the step, and the time budget fits fewer steps. Prints the median milliseconds of one
optimizer step for each optimizer, and of one eager forward + backward pass of the profile's model on the batch
one process trains (16 images of 16 px in 2x2 patches), with the Newton-Schulz products in fp32 and in bf16 (the
trainer's choice when it trains in bf16: fast only on CPUs with bf16 instructions); then the Muon step of each
of 2 processes (gloo, one thread each, as ``dit-train`` runs the profile on 2 cores) that share that work out::

    python benchmarks/cpu_optimizer_step.py [--batch 16 --threads 1 --repeats 20 --processes 2]
"""

from __future__ import annotations

import argparse
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from dit_core.measure.bench.timings import timed
from dit_core.train import make_config
from dit_core.train.loop import build_model
from dit_core.train.muon import make_muon


def profile_model(seed: int = 0):
    """The small-images model for a folder of 3 classes, with the gradients of one batch of noise."""
    torch.manual_seed(seed)
    cfg = make_config("small-images")
    size, classes = cfg.image_size, 3
    return cfg, build_model(cfg, (cfg.channels, size, size), classes), size, classes


def shared_step(rank: int, world: int, init_file: str, threads: int, repeats: int, ns_dtype) -> None:
    """One of ``world`` processes timing the Muon step that shares its Newton-Schulz work out."""
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    cfg, model, size, classes = profile_model()
    x = torch.randn(16, cfg.channels, size, size)
    (model(x, torch.rand(16), torch.randint(0, classes, (16,))) ** 2).mean().backward()
    opt = make_muon(model, 1e-6, (0.9, 0.999), 0.0, distributed=True, ns_dtype=ns_dtype)
    ms = 1e3 * timed(opt.step, torch.device("cpu"), repeats)
    if rank == 0:
        print(f"optimizer step, muon shared out over {world} processes, Newton-Schulz in "
              f"{str(ns_dtype or torch.float32).replace('torch.', '')}: {ms:.1f} ms in each")
    dist.destroy_process_group()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=16, help="images per process (the profile: 32 over 2 processes)")
    ap.add_argument("--threads", type=int, default=1, help="the profile trains one thread per process")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--processes", type=int, default=2, help="processes sharing Muon's work (1: skip that line)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    cfg, model, size, classes = profile_model()  # the profile's model, for a folder of 3 classes
    cpu = torch.device("cpu")
    x, t = torch.randn(args.batch, cfg.channels, size, size), torch.rand(args.batch)
    y = torch.randint(0, classes, (args.batch,))

    def forward_backward():
        model.zero_grad(set_to_none=False)
        (model(x, t, y) ** 2).mean().backward()

    print(f"{args.threads} thread(s), torch {torch.__version__}")
    ms = 1e3 * timed(forward_backward, cpu, args.repeats)
    print(f"eager forward + backward, {args.batch} images: {ms:.1f} ms")
    forward_backward()  # gradients for the optimizers to use
    muon = make_muon(model, 1e-6, (0.9, 0.999), 0.0)
    n = len(muon.param_groups[0]["params"])
    optimizers = {"adamw (fused)": torch.optim.AdamW(model.parameters(), lr=1e-6, fused=True),
                  f"muon ({n} matrices by Muon, the rest by AdamW)": muon,
                  "muon, Newton-Schulz in bfloat16 (the trainer's choice when it trains in bf16)":
                      make_muon(model, 1e-6, (0.9, 0.999), 0.0, ns_dtype=torch.bfloat16)}
    for name, opt in optimizers.items():
        print(f"optimizer step, {name}: {1e3 * timed(opt.step, cpu, args.repeats):.1f} ms")
    if args.processes > 1:
        with tempfile.TemporaryDirectory() as tmp:
            for ns_dtype in (None, torch.bfloat16):
                mp.spawn(shared_step, args=(args.processes, f"{tmp}/init{ns_dtype}", args.threads, args.repeats,
                                            ns_dtype), nprocs=args.processes)


if __name__ == "__main__":
    main()

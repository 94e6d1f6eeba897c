"""What an optimizer step costs on the CPU beside the forward and backward pass: fused AdamW against Muon.

Why it matters for the ``small-images`` profile (``optimizer: muon``, dit_core.train.muon): Muon's Newton-Schulz
products cost ~10 m^2 n multiply-adds per m x n matrix and step whatever the batch, so on a small CPU batch they
are a visible share of the step, and the time budget fits fewer steps. Prints the median milliseconds of one eager
forward + backward pass of the profile's model on the batch one process trains (16 images of 16 px in 2x2
patches), of one optimizer step with fused AdamW and with ``optimizer: muon`` (PyTorch's Muon, whose
Newton-Schulz iteration runs in bf16, or its fp32 form that a run training in fp32 on a CPU gets), and of the
Newton-Schulz iterations alone for the profile's matrices in bf16 and in fp32::

    python benchmarks/cpu_optimizer_step.py [--batch 16 --threads 1 --repeats 20]
"""

from __future__ import annotations

import argparse

import torch

from dit_core.measure.bench.timings import timed
from dit_core.train import make_config
from dit_core.train.loop import build_model
from dit_core.train.muon import make_muon, newton_schulz, split_parameters


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=16, help="images per process (the profile: 32 over 2 processes)")
    ap.add_argument("--threads", type=int, default=1, help="the profile trains one thread per process")
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg, size, classes = make_config("small-images"), 16, 3  # the profile's model, for a folder of 3 classes
    model = build_model(cfg, (cfg.channels, size, size), classes)
    cpu = torch.device("cpu")
    x, t = torch.randn(args.batch, cfg.channels, size, size), torch.rand(args.batch)
    y = torch.randint(0, classes, (args.batch,))

    def forward_backward():
        model.zero_grad(set_to_none=False)
        (model(x, t, y) ** 2).mean().backward()

    print(f"{args.threads} thread(s), torch {torch.__version__}")
    print(f"eager forward + backward, {args.batch} images: {1e3 * timed(forward_backward, cpu, args.repeats):.1f} ms")
    forward_backward()  # gradients for the optimizers to use
    matrices = [p.grad for p in split_parameters(model)[0]]
    for name, opt in {"adamw (fused)": torch.optim.AdamW(model.parameters(), lr=1e-6, fused=True),
                      f"muon ({len(matrices)} matrices by PyTorch's Muon, the rest by AdamW)":
                          make_muon(model, 1e-6, (0.9, 0.999), 0.0),
                      "muon, Newton-Schulz in fp32 (MuonFp32: a run that trains in fp32 on a CPU)":
                          make_muon(model, 1e-6, (0.9, 0.999), 0.0, fp32=True)}.items():
        print(f"optimizer step, {name}: {1e3 * timed(opt.step, cpu, args.repeats):.1f} ms")
    from torch.optim._muon import _zeropower_via_newtonschulz as torch_newton_schulz  # PyTorch's, in bf16

    for name, fn in (("bfloat16 (PyTorch's)", lambda g: torch_newton_schulz(g, (3.4445, -4.7750, 2.0315), 5, 1e-7)),
                     ("float32 (dit_core.train.muon.newton_schulz)", newton_schulz)):
        ms = 1e3 * timed(lambda: [fn(g) for g in matrices], cpu, args.repeats)
        print(f"Newton-Schulz alone, {len(matrices)} matrices in {name}: {ms:.1f} ms")


if __name__ == "__main__":
    main()

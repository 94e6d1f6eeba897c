"""Attention on the CPU: PyTorch's fused kernel against the explicit softmax(q k^T) v, forward and backward.

Why the ``small-images`` profile sets ``attn_backend: math``: at its shapes (batch 64, 4 heads, 64 tokens, head
size 32) the fused (flash) CPU kernel's backward in bf16 was the largest single cost of a training step.
Prints the median milliseconds of one forward + backward for each kernel and precision, and the largest
difference of the outputs from the explicit fp32 result::

    python benchmarks/cpu_attention.py [--batch 64 --heads 4 --tokens 64 --head-dim 32 --threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from dit_core.attention import attention


def time_one(backend: str, dtype: torch.dtype, shape, repeats: int = 20) -> tuple[float, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(shape, generator=gen).to(dtype).requires_grad_() for _ in range(3))
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        if backend == "flash":
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                out = attention(q, k, v, "sdpa")
        else:
            out = attention(q, k, v, "math")
        out.float().sum().backward()
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times[5:]), out.detach().float()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--head-dim", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    shape = (args.batch, args.heads, args.tokens, args.head_dim)
    _, ref = time_one("math", torch.float32, shape, repeats=6)
    print(f"attention {shape}, forward + backward, {args.threads} threads, torch {torch.__version__}, "
          f"CPU capability {torch.backends.cpu.get_cpu_capability()}")
    for dtype in (torch.float32, torch.bfloat16):
        for backend in ("flash", "math"):
            ms, out = time_one(backend, dtype, shape)
            print(f"  {str(dtype).replace('torch.', ''):9s} {backend:6s} {ms:7.2f} ms   max |out - fp32 math| "
                  f"{(out - ref).abs().max().item():.1e}")


if __name__ == "__main__":
    main()

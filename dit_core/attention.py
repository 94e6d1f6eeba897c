"""Multi-head self-attention with a selectable backend.

DiT uses plain multi-head self-attention over the patch tokens (Vaswani et al. 2017; Peebles & Xie 2023,
Sec. 3.2). The arithmetic is always ``softmax(q k^T / sqrt(d)) v``; only *how* it is computed changes:

``"sdpa"`` (default)
    :func:`torch.nn.functional.scaled_dot_product_attention`, which dispatches to FlashAttention-2 or the
    memory-efficient kernel on a GPU and never stores the ``T x T`` attention matrix for backward.
``"math"``
    the explicit reference: ``q @ k^T``, softmax, ``@ v``. Slow and memory hungry, but obviously correct.
``"xformers"``
    ``xformers.ops.memory_efficient_attention`` when the xformers package is installed.

With ``"sdpa"`` PyTorch picks the kernel; :func:`set_sdpa_kernel` pins one of its kernels instead (``"flash"``:
FlashAttention-2, also PyTorch's CPU kernel; ``"cudnn"``: cuDNN's fused attention on Hopper-class GPUs;
``"efficient"``: the memory-efficient kernel), so that the benchmark ladder can time each. The arithmetic and what
is saved for backward (one log-sum-exp per head and query) are the same for all three, so the memory planner's
``"sdpa"`` estimate covers them.

The module's parameter names (``qkv``, ``proj``) match the official checkpoints.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

BACKENDS = ("sdpa", "math", "xformers")
#: The kernels of ``F.scaled_dot_product_attention`` that :func:`set_sdpa_kernel` can pin, by their SDPBackend name.
SDPA_KERNELS = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION", "efficient": "EFFICIENT_ATTENTION"}


def xformers_available() -> bool:
    """True when ``xformers.ops.memory_efficient_attention`` can be imported."""
    try:
        import xformers.ops  # noqa: F401
    except Exception:
        return False
    return True


def check_backend(name: str) -> str:
    """Validate an attention backend name; raise a ValueError that says what to do otherwise."""
    if name not in BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; choose one of {', '.join(BACKENDS)}")
    if name == "xformers" and not xformers_available():
        raise ValueError(
            "attention backend 'xformers' needs the xformers package, which is not importable here; "
            "install it with `pip install -e .[xformers]` (GPU machines) or use 'sdpa' (the default)"
        )
    return name


def check_sdpa_kernel(kernel: str | None) -> str | None:
    if kernel is not None and kernel not in SDPA_KERNELS:
        raise ValueError(f"unknown sdpa kernel {kernel!r}; choose one of {', '.join(SDPA_KERNELS)} (or None: PyTorch picks)")
    return kernel


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backend: str = "sdpa",
              kernel: str | None = None) -> torch.Tensor:
    """Scaled dot-product attention on ``(batch, heads, tokens, head_dim)`` tensors; ``kernel`` pins one of SDPA's
    kernels (:data:`SDPA_KERNELS`; ``backend="sdpa"`` only)."""
    if backend == "sdpa":
        if kernel is None:
            return F.scaled_dot_product_attention(q, k, v)
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(getattr(SDPBackend, SDPA_KERNELS[kernel])):
            return F.scaled_dot_product_attention(q, k, v)
    if backend == "math":
        scores = (q * (1.0 / math.sqrt(q.shape[-1]))) @ k.transpose(-2, -1)
        return scores.softmax(dim=-1) @ v
    if backend == "xformers":
        import xformers.ops as xops

        # xformers expects (batch, tokens, heads, head_dim)
        out = xops.memory_efficient_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return out.transpose(1, 2)
    raise ValueError(f"unknown attention backend {backend!r}; choose one of {', '.join(BACKENDS)}")


class Attention(nn.Module):
    """Multi-head self-attention: one fused ``qkv`` projection, ``heads`` parallel heads, an output ``proj``."""

    def __init__(self, dim: int, num_heads: int, backend: str = "sdpa"):
        super().__init__()
        if dim % num_heads != 0:
            raise ValueError(f"hidden size {dim} is not divisible by num_heads={num_heads}")
        self.num_heads = num_heads
        self.backend = check_backend(backend)
        self.sdpa_kernel: str | None = None  # None: PyTorch picks (set_sdpa_kernel pins one)
        self.qkv = nn.Linear(dim, 3 * dim, bias=True)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, t, d = x.shape
        qkv = self.qkv(x).reshape(n, t, 3, self.num_heads, d // self.num_heads).permute(2, 0, 3, 1, 4)
        out = attention(qkv[0], qkv[1], qkv[2], self.backend, self.sdpa_kernel)  # (n, heads, t, head_dim)
        return self.proj(out.transpose(1, 2).reshape(n, t, d))


def set_sdpa_kernel(model: nn.Module, kernel: str | None) -> nn.Module:
    """Pin SDPA's ``kernel`` ("flash", "cudnn", "efficient"; None: PyTorch picks) in every :class:`Attention` of
    ``model``. A kernel that cannot run the inputs (cuDNN or the memory-efficient kernel on a CPU, an unsupported
    head size) makes the forward pass fail with PyTorch's "No available kernel" error, which lists why."""
    check_sdpa_kernel(kernel)
    for module in model.modules():
        if isinstance(module, Attention):
            module.sdpa_kernel = kernel
    return model


def benchmark_backends(model, x, t, y, backends=None, repeats: int = 3, backward: bool = True) -> dict:
    """Time forward (+ backward) of ``model`` under each attention backend and compare outputs to "math".

    Returns ``{backend: {"ms": median milliseconds, "max_abs_diff": vs the math reference}}``. The model's
    backend is restored afterwards. Used by chapter 03; ``dit-bench`` measures the full training step.
    """
    import statistics
    import time

    backends = list(backends or [b for b in BACKENDS if b != "xformers" or xformers_available()])
    original = model.attn_backend
    outputs, results = {}, {}
    try:
        for backend in ["math"] + [b for b in backends if b != "math"]:
            model.set_attention_backend(backend)
            times = []
            for _ in range(repeats + 1):  # the first run warms up
                model.zero_grad(set_to_none=True)
                start = time.perf_counter()
                with torch.set_grad_enabled(backward):
                    out = model(x, t, y)
                    if backward:
                        out.float().pow(2).mean().backward()
                if x.device.type == "cuda":
                    torch.cuda.synchronize()
                times.append(time.perf_counter() - start)
            outputs[backend] = out.detach()
            results[backend] = {
                "ms": 1000 * statistics.median(times[1:]),
                "max_abs_diff": (out.detach() - outputs["math"]).abs().max().item(),
            }
    finally:
        model.set_attention_backend(original)
        model.zero_grad(set_to_none=True)
    return {b: results[b] for b in backends}

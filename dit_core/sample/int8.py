"""Sampling on a CPU's integer units: a copy of the DiT with its token-carrying linear layers in int8 (opt-in).

Chapter 06 measures what it buys and what it costs; ``benchmarks/cpu_vs_official.py --int8-quality`` compares its
samples with the fp32 ones of the same seeds.
"""

from __future__ import annotations

import copy
import warnings

import torch

#: The linear layers :func:`int8_copy` quantizes: the four matrix products of each block that carry the tokens.
INT8_LAYERS = ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2")


def int8_copy(model: torch.nn.Module) -> torch.nn.Module:
    """An eval-mode copy of a CPU ``model`` for sampling, with the token-carrying linear layers of every block
    (:data:`INT8_LAYERS`) in int8: PyTorch's dynamic quantization (``torch.ao.quantization.quantize_dynamic``)
    stores each weight as int8 with one scale per tensor and quantizes each activation on the fly, so the matrix
    products run on the CPU's integer units (fbgemm/x86, or qnnpack on ARM). Opt-in only: it changes the samples.
    Measured on the digits model (``benchmarks/cpu_vs_official.py --int8-quality``): see chapter 06 for the
    class accuracy and Fréchet distance against the fp32 samples of the same seeds. The adaLN, embedding and
    final layers stay fp32 (they are small, and the final layer writes the prediction itself).

    ``model`` is not changed. ``torch.ao.quantization`` is deprecated in favour of the torchao package; it still
    ships with PyTorch and needs nothing else installed.
    """
    first = next(model.parameters(), None)
    if first is not None and (first.device.type != "cpu" or first.dtype != torch.float32):
        raise ValueError(f"int8 sampling is for fp32 models on the CPU; this one is {first.dtype} on "
                         f"{first.device} (on a GPU sample in bf16/fp16 instead: amp='bf16')")
    engines = torch.backends.quantized.supported_engines
    if not any(e in engines for e in ("x86", "fbgemm", "qnnpack")):
        raise ValueError(f"this PyTorch build has no quantized engine for the CPU (supported: {engines}); "
                         "sample in fp32")
    clone = copy.deepcopy(model).eval()
    names = {name for name, m in clone.named_modules()
             if isinstance(m, torch.nn.Linear) and name.startswith("blocks.") and name.endswith(INT8_LAYERS)}
    if not names:
        raise ValueError("int8_copy found no DiT block linear layers to quantize (is this a DiT?)")
    with warnings.catch_warnings():  # the deprecation notices of torch.ao.quantization
        warnings.simplefilter("ignore")
        return torch.ao.quantization.quantize_dynamic(clone, names, dtype=torch.qint8)

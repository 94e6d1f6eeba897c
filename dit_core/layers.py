"""The small pieces every DiT block is made of: adaLN's ``modulate``, the tanh GELU and the transformer MLP.

They live apart from :mod:`dit_core.models` so that the block designs of the paper's ablation
(:mod:`dit_core.designs`) and DiT's own block share them; :mod:`dit_core.models` re-exports them.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """adaLN: ``x * (1 + scale) + shift``, one shift/scale per sample, broadcast over the tokens."""
    return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)


#: sqrt(2 / pi) doubled: ``0.5 (1 + tanh(z)) = sigmoid(2 z)``, so the tanh GELU is ``x sigmoid(2 z)``.
_TWO_SQRT_2_OVER_PI = 2.0 * math.sqrt(2.0 / math.pi)


class TanhGELU(nn.Module):
    """GELU in its tanh approximation, ``0.5 x (1 + tanh(z))`` with ``z = sqrt(2/pi) (x + 0.044715 x^3)``.

    Eager PyTorch runs ``F.gelu(x, approximate="tanh")``. Under ``torch.compile`` the same function is written
    ``x * sigmoid(2 z)`` (``0.5 (1 + tanh z) = sigmoid(2 z)``): the compiler fuses it into one pass built on
    ``exp``, several times faster than PyTorch's tanh kernel on an AVX2 CPU (``benchmarks/cpu_vs_official.py``
    times both); on a GPU both are one fused kernel. The two agree to float32 round-off (``tests/test_speed_paths.py``).
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():
            return x * torch.sigmoid(_TWO_SQRT_2_OVER_PI * (x + 0.044715 * x * x * x))
        return F.gelu(x, approximate="tanh")


class Mlp(nn.Module):
    """The transformer feed-forward layer: ``fc1 -> GELU (tanh approximation) -> fc2``."""

    def __init__(self, dim: int, hidden_dim: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden_dim)
        self.act = TanhGELU()
        self.fc2 = nn.Linear(hidden_dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))

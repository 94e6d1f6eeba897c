"""What some training objectives add to a DiT for training only: the REPA projector and the MaskDiT mask token.
A sampled model is always the plain :class:`~dit_core.models.DiT`, whose forward pass takes the kept tokens and
the block to capture as options (:meth:`dit_core.models.DiT.forward`).

* **Masked training** (MaskDiT, Zheng et al. 2024): the encoder blocks see only the kept tokens (half of them at
  ``mask_ratio`` 0.5, so the step costs about half as much); before the *decoder* blocks, a learned mask token
  (plus its position embedding) is put back at every dropped position, and the decoder sees the full grid.
  MaskDiT adds a separate, narrower decoder (8 blocks of width 512 for DiT-XL/2) that also runs at sampling
  time. Here the decoder is the last ``decoder_depth`` blocks of the DiT itself, so the model that is sampled,
  saved, exported and compared is exactly the DiT, with the same parameters as the baseline; only its
  training differs.
* **Representation alignment** (REPA, Yu et al. 2024): the hidden tokens after block ``k`` (counted from 1) go
  through a small MLP, the *projector* (``Linear -> SiLU -> Linear -> SiLU -> Linear``, hidden width 2048 in
  REPA), to the width of a pretrained encoder's patch features, which they are pulled towards
  (:func:`dit_core.train.objectives.alignment_loss`). The projector is thrown away after training.

:class:`TrainingModel` holds the DiT and these heads as one module, so that DistributedDataParallel wraps (and
AdamW updates) both, while the EMA, checkpoints' ``model`` entry and sampling see the DiT alone.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from .models import DiT


class Projector(nn.Sequential):
    """REPA's projector: three linear layers with SiLU between them, ``hidden -> width -> width -> out``."""

    def __init__(self, hidden_size: int, width: int, out_dim: int):
        super().__init__(nn.Linear(hidden_size, width), nn.SiLU(), nn.Linear(width, width), nn.SiLU(),
                         nn.Linear(width, out_dim))


class TrainingHeads(nn.Module):
    """The training-only parameters: ``projector`` (REPA; None without alignment) and ``mask_token``
    (MaskDiT; None without masking)."""

    def __init__(self, hidden_size: int, *, projector_dim: int = 0, teacher_dim: int = 0, mask: bool = False):
        super().__init__()
        self.projector = Projector(hidden_size, projector_dim, teacher_dim) if teacher_dim else None
        self.mask_token = nn.Parameter(torch.randn(1, 1, hidden_size) * 0.02) if mask else None


def patchify(x: torch.Tensor, patch_size: int) -> torch.Tensor:
    """``(N, C, H, W)`` to ``(N, T, p*p*C)`` tokens in the DiT's token order: the inverse of
    :meth:`DiT.unpatchify <dit_core.models.DiT.unpatchify>`."""
    n, c, h, w = x.shape
    p = patch_size
    x = x.reshape(n, c, h // p, p, w // p, p)
    return torch.einsum("nchpwq->nhwpqc", x).reshape(n, (h // p) * (w // p), p * p * c)


def gather_tokens(tokens: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``tokens[n, index[n]]`` for every sample: ``(N, T, D)`` and ``(N, K)`` to ``(N, K, D)``."""
    return torch.gather(tokens, 1, index.unsqueeze(-1).expand(-1, -1, tokens.shape[-1]))


class TrainingModel(nn.Module):
    """The DiT with its :class:`TrainingHeads`: what the optimizer updates and DDP wraps under the training
    options of :mod:`dit_core.train.objectives`.

    ``forward(x, t, y, keep=None, capture=None)`` returns ``(output, projected)``: the DiT's output, and the
    projector's image of the tokens after block ``capture`` (None when ``capture`` is None).
    """

    def __init__(self, dit: DiT, heads: TrainingHeads, decoder_depth: int = 0):
        super().__init__()
        self.dit, self.heads, self.decoder_depth = dit, heads, int(decoder_depth)

    def forward(self, x, t, y=None, keep=None, capture=None):
        out = self.dit(x, t, y, keep=keep, mask_token=self.heads.mask_token, decoder_depth=self.decoder_depth,
                       capture=capture)
        if capture is None:
            return out, None
        out, tokens = out
        return out, self.heads.projector(tokens) if self.heads.projector is not None else None

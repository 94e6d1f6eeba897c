"""Muon for the transformer's matrices, AdamW for everything else, as one optimizer (``optimizer: muon``).

Muon (K. Jordan et al. 2024, "Muon: An optimizer for hidden layers", kellerjordan.github.io/posts/muon)
keeps one momentum buffer per weight matrix, like SGD, and replaces each update by the nearest semi-orthogonal
matrix: the momentum's singular vectors with every singular value set to ~1 (five Newton-Schulz iterations of
a quintic polynomial, which need only matrix products). A transformer's gradient matrices are nearly low-rank,
so a plain update moves a matrix along a few directions; the orthogonalised one moves it along all of them by
about as much (its authors' argument). The update is scaled by ``0.2 * sqrt(max(rows, cols))`` so that its RMS
matches a typical AdamW update (J. Liu et al. 2025, "Muon is Scalable for LLM Training", arXiv 2502.16982):
the same learning rate serves both halves of the optimizer.

Which weights: the matrices of the attention (``qkv``, ``proj``) and of the MLP (``fc1``, ``fc2``) in every
DiT block, the ones that act on tokens. Everything else (patch, time and label embeddings, the adaLN
modulations, which act on one conditioning vector per image, the final layer, biases, REPA's projector)
goes through AdamW, as Muon's authors advise for embeddings, heads and vectors.

Both halves are PyTorch's own optimizers: ``torch.optim.Muon`` (Nesterov momentum 0.95, five Newton-Schulz
iterations in bf16, ``adjust_lr_fn="match_rms_adamw"``) and ``torch.optim.AdamW``. :class:`MuonAdamW` holds the
two so that the training loop keeps one optimizer: one learning-rate schedule over ``param_groups``, one state
dict in the checkpoint, an exact resume.
"""

from __future__ import annotations

import re

import torch

#: Parameter names that Muon updates: the token-wise matrices of every block (with any module prefix).
MUON_PARAMETERS = re.compile(r"(^|\.)blocks\.\d+\.(attn\.(qkv|proj)|mlp\.fc[12])\.weight$")


def split_parameters(model: torch.nn.Module) -> tuple[list, list]:
    """``(muon, adamw)``: the trainable parameters Muon updates (:data:`MUON_PARAMETERS`) and all others."""
    muon, adamw = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (muon if MUON_PARAMETERS.search(name) and p.ndim == 2 else adamw).append(p)
    return muon, adamw


class MuonAdamW:
    """``torch.optim.Muon`` for ``muon_params`` and ``torch.optim.AdamW`` for ``adamw_params``, seen as one
    optimizer: ``param_groups`` lists both halves' groups (the loop sets their ``lr``), ``step``, ``zero_grad``,
    ``state_dict`` and ``load_state_dict`` act on both."""

    def __init__(self, muon_params, adamw_params, lr: float = 1e-3, betas=(0.9, 0.999), weight_decay: float = 0.0):
        muon_params, adamw_params = list(muon_params), list(adamw_params)
        if not muon_params:
            raise ValueError("optimizer muon found no block matrices (blocks.N.attn.qkv.weight, ...) to update")
        self.muon = torch.optim.Muon(muon_params, lr=lr, weight_decay=weight_decay, adjust_lr_fn="match_rms_adamw")
        self.adamw = torch.optim.AdamW(adamw_params, lr=lr, betas=tuple(betas), weight_decay=weight_decay) \
            if adamw_params else None
        self.parts = [o for o in (self.muon, self.adamw) if o is not None]
        self.defaults = dict(lr=lr)

    @property
    def param_groups(self) -> list[dict]:
        return [group for o in self.parts for group in o.param_groups]

    @property
    def state(self):
        return {**self.muon.state, **(self.adamw.state if self.adamw is not None else {})}

    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for o in self.parts:
            o.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self.parts:
            o.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return {"muon": self.muon.state_dict(), "adamw": self.adamw.state_dict() if self.adamw is not None else None}

    def load_state_dict(self, state: dict) -> None:
        if set(state) != {"muon", "adamw"}:
            raise ValueError("this is not the state of optimizer muon (MuonAdamW): resume with the optimizer the "
                             "run was trained with (--optimizer)")
        self.muon.load_state_dict(state["muon"])
        if self.adamw is not None:
            self.adamw.load_state_dict(state["adamw"])


def make_muon(model: torch.nn.Module, lr: float, betas, weight_decay: float) -> MuonAdamW:
    """The optimizer of ``optimizer: muon`` for a DiT (or a module holding one)."""
    return MuonAdamW(*split_parameters(model), lr=lr, betas=betas, weight_decay=weight_decay)

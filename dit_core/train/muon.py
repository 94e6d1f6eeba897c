"""Muon for the transformer's matrices, AdamW for everything else, as one optimizer (``optimizer: muon``).

Muon (K. Jordan et al. 2024, "Muon: An optimizer for hidden layers", kellerjordan.github.io/posts/muon)
keeps one momentum buffer per weight matrix, like SGD, and replaces each update by the nearest semi-orthogonal
matrix: the momentum's singular vectors with every singular value set to ~1 (five Newton-Schulz iterations of
a quintic polynomial, which need only matrix products). A transformer's gradient matrices are nearly low-rank,
so a plain update moves a matrix along a few directions; the orthogonalised one moves it along all of them by
about as much (its authors' argument). The update is scaled by ``0.2 * sqrt(max(rows, cols))`` so that its RMS
matches a typical AdamW update (J. Liu et al. 2025, "Muon is Scalable for LLM Training", arXiv 2502.16982):
the same learning rate serves both halves of the optimizer, as here.

Which weights: the matrices of the attention (``qkv``, ``proj``) and of the MLP (``fc1``, ``fc2``) in every
DiT block, the ones that act on tokens. Everything else (patch, time and label embeddings, the adaLN
modulations, which act on one conditioning vector per image, the final layer, biases, REPA's projector)
goes through AdamW, as Muon's authors advise for embeddings, heads and vectors.

The Muon half computes what ``torch.optim.Muon(..., adjust_lr_fn="match_rms_adamw")`` computes, except that
PyTorch always runs the iteration in bf16 and this one in ``ns_dtype``: bf16 where the run trains in bf16 (the
trainer's choice, where bf16 products are fast), else fp32 (a CPU without bf16 instructions runs bf16 products
several times slower than fp32); the AdamW half computes what ``torch.optim.AdamW`` does (tests/test_muon.py checks
both). One class holds both so that the training loop keeps one optimizer: one learning rate schedule over
``param_groups``, one state dict in the checkpoint, an exact resume.

Cost: the Newton-Schulz products are ~10 m^2 n multiply-adds per m x n matrix (m <= n) and step, whatever the
batch. For the small-images profile (width 128, 4 blocks, 2,048 tokens a step) that is ~25 % of a step's
compute on a 2-core CPU; on a GPU batch it is a small share. Under DistributedDataParallel every process holds
the same averaged gradients, so the work is shared out instead of repeated (``distributed=True``): each
process orthogonalises its own share of the matrices (balanced by that cost, :func:`owners`) and one
all-reduce hands every process all the updates, exactly the numbers one process would compute (the other
processes add zeros), in the Newton-Schulz precision (bf16: half the bytes). The matrices of one shape go
through the iteration as one stack (:func:`orthogonalize_all`): a DiT repeats its blocks, so the profile's 16
matrices go through each product of the iteration as 3 stacks, not as 16 small products.
"""

from __future__ import annotations

import math
import re

import torch
import torch.distributed as dist

#: Newton-Schulz coefficients (a, b, c) of the quintic iteration, as in Muon's reference and PyTorch's.
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
NS_STEPS = 5
MOMENTUM = 0.95
#: Parameter names that Muon updates: the token-wise matrices of every block (with any module prefix).
MUON_PARAMETERS = re.compile(r"(^|\.)blocks\.\d+\.(attn\.(qkv|proj)|mlp\.fc[12])\.weight$")


def orthogonalize(g: torch.Tensor, steps: int = NS_STEPS, eps: float = 1e-7, dtype=None) -> torch.Tensor:
    """The matrix ``g`` with its singular values pushed towards 1 by ``steps`` Newton-Schulz iterations
    ``X <- a X + (b A + c A^2) X`` with ``A = X X^T``, after scaling ``g`` to unit Frobenius norm (so that its
    spectral norm is at most 1). Not exactly to 1: into ~[0.5, 1.2] when they span 300x (chapter 7b). The short
    side goes first, so that ``A`` is the small Gram matrix. ``g`` may be a stack ``(..., m, n)`` of matrices of
    one shape, each orthogonalised on its own (one batched product instead of one per matrix: fewer, larger
    calls). ``dtype``: the products' precision (default ``g``'s); the result has ``g``'s dtype."""
    a, b, c = NS_COEFFICIENTS
    x = (g / g.norm(dim=(-2, -1), keepdim=True).clamp(min=eps)).to(dtype or g.dtype)
    tall = x.shape[-2] > x.shape[-1]
    if tall:
        x = x.mT
    for _ in range(steps):
        gram = x @ x.mT
        x = a * x + (b * gram + c * (gram @ gram)) @ x
    return (x.mT if tall else x).to(g.dtype)


def orthogonalize_all(matrices: list, steps: int = NS_STEPS, dtype=None) -> list:
    """:func:`orthogonalize` of each matrix, those of one shape (up to a transpose) stacked into one batch:
    a DiT's blocks repeat their shapes (4 blocks of the small-images profile: 16 matrices in 3 batches)."""
    batches: dict = {}
    for i, m in enumerate(matrices):
        batches.setdefault(tuple(sorted(m.shape)), []).append(i)
    out = [None] * len(matrices)
    for idx in batches.values():
        # each matrix with its short side first, so that one stack holds a shape and its transpose
        flat = [matrices[i] if matrices[i].shape[0] <= matrices[i].shape[1] else matrices[i].T for i in idx]
        for i, u in zip(idx, orthogonalize(torch.stack(flat), steps, dtype=dtype).unbind()):
            out[i] = u if u.shape == matrices[i].shape else u.T
    return out


def ns_cost(shape) -> int:
    """Multiply-adds of one Newton-Schulz iteration on a matrix of ``shape``: ``2 m^2 n + m^3``, m <= n."""
    m, n = sorted(shape)
    return 2 * m * m * n + m ** 3


def owners(shapes, world_size: int) -> list[int]:
    """Which process orthogonalises each matrix: the costliest first, each to the least loaded process (the
    same answer on every process, so no process waits long for another)."""
    load, owner = [0] * world_size, [0] * len(shapes)
    for i in sorted(range(len(shapes)), key=lambda i: -ns_cost(shapes[i])):
        owner[i] = min(range(world_size), key=lambda r: load[r])
        load[owner[i]] += ns_cost(shapes[i])
    return owner


def split_parameters(model: torch.nn.Module) -> tuple[list, list]:
    """``(muon, adamw)``: the trainable parameters Muon updates (:data:`MUON_PARAMETERS`) and all others."""
    muon, adamw = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (muon if MUON_PARAMETERS.search(name) and p.ndim == 2 else adamw).append(p)
    return muon, adamw


class MuonAdamW(torch.optim.Optimizer):
    """Two parameter groups: ``muon=True`` (Nesterov momentum, orthogonalised, RMS-matched), ``muon=False``
    (AdamW). Both use the group's ``lr`` and decoupled ``weight_decay``; AdamW's ``betas`` and ``eps`` apply to
    the second group only. ``distributed=True``: the processes of an initialised process group (all holding the
    same gradients, as under DDP) share the Newton-Schulz work out (module docstring); with one process, or no
    process group, it changes nothing. ``ns_dtype``: the precision of the Newton-Schulz products (None: the
    gradients' own)."""

    def __init__(self, muon_params, adamw_params, lr: float = 1e-3, betas=(0.9, 0.999), weight_decay: float = 0.0,
                 momentum: float = MOMENTUM, ns_steps: int = NS_STEPS, eps: float = 1e-8, distributed: bool = False,
                 ns_dtype: torch.dtype | None = None):
        groups = [dict(params=list(muon_params), muon=True), dict(params=list(adamw_params), muon=False)]
        groups = [g for g in groups if g["params"]]
        if not groups:
            raise ValueError("MuonAdamW got no parameters")
        super().__init__(groups, dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay, momentum=momentum,
                                      ns_steps=ns_steps, eps=eps))
        self.distributed, self.ns_dtype = distributed, ns_dtype

    def _world(self) -> tuple[int, int]:
        """(rank, world size) over which the orthogonalisation is shared; (0, 1) when it is not."""
        if self.distributed and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            return dist.get_rank(), dist.get_world_size()
        return 0, 1

    def _muon_updates(self, group) -> dict:
        """The orthogonalised Nesterov momentum of every matrix of ``group`` that has a gradient, after moving
        its momentum buffer; shared out over the processes and gathered by one all-reduce (:meth:`_world`)."""
        params = [p for p in group["params"] if p.grad is not None]
        for p in params:
            if p.ndim != 2:
                raise ValueError(f"Muon updates matrices, got a parameter of shape {tuple(p.shape)}")
        rank, world = self._world()
        owner = owners([p.shape for p in params], world)
        mu, mine, nesterov = group["momentum"], [], []
        for p, r in zip(params, owner):
            buf = self.state[p].setdefault("momentum_buffer", torch.zeros_like(p))
            buf.lerp_(p.grad, 1 - mu)  # every process moves every buffer: they stay equal, and checkpoints whole
            if r == rank:
                mine.append(p)
                nesterov.append(p.grad.lerp(buf, mu))
        updates = dict(zip(mine, orthogonalize_all(nesterov, group["ns_steps"], dtype=self.ns_dtype)))
        if world > 1:
            # the updates travel in the Newton-Schulz precision: bf16 halves the bytes and loses nothing
            flat = torch.zeros(sum(p.numel() for p in params), dtype=self.ns_dtype or params[0].grad.dtype,
                               device=params[0].device)
            chunks = flat.split([p.numel() for p in params])
            for p, chunk in zip(params, chunks):
                if p in updates:
                    chunk.copy_(updates[p].flatten())
            dist.all_reduce(flat)  # the others' chunks are zeros: each sum is one process's numbers, exactly
            updates = {p: chunk.view_as(p) for p, chunk in zip(params, chunks)}
        return updates

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, wd = group["lr"], group["weight_decay"]
            if group["muon"]:
                for p, update in self._muon_updates(group).items():
                    p.mul_(1 - lr * wd)
                    p.add_(update.to(p.dtype), alpha=-lr * 0.2 * math.sqrt(max(p.shape)))
                continue
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad, state = p.grad, self.state[p]
                beta1, beta2 = group["betas"]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                state["step"] += 1
                n = float(state["step"])
                p.mul_(1 - lr * wd)
                state["exp_avg"].lerp_(grad, 1 - beta1)
                state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                denom = (state["exp_avg_sq"].sqrt() / math.sqrt(1 - beta2 ** n)).add_(group["eps"])
                p.addcdiv_(state["exp_avg"], denom, value=-lr / (1 - beta1 ** n))
        return loss


def make_muon(model: torch.nn.Module, lr: float, betas, weight_decay: float, distributed: bool = False,
              ns_dtype: torch.dtype | None = None) -> MuonAdamW:
    """The optimizer of ``optimizer: muon`` for a DiT (or a module holding one); ``distributed``: the trainer's
    processes share the Newton-Schulz work; ``ns_dtype``: its precision (:class:`MuonAdamW`)."""
    muon, adamw = split_parameters(model)
    if not muon:
        raise ValueError("optimizer muon found no block matrices (blocks.N.attn.qkv.weight, ...) to update")
    return MuonAdamW(muon, adamw, lr=lr, betas=betas, weight_decay=weight_decay, distributed=distributed,
                     ns_dtype=ns_dtype)

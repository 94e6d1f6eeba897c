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

One thing PyTorch's Muon cannot do: run its iteration in fp32. On a CPU without bf16 instructions bf16 matrix
products are emulated, and there it costs most of the step (measured on a 2-core AMD EPYC, Zen 3, one thread,
the small-images model: the 16 matrices' iterations 1,207 ms in bf16 against 43 ms in fp32, beside 438 ms of
forward and backward; ``benchmarks/cpu_optimizer_step.py``). A run that trains in fp32 therefore gets
:class:`MuonFp32`, the same update with the iteration in fp32 (the state dict is PyTorch's Muon's). With several
CPU processes it also shares the iterations out among them: on the same CPU the ``small-images`` profile's step
takes 189 ms instead of 232 ms, with the same weights, bit for bit, after 400 steps
(``benchmarks/results/small-images-recipe.md``, section 7).
"""

from __future__ import annotations

import math
import re

import torch

#: The PyTorch release that brought ``torch.optim.Muon``, which this module builds on. The rest of ``dit_core``
#: runs on older releases: the trainer imports this module only for ``optimizer: muon``.
MUON_TORCH = "2.9"

if not hasattr(torch.optim, "Muon"):
    raise ImportError(f"optimizer muon needs torch>={MUON_TORCH} (torch.optim.Muon); this is torch "
                      f"{torch.__version__}: pip install -U 'torch>={MUON_TORCH}', or train with --optimizer adamw")

#: Parameter names that Muon updates: the token-wise matrices of every block (with any module prefix).
MUON_PARAMETERS = re.compile(r"(^|\.)blocks\.\d+\.(attn\.(qkv|proj)|mlp\.fc[12])\.weight$")


def split_parameters(model: torch.nn.Module) -> tuple[list, list]:
    """``(muon, adamw)``: the trainable parameters Muon updates (:data:`MUON_PARAMETERS`) and all others."""
    muon, adamw = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (muon if MUON_PARAMETERS.search(name) and p.ndim == 2 else adamw).append(p)
    return muon, adamw


#: The coefficients (a, b, c) of the quintic Newton-Schulz iteration: Muon's reference and PyTorch's.
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)


def newton_schulz(g: torch.Tensor, steps: int = 5, eps: float = 1e-7) -> torch.Tensor:
    """The iteration of ``torch.optim.Muon`` in fp32: ``g`` scaled to unit norm (so its spectral norm is at most
    1), then ``X <- a X + (b A + c A^2) X`` with ``A = X X^T``, the short side first (``A`` the small Gram
    matrix). The singular values go to ~[0.5, 1.2], not exactly 1 (Muon's authors: that does not hurt)."""
    a, b, c = NS_COEFFICIENTS
    x = g.float()
    tall = x.shape[0] > x.shape[1]
    x = x.T if tall else x
    x = x / x.norm().clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * (gram @ gram)) @ x
    return x.T if tall else x


class MuonFp32(torch.optim.Muon):
    """``torch.optim.Muon`` (Nesterov, ``adjust_lr_fn="match_rms_adamw"``) with the iteration in fp32
    (:func:`newton_schulz`); the same state (one ``momentum_buffer`` per matrix).

    With several processes (CPU DDP, where the gradients are already averaged, so every process holds the same
    momentum) each process orthogonalises every ``world_size``-th matrix only and the processes then exchange
    the results (one broadcast per process): the same update, bit for bit, for a share of the work.
    """

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        dist = torch.distributed
        world, rank = (dist.get_world_size(), dist.get_rank()) if dist.is_initialized() else (1, 0)
        for group in self.param_groups:
            mu, lr = group["momentum"], group["lr"]
            params = [p for p in group["params"] if p.grad is not None]
            updates = []
            for i, p in enumerate(params):
                buf = self.state[p].setdefault("momentum_buffer", torch.zeros_like(p.grad))
                buf.lerp_(p.grad, 1 - mu)
                g = p.grad.lerp(buf, mu) if group["nesterov"] else buf
                updates.append(newton_schulz(g, group["ns_steps"], group["eps"]) if i % world == rank else None)
            for owner in range(world if world > 1 else 0):  # each process's share, sent to the others
                mine = range(owner, len(params), world)
                if not mine:  # more processes than matrices
                    continue
                flat = (torch.cat([updates[i].flatten() for i in mine]) if owner == rank
                        else torch.empty(sum(params[i].numel() for i in mine)))
                dist.broadcast(flat, src=owner)
                for i, part in zip(mine, flat.split([params[i].numel() for i in mine])):
                    updates[i] = part.view(params[i].shape)
            for p, update in zip(params, updates):
                p.mul_(1 - lr * group["weight_decay"])
                p.add_(update.to(p.dtype), alpha=-lr * 0.2 * math.sqrt(max(p.shape[:2])))
        return loss


class MuonAdamW:
    """``torch.optim.Muon`` (:class:`MuonFp32` with ``fp32``) for ``muon_params`` and ``torch.optim.AdamW`` for
    ``adamw_params``, seen as one optimizer: ``param_groups`` lists both halves' groups (the loop sets their
    ``lr``), ``step``, ``zero_grad``, ``state_dict`` and ``load_state_dict`` act on both."""

    def __init__(self, muon_params, adamw_params, lr: float = 1e-3, betas=(0.9, 0.999), weight_decay: float = 0.0,
                 fp32: bool = False):
        muon_params, adamw_params = list(muon_params), list(adamw_params)
        if not muon_params:
            raise ValueError("optimizer muon found no block matrices (blocks.N.attn.qkv.weight, ...) to update")
        muon = MuonFp32 if fp32 else torch.optim.Muon
        self.muon = muon(muon_params, lr=lr, weight_decay=weight_decay, adjust_lr_fn="match_rms_adamw")
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


def make_muon(model: torch.nn.Module, lr: float, betas, weight_decay: float, fp32: bool = False) -> MuonAdamW:
    """The optimizer of ``optimizer: muon`` for a DiT (or a module holding one); ``fp32``: the Newton-Schulz
    iteration in fp32 (:class:`MuonFp32`), for runs that train in fp32 on a CPU."""
    return MuonAdamW(*split_parameters(model), lr=lr, betas=betas, weight_decay=weight_decay, fp32=fp32)

"""Counting parameters and multiply-adds of the DiT configurations, on the meta device.

The paper's "Gflops" (Table 1, Fig. 2) are multiply-adds of one forward pass for one image. We count them the
way a profiler would, not by formula: the model is built on PyTorch's ``meta`` device (shapes only, no memory,
no arithmetic), run once under :class:`torch.utils.flop_counter.FlopCounterMode`, and the counted FLOPs
(2 per multiply-add) are halved. Patch embedding, every linear layer, adaLN and attention's two batched
matrix products are counted; normalisation, softmax and activations are not (as in the paper).

The same count covers the four block designs of the paper's ablation (``DiT(block=...)``, Sec. 3.2):
cross-attention's extra projections and attention over the ``[t, y]`` tokens, and in-context's two extra tokens
in every block, are counted as they run (:func:`design_table`).

``dit-models`` (:mod:`dit_core.cli.models`) prints all 12 configurations against the published figures.
"""

from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode

from ..models import DiT, DiT_models, model_kwargs

#: Published figures at 256 px: parameters (``pos_embed`` included; shared/reference) and forward Gmacs
#: (paper Table 4 / Fig. 2, three significant figures).
PAPER_PARAMS_256 = {"DiT-S/2": 32_963_360, "DiT-B/2": 130_512_416, "DiT-L/2": 458_102_816, "DiT-XL/2": 675_129_632}
PAPER_GMACS_256 = {
    "DiT-S/2": 6.06, "DiT-S/4": 1.41, "DiT-S/8": 0.36,
    "DiT-B/2": 23.0, "DiT-B/4": 5.56, "DiT-B/8": 1.42,
    "DiT-L/2": 80.7, "DiT-L/4": 19.7, "DiT-L/8": 5.01,
    "DiT-XL/2": 118.6, "DiT-XL/4": 29.0, "DiT-XL/8": 7.39,
}


def meta_model(name: str, image_size: int = 256, **kwargs) -> DiT:
    """Build a named DiT on the meta device (no memory is allocated) for ``image_size`` pixel images."""
    if image_size % 8:
        raise ValueError(f"image_size must be a multiple of 8 (the VAE downsamples by 8), got {image_size}")
    with torch.device("meta"):
        return DiT(**{**model_kwargs(name), "input_size": image_size // 8, **kwargs})


def count_params(model: DiT) -> int:
    """All parameters, the fixed ``pos_embed`` included (the convention of the published counts)."""
    return sum(p.numel() for p in model.parameters())


def forward_macs(model: DiT, batch_size: int = 1) -> int:
    """Multiply-adds of one forward pass over ``batch_size`` samples, counted on the model's device."""
    p = next(model.parameters())
    x = torch.zeros(batch_size, model.in_channels, model.input_size, model.input_size, device=p.device)
    t = torch.zeros(batch_size, dtype=torch.long, device=p.device)
    y = torch.zeros(batch_size, dtype=torch.long, device=p.device) if model.num_classes else None
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(x, t, y)
    return counter.get_total_flops() // 2


def model_facts(model: DiT) -> dict:
    """What the paper's tables give of a model: ``params`` (:func:`count_params`), ``gflops`` (forward multiply-adds
    per image, in G: :func:`forward_macs`) and ``tokens`` (the image's, plus in-context's conditioning tokens)."""
    return {"params": count_params(model), "gflops": forward_macs(model) / 1e9,
            "tokens": model.x_embedder.num_patches + model.extra_tokens}


def config_table(image_size: int = 256) -> list[dict]:
    """Parameters and forward Gmacs of all 12 configurations, with the published figures beside them."""
    rows = []
    for name in DiT_models:
        model = meta_model(name, image_size)
        gmacs = forward_macs(model) / 1e9
        rows.append(
            dict(
                model=name,
                params=count_params(model),
                paper_params=PAPER_PARAMS_256.get(name) if image_size == 256 else None,
                gmacs=gmacs,
                paper_gmacs=PAPER_GMACS_256[name] if image_size == 256 else None,
                train_gflop_per_image=6 * gmacs,  # forward + backward = 3 forwards, 2 FLOPs per multiply-add
            )
        )
    return rows


def format_table(rows: list[dict]) -> str:
    lines = [f"{'model':<10}{'params':>14}{'paper':>14}{'Gmacs':>9}{'paper':>8}{'train GFLOP/img':>17}"]
    for r in rows:
        paper_p = f"{r['paper_params']:,}" if r["paper_params"] else "-"
        paper_g = f"{r['paper_gmacs']:g}" if r["paper_gmacs"] else "-"
        lines.append(
            f"{r['model']:<10}{r['params']:>14,}{paper_p:>14}{r['gmacs']:>9.2f}{paper_g:>8}"
            f"{r['train_gflop_per_image']:>17.1f}"
        )
    return "\n".join(lines)


#: The paper's words on the designs' cost (Sec. 3.2): cross-attention "adds the most Gflops to the model, roughly a
#: 15% overhead"; in-context "introduces negligible new Gflops"; adaLN "adds the least Gflops".
PAPER_CROSS_ATTENTION_OVERHEAD = 0.15


#: The four block designs of the paper's ablation (Sec. 3.2), adaLN-Zero first: the rows of :func:`design_table`.
PAPER_DESIGNS = ("adaln-zero", "adaln", "cross-attention", "in-context")


def design_table(name: str = "DiT-XL/2", image_size: int = 256, blocks=PAPER_DESIGNS, **kwargs) -> list[dict]:
    """Parameters and forward Gmacs of the block designs ``blocks`` (:data:`dit_core.models.BLOCKS`; default the
    paper's four) of the named configuration, each with its overhead over the first (adaLN-Zero) (``kwargs``: more
    :class:`DiT` arguments, e.g. ``input_size`` and ``in_channels`` of a pixel-space model, which then replace the
    latent size that ``image_size`` gives)."""
    rows, base = [], None
    for block in blocks:
        model = meta_model(name, image_size, **{**kwargs, "block": block})
        gmacs = forward_macs(model) / 1e9
        base = gmacs if base is None else base
        rows.append(dict(model=name, block=block, params=count_params(model), gmacs=gmacs,
                         overhead=gmacs / base - 1.0, tokens=model.x_embedder.num_patches + model.extra_tokens))
    return rows

"""Figures drawn by code for the book: the Diffusion Transformer of chapter 03.

:func:`dit_figure` draws the whole model (left) and one DiT block with adaLN-Zero conditioning (right): the
paper's Figure 3 (Peebles & Xie 2023) in the book's own drawing, with matplotlib boxes and arrows. Every size in
it (latent shape, patch size, tokens, width, depth, heads, MLP width, output channels) is read off a
:class:`dit_core.models.DiT`, so the picture is of the model that runs, whichever configuration it is.

Example::

    from dit_book.figures import dit_figure
    from dit_core.measure.flops import meta_model

    fig = dit_figure(meta_model("DiT-XL/2"))     # built on the meta device: no memory
"""

from __future__ import annotations

from dataclasses import dataclass

#: Box colours by role: data (tensors), layers with weights, conditioning, parameter-free operations.
COLOURS = {"data": "#dfe9f5", "layer": "#fde7c8", "cond": "#e3f2dc", "op": "#eeeeee", "block": "#f7f1fb"}


@dataclass(frozen=True)
class DiTShape:
    """The sizes the figure prints, as :class:`~dit_core.models.DiT` holds them."""

    input_size: int = 32
    in_channels: int = 4
    patch_size: int = 2
    hidden_size: int = 1152
    depth: int = 28
    num_heads: int = 16
    mlp_ratio: float = 4.0
    learn_sigma: bool = True
    num_classes: int = 1000
    class_dropout_prob: float = 0.1  # > 0: the label table has an extra row, the null class

    @classmethod
    def of(cls, model) -> "DiTShape":
        """Read the sizes off a DiT (any object with its attributes)."""
        missing = [f for f in cls.__dataclass_fields__ if not hasattr(model, f)]
        if missing:
            raise TypeError(
                f"dit_figure needs a dit_core.models.DiT (or keyword sizes); {type(model).__name__} has no "
                f"{', '.join(missing)}")
        return cls(**{f: getattr(model, f) for f in cls.__dataclass_fields__})

    @property
    def tokens(self) -> int:
        return (self.input_size // self.patch_size) ** 2

    @property
    def out_channels(self) -> int:
        return 2 * self.in_channels if self.learn_sigma else self.in_channels


def _box(ax, x, y, w, h, text, kind, fontsize=8.5, **kwargs):
    """A rounded box centred on (x, y); returns its (x, y, w, h)."""
    from matplotlib.patches import FancyBboxPatch

    ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.02,rounding_size=0.12",
                                facecolor=COLOURS[kind], edgecolor="#555555", linewidth=1.0, **kwargs))
    if text:
        ax.text(x, y, text, ha="center", va="center", fontsize=fontsize)
    return (x, y, w, h)


def _arrow(ax, start, end, colour="#333333", style="-|>", **kwargs):
    ax.annotate("", xy=end, xytext=start,
                arrowprops=dict(arrowstyle=style, color=colour, lw=1.1, shrinkA=0, shrinkB=0, **kwargs))


def _up(ax, lower, upper, **kwargs):
    """An arrow from the top of box ``lower`` to the bottom of box ``upper`` (same x)."""
    _arrow(ax, (lower[0], lower[1] + lower[3] / 2), (upper[0], upper[1] - upper[3] / 2), **kwargs)


def draw_dit_model(ax, shape: DiTShape) -> None:
    """The whole DiT, bottom to top: patchify, embed, N blocks, final layer, unpatchify; t and y on the right."""
    s, p, c_in = shape.input_size, shape.patch_size, shape.in_channels
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 16)
    ax.axis("off")
    ax.set_title("DiT: the whole model", fontsize=10)

    latent = _box(ax, 3.2, 0.8, 4.0, 0.8, f"noised latent $x_t$\n{s}×{s}×{c_in}", "data")
    patch = _box(ax, 3.2, 2.3, 4.8, 0.9, f"patchify: {p}×{p} patches, linear to {shape.hidden_size}\n"
                 "+ fixed sin-cos pos_embed", "layer")
    tokens = _box(ax, 3.2, 3.7, 4.0, 0.7, f"{shape.tokens} tokens × {shape.hidden_size}", "data")
    blocks = _box(ax, 3.2, 6.6, 4.8, 2.6, "", "block")
    ax.text(3.2, 7.1, "DiT block", ha="center", va="center", fontsize=10, weight="bold")
    ax.text(3.2, 6.3, f"adaLN-Zero, {shape.num_heads} heads\n(right)", ha="center", va="center", fontsize=8.5)
    ax.text(blocks[0] - blocks[2] / 2 + 0.15, blocks[1] + blocks[3] / 2 - 0.3, f"{shape.depth} ×", fontsize=10,
            weight="bold", ha="left", va="center")
    final = _box(ax, 3.2, 9.6, 4.8, 0.9, "layer norm, adaLN shift & scale from c\n"
                 f"linear: {shape.hidden_size} → {p}×{p}×{shape.out_channels} per token", "layer")
    unpatch = _box(ax, 3.2, 11.0, 4.0, 0.7, "unpatchify", "op")
    for lower, upper in ((latent, patch), (patch, tokens), (tokens, blocks), (blocks, final), (final, unpatch)):
        _up(ax, lower, upper)

    if shape.learn_sigma:
        noise = _box(ax, 1.9, 12.7, 2.4, 0.9, f"noise $\\epsilon_\\theta$\n{s}×{s}×{c_in}", "data")
        sigma = _box(ax, 4.5, 12.7, 2.4, 0.9, f"variance $v$ (Σ)\n{s}×{s}×{c_in}", "data")
        for out in (noise, sigma):
            _arrow(ax, (out[0], unpatch[1] + unpatch[3] / 2), (out[0], out[1] - out[3] / 2))
    else:
        noise = _box(ax, 3.2, 12.7, 2.8, 0.9, f"noise $\\epsilon_\\theta$\n{s}×{s}×{c_in}", "data")
        _up(ax, unpatch, noise)

    # conditioning: timestep and label embeddings, summed into c
    t_in = _box(ax, 7.0, 0.8, 1.4, 0.8, "timestep t", "data")
    y_in = _box(ax, 8.8, 0.8, 1.4, 0.8, "label y", "data")
    t_emb = _box(ax, 7.0, 2.5, 1.6, 1.2, "256 sin-cos\nfeatures\n→ MLP", "cond", fontsize=7.5)
    null = " + null" if shape.class_dropout_prob > 0 else ""
    label_rows = f"{shape.num_classes}{null}" if shape.num_classes else "none"
    y_emb = _box(ax, 8.8, 2.5, 1.6, 1.2, f"embedding\ntable\n({label_rows})", "cond", fontsize=7.5)
    plus = _box(ax, 7.9, 4.2, 0.6, 0.6, "+", "op", fontsize=11)
    cond = _box(ax, 7.9, 5.3, 1.6, 0.7, f"c ({shape.hidden_size})", "cond")
    _up(ax, t_in, t_emb)
    _up(ax, y_in, y_emb)
    _arrow(ax, (t_emb[0], t_emb[1] + t_emb[3] / 2), (plus[0] - 0.2, plus[1] - 0.3))
    _arrow(ax, (y_emb[0], y_emb[1] + y_emb[3] / 2), (plus[0] + 0.2, plus[1] - 0.3))
    _up(ax, plus, cond)
    # c feeds every block and the final layer
    right = blocks[0] + blocks[2] / 2
    _arrow(ax, (cond[0] - cond[2] / 2, cond[1]), (right, cond[1]), colour="#3a7d2c")
    ax.plot([cond[0], cond[0]], [cond[1] + cond[3] / 2, final[1]], color="#3a7d2c", lw=1.1)
    _arrow(ax, (cond[0], final[1]), (final[0] + final[2] / 2, final[1]), colour="#3a7d2c")


def draw_dit_block(ax, shape: DiTShape) -> None:
    """One DiT block with adaLN-Zero: two residual branches, each normalised, modulated and gated by c."""
    d, mlp = shape.hidden_size, int(shape.hidden_size * shape.mlp_ratio)
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 16)
    ax.axis("off")
    ax.set_title("DiT block with adaLN-Zero", fontsize=10)
    x0 = 4.0
    inp = _box(ax, x0, 0.8, 3.4, 0.7, "input tokens", "data")
    ln1 = _box(ax, x0, 2.0, 3.4, 0.6, "layer norm (no affine)", "op")
    mod1 = _box(ax, x0, 3.1, 3.4, 0.6, "scale $(1+\\gamma_1)$, shift $\\beta_1$", "cond")
    attn = _box(ax, x0, 4.4, 3.4, 0.9, f"multi-head self-attention\n{shape.num_heads} heads × "
                f"{d // max(shape.num_heads, 1)}", "layer")
    gate1 = _box(ax, x0, 5.7, 3.4, 0.6, "scale by gate $\\alpha_1$", "cond")
    add1 = _box(ax, x0, 6.8, 0.6, 0.6, "+", "op", fontsize=11)
    ln2 = _box(ax, x0, 8.0, 3.4, 0.6, "layer norm (no affine)", "op")
    mod2 = _box(ax, x0, 9.1, 3.4, 0.6, "scale $(1+\\gamma_2)$, shift $\\beta_2$", "cond")
    ff = _box(ax, x0, 10.4, 3.4, 0.9, f"pointwise feedforward\n{d} → {mlp} → {d} (GELU)", "layer")
    gate2 = _box(ax, x0, 11.7, 3.4, 0.6, "scale by gate $\\alpha_2$", "cond")
    add2 = _box(ax, x0, 12.8, 0.6, 0.6, "+", "op", fontsize=11)
    out = _box(ax, x0, 14.0, 3.4, 0.7, "output tokens", "data")
    for lower, upper in ((inp, ln1), (ln1, mod1), (mod1, attn), (attn, gate1), (gate1, add1), (add1, ln2),
                         (ln2, mod2), (mod2, ff), (ff, gate2), (gate2, add2), (add2, out)):
        _up(ax, lower, upper)
    # residual connections around each branch, on the left
    left = x0 - 2.3
    for start, add in ((1.4, add1), (7.4, add2)):
        ax.plot([x0, left, left], [start, start, add[1]], color="#333333", lw=1.1)
        _arrow(ax, (left, add[1]), (add[0] - add[2] / 2, add[1]))

    # conditioning: c -> SiLU -> linear (initialised at zero) -> six vectors
    cond = _box(ax, 8.2, 0.5, 1.6, 0.6, "c", "cond")
    mlp_c = _box(ax, 8.2, 1.75, 2.2, 1.2, "SiLU → linear\n" f"{d} → 6×{d}\n(zero at init)", "layer",
                 fontsize=7.5)
    _up(ax, cond, mlp_c)
    top = mlp_c[1] + mlp_c[3] / 2
    ax.plot([mlp_c[0], mlp_c[0]], [top, gate2[1]], color="#3a7d2c", lw=1.1)
    for target, label in ((mod1, "$\\gamma_1, \\beta_1$"), (gate1, "$\\alpha_1$"), (mod2, "$\\gamma_2, \\beta_2$"),
                          (gate2, "$\\alpha_2$")):
        _arrow(ax, (mlp_c[0], target[1]), (target[0] + target[2] / 2, target[1]), colour="#3a7d2c")
        ax.text(mlp_c[0] + 0.1, target[1] + 0.22, label, fontsize=8, color="#3a7d2c", ha="left")
    ax.text(5.0, 15.2, "gates start at 0: every block starts as the identity", fontsize=8, ha="center",
            style="italic")


def dit_figure(model=None, **sizes):
    """The whole DiT and its block, side by side; sizes from ``model`` (a DiT, e.g. on the meta device), from
    keyword ``sizes`` (the fields of :class:`DiTShape`), or DiT-XL/2 at 256 px by default. Returns the figure."""
    import matplotlib.pyplot as plt

    if model is not None and sizes:
        raise ValueError("give dit_figure either a model or keyword sizes, not both")
    if model is not None:
        shape = DiTShape.of(model)
    else:
        unknown = sorted(set(sizes) - set(DiTShape.__dataclass_fields__))
        if unknown:
            raise TypeError(f"unknown sizes {unknown}; use {sorted(DiTShape.__dataclass_fields__)}")
        shape = DiTShape(**sizes)
    if shape.input_size % shape.patch_size:
        raise ValueError(f"input_size {shape.input_size} is not a multiple of patch_size {shape.patch_size}")
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 7.2))
    draw_dit_model(left, shape)
    draw_dit_block(right, shape)
    fig.tight_layout()
    return fig

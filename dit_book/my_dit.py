"""The book's solutions of chapter 3's exercises: DiT's parts as the chapter's folded solution cells write them.

Chapter 3 shows ``dit_core.models``, then asks the reader to write DiT's own parts in ``%%answer`` cells, each
checked against it (:mod:`dit_book.exercises`): patchify (exercise 4), the timestep embedding (5), the label
embedding with its null class (6), the adaLN-Zero block (7), the final layer (8) and the assembled model (9), which
loads a ``dit_core`` ``DiT``'s state dict and gives its outputs. The chapter's ``%%solution`` cells hold exactly the
code of this file (``tests/test_my_dit.py`` checks that the two are the same).

:func:`dit_book.reader.load` assembles the reader's DiT for chapters 5 and 7 from the parts they saved in
``READER_DIR``; this module is the book's solution that stands in for each part they have not written, or that
does not pass its check (:func:`dit_book.reader.book_source` reads its definitions; the imports below, with
:mod:`dit_book.my_diffusion`'s, are what every ``%%answer`` cell starts with).

What the reader does not write: the ViT's attention and MLP (``dit_core.attention.Attention``,
``dit_core.models.Mlp``; the official code takes them from timm), the strided convolution of the patch embedding
(``dit_core.models.PatchEmbed``, which exercise 4 shows to be a linear layer on the patches), the fixed
sine-cosine position table (``dit_core.models.sincos_2d``) and the weights' initialisation (chapter 5 loads the
initial weights of ``dit_core``'s DiT into the reader's model, so both start alike). The real code stays in
:mod:`dit_core.models`; this module is the book's exercise, and nothing in ``dit_core`` uses it.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from dit_core.attention import Attention
from dit_core.models import Mlp, PatchEmbed, sincos_2d

__all__ = ["DiT", "DiTBlock", "FinalLayer", "LabelEmbedder", "TimestepEmbedder", "modulate", "patchify",
           "timestep_embedding", "unpatchify"]


# Exercise 4: patchify and unpatchify
def patchify(x, p):
    n, c, h, w = x.shape
    x = x.reshape(n, c, h // p, p, w // p, p)          # (image, channel, patch row, row inside, patch column, column inside)
    return x.permute(0, 2, 4, 3, 5, 1).reshape(n, (h // p) * (w // p), p * p * c)


def unpatchify(tokens, p, channels):
    n, t, _ = tokens.shape
    g = math.isqrt(t)                                   # the grid is square: g x g patches
    x = tokens.reshape(n, g, g, p, p, channels)
    return x.permute(0, 5, 1, 3, 2, 4).reshape(n, channels, g * p, g * p)


# Exercise 5: the timestep embedding
def timestep_embedding(t, dim=256, max_period=10000):
    half = dim // 2
    w = torch.exp(-math.log(max_period) * torch.arange(half, device=t.device) / half)   # w_k = 10000^(-k / half)
    angles = t[:, None].float() * w[None]
    return torch.cat([torch.cos(angles), torch.sin(angles)], dim=1)                    # cosines first


class TimestepEmbedder(nn.Module):
    def __init__(self, hidden_size, frequencies=256):
        super().__init__()
        self.frequencies = frequencies
        self.mlp = nn.Sequential(nn.Linear(frequencies, hidden_size), nn.SiLU(), nn.Linear(hidden_size, hidden_size))

    def forward(self, t):
        return self.mlp(timestep_embedding(t, self.frequencies))


# Exercise 6: the label embedding, its dropout and the null class
class LabelEmbedder(nn.Module):
    def __init__(self, num_classes, hidden_size, dropout_prob=0.1):
        super().__init__()
        self.num_classes, self.dropout_prob = num_classes, dropout_prob
        self.embedding_table = nn.Embedding(num_classes + 1, hidden_size)   # row num_classes: the null class

    def forward(self, y, drop=None):
        if drop is None and self.training:                                   # label dropout, in training only
            drop = torch.rand(y.shape, device=y.device) < self.dropout_prob
        if drop is not None:
            y = torch.where(drop, torch.full_like(y, self.num_classes), y)  # a dropped label: the null class
        return self.embedding_table(y)


# Exercise 7: the adaLN-Zero block
def modulate(x, shift, scale):
    return x * (1 + scale[:, None]) + shift[:, None]                          # one shift and scale per image


class DiTBlock(nn.Module):
    def __init__(self, hidden_size, num_heads, mlp_ratio=4.0):
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.attn = Attention(hidden_size, num_heads)
        self.norm2 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.mlp = Mlp(hidden_size, int(hidden_size * mlp_ratio))
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, 6 * hidden_size))
        nn.init.zeros_(self.adaLN_modulation[1].weight)                       # adaLN-Zero: every gate starts at 0
        nn.init.zeros_(self.adaLN_modulation[1].bias)

    def forward(self, x, c):
        shift1, scale1, gate1, shift2, scale2, gate2 = self.adaLN_modulation(c).chunk(6, dim=1)
        x = x + gate1[:, None] * self.attn(modulate(self.norm1(x), shift1, scale1))
        x = x + gate2[:, None] * self.mlp(modulate(self.norm2(x), shift2, scale2))
        return x


# Exercise 8: the final layer
class FinalLayer(nn.Module):
    def __init__(self, hidden_size, patch_size, out_channels):
        super().__init__()
        self.norm_final = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(hidden_size, patch_size * patch_size * out_channels)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, 2 * hidden_size))
        for layer in (self.linear, self.adaLN_modulation[1]):                  # zero: the new model predicts 0
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)

    def forward(self, x, c):
        shift, scale = self.adaLN_modulation(c).chunk(2, dim=1)
        return self.linear(modulate(self.norm_final(x), shift, scale))


# Exercise 9: the whole DiT
class DiT(nn.Module):
    def __init__(self, input_size=32, patch_size=2, in_channels=4, hidden_size=1152, depth=28, num_heads=16,
                 mlp_ratio=4.0, class_dropout_prob=0.1, num_classes=1000, learn_sigma=True):
        super().__init__()
        self.input_size, self.patch_size, self.in_channels = input_size, patch_size, in_channels
        self.out_channels = 2 * in_channels if learn_sigma else in_channels
        self.num_classes, self.learn_sigma = num_classes, learn_sigma
        self.x_embedder = PatchEmbed(input_size, patch_size, in_channels, hidden_size)
        self.t_embedder = TimestepEmbedder(hidden_size)
        self.y_embedder = LabelEmbedder(num_classes, hidden_size, class_dropout_prob)
        grid = input_size // patch_size                                           # fixed, never trained:
        self.pos_embed = nn.Parameter(torch.tensor(sincos_2d(hidden_size, grid), dtype=torch.float32)[None],
                                      requires_grad=False)
        self.blocks = nn.ModuleList(DiTBlock(hidden_size, num_heads, mlp_ratio) for _ in range(depth))
        self.final_layer = FinalLayer(hidden_size, patch_size, self.out_channels)

    def forward(self, x, t, y):
        tokens = self.x_embedder(x) + self.pos_embed                              # (N, T, D)
        c = self.t_embedder(t) + self.y_embedder(y)                               # (N, D): the conditioning
        for block in self.blocks:
            tokens = block(tokens, c)
        return unpatchify(self.final_layer(tokens, c), self.patch_size, self.out_channels)

"""An independent reference forward pass of DiT, written as plain tensor algebra over a state dict.

It shares no code with ``dit_core.models``: no modules, no ``nn.Linear``, no SDPA, no einsum of the library's
unpatchify. Each line follows the paper (Peebles & Xie 2023, Sec. 3.2) and the published key layout, and it runs
in float64, so it checks the library's fp32 model to round-off and its fp64 model to ~1e-12.
"""

from __future__ import annotations

import math

import torch


def _linear(x, sd, name):
    return x @ sd[name + ".weight"].T + sd[name + ".bias"]


def _layernorm(x, eps=1e-6):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps)


def _gelu_tanh(x):
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def _silu(x):
    return x / (1 + torch.exp(-x))


def reference_forward(sd: dict, x, t, y, num_heads: int, patch: int):
    """Forward pass of an official-layout DiT state dict ``sd`` in float64."""
    sd = {k: v.double() for k, v in sd.items()}
    x = x.double()
    n, c, h, w = x.shape
    hidden = sd["x_embedder.proj.weight"].shape[0]
    g = h // patch
    # patchify: each p x p patch, flattened as (channel, row, col), times the conv kernel
    patches = x.reshape(n, c, g, patch, g, patch).permute(0, 2, 4, 1, 3, 5).reshape(n, g * g, c * patch * patch)
    tokens = patches @ sd["x_embedder.proj.weight"].reshape(hidden, -1).T + sd["x_embedder.proj.bias"]
    tokens = tokens + sd["pos_embed"]
    # timestep: 256 sinusoidal features, cosines first, frequencies 10000^(-k/128)
    # (computed in float32, as the published model does: for t near 1000 fp32 angles are part of the function)
    k = torch.arange(128, dtype=torch.float32)
    ang = t.float()[:, None] * torch.exp(-math.log(10000.0) * k / 128)[None]
    temb = torch.cat([torch.cos(ang), torch.sin(ang)], dim=1).double()
    temb = _linear(_silu(_linear(temb, sd, "t_embedder.mlp.0")), sd, "t_embedder.mlp.2")
    cond = temb + sd["y_embedder.embedding_table.weight"][y]
    depth = 1 + max(int(k.split(".")[1]) for k in sd if k.startswith("blocks."))
    hd = hidden // num_heads
    for i in range(depth):
        b = f"blocks.{i}."
        mod = _linear(_silu(cond), sd, b + "adaLN_modulation.1")
        s1, sc1, g1, s2, sc2, g2 = [mod[:, j * hidden:(j + 1) * hidden][:, None, :] for j in range(6)]
        a = _layernorm(tokens) * (1 + sc1) + s1
        qkv = _linear(a, sd, b + "attn.qkv")
        q, kk, v = (qkv[..., j * hidden:(j + 1) * hidden].reshape(n, -1, num_heads, hd).transpose(1, 2) for j in range(3))
        att = torch.softmax(q @ kk.transpose(-1, -2) / math.sqrt(hd), dim=-1) @ v
        att = _linear(att.transpose(1, 2).reshape(n, -1, hidden), sd, b + "attn.proj")
        tokens = tokens + g1 * att
        m = _layernorm(tokens) * (1 + sc2) + s2
        m = _linear(_gelu_tanh(_linear(m, sd, b + "mlp.fc1")), sd, b + "mlp.fc2")
        tokens = tokens + g2 * m
    mod = _linear(_silu(cond), sd, "final_layer.adaLN_modulation.1")
    shift, scale = mod[:, :hidden][:, None], mod[:, hidden:][:, None]
    out = _linear(_layernorm(tokens) * (1 + scale) + shift, sd, "final_layer.linear")
    c_out = out.shape[-1] // (patch * patch)
    # unpatchify: token (row i, col j) holds a p x p x C_out patch laid out as (row, col, channel)
    out = out.reshape(n, g, g, patch, patch, c_out).permute(0, 5, 1, 3, 2, 4).reshape(n, c_out, g * patch, g * patch)
    return out

"""Build state dicts in the official DiT key layout (shared/reference/official_dit_state_dict.json).

The layout is taken from the published key list, not from ``dit_core``: the keys outside the blocks and of
block 0 are listed there with their XL/2 shapes, and ``blocks.1 ... blocks.N-1`` repeat block 0. We re-derive
each shape for a smaller width/depth by the rule the names imply (hidden -> hidden, 3*hidden for qkv, 6*hidden
for the block modulation, ...), and fill every tensor with random non-zero values (no adaLN-Zero zeros, so the
test exercises every weight).
"""

from __future__ import annotations

import json
import torch

from shared_reference import reference_file

REFERENCE = "official_dit_state_dict.json"

# Published layout of DiT-XL/2 (used when the shared/ folder is not beside the repository).
_XL = 1152


def published_layout() -> dict:
    """The JSON reference, or None when the shared reference folder is not found (see shared_reference.py)."""
    path = reference_file(REFERENCE)
    return json.loads(path.read_text()) if path else None


def official_shapes(hidden: int, depth: int, patch: int, in_channels: int, grid: int, num_classes: int,
                    learn_sigma: bool = True, mlp_ratio: int = 4) -> dict:
    """Key -> shape for an official-layout DiT of the given size."""
    out_ch = 2 * in_channels if learn_sigma else in_channels
    shapes = {
        "pos_embed": (1, grid * grid, hidden),
        "x_embedder.proj.weight": (hidden, in_channels, patch, patch),
        "x_embedder.proj.bias": (hidden,),
        "t_embedder.mlp.0.weight": (hidden, 256),
        "t_embedder.mlp.0.bias": (hidden,),
        "t_embedder.mlp.2.weight": (hidden, hidden),
        "t_embedder.mlp.2.bias": (hidden,),
        "y_embedder.embedding_table.weight": (num_classes + 1, hidden),
    }
    for i in range(depth):
        b = f"blocks.{i}."
        shapes.update({
            b + "attn.qkv.weight": (3 * hidden, hidden),
            b + "attn.qkv.bias": (3 * hidden,),
            b + "attn.proj.weight": (hidden, hidden),
            b + "attn.proj.bias": (hidden,),
            b + "mlp.fc1.weight": (mlp_ratio * hidden, hidden),
            b + "mlp.fc1.bias": (mlp_ratio * hidden,),
            b + "mlp.fc2.weight": (hidden, mlp_ratio * hidden),
            b + "mlp.fc2.bias": (hidden,),
            b + "adaLN_modulation.1.weight": (6 * hidden, hidden),
            b + "adaLN_modulation.1.bias": (6 * hidden,),
        })
    shapes.update({
        "final_layer.linear.weight": (patch * patch * out_ch, hidden),
        "final_layer.linear.bias": (patch * patch * out_ch,),
        "final_layer.adaLN_modulation.1.weight": (2 * hidden, hidden),
        "final_layer.adaLN_modulation.1.bias": (2 * hidden,),
    })
    return shapes


def random_state_dict(shapes: dict, seed: int = 0) -> dict:
    """Random non-zero weights scaled by 1/sqrt(fan_in), so activations stay O(1) through the blocks."""
    g = torch.Generator().manual_seed(seed)
    sd = {}
    for k, shape in shapes.items():
        fan_in = shape[1] if len(shape) == 2 and not k.endswith("embedding_table.weight") else 1
        if len(shape) == 4:
            fan_in = shape[1] * shape[2] * shape[3]
        scale = 0.5 / fan_in**0.5 if fan_in > 1 else 0.1
        if k == "pos_embed" or k.endswith("embedding_table.weight"):
            scale = 0.5
        sd[k] = torch.randn(shape, generator=g) * scale
    return sd

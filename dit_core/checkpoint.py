"""Saving and loading DiT weights safely, including the official checkpoints.

Two layouts are accepted by :func:`load_dit`:

* a bare state dict, like the released ``DiT-XL-2-256x256.pt`` / ``DiT-XL-2-512x512.pt`` (EMA weights), or a
  ``.safetensors`` file holding one;
* a training checkpoint: a dict with ``model``, ``ema``, ``opt`` and ``args`` (the official ``train.py``
  layout, ``args`` being an ``argparse.Namespace``) or with ``model``/``ema`` and a plain-data ``config``
  (ours). The EMA weights are preferred, as the paper samples from them.

A checkpoint also holds one of the four block designs of the paper's ablation (``DiT(block=...)``): it is read
off the weights' names and shapes (:func:`infer_block`), recorded in our training checkpoints' ``model_config``,
and a file of one design refuses to load into a model of another with a message that names both
(:func:`check_block_matches`). A file that does not record it (the official ones, older ones of ours) holds
adaLN-Zero, the only design DiT released.

Nothing is unpickled beyond tensors and plain containers: :func:`torch.load` runs with ``weights_only=True``
and only ``argparse.Namespace`` is allowed on top, for the official ``args``. The model's configuration is read
off the tensors' shapes, so a file never needs to be trusted to describe itself.
"""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

import torch

from .atomic import atomic_write
from .models import BLOCKS, DEFAULT_BLOCK, SIZES, DiT

_PREFIXES = ("module.", "_orig_mod.")  # DistributedDataParallel and torch.compile wrappers


class CheckpointError(ValueError):
    """A checkpoint that cannot be read, or that does not fit the model asked for."""


# ----------------------------------------------------------------------------------------------------------
# Writing
# ----------------------------------------------------------------------------------------------------------


def atomic_save(obj, path: str | os.PathLike) -> Path:
    """``torch.save`` to a temporary file in the same folder, fsync, then rename over ``path``.

    A crash or a kill at any moment leaves either the old file or the new one, never half of one.
    """
    return atomic_write(path, lambda f: torch.save(obj, f))


# ----------------------------------------------------------------------------------------------------------
# Reading
# ----------------------------------------------------------------------------------------------------------


def read_checkpoint(path: str | os.PathLike) -> dict:
    """Load a ``.pt``/``.pth``/``.safetensors`` file without arbitrary unpickling."""
    path = Path(path)
    if not path.exists():
        hint = ""
        if path.name.startswith("DiT-XL-2-"):
            hint = (" The official weights are downloaded by name from the DiT release page; put the file at this"
                    " path or pass its location.")
        raise FileNotFoundError(f"checkpoint not found: {path}.{hint}")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path), device="cpu")
    try:
        with torch.serialization.safe_globals([argparse.Namespace]):
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # pickle errors, truncated files, non-checkpoints
        raise CheckpointError(
            f"cannot read {path} as a checkpoint safely ({type(err).__name__}: {err}). Only tensors, plain "
            "containers and the official argparse.Namespace are loaded; a truncated file must be replaced."
        ) from None


def _strip_prefixes(state: dict) -> dict:
    out = {}
    for k, v in state.items():
        for prefix in _PREFIXES:
            while k.startswith(prefix):
                k = k[len(prefix):]
        out[k] = v
    return out


def extract_state_dict(ckpt: dict, prefer_ema: bool = True) -> tuple[dict, dict]:
    """Pick the model weights out of a checkpoint; returns ``(state_dict, meta)``, where ``meta`` holds the
    plain-data settings the file carries (official ``args`` or our ``config``) and which weights were taken."""
    if not isinstance(ckpt, dict):
        raise CheckpointError(f"a checkpoint must be a dict of tensors or a training dict, got {type(ckpt).__name__}")
    meta: dict = {}
    if "args" in ckpt and isinstance(ckpt["args"], argparse.Namespace):
        meta.update(vars(ckpt["args"]))
    if isinstance(ckpt.get("config"), dict) and isinstance(ckpt["config"].get("model_config"), dict):
        meta.update(ckpt["config"]["model_config"])  # dit_core training checkpoints
        meta["objective"] = ckpt["config"].get("objective", "ddpm")  # what the output means: noise, or a velocity
    order = ("ema", "model") if prefer_ema else ("model", "ema")
    for key in order:
        if isinstance(ckpt.get(key), dict):
            meta["weights"] = key
            return _strip_prefixes(ckpt[key]), meta
    if all(isinstance(v, torch.Tensor) for v in ckpt.values()):
        meta["weights"] = "state_dict"
        return _strip_prefixes(ckpt), meta
    raise CheckpointError(
        f"no model weights found: expected a state dict or a dict with 'ema'/'model' entries, got keys "
        f"{sorted(ckpt)[:8]}"
    )


#: Designs whose weights are those of another design and differ only in what they compute (a LayerNorm without
#: parameters): read off the keys, they are that design; a saved configuration tells them apart.
SAME_WEIGHTS = {"cross-attention-raw": "cross-attention"}

#: How each block design shows in a state dict: a key of block 0 that only it has, or the number of vectors its
#: adaLN layer regresses (adaLN-Zero 6: shift, scale and gate twice; adaLN 4: no gates).
_DESIGN_SIGNS = {"adaln-zero": "6 adaLN vectors per block (shift, scale, gate x 2)",
                 "adaln": "4 adaLN vectors per block (shift, scale x 2, no gates)",
                 "cross-attention": "a cross-attention layer in every block (blocks.N.cross_attn.*)",
                 "cross-attention-raw": "the cross-attention design's weights, its context read without the LayerNorm",
                 "in-context": "plain ViT blocks with learned LayerNorms and no adaLN layer"}


def block_of(config: dict | None) -> str:
    """The block design a saved configuration records; one that does not say (official files, older
    checkpoints) holds adaLN-Zero, the only design of the official code."""
    return (config or {}).get("block") or DEFAULT_BLOCK


def infer_block(state: dict) -> str:
    """The block design of a DiT state dict, read off its keys and shapes (:data:`dit_core.models.BLOCKS`)."""
    if "blocks.0.cross_attn.q.weight" in state:
        return "cross-attention"
    mod = state.get("blocks.0.adaLN_modulation.1.weight")
    if mod is not None:
        ratio = mod.shape[0] // mod.shape[1]
        if ratio == 6:
            return "adaln-zero"
        if ratio == 4:
            return "adaln"
        raise CheckpointError(f"blocks.0.adaLN_modulation regresses {ratio} vectors per block; DiT's designs regress "
                              "6 (adaLN-Zero) or 4 (adaLN)")
    if "blocks.0.norm1.weight" in state:
        return "in-context"
    return DEFAULT_BLOCK  # no blocks at all (depth 0): the default design, which then has nothing to disagree with


def check_block_matches(saved: str, wanted: str, where: str = "the checkpoint") -> None:
    """A :class:`CheckpointError` when ``where`` holds a ``saved`` design and the model is built as ``wanted``."""
    if saved != wanted:
        raise CheckpointError(
            f"{where} holds a DiT with {saved} blocks ({_DESIGN_SIGNS.get(saved, saved)}), but the model is built with "
            f"{wanted} blocks ({_DESIGN_SIGNS.get(wanted, wanted)}); the weights of one design do not fit another. "
            f"Build the model with block={saved!r} (dit-train: --block {saved}; load_dit reads the design off the "
            "file when no block is given), or start a new run for the other design."
        )


def infer_config(state: dict, num_heads: int | None = None) -> dict:
    """Read the DiT constructor arguments off the shapes of a state dict.

    Width, channels and patch size come from ``x_embedder.proj.weight``; depth from the block indices; input
    size from ``pos_embed``; output channels (so ``learn_sigma``) from ``final_layer.linear``; classes from the
    label table, whose extra row is the null class of guidance; the block design from the blocks' keys
    (:func:`infer_block`). The head count is not visible in any shape: it
    is taken from the paper's table for the standard sizes, else ``hidden_size // 64``, unless given.
    """
    try:
        hidden, in_ch, patch, _ = state["x_embedder.proj.weight"].shape
        tokens = state["pos_embed"].shape[1]
        out_ch = state["final_layer.linear.weight"].shape[0] // (patch * patch)
        mlp_hidden = state["blocks.0.mlp.fc1.weight"].shape[0]
    except KeyError as err:
        raise CheckpointError(
            f"not a DiT state dict: key {err.args[0]!r} is missing (found e.g. {sorted(state)[:5]})"
        ) from None
    depth = 1 + max(int(m.group(1)) for k in state if (m := re.match(r"blocks\.(\d+)\.", k)))
    grid = int(round(tokens**0.5))
    if grid * grid != tokens:
        raise CheckpointError(f"pos_embed holds {tokens} tokens, which is not a square grid")
    if num_heads is None:
        standard = {(s["depth"], s["hidden_size"]): s["num_heads"] for s in SIZES.values()}
        num_heads = standard.get((depth, hidden), max(1, hidden // 64))
    table = state.get("y_embedder.embedding_table.weight")
    return dict(
        input_size=grid * patch,
        patch_size=patch,
        in_channels=in_ch,
        hidden_size=hidden,
        depth=depth,
        num_heads=num_heads,
        mlp_ratio=mlp_hidden / hidden,
        class_dropout_prob=0.1 if table is not None else 0.0,
        num_classes=table.shape[0] - 1 if table is not None else 0,
        learn_sigma=out_ch == 2 * in_ch,
        block=infer_block(state),
    )


def check_block_name(block: str) -> str:
    if block not in BLOCKS:
        raise CheckpointError(f"unknown block design {block!r}; the designs are {', '.join(BLOCKS)}")
    return block


def check_state_dict(model: torch.nn.Module, state: dict) -> None:
    """Raise a :class:`CheckpointError` naming every missing, unexpected or mis-shaped key."""
    expected = model.state_dict()
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    shapes = [
        f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(v.shape)}"
        for k, v in expected.items()
        if k in state and tuple(state[k].shape) != tuple(v.shape)
    ]
    if missing or unexpected or shapes:
        parts = []
        if shapes:
            parts.append(f"{len(shapes)} shape mismatches, e.g. " + "; ".join(shapes[:6]))
        if missing:
            parts.append(f"{len(missing)} keys missing from the checkpoint, e.g. {missing[:6]}")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected keys, e.g. {unexpected[:6]}")
        raise CheckpointError(
            "checkpoint does not match the model: " + " | ".join(parts)
            + ". Is it another model size, patch size, image size or class count? Let load_dit infer the "
            "configuration (pass no size overrides) or build the matching DiT_models entry."
        )


def load_dit(
    path: str | os.PathLike,
    *,
    prefer_ema: bool = True,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    **overrides,
) -> DiT:
    """Load a DiT from an official or a dit_core checkpoint, inferring its configuration.

    ``overrides`` are :class:`DiT` constructor arguments. Those that fix shapes (``depth``, ``hidden_size``,
    ``num_classes``, ...) are checked against the file; ``num_heads``, ``class_dropout_prob``,
    ``attn_backend`` and ``grad_checkpointing`` choose what the shapes cannot tell. The model is returned in
    eval mode. Example: ``load_dit("DiT-XL-2-256x256.pt")`` gives the 256 px DiT-XL/2 with 1000 classes.
    A checkpoint whose settings say ``class_dropout_prob: 0`` has no null-class row: every row of its label
    table is a class (a bare state dict cannot say so, and is read as having the null class).
    """
    state, meta = extract_state_dict(read_checkpoint(path), prefer_ema=prefer_ema)
    config = infer_config(state, num_heads=overrides.pop("num_heads", meta.get("num_heads")))
    if "block" in meta:
        recorded = check_block_name(meta["block"])
        if SAME_WEIGHTS.get(recorded, recorded) != config["block"]:
            raise CheckpointError(f"{path} records {recorded} blocks, but its weights are those of {config['block']} "
                                  f"blocks ({_DESIGN_SIGNS[config['block']]}): the file contradicts itself; re-save it")
        config["block"] = recorded  # e.g. cross-attention-raw, whose weights read as cross-attention
    if "block" in overrides:
        check_block_matches(config["block"], check_block_name(overrides.pop("block")), where=str(path))
    if "class_dropout_prob" in meta:
        config["class_dropout_prob"] = meta["class_dropout_prob"]
        table = state.get("y_embedder.embedding_table.weight")
        if table is not None and not meta["class_dropout_prob"]:  # no null-class row: every row is a class
            config["num_classes"] = table.shape[0]
    unknown = set(overrides) - set(DiT.__init__.__code__.co_varnames[1 : DiT.__init__.__code__.co_argcount])
    if unknown:
        raise TypeError(f"unknown DiT argument(s) {sorted(unknown)} for load_dit")
    config.update(overrides)
    with torch.device("meta"):
        model = DiT(**config)
    check_state_dict(model, state)
    model.load_state_dict(state, assign=True)
    model.pos_embed.requires_grad_(False)
    model = model.to(device=device, dtype=dtype) if dtype is not None else model.to(device)
    model.checkpoint_meta = meta
    return model.eval()

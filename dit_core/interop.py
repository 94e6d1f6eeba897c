"""diffusers interop: export a DiT to a ``DiTTransformer2DModel`` + ``DiTPipeline`` folder, and import it back.

The Hugging Face port of DiT (``diffusers.DiTTransformer2DModel``) computes the same network as the paper
with other parameter names and one structural difference: each of its blocks owns a copy of the timestep and
label embedders (``transformer_blocks.i.norm1.emb``), where DiT has one shared ``t_embedder``/``y_embedder``.
The export copies the shared embedders into every block; the import takes them from block 0 and checks that
all blocks agree (a model *trained* in diffusers may have untied copies, which DiT cannot represent).

The key mapping (ours -> diffusers), written from the two state-dict layouts:

=========================================  ================================================================
``x_embedder.proj.*``                      ``pos_embed.proj.*``
``pos_embed`` (fixed sine-cosine)          not stored: diffusers recomputes it (same values, float32)
``t_embedder.mlp.0.*`` / ``mlp.2.*``       ``transformer_blocks.i.norm1.emb.timestep_embedder.linear_1/2.*``
``y_embedder.embedding_table.weight``      ``transformer_blocks.i.norm1.emb.class_embedder.embedding_table.weight``
``blocks.i.adaLN_modulation.1.*``          ``transformer_blocks.i.norm1.linear.*``
``blocks.i.attn.qkv.*`` (q, k, v stacked)  ``transformer_blocks.i.attn1.to_q/to_k/to_v.*``
``blocks.i.attn.proj.*``                   ``transformer_blocks.i.attn1.to_out.0.*``
``blocks.i.mlp.fc1.*`` / ``fc2.*``         ``transformer_blocks.i.ff.net.0.proj.*`` / ``ff.net.2.*``
``final_layer.adaLN_modulation.1.*``       ``proj_out_1.*``
``final_layer.linear.*``                   ``proj_out_2.*``
=========================================  ================================================================

Where the two implementations differ numerically (measured in ``tests/test_interop.py``):

1. **Timestep frequencies.** DiT embeds ``t`` with ``[cos(t w_k), sin(t w_k)]``, ``w_k = 10000^(-k/128)``.
   diffusers' ``Timesteps(256, flip_sin_to_cos=True, downscale_freq_shift=1)`` has the same cos-then-sin
   order but divides by ``128 - 1``: ``w_k = 10000^(-k/127)``. Every frequency is a little higher, so an
   exported model sees slightly "wrong" timesteps. :func:`match_dit_timestep_embedding` sets the shift to
   0 on a loaded transformer, after which its outputs equal ours to float rounding; the shift is not part of
   the saved config, so call it after every ``from_pretrained``.
2. **LayerNorm eps.** DiT uses 1e-6 everywhere; ``DiTTransformer2DModel`` uses 1e-6 before attention and
   ``norm_eps`` (default 1e-5) before the MLP. The export writes ``norm_eps=1e-6``; the hub's
   ``facebook/DiT-XL-2-*`` folders keep 1e-5.
3. **The null class.** ``DiTPipeline`` hard-codes the null label 1000 (ImageNet). For other class counts the
   export pads the label table to 1001 rows, every row from ``num_classes`` on holding our null embedding, so
   the pipeline's guidance works; ``dit_core.json`` records the true count and the import removes the rows.
4. **Guidance.** ``DiTPipeline`` guides all latent channels (our default, ``guidance_channels=None``), not
   the official 3 of 4; its guidance is off for ``guidance_scale <= 1``.
5. **Learned variance.** ``DiTPipeline`` drops the variance channels before the scheduler step, so a DDPM
   scheduler there samples with a fixed variance, not DiT's learned one. DDIM (eta 0) and DPM-Solver++ do
   not use the variance, and agree with our samplers.
6. **Scheduler arithmetic.** diffusers keeps the schedule in float32 (ours: float64); with the
   ``"leading"`` spacing its DDIM steps are ours (``ddimN``: 0, T/N, 2T/N, ...). Its DDIM ``clip_sample``
   clips x0 without recomputing eps (ours recomputes), so the export turns clipping off.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from .models import DiT

META_FILE = "dit_core.json"
FORMAT = "dit-core-diffusers"
PIPELINE_NULL_CLASS = 1000  # hard-coded in diffusers' DiTPipeline

_SHARED_EMBEDDERS = {  # ours -> diffusers (inside transformer_blocks.i.norm1.emb.)
    "t_embedder.mlp.0.weight": "timestep_embedder.linear_1.weight",
    "t_embedder.mlp.0.bias": "timestep_embedder.linear_1.bias",
    "t_embedder.mlp.2.weight": "timestep_embedder.linear_2.weight",
    "t_embedder.mlp.2.bias": "timestep_embedder.linear_2.bias",
    "y_embedder.embedding_table.weight": "class_embedder.embedding_table.weight",
}
_PER_BLOCK = {  # ours blocks.i.X -> diffusers transformer_blocks.i.Y
    "adaLN_modulation.1.weight": "norm1.linear.weight",
    "adaLN_modulation.1.bias": "norm1.linear.bias",
    "attn.proj.weight": "attn1.to_out.0.weight",
    "attn.proj.bias": "attn1.to_out.0.bias",
    "mlp.fc1.weight": "ff.net.0.proj.weight",
    "mlp.fc1.bias": "ff.net.0.proj.bias",
    "mlp.fc2.weight": "ff.net.2.weight",
    "mlp.fc2.bias": "ff.net.2.bias",
}
_TOP = {
    "x_embedder.proj.weight": "pos_embed.proj.weight",
    "x_embedder.proj.bias": "pos_embed.proj.bias",
    "final_layer.adaLN_modulation.1.weight": "proj_out_1.weight",
    "final_layer.adaLN_modulation.1.bias": "proj_out_1.bias",
    "final_layer.linear.weight": "proj_out_2.weight",
    "final_layer.linear.bias": "proj_out_2.bias",
}


class InteropError(ValueError):
    """A model or folder that cannot be converted, with the reason and what to do."""


# ----------------------------------------------------------------------------------------------------------
# Configurations
# ----------------------------------------------------------------------------------------------------------


def diffusers_config(config: dict, pipeline_null_class: bool = True) -> dict:
    """``DiTTransformer2DModel`` constructor arguments for a DiT configuration (``DiT.config()``)."""
    if config.get("block", "adaln-zero") != "adaln-zero":
        raise InteropError(f"DiTTransformer2DModel has adaLN-Zero blocks only; this DiT has {config['block']} blocks "
                           "(the paper's block-design ablation), which diffusers cannot hold")
    if float(config.get("mlp_ratio", 4.0)) != 4.0:
        raise InteropError(
            f"DiTTransformer2DModel has a fixed MLP ratio of 4; this DiT uses mlp_ratio={config['mlp_ratio']}"
        )
    if config["num_classes"] < 1:
        raise InteropError("DiTTransformer2DModel is class-conditional; an unconditional DiT (num_classes=0) "
                           "cannot be exported to it")
    heads = int(config["num_heads"])
    num_classes = int(config["num_classes"])
    if pipeline_null_class and num_classes < PIPELINE_NULL_CLASS:
        num_classes = PIPELINE_NULL_CLASS
    return dict(
        num_attention_heads=heads,
        attention_head_dim=int(config["hidden_size"]) // heads,
        in_channels=int(config["in_channels"]),
        out_channels=int(config["in_channels"]) * (2 if config.get("learn_sigma", True) else 1),
        num_layers=int(config["depth"]),
        sample_size=int(config["input_size"]),
        patch_size=int(config["patch_size"]),
        activation_fn="gelu-approximate",
        num_embeds_ada_norm=num_classes,
        norm_type="ada_norm_zero",
        norm_elementwise_affine=False,
        norm_eps=1e-6,
    )


def dit_config_from_diffusers(dconfig: dict, meta: dict | None = None) -> dict:
    """DiT constructor arguments for a ``DiTTransformer2DModel`` config (plus our ``dit_core.json``)."""
    meta = meta or {}
    if dconfig.get("norm_type", "ada_norm_zero") != "ada_norm_zero":
        raise InteropError(f"only adaLN-Zero DiT transformers can be imported, got norm_type={dconfig['norm_type']}")
    if dconfig.get("activation_fn", "gelu-approximate") != "gelu-approximate":
        raise InteropError(f"DiT uses the tanh GELU; this transformer uses {dconfig['activation_fn']!r}")
    heads = int(dconfig["num_attention_heads"])
    in_ch = int(dconfig["in_channels"])
    out_ch = int(dconfig.get("out_channels") or in_ch)
    return dict(
        input_size=int(dconfig["sample_size"]),
        patch_size=int(dconfig["patch_size"]),
        in_channels=in_ch,
        hidden_size=heads * int(dconfig["attention_head_dim"]),
        depth=int(dconfig["num_layers"]),
        num_heads=heads,
        mlp_ratio=4.0,
        class_dropout_prob=float(meta.get("class_dropout_prob", 0.1)),
        num_classes=int(meta.get("num_classes", dconfig["num_embeds_ada_norm"])),
        learn_sigma=out_ch == 2 * in_ch,
    )


# ----------------------------------------------------------------------------------------------------------
# State dicts
# ----------------------------------------------------------------------------------------------------------


def to_diffusers_state_dict(state: dict, config: dict, pipeline_null_class: bool = True) -> dict:
    """Rename and split a DiT state dict into ``DiTTransformer2DModel``'s layout (see the module table).

    The label table gets the null row diffusers always has (``num_classes + 1`` rows) and, with
    ``pipeline_null_class``, is padded to 1001 rows so that ``DiTPipeline``'s null label 1000 is our null class.
    """
    hidden, depth, num_classes = int(config["hidden_size"]), int(config["depth"]), int(config["num_classes"])
    out = {new: state[old] for old, new in _TOP.items()}
    table = state["y_embedder.embedding_table.weight"]
    if table.shape[0] == num_classes:  # trained without label dropout: no null row, add a zero one
        table = torch.cat([table, torch.zeros_like(table[:1])])
    target_rows = diffusers_config(config, pipeline_null_class)["num_embeds_ada_norm"] + 1
    if target_rows > table.shape[0]:
        null = table[num_classes : num_classes + 1]
        table = torch.cat([table[:num_classes], null.expand(target_rows - num_classes, -1)]).clone()
    shared = {new: state[old] for old, new in _SHARED_EMBEDDERS.items() if old != "y_embedder.embedding_table.weight"}
    shared["class_embedder.embedding_table.weight"] = table
    for i in range(depth):
        ours, theirs = f"blocks.{i}.", f"transformer_blocks.{i}."
        for name, value in shared.items():
            out[theirs + "norm1.emb." + name] = value.clone()
        for old, new in _PER_BLOCK.items():
            out[theirs + new] = state[ours + old]
        for kind in ("weight", "bias"):
            q, k, v = state[ours + f"attn.qkv.{kind}"].split(hidden, dim=0)
            out[theirs + f"attn1.to_q.{kind}"] = q.clone()
            out[theirs + f"attn1.to_k.{kind}"] = k.clone()
            out[theirs + f"attn1.to_v.{kind}"] = v.clone()
    return out


def from_diffusers_state_dict(dstate: dict, config: dict, atol: float = 0.0) -> dict:
    """The inverse of :func:`to_diffusers_state_dict`: a DiT state dict (``pos_embed`` recomputed).

    The per-block embedder copies must agree (to ``atol``); DiT has one shared timestep and label embedder.
    """
    depth, num_classes = int(config["depth"]), int(config["num_classes"])
    out = {old: dstate[new] for old, new in _TOP.items()}
    for old, new in _SHARED_EMBEDDERS.items():
        first = dstate[f"transformer_blocks.0.norm1.emb.{new}"]
        for i in range(1, depth):
            other = dstate[f"transformer_blocks.{i}.norm1.emb.{new}"]
            if not torch.allclose(first.float(), other.float(), atol=atol, rtol=0):
                raise InteropError(
                    f"block {i} has its own {new} (max difference {float((first - other).abs().max()):.3g} from "
                    "block 0): this transformer was trained with untied per-block embedders, which DiT's single "
                    "shared embedder cannot hold"
                )
        out[old] = first
    table = out["y_embedder.embedding_table.weight"]
    keep = num_classes + (1 if float(config.get("class_dropout_prob", 0.1)) > 0 else 0)
    if table.shape[0] > num_classes + 1:  # padded for DiTPipeline: rows num_classes..1000 are the null class
        table = torch.cat([table[:num_classes], table[-1:]])
    out["y_embedder.embedding_table.weight"] = table[:keep].clone()
    for i in range(depth):
        ours, theirs = f"blocks.{i}.", f"transformer_blocks.{i}."
        for old, new in _PER_BLOCK.items():
            out[ours + old] = dstate[theirs + new]
        for kind in ("weight", "bias"):
            out[ours + f"attn.qkv.{kind}"] = torch.cat(
                [dstate[theirs + f"attn1.to_{p}.{kind}"] for p in ("q", "k", "v")], dim=0
            )
    return out


# ----------------------------------------------------------------------------------------------------------
# Models
# ----------------------------------------------------------------------------------------------------------


def match_dit_timestep_embedding(transformer) -> object:
    """Make a diffusers DiT embed timesteps exactly as DiT does (``w_k = 10000^(-k/128)``, not ``/127``).

    Sets ``downscale_freq_shift = 0`` on every block's ``Timesteps`` module, in place; returns the model. The
    setting lives on the module only, so apply it again after each ``from_pretrained``.
    """
    count = 0
    for module in transformer.modules():
        if type(module).__name__ == "Timesteps" and hasattr(module, "downscale_freq_shift"):
            module.downscale_freq_shift = 0
            count += 1
    if count == 0:
        raise InteropError("no diffusers Timesteps module found: is this a DiTTransformer2DModel?")
    return transformer


def to_diffusers_transformer(model: DiT, pipeline_null_class: bool = True, match_timesteps: bool = False):
    """A ``diffusers.DiTTransformer2DModel`` holding the weights of ``model`` (in its dtype, on the CPU)."""
    from diffusers import DiTTransformer2DModel

    config = model.config()
    dconfig = diffusers_config(config, pipeline_null_class)
    transformer = DiTTransformer2DModel(**dconfig)
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    dstate = to_diffusers_state_dict(state, config, pipeline_null_class)
    missing, unexpected = transformer.load_state_dict(dstate, strict=False)
    if missing or unexpected:  # a diffusers version with other names: say which, rather than load garbage
        raise InteropError(f"diffusers layout changed: missing {missing[:5]}, unexpected {unexpected[:5]}")
    dtype = next(model.parameters()).dtype
    if dtype != torch.float32:
        transformer = transformer.to(dtype)
    transformer = transformer.eval()
    return match_dit_timestep_embedding(transformer) if match_timesteps else transformer


def from_diffusers_transformer(transformer, meta: dict | None = None, **overrides) -> DiT:
    """Our :class:`DiT` with the weights of a ``DiTTransformer2DModel`` (``meta``: our ``dit_core.json``)."""
    config = dit_config_from_diffusers(dict(transformer.config), meta)
    config.update(overrides)
    state = from_diffusers_state_dict(transformer.state_dict(), config)
    model = DiT(**config)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or set(missing) - {"pos_embed"}:
        raise InteropError(f"cannot map the transformer: missing {missing[:5]}, unexpected {unexpected[:5]}")
    return model.eval()


# ----------------------------------------------------------------------------------------------------------
# Pipeline folders
# ----------------------------------------------------------------------------------------------------------


def make_scheduler(
    kind: str = "ddim",
    num_train_timesteps: int = 1000,
    noise_schedule: str = "linear",
    clip_sample: bool = False,
):
    """A diffusers scheduler for DiT's training process: linear betas 1e-4..0.02 over 1000 steps, eps target.

    ``kind``: ``"ddim"`` (DDIMScheduler, "leading" spacing: the steps of our ``ddimN``), ``"ddpm"``
    (DDPMScheduler; in DiTPipeline it runs with a fixed variance) or ``"dpm-solver++"``
    (DPMSolverMultistepScheduler, second order).
    """
    from diffusers import DDIMScheduler, DDPMScheduler, DPMSolverMultistepScheduler

    schedule = {"linear": "linear", "squaredcos_cap_v2": "squaredcos_cap_v2", "cosine": "squaredcos_cap_v2"}
    if noise_schedule not in schedule:
        raise InteropError(f"unknown noise_schedule {noise_schedule!r}; choose 'linear' or 'squaredcos_cap_v2'")
    scale = 1000 / num_train_timesteps
    common = dict(num_train_timesteps=num_train_timesteps, beta_start=0.0001 * scale, beta_end=0.02 * scale,
                  beta_schedule=schedule[noise_schedule], prediction_type="epsilon")
    kind = kind.lower()
    if kind == "ddim":
        return DDIMScheduler(**common, clip_sample=clip_sample, set_alpha_to_one=True, steps_offset=0,
                             timestep_spacing="leading")
    if kind == "ddpm":
        return DDPMScheduler(**common, clip_sample=clip_sample, variance_type="fixed_small")
    if kind == "dpm-solver++":
        return DPMSolverMultistepScheduler(**common, algorithm_type="dpmsolver++", solver_order=2,
                                           lower_order_final=True, timestep_spacing="linspace")
    raise InteropError(f"unknown scheduler {kind!r}; choose 'ddim', 'ddpm' or 'dpm-solver++'")


def export_diffusers(
    model: DiT,
    out_dir: str | os.PathLike,
    *,
    vae=None,
    label_names: list[str] | dict | None = None,
    scheduler: str = "ddim",
    noise_schedule: str = "linear",
    diffusion_steps: int = 1000,
    pipeline_null_class: bool = True,
    overwrite: bool = False,
    objective: str | None = None,
) -> Path:
    """Write ``model`` as a diffusers ``DiTPipeline`` folder (``save_pretrained`` layout); returns the folder.

    ``out_dir/model_index.json`` (with ``id2label``), ``transformer/`` (config + safetensors),
    ``scheduler/``, ``vae/`` when a VAE is given (an ``AutoencoderKL`` or a name/path for
    :func:`dit_core.vae.load_vae`), and ``dit_core.json`` with what diffusers' config cannot say (the
    true class count, the label names, pixel or latent space). Without a VAE (a pixel-space model such as
    the digits default), load it with ``DiTPipeline.from_pretrained(out_dir, vae=PixelDecoder())``.

    ``objective``: what the model was trained for (default: what its checkpoint recorded, else "ddpm"). A model
    of ``objective: flow`` is refused: it predicts the velocity of the linear interpolant, and ``DiTPipeline``
    hands the transformer's output to its scheduler as DDPM noise.
    """
    from diffusers import DiTPipeline

    objective = objective or getattr(model, "checkpoint_meta", {}).get("objective") or "ddpm"
    if objective != "ddpm":
        raise InteropError(
            f"this model was trained with objective {objective!r}: it predicts the velocity of the linear interpolant "
            "(x_t = (1 - t) x_0 + t eps), but diffusers' DiTPipeline reads the transformer's output as DDPM noise "
            "(epsilon) for its DDIM/DDPM/DPM-Solver schedulers, so an export would sample garbage. Sample it with "
            "dit-sample (samplers euler, heun, euler-maruyama) instead"
        )

    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        if not overwrite:
            raise FileExistsError(f"{out_dir} exists and is not empty; pass overwrite=True (--overwrite) to replace it")
    if isinstance(vae, (str, os.PathLike)):
        from .vae import load_vae

        vae = load_vae(vae)
    config = model.config()
    names = _label_names(label_names, config["num_classes"])
    transformer = to_diffusers_transformer(model, pipeline_null_class)
    sched = make_scheduler(scheduler, diffusion_steps, noise_schedule)
    pipe = DiTPipeline(transformer=transformer, vae=vae, scheduler=sched, id2label=names)
    pipe.register_to_config(id2label={str(k): v for k, v in names.items()})

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        if vae is None:  # save_pretrained refuses None components: save the two that exist by hand
            transformer.save_pretrained(tmp / "transformer")
            sched.save_pretrained(tmp / "scheduler")
            pipe.save_config(tmp)
        else:
            pipe.save_pretrained(tmp)
        meta = dict(
            format=FORMAT, version=1, num_classes=config["num_classes"],
            class_dropout_prob=config["class_dropout_prob"], num_heads=config["num_heads"],
            space="latent" if vae is not None else "pixel", label_names=[names[i] for i in range(len(names))],
            pipeline_null_class=bool(pipeline_null_class and config["num_classes"] < PIPELINE_NULL_CLASS),
            note="dit_core export; call dit_core.interop.match_dit_timestep_embedding(pipe.transformer) for "
                 "DiT's exact timestep embedding",
        )
        (tmp / META_FILE).write_text(json.dumps(meta, indent=1))
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def is_diffusers_folder(path: str | os.PathLike) -> bool:
    """True for a DiTPipeline folder (``model_index.json``) or a bare transformer folder (``config.json``)."""
    path = Path(path)
    return path.is_dir() and ((path / "model_index.json").is_file() or (path / "transformer" / "config.json").is_file()
                              or (path / "config.json").is_file())


def read_meta(path: str | os.PathLike) -> dict:
    """``dit_core.json`` plus the pipeline's ``id2label`` (empty dict for folders from elsewhere)."""
    path = Path(path)
    meta = json.loads((path / META_FILE).read_text()) if (path / META_FILE).is_file() else {}
    index = path / "model_index.json"
    if index.is_file() and "label_names" not in meta:
        id2label = json.loads(index.read_text()).get("id2label") or {}
        if id2label:
            meta["label_names"] = [id2label[k] for k in sorted(id2label, key=int)]
    return meta


def load_diffusers(
    path: str | os.PathLike,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    **overrides,
) -> DiT:
    """Import a diffusers DiT folder (a ``DiTPipeline`` folder or its ``transformer/``) as our :class:`DiT`.

    Works for our exports and for the hub's ``facebook/DiT-XL-2-256`` once downloaded. The returned model
    carries ``checkpoint_meta`` with ``label_names``, ``vae`` (the folder's ``vae/`` if any) and ``space``.
    """
    from diffusers import DiTTransformer2DModel

    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"diffusers folder not found: {path}")
    sub = "transformer" if (path / "transformer" / "config.json").is_file() else None
    if sub is None and not (path / "config.json").is_file():
        raise InteropError(f"{path} holds neither transformer/config.json nor config.json; is it a DiTPipeline folder?")
    meta = read_meta(path)
    kwargs = {} if dtype is None else {"torch_dtype": dtype}
    try:
        transformer = DiTTransformer2DModel.from_pretrained(path, subfolder=sub, low_cpu_mem_usage=False, **kwargs)
    except (OSError, ValueError) as err:
        raise InteropError(f"cannot load the diffusers transformer in {path}: {err}") from None
    model = from_diffusers_transformer(transformer, meta, **overrides).to(device)
    if dtype is not None:
        model = model.to(dtype)
    model.checkpoint_meta = dict(
        meta, weights="diffusers", source=str(path),
        vae=str(path / "vae") if (path / "vae" / "config.json").is_file() else None,
    )
    return model


class PixelDecoder(torch.nn.Module):
    """A stand-in "VAE" for pixel-space models in ``DiTPipeline``: ``decode(x).sample`` is ``x`` itself.

    ``DiTPipeline.from_pretrained(folder, vae=PixelDecoder())`` then returns the model's pixels, mapped from
    [-1, 1] to [0, 1] by the pipeline as usual.
    """

    class _Config(dict):
        __getattr__ = dict.get

    class _Decoded:
        def __init__(self, sample):
            self.sample = sample

    def __init__(self):
        super().__init__()
        self.config = self._Config(scaling_factor=1.0)
        self.register_buffer("_anchor", torch.zeros(()), persistent=False)  # gives the module a device/dtype

    @property
    def dtype(self):
        return self._anchor.dtype

    @property
    def device(self):
        return self._anchor.device

    def decode(self, z, return_dict: bool = True):
        return self._Decoded(z) if return_dict else (z,)


def _label_names(label_names, num_classes: int) -> dict[int, str]:
    if label_names is None:
        return {i: str(i) for i in range(num_classes)}
    if isinstance(label_names, dict):
        names = {int(k): str(v) for k, v in label_names.items()}
    else:
        names = {i: str(v) for i, v in enumerate(label_names)}
    if sorted(names) != list(range(num_classes)):
        raise InteropError(f"label_names must name each of the {num_classes} classes once, got {len(names)} names")
    return names

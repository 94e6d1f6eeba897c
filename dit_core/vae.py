"""The VAE of latent DiT: Stable Diffusion's autoencoder, loaded, built at random, encoding and decoding.

DiT is a latent diffusion model: it denoises the 4 x H/8 x W/8 latents of Stable Diffusion's VAE, not pixels
(Peebles & Xie 2023, Sec. 3; Rombach et al. 2022). The encoder gives a Gaussian posterior per image; its
mean and std times :data:`LATENT_SCALE` (0.18215, the constant that gives SD-VAE latents roughly unit
variance) are what the diffusion sees, and the decoder turns denoised latents, divided by it again, into
images.

* :func:`load_vae`: a diffusers ``AutoencoderKL`` from a hub id, a short name (``"ema"``, ``"mse"``: the two
  VAEs the official code chooses between) or a local folder; offline, missing weights say how to provide them;
* :func:`random_vae`: a randomly initialised one of SD's architecture (:data:`SD_VAE_CONFIG`) or a tiny one
  for tests. A VAE's speed, shapes and memory do not depend on its weights, so timings with random weights are
  real timings (its pictures are not); :func:`load_vae_or_random` falls back to one when the named VAE cannot
  be loaded, and says so;
* :func:`encode_moments` / :func:`sample_latents`: the posterior's scaled mean and std, or one draw from it;
* :func:`decode_latents`: latents to images, in slices and tiles so that large batches fit in memory;
* :func:`compare_precisions`: how much reduced-precision encoding changes the latents.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import torch

from .runtime import DTYPES, autocast

#: Rombach et al. (2022): 1 / std of SD-VAE latents on their training data; the official code multiplies by it.
LATENT_SCALE = 0.18215
#: The two SD VAEs the official code uses, by the names of its ``--vae`` flag.
SD_VAES = {"ema": "stabilityai/sd-vae-ft-ema", "mse": "stabilityai/sd-vae-ft-mse"}
DEFAULT_VAE = SD_VAES["ema"]  # what the official train.py encodes with (and what dit_core extracts with)
OFFICIAL_VAE = SD_VAES["mse"]  # what the official sample.py decodes with by default

#: The architecture of Stable Diffusion's VAE (``stabilityai/sd-vae-ft-ema``), as diffusers' AutoencoderKL
#: arguments: 83.65 M parameters, 8x downsampling to 4 latent channels.
SD_VAE_CONFIG = dict(
    in_channels=3,
    out_channels=3,
    down_block_types=["DownEncoderBlock2D"] * 4,
    up_block_types=["UpDecoderBlock2D"] * 4,
    block_out_channels=[128, 256, 512, 512],
    layers_per_block=2,
    latent_channels=4,
    norm_num_groups=32,
    sample_size=256,
    act_fn="silu",
)
#: The same 8x downsampling (4 blocks) with 8-16 channels instead of 128-512: for smoke runs and tests, where
#: only shapes and code paths matter.
TINY_VAE_CONFIG = dict(SD_VAE_CONFIG, layers_per_block=1, norm_num_groups=4, block_out_channels=[8, 8, 16, 16])
ARCHITECTURES = {"sd": SD_VAE_CONFIG, "tiny": TINY_VAE_CONFIG}


class VAENotFoundError(FileNotFoundError):
    """The VAE weights are neither in a local folder nor in the Hugging Face cache, and cannot be fetched."""


# ----------------------------------------------------------------------------------------------------------
# Loading and building
# ----------------------------------------------------------------------------------------------------------


def load_vae(
    name_or_path: str | os.PathLike = DEFAULT_VAE,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    local_files_only: bool | None = None,
):
    """Load a diffusers ``AutoencoderKL`` from a hub id or a local folder, in eval mode.

    A local folder is one written by ``save_pretrained`` (``config.json`` + weights), or a whole
    Stable Diffusion pipeline folder (its ``vae/`` sub-folder is used). A hub id (or ``"ema"``/``"mse"``,
    the official code's names for the two SD VAEs) is looked up in the local Hugging Face cache first and
    downloaded only when it is missing there and ``local_files_only`` is not true. Missing weights raise
    :class:`VAENotFoundError` with the two ways to provide them.
    """
    try:
        from diffusers import AutoencoderKL
    except ImportError as err:  # pragma: no cover - diffusers is a dependency
        raise ImportError("loading the VAE needs diffusers: pip install diffusers") from err

    name = str(name_or_path)
    path = Path(name).expanduser()
    if path.exists():
        if not path.is_dir():
            raise VAENotFoundError(
                f"VAE path {name!r} is a file; pass the folder that holds config.json and the weights"
            )
        subfolder = None
        if not (path / "config.json").is_file():
            if (path / "vae" / "config.json").is_file():
                subfolder = "vae"
            else:
                raise VAENotFoundError(
                    f"VAE folder {name!r} has no config.json; it must be a folder written by "
                    "AutoencoderKL.save_pretrained or by `huggingface-cli download <id> --local-dir <folder>`"
                )
        vae = AutoencoderKL.from_pretrained(path, subfolder=subfolder, **_load_kwargs(dtype))
    else:
        name = SD_VAES.get(name, name)
        if name.startswith((".", "/", "~")) or name.count("/") != 1:
            raise VAENotFoundError(
                f"VAE {name!r} is neither an existing folder nor a hub id of the form 'owner/name' "
                f"(the default is {DEFAULT_VAE!r})"
            )
        vae = _from_hub(AutoencoderKL, name, local_files_only, _load_kwargs(dtype))
    return vae.to(device).eval().requires_grad_(False)


def _load_kwargs(dtype: torch.dtype) -> dict:
    kwargs = {"torch_dtype": dtype}
    try:
        import accelerate  # noqa: F401 - diffusers loads faster with it
    except ImportError:
        kwargs["low_cpu_mem_usage"] = False  # say so, instead of diffusers warning about it
    return kwargs


def _from_hub(cls, name: str, local_files_only: bool | None, kwargs: dict):
    try:  # the cache first: no network when the weights are already here
        return cls.from_pretrained(name, local_files_only=True, **kwargs)
    except (OSError, ValueError) as err:
        cached_error = err
    offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")
    if not (local_files_only or offline):
        try:
            return cls.from_pretrained(name, **kwargs)
        except Exception as err:  # noqa: BLE001 - network, auth and missing-repo errors alike
            cached_error = err
    raise VAENotFoundError(
        f"could not load the VAE {name!r}: it is not in the local Hugging Face cache"
        + (" and downloading is switched off" if (local_files_only or offline) else " and could not be downloaded")
        + f" ({type(cached_error).__name__}: {str(cached_error).splitlines()[0][:200] if str(cached_error) else ''}).\n"
        "Provide the weights in one of two ways:\n"
        f"  1. on a machine with internet: `huggingface-cli download {name} --local-dir ./{name.split('/')[-1]}`\n"
        f"     (`hf download ...` in huggingface_hub 1.0 and later), copy that folder here and pass its path\n"
        f"     instead of the id (--vae ./{name.split('/')[-1]});\n"
        f"  2. or fill the cache here (run the same download with network access, or point HF_HOME at a\n"
        f"     cache that holds {name}) and pass the id again."
    ) from cached_error


def random_vae(architecture: str = "sd", seed: int = 0, device: str | torch.device = "cpu"):
    """A randomly initialised ``AutoencoderKL`` in eval mode: ``"sd"`` has Stable Diffusion's architecture
    (:data:`SD_VAE_CONFIG`, 83.7 M parameters), ``"tiny"`` the 8-16 channel one (:data:`TINY_VAE_CONFIG`).
    Same shapes and cost as a trained one; it reconstructs nothing."""
    from diffusers import AutoencoderKL

    if architecture not in ARCHITECTURES:
        raise ValueError(f"architecture must be 'sd' or 'tiny', got {architecture!r}")
    torch.manual_seed(seed)
    with torch.device(device):
        vae = AutoencoderKL(**ARCHITECTURES[architecture])
    return vae.eval().requires_grad_(False)


def load_vae_or_random(name: str | os.PathLike | None, device: str | torch.device = "cpu", download: bool = False,
                       fallback: str = "sd") -> tuple[object, str, bool]:
    """``(vae, description, pretrained)``: the VAE ``name`` if it can be loaded, else a randomly initialised
    one of architecture ``fallback`` (:func:`random_vae`), for timing and for pictures that need not be real.

    ``download=False`` never touches the network: a hub id must already be in the Hugging Face cache. When the
    named VAE cannot be loaded, the description gives the reason in one line and ``pretrained`` is False.
    """
    description = f"random-init AutoencoderKL ({fallback!r} architecture)"
    if not name:
        return random_vae(fallback, device=device), description, False
    try:
        with warnings.catch_warnings():  # noise from huggingface_hub about an argument diffusers passes
            warnings.filterwarnings("ignore", message=".*local_dir_use_symlinks.*")
            vae = load_vae(name, device=device, local_files_only=not download)
        return vae, f"{name} (pretrained weights)", True
    except (VAENotFoundError, OSError, ValueError) as err:
        reason = str(err).splitlines()[0]
        reason = reason if len(reason) <= 200 else reason[:197] + "..."
        return random_vae(fallback, device=device), f"{description}: {name} could not be loaded ({reason})", False


def downsample_factor(vae) -> int:
    """Pixels per latent cell along one side: 2 ** (number of encoder blocks - 1), 8 for SD's VAE."""
    return 2 ** (len(vae.config.block_out_channels) - 1)


def vae_scale(vae) -> float:
    """The latent scale factor from the VAE's config (0.18215 for SD 1.x VAEs and diffusers' default)."""
    return float(getattr(vae.config, "scaling_factor", None) or LATENT_SCALE)


# ----------------------------------------------------------------------------------------------------------
# Encoding and decoding
# ----------------------------------------------------------------------------------------------------------


@torch.no_grad()
def encode_moments(vae, x: torch.Tensor, precision: str = "fp32", scale: float = LATENT_SCALE,
                   retry_in_fp32: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Posterior mean and std of images ``x`` (N, 3, H, W) in [-1, 1], times ``scale``, as float32.

    ``precision`` runs the encoder under autocast ("bf16", "fp16") or in full fp32. With ``retry_in_fp32`` a
    batch that comes out non-finite in reduced precision (fp16 overflow) is encoded again in fp32 (a check
    that waits for the result: latent extraction does it, a training step does not).
    """
    if precision not in DTYPES:
        raise ValueError(f"precision must be one of {', '.join(DTYPES)}, got {precision!r}")
    with autocast(x.device, precision):
        dist = vae.encode(x.to(next(vae.parameters()).dtype)).latent_dist
    mean = dist.mean.float()
    std = torch.exp(0.5 * dist.logvar.float())
    if retry_in_fp32 and precision != "fp32" and not (torch.isfinite(mean).all() and torch.isfinite(std).all()):
        warnings.warn(f"non-finite latents in {precision}; this batch was encoded again in fp32", stacklevel=2)
        return encode_moments(vae, x, "fp32", scale)
    return mean * scale, std * scale


def sample_latents(vae, x: torch.Tensor, precision: str = "fp32", scale: float = LATENT_SCALE) -> torch.Tensor:
    """One posterior draw ``mean + std * noise`` of the scaled latents of images ``x``: what a training step
    with the VAE in the loop trains on (the official ``vae.encode(x).latent_dist.sample() * 0.18215``)."""
    mean, std = encode_moments(vae, x, precision, scale, retry_in_fp32=False)
    return mean + std * torch.randn_like(std)


@torch.no_grad()
def decode_latents(vae, z: torch.Tensor, scale: float | None = None, batch_size: int | None = None,
                   tiling: bool | None = None) -> torch.Tensor:
    """Images in [-1, 1] (float32, on the CPU) from scaled latents ``z`` (N, C, H/8, W/8): the inverse of
    :func:`encode_moments`. ``scale`` defaults to the VAE's own (:func:`vae_scale`).

    Decodes ``batch_size`` latents at a time ("slicing": the peak memory of one slice, not of the whole batch),
    with tiled decoding when ``tiling`` (default: latents of 64 and up, i.e. 512 px images).
    """
    scale = float(scale if scale is not None else vae_scale(vae))
    if tiling is None:
        tiling = z.shape[-1] >= 64
    if tiling and hasattr(vae, "enable_tiling"):
        vae.enable_tiling()
    elif hasattr(vae, "disable_tiling"):
        vae.disable_tiling()
    param = next(vae.parameters())
    batch_size = batch_size or len(z)
    images = []
    for s in range(0, len(z), batch_size):
        zs = z[s : s + batch_size].to(param.device, param.dtype) / scale
        images.append(vae.decode(zs).sample.float().clamp(-1, 1).cpu())
    return torch.cat(images)


@torch.no_grad()
def compare_precisions(vae, x: torch.Tensor, precisions=("bf16", "fp16"), scale: float = LATENT_SCALE) -> dict:
    """Latent error of reduced-precision encoding against fp32, for choosing the extraction precision.

    For each precision: ``rel_rms`` (rms of the mean's error / rms of the fp32 mean), ``max_abs`` (largest
    error, scaled units), and ``vs_std`` (rms error / rms posterior std: below 1 the error is smaller than
    the noise of one posterior draw, which training adds anyway).
    """
    ref_mean, ref_std = encode_moments(vae, x, "fp32", scale)
    rms = lambda t: float(t.pow(2).mean().sqrt())  # noqa: E731
    out = {}
    for p in precisions:
        mean, _ = encode_moments(vae, x, p, scale)
        err = mean - ref_mean
        out[p] = {
            "rel_rms": rms(err) / rms(ref_mean),
            "max_abs": float(err.abs().max()),
            "vs_std": rms(err) / rms(ref_std),
        }
    return out

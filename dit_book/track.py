"""The book's two tracks through the same chapters, and what the GPU track costs.

Each chapter's ``parameters`` cell has ``TRACK = "auto"``: the **GPU track** when torch sees a CUDA GPU (Imagenette
with ImageNet-1k labels in chapter 01, its ``sd-vae-ft-ema`` latents in chapter 02, DiT-B/2 trained for a budget of
minutes in chapter 05, samples and FID of that model and of the official DiT-XL/2 in chapter 07), the **CPU track**
otherwise (the digits). ``TRACK = "gpu"`` forces the GPU track's cells; the smoke tests do that on a CPU with tiny
stand-ins (:func:`standins`) so that every GPU cell runs before a reader meets it.

This module holds what those cells share:

* :func:`choose_track`, and the stand-ins for offline runs (:func:`standins`);
* the chain data -> latents -> run, each step reusing what exists (:func:`gpu_data`, :func:`gpu_latents`,
  :func:`train_for`), so that any chapter can build what it needs when an earlier one did not run;
* :func:`card_peak` and :func:`costs`: the GPU time of each chapter, **estimated** from the measured H200 records
  (``benchmarks/results/gpu-ladder-h200.md``) scaled by each card's dense 16-bit peak, until measured;
* :func:`fid_samples_within` and :func:`latents_within`: the two cells that a small card would keep past the
  book's time limit for one cell (:data:`CELL_TIMEOUT_S`), sized to stay within it: chapter 07's FID sample count
  from the card's estimate, chapter 02's extraction in legs timed on the machine itself;
* :func:`sample_uint8` and :func:`real_images`: the image arrays FID compares.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import torch

TRACKS = ("auto", "cpu", "gpu")


def choose_track(track: str = "auto") -> str:
    """``"gpu"`` or ``"cpu"``: ``"auto"`` is the GPU track when torch sees a CUDA GPU."""
    track = str(track).lower()
    if track not in TRACKS:
        raise ValueError(f"TRACK must be one of {', '.join(TRACKS)}, got {track!r}")
    if track == "auto":
        return "gpu" if torch.cuda.is_available() else "cpu"
    return track


def auto(value, default):
    """``default`` when ``value`` is ``"auto"``, else ``value``."""
    return default if isinstance(value, str) and value == "auto" else value


# ----------------------------------------------------------------------------------------------------------
# GPU time: peaks, the measured H200 records, and the estimates built on them
# ----------------------------------------------------------------------------------------------------------

#: Dense 16-bit tensor peaks in TFLOP/s (bf16, or fp16 on cards without bf16), by a substring of the device name.
#: Sources: NVIDIA datasheets and the copies collected in the project's research notes (facts.md, section 8);
#: the RTX 3060 figure is derived from its SM count and clock, not quoted.
GPU_PEAKS = (
    ("H200", 989.0), ("H100 PCIe", 756.0), ("H100", 989.0), ("A100", 312.0), ("L40S", 362.0), ("L4", 121.0),
    ("4090", 165.2), ("3090", 71.0), ("3060", 25.5), ("V100", 125.0), ("T4", 65.0),
)
H200_PEAK = 989.0

#: Multiply-adds of one forward pass at 256 px (DiT: paper Table 4; the SD VAE: counted by PyTorch's FLOP counter).
GMACS = {"DiT-B/2": 23.0, "DiT-XL/2": 118.6, "vae_encoder": 136.4, "vae_decoder": 311.1}
#: What the H200 measured (benchmarks/results/gpu-ladder-h200.md, 2026-11-29), the anchors of every estimate.
H200_RECORDS = {
    # dit-train, profile rtx3090-24gb (DiT-XL/2, bf16, every block checkpointed): 195.9 img/s over its last 10 steps.
    # Checkpointing adds one forward (4/3 of 6 x 118.6 GFLOP per image): 186 TFLOP/s, 18.8 % of the peak.
    "trainer_mfu": 195.9 * 6 * GMACS["DiT-XL/2"] * 1e9 * 4 / 3 / (H200_PEAK * 1e12),
    # sampling DiT-XL/2: 250 DDPM steps with guidance (two passes per step), batch 16, bf16: 8.49 s denoising.
    "xl2_guided_step_s": 8.49 / 16 / 250,
    # the SD VAE decoder on the same 16 images: 0.10 s.
    "vae_decode_s": 0.10 / 16,
}
#: Imagenette's image counts (train, val).
IMAGENETTE_IMAGES = (9469, 3925)


def card_peak(name: str | None) -> float | None:
    """The dense 16-bit peak (TFLOP/s) of a card named ``name`` (as torch reports it), or None if unknown."""
    if not name:
        return None
    for pattern, peak in GPU_PEAKS:
        if pattern.lower() in name.lower():
            return peak
    return None


def train_images_per_s(model: str, peak: float) -> float:
    """Estimated training images/s of ``model`` at 256 px: the trainer's utilisation measured on the H200
    (:data:`H200_RECORDS`) applied to ``peak``. Smaller models usually reach a lower utilisation, so for DiT-B/2
    this leans optimistic."""
    return H200_RECORDS["trainer_mfu"] * peak * 1e12 / (6 * GMACS[model] * 1e9)


def sample_seconds(model: str, images: int, steps: int, peak: float, guided: bool = True, decode: bool = True) -> float:
    """Estimated seconds to sample ``images`` at 256 px with ``steps`` model steps (two passes each when
    ``guided``), plus the VAE decode: the H200's measured DiT-XL/2 sampling scaled by multiply-adds and peak."""
    per_step = H200_RECORDS["xl2_guided_step_s"] * GMACS[model] / GMACS["DiT-XL/2"] * (1.0 if guided else 0.5)
    seconds = images * steps * per_step + (images * H200_RECORDS["vae_decode_s"] if decode else 0.0)
    return seconds * H200_PEAK / peak


def encode_seconds(images: int, peak: float) -> float:
    """Estimated seconds to encode ``images`` at 256 px with both flips (two encoder passes each): the H200's
    measured decode time scaled by the encoder's share of the multiply-adds, then by peak."""
    per_pass = H200_RECORDS["vae_decode_s"] * GMACS["vae_encoder"] / GMACS["vae_decoder"]
    return 2 * images * per_pass * H200_PEAK / peak


#: The GPU track's default sizes: what its chapters run when nothing is changed.
DEFAULTS = dict(train_minutes=15.0, fid_samples=2000, fid_steps=25, picture_steps=250, classes=10, per_class=2,
                guidance=(1.0, 1.5, 4.0))


#: The book's time limit for one cell in seconds (``_config.yml``: ``execute.timeout``); a cell that runs longer
#: fails the build.
CELL_TIMEOUT_S = 1800
#: The share of that limit a sized cell plans to use. The rest is the margin for the estimate's error (one card's
#: measurements scaled by peak; JPEG decoding and Inception are not in the cost model).
CELL_SHARE = 0.6
#: The share a cell whose time is measured as it runs plans to use (:func:`latents_within`).
LATENTS_SHARE = 0.8


def cell_budget(timeout_s: float = CELL_TIMEOUT_S, share: float = CELL_SHARE) -> float:
    """Seconds a sized cell plans to use: ``share`` of the book's cell time limit."""
    return share * timeout_s


def fid_seconds_per_sample(peak: float, steps: int = DEFAULTS["fid_steps"]) -> float:
    """Estimated seconds per FID sample in chapter 07, both models together: DiT-B/2 and DiT-XL/2 with guidance,
    ``steps`` sampler steps each, and the VAE decode of each sample."""
    return sum(sample_seconds(model, 1, steps, peak) for model in ("DiT-B/2", "DiT-XL/2"))


def fid_samples_within(peak: float | None, requested="auto", steps: int = DEFAULTS["fid_steps"],
                       classes: int = DEFAULTS["classes"], budget_s: float | None = None) -> int:
    """Samples per model behind chapter 07's FIDs. A number is used as given. ``"auto"``: the GPU track's 2,000,
    or, on a card whose estimate (:func:`fid_seconds_per_sample`) would take the FID cell past ``budget_s``
    (default :func:`cell_budget`), the largest multiple of ``classes`` that fits (at least ``classes``: one per
    class). ``peak`` None (no card, or one the table does not know): 2,000."""
    if not (isinstance(requested, str) and requested == "auto"):
        n = int(requested)
        if n < 1:
            raise ValueError(f"FID_SAMPLES must be a positive number of samples or 'auto', got {requested!r}")
        return n
    n = DEFAULTS["fid_samples"]
    if peak:
        budget = cell_budget() if budget_s is None else budget_s
        fits = int(budget / fid_seconds_per_sample(peak, steps)) // classes * classes
        n = max(classes, min(n, fits))
    return n


def costs(peak: float, train_minutes: float = DEFAULTS["train_minutes"], fid_samples="auto",
          fid_steps: int = DEFAULTS["fid_steps"], picture_steps: int = DEFAULTS["picture_steps"],
          pictures: int = DEFAULTS["classes"] * DEFAULTS["per_class"]) -> dict:
    """Estimated GPU seconds of each GPU-track chapter on a card of ``peak`` TFLOP/s (downloads not included).

    - ``01_data``: none (extraction runs on the CPU);
    - ``02_latents``: all of Imagenette (train) encoded with both flips;
    - ``05b_your_data``: the training budget (``train_minutes``);
    - ``07_sampling``: guidance grids (3 scales) and the 3-channel comparison for both models at
      ``picture_steps`` DDPM steps, the sampler comparison on the official model (DDPM-250, DDIM-50,
      DPM-Solver++-25), and ``fid_samples`` FID samples of each model (``"auto"``: as many as
      :func:`fid_samples_within` gives this card) with ``fid_steps`` DPM-Solver++ steps.
    """
    fid_samples = fid_samples_within(peak, fid_samples, fid_steps)
    b2, xl2 = "DiT-B/2", "DiT-XL/2"
    pics = 0.0
    for model in (b2, xl2):
        pics += sum(sample_seconds(model, pictures, picture_steps, peak, guided=g != 1.0) for g in DEFAULTS["guidance"])
    pics += sample_seconds(xl2, pictures, picture_steps, peak)  # the 3-channel guidance of the official sampler
    samplers = sum(sample_seconds(xl2, DEFAULTS["classes"], s, peak) for s in (250, 50, 25))
    fid = sample_seconds(b2, fid_samples, fid_steps, peak) + sample_seconds(xl2, fid_samples, fid_steps, peak)
    return {"00_environment": 10.0, "01_data": 0.0, "02_latents": encode_seconds(IMAGENETTE_IMAGES[0], peak),
            "05b_your_data": 60.0 * train_minutes, "07_sampling": pics + samplers + fid}


def format_costs(peak: float, card: str, **sizes) -> str:
    """The cost estimates as a few lines, labelled as estimates."""
    c = costs(peak, **sizes)
    lines = [f"GPU time of the GPU track on {card} ({peak:g} TFLOP/s dense 16-bit), ESTIMATED from the H200 records "
             "scaled by peak (downloads and start-up not included):"]
    lines += [f"  {k:<15} ~{v / 60:5.1f} min" for k, v in c.items()]
    lines.append(f"  {'total':<15} ~{sum(c.values()) / 60:5.1f} min")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------------
# Stand-ins: the downloads' local-file route, with made-up contents
# ----------------------------------------------------------------------------------------------------------


def standins(folder: str | os.PathLike, full_size: bool = False, workers: int = 1, seed: int = 0) -> dict:
    """Files in place of the GPU track's downloads, made here without a network; returns their paths.

    - ``archive``: an ``imagenette2-320.tgz`` in Imagenette's layout of generated JPEGs (2 + 1 images per class;
      ``full_size``: Imagenette's 9,469 + 3,925);
    - ``vae``: a randomly initialised ``AutoencoderKL`` saved with ``save_pretrained`` (the tiny test architecture;
      ``full_size``: Stable Diffusion's);
    - ``official``: a randomly initialised DiT in the official checkpoint format (a bare state dict): a tiny one,
      or ``full_size`` DiT-XL/2 at 256 px (2.7 GB);
    - ``inception``: the FID Inception-v3 with random weights.

    Pictures from them are noise and FIDs meaningless; shapes, code paths, timings and memory are real. Existing
    files are reused.
    """
    from dit_core.data.imagenette import make_archive
    from dit_core.eval.inception import INCEPTION_FILE, InceptionV3
    from dit_core.models import DiT
    from dit_core.vae import random_vae

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    out = {"archive": folder / "imagenette2-320.tgz", "vae": folder / "vae", "official": folder / "DiT-XL-2-256x256.pt",
           "inception": folder / INCEPTION_FILE}
    if not out["archive"].exists():
        counts = (None, None) if full_size else (2, 1)
        make_archive(out["archive"], *counts, short_side=320 if full_size else 48, seed=seed, workers=workers)
    if not (out["vae"] / "config.json").exists():
        random_vae("sd" if full_size else "tiny", seed=seed).save_pretrained(out["vae"])
    if not out["official"].exists():
        from dit_core.checkpoint import atomic_save

        torch.manual_seed(seed)
        size = dict(depth=28, hidden_size=1152, num_heads=16) if full_size else dict(depth=1, hidden_size=32, num_heads=2)
        model = DiT(input_size=32 if full_size else 4, patch_size=2, in_channels=4, num_classes=1000, **size)
        for p in model.parameters():  # adaLN-Zero starts at zero: give every weight a value, as a trained model has
            if p.requires_grad:
                p.data.normal_(0, 0.02)
        atomic_save(model.state_dict(), out["official"])
    if not out["inception"].exists():
        from dit_core.atomic import atomic_write

        torch.manual_seed(seed)
        net = InceptionV3()
        for m in net.modules():  # He init keeps the activations alive through 90 layers (the default fades them to 0)
            if isinstance(m, torch.nn.Conv2d):
                torch.nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
        atomic_write(out["inception"], lambda f: torch.save(net.state_dict(), f))
    return out


# ----------------------------------------------------------------------------------------------------------
# The chain: data -> latents -> a run
# ----------------------------------------------------------------------------------------------------------


def gpu_data(data_dir: str | os.PathLike, archive=None, download: bool = False, checksum: bool = True,
             progress: bool = True) -> Path:
    """The GPU track's dataset: Imagenette prepared in ``data_dir`` (from ``archive``, the cache, or a download
    when ``download``), or, when ``data_dir`` already holds an ImageFolder of yours (ImageNet, or any
    ``root/<class>/<image>``), that folder as it is."""
    from dit_core.data.imagenette import is_prepared, prepare_imagenette

    data_dir = Path(data_dir).expanduser()
    if is_prepared(data_dir) or (data_dir.is_dir() and any(p.is_dir() and not p.name.startswith(".")
                                                           for p in data_dir.iterdir())):
        return data_dir
    return prepare_imagenette(data_dir, archive=archive, download=download, checksum=checksum, progress=progress)


def gpu_paths(data_dir="auto", latents_dir="auto", smoke: bool = False) -> tuple[Path, Path]:
    """The GPU track's data and latent folders, relative to the book: ``"auto"`` is Imagenette in
    ``../data/imagenette`` and its latents beside it (``-smoke`` folders for smoke runs, so that stand-in data
    never passes for the real thing); a data folder of your own gets its latents in ``<folder>-latents``."""
    data = Path("../data/imagenette" + ("-smoke" if smoke else "")) if data_dir == "auto" else Path(data_dir).expanduser()
    latents = data.with_name(data.name + "-latents") if latents_dir == "auto" else Path(latents_dir).expanduser()
    return data, latents


def gpu_latents(data_dir, latents_dir, vae, image_size: int = 256, batch_size: int = 64, progress: bool = True,
                device=None, vae_name: str | None = None, **kwargs) -> dict:
    """Latents of ``data_dir`` (its ``train/`` split when it has one) in ``latents_dir``: extracted with ``vae``
    (a hub id, a folder, or a loaded VAE with its ``vae_name``) at ``image_size`` with both flips, resumed where an
    earlier run stopped, or reused when complete. Returns the manifest (``"seconds"``: the extraction's time)."""
    from dit_core.latents import extract_latents

    vae = str(vae) if isinstance(vae, (str, os.PathLike)) else vae
    return extract_latents(data_dir, latents_dir, vae=vae, vae_name=vae_name, image_size=image_size,
                           batch_size=batch_size, progress=progress, device=device, **kwargs)


def ensure_latents(data_dir, latents_dir, vae, *, archive=None, download: bool = False, checksum: bool = True,
                   image_size: int = 256, batch_size: int = 64, device=None, progress: bool = True) -> Path:
    """``latents_dir`` if it holds a finished extraction; else the data (:func:`gpu_data`) and the VAE
    (:func:`dit_core.downloads.vae`, downloaded only when ``download``) are fetched and the latents extracted, as
    chapters 01 and 02 do. For chapters that need the latents when the earlier ones did not run."""
    from dit_core import downloads
    from dit_core.latents import MANIFEST

    latents_dir = Path(latents_dir)
    if (latents_dir / MANIFEST).is_file():
        return latents_dir
    data = gpu_data(data_dir, archive=archive, download=download, checksum=checksum, progress=progress)
    model = downloads.vae(vae, download=download, device=device or "cpu")
    gpu_latents(data, latents_dir, model, vae_name=str(vae), image_size=image_size, batch_size=batch_size,
                progress=progress, device=device)
    return latents_dir


def latents_within(data_dir, latents_dir, vae, seconds: float | None = None, calibration_batches: int = 8,
                   clock=time.perf_counter, **kwargs) -> dict:
    """:func:`gpu_latents` for about ``seconds`` at most, so that one cell stays within the book's time limit on any
    card: a first leg of ``calibration_batches`` batches measures this machine's rate (start-up included), a second
    leg sized from that rate fills the rest. The default, :data:`LATENTS_SHARE` of the limit, is larger than the
    share of an estimated cell: the rate is measured here, not scaled from another card. An extraction that is
    not finished then continues at the next call, where this one stopped (resuming gives the same latents as one
    uninterrupted run). Returns the manifest when the extraction is complete, else its progress state
    (``"complete": False``, ``"done"`` of ``"count"`` images)."""
    budget = cell_budget(share=LATENTS_SHARE) if seconds is None else float(seconds)
    t0 = clock()
    result = gpu_latents(data_dir, latents_dir, vae, max_batches=calibration_batches, **kwargs)
    if result.get("complete", True):
        return {**result, "complete": True}
    spent = clock() - t0
    rate = calibration_batches / spent if spent > 0 else float("inf")
    more = int(0.95 * (budget - spent) * rate)
    if more > 0:
        result = gpu_latents(data_dir, latents_dir, vae, max_batches=more, **kwargs)
    return {**result, "complete": result.get("complete", True)}


def run_step(run_dir: str | os.PathLike) -> int:
    """The optimizer step the run in ``run_dir`` has reached (0 when it has no checkpoint yet)."""
    last = Path(run_dir) / "checkpoints" / "last.pt"
    if not last.is_file():
        return 0
    return int(torch.load(last, map_location="cpu", weights_only=True, mmap=True)["step"])


def planned_batch(model: str, gpu_memory_gib: float, precision: str, image_size: int = 256,
                  global_batch: int = 256) -> dict:
    """Micro-batch, accumulation and checkpointed blocks that the memory planner picks for ``model`` on a card of
    ``gpu_memory_gib`` (:func:`dit_core.measure.memory.plan`), as trainer overrides."""
    from dit_core.measure.memory import ModelShape, plan

    p = plan(ModelShape.from_name(model, image_size), gpu_memory_gib, global_batch, precision)
    if not p.fits:
        raise ValueError("\n".join(p.explanation))
    return {"grad_accum": p.setup.grad_accum, "grad_checkpointing": p.setup.checkpointed,
            "planned_peak_gib": round(p.estimate.peak / 2**30, 2)}


def train_for(profile: str, overrides: dict, minutes: float | None = None, steps: int | None = None,
              calibration_steps: int = 50, train_fn=None) -> dict:
    """Continue (or start) the run ``overrides["out"]`` for a budget of ``minutes`` or a number of ``steps``.

    With ``steps``: one call of the trainer up to the current step + ``steps``. With ``minutes``: a first leg of
    ``calibration_steps`` measures this machine's steps per second (start-up included), then a second leg, sized
    from that rate, fills the rest of the budget. Both legs resume the same run (``resume: auto``), so calling
    this again continues where the last call stopped. Returns ``start_step``, ``end_step``, ``seconds`` and the
    trainer's ``summaries``.
    """
    from dit_core.train import make_config, train

    train_fn = train_fn or train
    out = overrides["out"]
    start = run_step(out)
    t0 = time.perf_counter()

    def leg(target: int) -> dict:
        # the legs are the budget here: a profile's own time budget (max_minutes) would fix the first leg's length
        cfg = make_config(profile, {**overrides, "resume": "auto", "max_steps": target, "max_minutes": 0})
        return train_fn(cfg)

    summaries = []
    if steps is not None or minutes is None:
        summaries.append(leg(start + int(steps or calibration_steps)))
    else:
        first = start + calibration_steps
        summaries.append(leg(first))
        s = summaries[-1]
        rate = s["steps_this_run"] / s["train_seconds"] if s.get("train_seconds") else 0.0
        left = 60.0 * minutes - (time.perf_counter() - t0)
        more = int(0.95 * left * rate)  # 5 % for start-up and the last checkpoint
        if more > 0:
            summaries.append(leg(first + more))
    return {"start_step": start, "end_step": run_step(out), "seconds": time.perf_counter() - t0, "summaries": summaries}


def read_metrics(run_dir: str | os.PathLike) -> list[dict]:
    """The records of ``<run>/metrics.jsonl``."""
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


# ----------------------------------------------------------------------------------------------------------
# Images for FID
# ----------------------------------------------------------------------------------------------------------


def sample_uint8(model, diffusion, labels, *, chunk: int = 256, progress: bool = False, **generate_kwargs):
    """``generate`` over ``labels`` in chunks of ``chunk`` images, each converted to uint8 at once (so thousands of
    256 px samples never sit in memory as floats); returns ``(images N x H x W x C uint8, seconds)``."""
    from dit_core.runtime import synchronize
    from dit_core.sample import generate, to_uint8

    labels = torch.as_tensor(labels).reshape(-1)
    seed = int(generate_kwargs.pop("seed", 0))
    parts, t0 = [], time.perf_counter()
    starts = range(0, len(labels), chunk)
    if progress:
        from tqdm.auto import tqdm

        starts = tqdm(starts, desc=f"sampling {len(labels)} images", unit="chunk")
    for s in starts:
        # seed + s: image i keeps the seed it has in one big call (generate seeds image j of a call with seed + j)
        parts.append(to_uint8(generate(model, diffusion, labels[s : s + chunk], seed=seed + s, **generate_kwargs)))
    device = generate_kwargs.get("device")
    if device is not None:
        synchronize(device)
    return np.concatenate(parts), time.perf_counter() - t0


def real_images(data_dir, split: str | None, image_size: int, limit: int | None = None, seed: int = 0) -> tuple:
    """``(uint8 N x H x W x 3, labels)``: images of ``data_dir``'s ``split`` with the ADM center crop at
    ``image_size``, not flipped; ``limit`` picks that many at random (fixed ``seed``), else all."""
    from dit_core.data import ImageFolderDataset
    from dit_core.sample import to_uint8

    ds = ImageFolderDataset(data_dir, image_size, split=split, flip=False)
    order = np.arange(len(ds))
    if limit is not None and limit < len(ds):
        order = np.sort(np.random.default_rng(seed).choice(len(ds), limit, replace=False))
    images, labels = [], []
    for i in order:
        x, y = ds.load(int(i))
        images.append(x)
        labels.append(y)
    return to_uint8(torch.stack(images)), np.asarray(labels)


def fid_gap_note(n: int, reference: int) -> str:
    """Why an FID of ``n`` samples against ``reference`` Imagenette images is not DiT's FID-50K."""
    return (f"FID here: {n:,} samples against {reference:,} real Imagenette images (10 classes). The paper's FID-50K "
            "takes 50,000 samples over all 1,000 classes with 250 DDPM steps and compares them with the statistics of "
            "the whole ImageNet training set (1.28 M images). FID is biased upwards for small sets (its covariances "
            "are estimated from few images), so the real-vs-real floor below, at the same sizes, is the zero line of "
            "these numbers; they rank models on Imagenette, they are not comparable with 2.27.")

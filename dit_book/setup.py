"""Each chapter's setup in one call: the track, the device, the tiny sizes of a smoke run, stand-ins for downloads.

A chapter's first code cell after its ``parameters`` cell imports what the chapter uses and calls one function of
this module with the notebook's namespace, then unpacks what it returns::

    ch = setup.sampling(globals())
    track, device, amp, out_dir = ch.track, ch.device, ch.amp, ch.out_dir

Each function

* reads the chapter's parameters from that namespace (a missing one is an error that names it);
* writes back the values this run uses instead: ``SMOKE`` or'ed with ``DIT_SMOKE`` (:func:`dit_book.smoke_mode`),
  every ``"auto"`` it resolves, the tiny sizes of a smoke run (``SMOKE = True``, set by the tests), and on the GPU
  track in a smoke run the paths of stand-ins made here for the downloads (:func:`dit_book.track.standins`), so
  that the rest of the chapter reads its knobs by the names of its ``parameters`` cell;
* sets torch's CPU threads (and the seeds a chapter fixes) and returns what the chapter derives, as attributes.

What a reader changes stays in the ``parameters`` cell; what the chapter then does with it is here, in one place:
what ``SMOKE`` or ``TRACK = "gpu"`` change in a chapter is in that chapter's function.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import torch

from dit_core.runtime import set_threads

from . import track as tracks
from .notebooks import smoke_mode

#: Where the chapters make the stand-ins for the GPU track's downloads in a smoke run (relative to book/, where a
#: chapter runs); every chapter uses the same ones.
STANDINS = "../outputs/standins"


def _need(params: dict, *names: str) -> list:
    missing = [n for n in names if n not in params]
    if missing:
        raise KeyError(f"this chapter's setup reads {missing} from its `parameters` cell, which does not define "
                       f"{'it' if len(missing) == 1 else 'them'}; add {'it' if len(missing) == 1 else 'them'} there")
    return [params[n] for n in names]


def _smoke(params: dict) -> bool:
    """``SMOKE`` of the parameters cell, or the ``DIT_SMOKE`` environment variable; written back."""
    (smoke,) = _need(params, "SMOKE")
    params["SMOKE"] = smoke = bool(smoke) or smoke_mode()
    return smoke


def _device(name) -> torch.device:
    """``"auto"``: the first CUDA GPU if there is one, else the CPU."""
    return torch.device(("cuda" if torch.cuda.is_available() else "cpu") if name == "auto" else name)


def _standins(params: dict, vae: bool = False, official: bool = False) -> dict:
    """Stand-ins for the GPU track's downloads (made once in :data:`STANDINS`), put in place of the download knobs
    the chapter has: the VAE (``vae``), the official checkpoint and Inception (``official``, where ``"auto"``),
    and Imagenette's archive (where none is given; a made-up archive has no published checksum)."""
    stand = tracks.standins(STANDINS)
    if vae:
        params["VAE"] = str(stand["vae"])
    if official:
        if params["OFFICIAL_CKPT"] == "auto":
            params["OFFICIAL_CKPT"] = stand["official"]
        if params["INCEPTION"] == "auto":
            params["INCEPTION"] = stand["inception"]
    if params["IMAGENETTE_ARCHIVE"] is None:
        params["IMAGENETTE_ARCHIVE"], params["CHECKSUM"] = stand["archive"], False
    return stand


def _gpu_route(params: dict, smoke: bool) -> tuple[str, bool]:
    """The track, and whether this run may download (the GPU track's ``DOWNLOAD="auto"``; never in a smoke run)."""
    track, download = _need(params, "TRACK", "DOWNLOAD")
    track = tracks.choose_track(track)
    return track, bool(tracks.auto(download, track == "gpu")) and not smoke


def _gpu_sizes(smoke: bool) -> dict:
    """The GPU track's image size (DiT's 256 px; 32 px stand-ins in a smoke run) and the steps of the first leg of a
    run trained for a budget of minutes, which measure the card's speed (:func:`dit_book.track.train_for`)."""
    return {"gpu_image_size": 32 if smoke else 256, "calibration_steps": 2 if smoke else 50}


# ------------------------------------------------------------------------------------------------ 00 .. 02
def environment(params: dict) -> SimpleNamespace:
    """Chapter 00. ``MATMUL_SIZE="auto"``: 8192 on a GPU, 512 on a CPU; a smoke run times 256 x 256, twice.
    Returns ``device``, ``threads``, ``track``."""
    smoke = _smoke(params)
    device = _device(_need(params, "DEVICE")[0])
    if params["MATMUL_SIZE"] == "auto":
        params["MATMUL_SIZE"] = 8192 if device.type == "cuda" else 512
    if smoke:
        params["MATMUL_SIZE"], params["MATMUL_REPEATS"] = 256, 2
    threads = set_threads()
    return SimpleNamespace(device=device, threads=threads, track=tracks.choose_track(_need(params, "TRACK")[0]))


def data(params: dict) -> SimpleNamespace:
    """Chapter 01. A smoke run shows fewer and smaller images; on the GPU track it prepares a stand-in archive in
    Imagenette's layout. Returns ``track``, ``download`` and ``data_dir`` (the GPU track's folder)."""
    smoke = _smoke(params)
    if smoke:
        params.update(GRID_PER_CLASS=4, PHOTO_SIZE=64, MESSY_IMAGES=8, MESSY_SIZE=32)
    torch.manual_seed(0)
    set_threads()
    track, download = _gpu_route(params, smoke)
    data_dir, _ = tracks.gpu_paths(_need(params, "DATA_DIR")[0], smoke=smoke)
    if smoke and track == "gpu" and params["IMAGENETTE_ARCHIVE"] is None:
        _standins(params)
    return SimpleNamespace(track=track, download=download, data_dir=data_dir)


def latents(params: dict) -> SimpleNamespace:
    """Chapter 02. Its ``"auto"`` sizes are a GPU's (256 px, 512 images, batch 32, 8 compared) or a CPU's (128 px,
    8, 4, 1); a smoke run encodes 8 images of 32 px, and on the GPU track a stand-in archive with a tiny VAE.
    Returns ``device``, ``gpu``, ``precision`` (the encoder's), ``threads``, ``work`` (the scratch folder),
    ``track``, ``download`` (the VAE's), ``data_dir``, ``latents_dir`` and ``stand`` (the stand-ins, or None)."""
    smoke = _smoke(params)
    device = _device(_need(params, "DEVICE")[0])
    gpu = device.type == "cuda"
    for name, on_gpu, on_cpu in (("IMAGE_SIZE", 256, 128), ("NUM_IMAGES", 512, 8), ("BATCH_SIZE", 32, 4),
                                 ("COMPARE_IMAGES", 8, 1)):
        if _need(params, name)[0] == "auto":
            params[name] = on_gpu if gpu else on_cpu
    download = (gpu if params["DOWNLOAD_VAE"] == "auto" else bool(params["DOWNLOAD_VAE"])) and not smoke
    if smoke:
        params.update(IMAGE_SIZE=32, NUM_IMAGES=8, BATCH_SIZE=4, SHOW_IMAGES=2, COMPARE_IMAGES=1)
    from dit_core.runtime import resolve_precision

    precision = resolve_precision(params["PRECISION"], device, "vae")
    torch.manual_seed(0)
    threads = set_threads()
    track = tracks.choose_track(params["TRACK"])
    data_dir, latents_dir = tracks.gpu_paths(params["DATA_DIR"], params["LATENTS_DIR"], smoke=smoke)
    stand = None
    if smoke and track == "gpu":
        stand = _standins(params)
        params.update(GPU_IMAGE_SIZE=32, GPU_BATCH_SIZE=8, RECON_IMAGES=4)
    return SimpleNamespace(device=device, gpu=gpu, precision=precision, threads=threads,
                           work=Path(params["WORK_DIR"]), track=track, download=download, data_dir=data_dir,
                           latents_dir=latents_dir, stand=stand)


# ------------------------------------------------------------------------------------------------ 03 .. 05
#: Chapter 05's demonstrations (and, in a smoke run, its main run): a DiT of 2 blocks of width 64.
TINY = dict(depth=2, hidden_size=64, num_heads=2, batch_size=32, warmup_steps=5, sample_steps=5,
            sample_per_class=2, log_every=5, ckpt_every=10)


def digits(count: int | None = None, start: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """scikit-learn's 8x8 digits as ``(N, 1, 8, 8)`` floats in [-1, 1] (0..16 mapped linearly) and their labels;
    ``count`` digits from ``start`` (all of them by default)."""
    from sklearn.datasets import load_digits

    data = load_digits()
    end = None if count is None else start + count
    images = torch.tensor(data.images[start:end], dtype=torch.float32)[:, None] / 8 - 1
    return images, torch.tensor(data.target[start:end])


def model(params: dict) -> SimpleNamespace:
    """Chapter 03. ``DEVICE="auto"``: the first CUDA GPU when there is one, else the CPU (written back as its name);
    a smoke run times the attention backends on DiT-S/4 at 64 px, batch 2, once. Prints what runs where."""
    import dit_core

    smoke = _smoke(params)
    params["DEVICE"] = device = str(_device(_need(params, "DEVICE")[0]))
    _need(params, "BENCH_MODEL", "BENCH_IMAGE_SIZE", "BENCH_BATCH", "BENCH_REPEATS")
    if smoke:
        params.update(BENCH_MODEL="DiT-S/4", BENCH_IMAGE_SIZE=64, BENCH_BATCH=2, BENCH_REPEATS=1)
    set_threads()
    torch.manual_seed(0)
    print("dit_core", dit_core.__version__, "| torch", torch.__version__, "| device", device)
    return SimpleNamespace(device=device)


def diffusion(params: dict) -> SimpleNamespace:
    """Chapter 04. A smoke run uses 50 digits, 4 samples, two samplers and 10 DPM-Solver++ steps. Returns the
    digits: ``points``, ``labels`` (the first ``NUM_POINTS``, which the exact denoiser knows) and ``held_out``
    (200 real digits after them, which it never sees)."""
    smoke = _smoke(params)
    _need(params, "NUM_POINTS", "NUM_SAMPLES", "SAMPLERS", "DPM_STEPS")
    if smoke:
        params.update(NUM_POINTS=50, NUM_SAMPLES=4, SAMPLERS=["50", "ddim10"], DPM_STEPS=10)
    params["SAMPLERS"] = list(params["SAMPLERS"])
    set_threads()
    torch.manual_seed(0)
    points, labels = digits(params["NUM_POINTS"])
    held_out, _ = digits(200, start=params["NUM_POINTS"])
    return SimpleNamespace(points=points, labels=labels, held_out=held_out)


def training(params: dict) -> SimpleNamespace:
    """Chapter 05. A smoke run trains the tiny DiT for 20 steps in ``<OUT_DIR>/smoke_run`` and the reader's DiT
    for 30. Returns the digits (``x_all``, ``y_all``), :data:`TINY` (``tiny``) and ``out_dir``, whose ``demo``
    folder, for the small demonstrations, starts empty."""
    smoke = _smoke(params)
    (out_dir,) = _need(params, "OUT_DIR")
    _need(params, "RUN_DIR", "MAX_STEPS", "SAMPLE_EVERY", "EVAL_PER_CLASS", "MY_DIT_STEPS")
    if smoke:
        params.update(RUN_DIR=f"{out_dir}/smoke_run", MAX_STEPS=20, SAMPLE_EVERY=10, EVAL_PER_CLASS=2,
                      MY_DIT_STEPS=min(params["MY_DIT_STEPS"], 30))
    set_threads()
    out = Path(out_dir)
    shutil.rmtree(out / "demo", ignore_errors=True)
    x_all, y_all = digits()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads, CUDA: {torch.cuda.is_available()}")
    return SimpleNamespace(out_dir=out, tiny=dict(TINY), x_all=x_all, y_all=y_all)


# ------------------------------------------------------------------------------------------------ 05b
#: The tiny DiT of a smoke run of chapter 05b's own-folder run (section 5b.3): chapter 05's, without progress bars.
OWN_TINY = dict(TINY, progress=False)


def your_data(params: dict) -> SimpleNamespace:
    """Chapter 05b. A smoke run trains 10 steps of a tiny DiT on the own-folder path and, on the GPU track, a few
    seconds at 32 px on stand-ins (a made-up archive, a tiny VAE). Returns ``track``, ``download``, ``data_dir``,
    ``latents_dir``, ``out_dir``, ``own_overrides`` (the settings a smoke run adds to the own-folder run),
    ``gpu_image_size`` and ``calibration_steps``."""
    smoke = _smoke(params)
    (out_dir,) = _need(params, "OUT_DIR")
    if smoke:
        params.update(OWN_RUN_DIR=out_dir + "/smoke_own_run", OWN_MAX_STEPS=10, EVAL_PER_CLASS=2)
    set_threads()
    track, download = _gpu_route(params, smoke)
    data_dir, latents_dir = tracks.gpu_paths(params["DATA_DIR"], params["LATENTS_DIR"], smoke=smoke)
    if smoke:  # the GPU track at toy size: 32 px stand-in data, a tiny VAE and a tiny DiT, a few seconds of training
        params.update(GPU_RUN_DIR=out_dir + "/smoke_gpu_run", TRAIN_MINUTES=0.05, TRAIN_STEPS=None, GPU_SAMPLE_EVERY=2)
        if track == "gpu":
            _standins(params, vae=True)
    return SimpleNamespace(track=track, download=download, data_dir=data_dir, latents_dir=latents_dir,
                           out_dir=Path(out_dir), own_overrides=dict(OWN_TINY) if smoke else {},
                           **_gpu_sizes(smoke))


# ------------------------------------------------------------------------------------------------ 06
def memory_and_speed(params: dict) -> SimpleNamespace:
    """Chapter 06. ``"auto"``: DiT-XL/2 at batch 32 with the compiled rungs, each rung in its own process, on a GPU;
    the digits profile's model at batch 64 in this process on a CPU. A smoke run times one step of a tiny pixel
    model. Returns ``device``, ``gpu``, ``threads``, ``spec`` (the ladder's :class:`~dit_core.measure.bench.BenchSpec`)
    and ``shape`` (its model's shape)."""
    from dit_core.measure import bench
    from dit_core.runtime import resolve_device

    smoke = _smoke(params)
    model, image_size, batch, steps, threads, sample_steps, card = _need(
        params, "MODEL", "IMAGE_SIZE", "BATCH_SIZE", "STEPS", "THREADS", "SAMPLE_STEPS", "CARD_GIB")
    threads = set_threads(threads)
    device = resolve_device(params["DEVICE"])
    gpu = device.type == "cuda"
    params["MODEL"] = model = ("DiT-XL/2" if gpu else "digits") if model == "auto" else model
    params["BATCH_SIZE"] = batch = (32 if gpu else 64) if batch == "auto" else batch
    for name in ("INCLUDE_COMPILE", "ISOLATE"):
        params[name] = gpu if params[name] == "auto" else params[name]
    spec = bench.resolve_spec(bench.BenchSpec(model=model, image_size=image_size, batch_size=batch, steps=steps,
                                              device=str(device), threads=threads, sample_steps=sample_steps,
                                              vae="stabilityai/sd-vae-ft-ema",
                                              memory_limit_gib=None if card == "auto" else float(card)))
    if smoke:  # a tiny pixel-space model, one timed step, no compilation, no subprocesses
        spec = bench.BenchSpec(model="tiny", pixel=True, image_size=8, batch_size=8, steps=1, warmup=1, device="cpu",
                               threads=threads, sample_steps=2, sample_batch=2,
                               shape=dict(depth=2, hidden_size=64, num_heads=4, patch_size=2, input_size=8,
                                          in_channels=1, num_classes=10))
        params.update(INCLUDE_COMPILE=False, ISOLATE=False, CARDS_GIB=[12, 24, 80])
    return SimpleNamespace(device=device, gpu=gpu, threads=threads, spec=spec, shape=bench.model_shape(spec))


# ------------------------------------------------------------------------------------------------ 07, 07b
def sampling(params: dict) -> SimpleNamespace:
    """Chapter 07. A smoke run trains a 30-step digits model and samples a few images at few steps; on the GPU track
    it makes stand-ins for every download (a made-up archive, a tiny VAE, a tiny DiT in the official format, random
    Inception weights) and computes FIDs of 10 samples. Returns ``track``, ``download``, ``data_dir``,
    ``latents_dir``, ``device``, ``amp`` (the autocast precision), ``out_dir`` (created), ``gpu_image_size`` and
    ``calibration_steps``."""
    from dit_core.runtime import resolve_precision

    smoke = _smoke(params)
    (out_dir,) = _need(params, "OUT_DIR")
    if smoke:  # tiny settings: a 30-step model, a few images, two sweep points
        params.update(RUN_DIR=out_dir + "/smoke_run", TRAIN_STEPS=30, PER_CLASS=2, SWEEP_PER_CLASS=1, STEPS=5,
                      ANIMATION_STEPS=5, CFG_SWEEP=[1.0, 4.0], STEP_SWEEP=[2, 5], SWEEP_SAMPLERS=["ddim", "dpm-solver++"])
    set_threads()
    track, download = _gpu_route(params, smoke)
    data_dir, latents_dir = tracks.gpu_paths(params["DATA_DIR"], params["LATENTS_DIR"], smoke=smoke)
    if smoke:  # the GPU track at toy size: a few sampler steps, a handful of FID samples
        params.update(GPU_RUN_DIR=out_dir + "/smoke_gpu_run", TRAIN_MINUTES=0.05, PICTURE_STEPS=3,
                      SAMPLER_RACE=[["ddpm", 3], ["ddim", 2], ["dpm-solver++", 2]], FID_SAMPLES=10, FID_STEPS=2,
                      GPU_BATCH=10)
        if track == "gpu":
            _standins(params, vae=True, official=True)
    device = _device(params["DEVICE"])
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return SimpleNamespace(track=track, download=download, data_dir=data_dir, latents_dir=latents_dir, device=device,
                           amp=resolve_precision(params["PRECISION"], device), out_dir=out, **_gpu_sizes(smoke))


def converging(params: dict) -> SimpleNamespace:
    """Chapter 07b. A smoke run re-measures 30 steps of a tiny model. Returns ``live_overrides``, the model settings
    the live runs add to the profile (none at the chapter's defaults)."""
    smoke = _smoke(params)
    overrides = {}
    if smoke:
        params.update(LIVE_STEPS=30, LIVE_EVAL_EVERY=15, LIVE_PER_CLASS=3, LIVE_EVAL_STEPS=5)
        overrides = dict(depth=2, hidden_size=64, repa_depth=1, repa_projector_dim=32)
    set_threads()
    torch.manual_seed(0)
    return SimpleNamespace(live_overrides=overrides)


# ------------------------------------------------------------------------------------------------ 08
class SmallRuns:
    """Chapter 08's small training runs: the ``digits`` profile with a tiny DiT (``TINY_DIT``), the official
    optimizer recipe (AdamW, a constant learning rate of 1e-3, no warm-up, no clipping) and a loss record at every
    step; each run in ``<folder>/<name>``, its console lines in its ``log.txt`` instead of on the page."""

    def __init__(self, folder: Path, digits_dir: Path, dataset, tiny: dict, steps: int, batch_size: int, device):
        self.folder = Path(folder)
        self.dataset = dataset
        self.base = dict(data_path=str(digits_dir), **tiny, batch_size=batch_size, max_steps=steps, lr=1e-3,
                         lr_schedule="constant", warmup_steps=0, grad_clip=0.0, device=device, log_every=1,
                         progress=False, tensorboard=False, sample_at_end=False, preload="false", num_workers=0)

    def run(self, name: str, dataset=None, **overrides) -> dict:
        """Train run ``name`` with :func:`dit_core.train.train` (``overrides`` on top of :attr:`base`); returns its
        summary. ``dataset``: another dataset in place of the digits."""
        from dit_core.train import make_config, train

        cfg = make_config("digits", {**self.base, "out": str(self.folder / name), **overrides})
        log = io.StringIO()
        try:
            with contextlib.redirect_stdout(log):
                return train(cfg, dataset=self.dataset if dataset is None else dataset)
        finally:
            (self.folder / name).mkdir(parents=True, exist_ok=True)
            (self.folder / name / "log.txt").write_text(log.getvalue())

    def losses(self, name: str) -> dict[int, float]:
        """``{step: loss}`` of run ``name`` (its ``metrics.jsonl``); a resumed run's records replace the crashed ones."""
        lines = (self.folder / name / "metrics.jsonl").read_text().splitlines()
        return {r["step"]: r["loss"] for r in map(json.loads, lines)}


def troubleshooting(params: dict) -> SimpleNamespace:
    """Chapter 08. Clears the chapter's ``runs/`` and ``bad-data/`` (only what it writes), exports the digits as an
    ImageFolder and opens them as 8 x 8 grey images, one CPU thread (at this size more threads only add overhead).
    A smoke run: 16 steps of 16 images. Returns ``out``, ``runs_dir``, ``digits_dir``, ``digits`` and ``runs`` (a
    :class:`SmallRuns`)."""
    from dit_core.data import export_digits
    from dit_core.latents import open_dataset

    smoke = _smoke(params)
    if smoke:
        params.update(STEPS=16, BATCH_SIZE=16)
    out_dir, steps, batch, tiny, device = _need(params, "OUT_DIR", "STEPS", "BATCH_SIZE", "TINY_DIT", "DEVICE")
    set_threads(1)
    torch.manual_seed(0)
    out = Path(out_dir)
    runs_dir = out / "runs"
    for scratch in (runs_dir, out / "bad-data"):
        shutil.rmtree(scratch, ignore_errors=True)
    digits_dir = export_digits(out / "data" / "digits")
    digits = open_dataset(digits_dir, image_size=8, mode="L", flip=False)
    return SimpleNamespace(out=out, runs_dir=runs_dir, digits_dir=digits_dir, digits=digits,
                           runs=SmallRuns(runs_dir, digits_dir, digits, tiny, steps, batch, device))


# ------------------------------------------------------------------------------------------------ 09, appendix
def beyond_one_gpu(params: dict) -> SimpleNamespace:
    """Chapter 09. Clears the chapter's ``runs/`` and exports the digits. A smoke run: 4 steps of 16 images.
    Returns ``out_dir`` and ``digits`` (the folder)."""
    from dit_core.data import export_digits

    if _smoke(params):
        params.update(STEPS=4, BATCH_SIZE=16)
    out_dir = Path(_need(params, "OUT_DIR")[0])
    shutil.rmtree(out_dir / "runs", ignore_errors=True)
    return SimpleNamespace(out_dir=out_dir, digits=export_digits(out_dir / "data" / "digits"))


def tutorial_claims(params: dict) -> SimpleNamespace:
    """The appendix. Reads the DiT-XL/2 ladder recorded on an H200 (``GPU_RESULTS="auto"``: the repository's
    ``benchmarks/results``). A smoke run: 3 training steps. Returns ``rows`` (the ladder's rows by rung; empty when
    the record is missing), ``ladder_path``, ``shape`` (DiT-XL/2's) and ``static`` (its fp32 weights, gradients,
    AdamW moments and EMA, in bytes)."""
    import dit_core
    from dit_core.measure import memory

    if _smoke(params):
        params["STEPS"] = 3
    set_threads()
    torch.manual_seed(0)
    (results,) = _need(params, "GPU_RESULTS")
    folder = (Path(dit_core.__file__).resolve().parent.parent / "benchmarks" / "results" if results == "auto"
              else Path(results))
    ladder_path = folder / "nvidia-h200-dit-xl2.json"
    ladder = json.loads(ladder_path.read_text()) if ladder_path.is_file() else None
    rows = {r["rung"]: r for run in ladder["results"] for r in run["rows"]} if ladder else {}
    shape = memory.ModelShape.from_name("DiT-XL/2")
    floor = memory.estimate(shape, micro_batch=1, precision="fp32")
    return SimpleNamespace(rows=rows, ladder_path=ladder_path if ladder else None, folder=folder, shape=shape,
                           static=floor.weights + floor.grads + floor.optimizer + floor.ema)

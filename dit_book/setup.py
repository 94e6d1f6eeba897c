"""Each chapter's set-up in one call: the track, the device, the tiny sizes of a smoke run, stand-ins for downloads.

A chapter's first code cell after its ``parameters`` cell imports what the chapter uses, calls this module's function
for the chapter with the notebook's names, and applies what it returns in one visible line::

    ch = setup.sampling(globals())   # reads the parameters; prints what this run changes in them, and why
    globals().update(ch.changes)     # the one place where those changes take effect

Each function

* reads the chapter's parameters (a missing one is an error that names it) and **never writes into them**;
* returns a :class:`Resolved`: ``changes``, the parameters this run uses with another value (the tiny sizes of a
  smoke run, each ``"auto"`` that the chapter reads under its own name, and on the GPU track in a smoke run the
  stand-ins made here for the downloads, :func:`dit_book.track.standins`), and as attributes what the chapter derives
  (``ch.device``, ``ch.track``, ``ch.out_dir``, ...);
* prints one line that says each change and why, each ``"auto"`` it resolved into an attribute, each folder it
  cleared, and the CPU threads and seed it set for torch, e.g.
  ``smoke run: PER_CLASS 20 -> 2, STEPS 50 -> 5 | stand-ins: VAE stabilityai/sd-vae-ft-ema -> ../outputs/standins/vae
  | auto: TRACK = gpu, DEVICE = cpu | torch: 2 CPU threads``.

What a reader changes stays in the ``parameters`` cell; what ``SMOKE``, ``"auto"`` or ``TRACK = "gpu"`` then change is
in that chapter's function here, and on the page under its set-up cell. ``tests/test_book_setup.py`` reads every
chapter's ``parameters`` cell (without running it) and checks what each function changes.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path
from typing import Any, Mapping

import torch

from dit_core.runtime import set_threads

from . import track as tracks
from .notebooks import SMOKE_ENV, smoke_mode

#: Where the chapters make the stand-ins for the GPU track's downloads in a smoke run (relative to book/, where a
#: chapter runs); every chapter uses the same ones.
STANDINS = "../outputs/standins"

SMOKE_RUN = "smoke run"
AUTO = "auto"
STANDIN = "stand-ins"


def _show(value: Any, width: int = 48) -> str:
    text = str(value) if isinstance(value, (str, Path)) else repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


class Resolved:
    """What a chapter's set-up resolved from its ``parameters``, without writing into them.

    * ``changes``: parameter name -> the value this run uses instead (apply with ``globals().update(ch.changes)``);
    * ``reasons``: parameter name -> why it changed (``"smoke run"``, ``"auto"``, ``"stand-ins"``, ...);
    * ``resolved``: ``"auto"`` knobs the chapter reads through an attribute instead (``TRACK`` -> ``ch.track``);
    * ``cleared``: folders emptied for this run; ``threads``, ``seed``: what was set for torch (or None);
    * any other attribute: a value the chapter derives (``ch.device``, ``ch.out_dir``, ...).

    ``str(ch)`` is the line the set-up prints.
    """

    def __init__(self, chapter: str, params: Mapping[str, Any]):
        self.chapter = chapter
        self._params = params
        self.changes: dict[str, Any] = {}
        self.reasons: dict[str, str] = {}
        self.resolved: dict[str, Any] = {}
        self.cleared: list[str] = []
        self.threads: int | None = None
        self.seed: int | None = None

    # -- reading and changing knobs
    def need(self, *names: str) -> list:
        """The current values of ``names`` (a change made here included); a name the parameters lack is an error."""
        missing = [n for n in names if n not in self._params]
        if missing:
            it = "it" if len(missing) == 1 else "them"
            raise KeyError(f"this chapter's setup reads {missing} from its `parameters` cell, which does not define "
                           f"{it}; add {it} there")
        return [self.changes.get(n, self._params[n]) for n in names]

    def get(self, name: str) -> Any:
        return self.need(name)[0]

    def set(self, name: str, value: Any, why: str) -> Any:
        """This run uses ``value`` for parameter ``name``, because ``why``; returns ``value``."""
        self.need(name)
        original = self._params[name]
        if type(value) is type(original) and value == original:
            self.changes.pop(name, None)
            self.reasons.pop(name, None)
        else:
            self.changes[name] = value
            self.reasons[name] = why
        return value

    def smoke_sizes(self, **values) -> None:
        """A smoke run's tiny values of several parameters."""
        for name, value in values.items():
            self.set(name, value, SMOKE_RUN)

    def auto(self, name: str, value: Any) -> Any:
        """``value`` for ``name`` when the parameter is ``"auto"`` (recorded as a change); else its own value."""
        current = self.get(name)
        return self.set(name, value, AUTO) if isinstance(current, str) and current == "auto" else current

    def note_auto(self, name: str, value: Any) -> Any:
        """Record what an ``"auto"`` knob that the chapter reads through an attribute came to; returns ``value``."""
        if isinstance(self.get(name), str) and self.get(name) == "auto":
            self.resolved[name] = value
        return value

    # -- what the set-up does besides
    def clear(self, folder) -> Path:
        """Empty ``folder`` for this run (it is the chapter's own scratch folder) and say so."""
        folder = Path(folder)
        if folder.exists():
            shutil.rmtree(folder)
            self.cleared.append(str(folder))
        return folder

    def set_threads(self, n: int | None = None) -> int:
        self.threads = set_threads(n)
        return self.threads

    def manual_seed(self, seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.seed = seed

    # -- the line
    def __str__(self) -> str:
        groups: dict[str, list[str]] = {}
        for name, value in self.changes.items():
            groups.setdefault(self.reasons[name], []).append(f"{name} {_show(self._params[name])} -> {_show(value)}")
        for name, value in self.resolved.items():  # an "auto" the chapter reads through an attribute
            groups.setdefault(AUTO, []).append(f"{name} = {_show(value)}")
        parts = [f"{why}: {', '.join(items)}" for why, items in groups.items()]
        if self.cleared:
            parts.append("cleared " + ", ".join(self.cleared))
        torch_parts = ([f"{self.threads} CPU thread{'s' if self.threads != 1 else ''}"] if self.threads else []) + \
            ([f"seed {self.seed}"] if self.seed is not None else [])
        if torch_parts:
            parts.append("torch: " + ", ".join(torch_parts))
        return " | ".join(parts) if parts else "the parameters as given"

    def __repr__(self) -> str:
        return f"<set-up of {self.chapter}: {self}>"

    def done(self) -> "Resolved":
        """Print the line and return self (the last step of every chapter's function)."""
        print(self)
        return self


def _start(chapter: str, params: Mapping[str, Any]) -> tuple[Resolved, bool]:
    """A :class:`Resolved` for ``chapter`` and whether this is a smoke run (``SMOKE``, or ``DIT_SMOKE`` set)."""
    r = Resolved(chapter, params)
    smoke = bool(r.get("SMOKE"))
    if not smoke and smoke_mode():
        smoke = r.set("SMOKE", True, f"{SMOKE_ENV} set")
    return r, smoke


def _device(r: Resolved, name: str = "DEVICE", write: bool = False) -> torch.device:
    """``"auto"``: the first CUDA GPU if there is one, else the CPU. ``write``: the chapter reads the knob itself, so
    the resolved name becomes a change; else it is noted and the chapter uses the returned device."""
    value = r.get(name)
    if value == "auto":
        resolved = "cuda" if torch.cuda.is_available() else "cpu"
        r.set(name, resolved, AUTO) if write else r.note_auto(name, resolved)
        value = resolved
    return torch.device(value)


def _track(r: Resolved) -> str:
    return r.note_auto("TRACK", tracks.choose_track(r.get("TRACK")))


def _standins(r: Resolved, vae: bool = False, official: bool = False) -> dict:
    """Stand-ins for the GPU track's downloads (made once in :data:`STANDINS`), in place of the download knobs the
    chapter has: the VAE (``vae``), the official checkpoint and Inception (``official``, where ``"auto"``), and
    Imagenette's archive (where none is given; a made-up archive has no published checksum)."""
    stand = tracks.standins(STANDINS)
    if vae:
        r.set("VAE", str(stand["vae"]), STANDIN)
    if official:
        for name, key in (("OFFICIAL_CKPT", "official"), ("INCEPTION", "inception")):
            if r.get(name) == "auto":
                r.set(name, str(stand[key]), STANDIN)
    if r.get("IMAGENETTE_ARCHIVE") is None:
        r.set("IMAGENETTE_ARCHIVE", str(stand["archive"]), STANDIN)
        r.set("CHECKSUM", False, STANDIN)
    return stand


def _gpu_route(r: Resolved, smoke: bool) -> tuple[str, bool]:
    """The track, and whether this run may download (the GPU track's ``DOWNLOAD="auto"``; never in a smoke run)."""
    track = _track(r)
    download = r.note_auto("DOWNLOAD", bool(tracks.auto(r.get("DOWNLOAD"), track == "gpu")) and not smoke)
    return track, download


def _gpu_paths(r: Resolved, smoke: bool, latents: bool = True):
    names = ("DATA_DIR", "LATENTS_DIR") if latents else ("DATA_DIR",)
    data_dir, latents_dir = tracks.gpu_paths(*r.need(*names), smoke=smoke)
    r.note_auto("DATA_DIR", str(data_dir))
    if latents:
        r.note_auto("LATENTS_DIR", str(latents_dir))
    return data_dir, latents_dir


def _gpu_sizes(smoke: bool) -> dict:
    """The GPU track's image size (DiT's 256 px; 32 px stand-ins in a smoke run) and the steps of the first leg of a
    run trained for a budget of minutes, which measure the card's speed (:func:`dit_book.track.train_for`)."""
    return {"gpu_image_size": 32 if smoke else 256, "calibration_steps": 2 if smoke else 50}


def _attrs(r: Resolved, **values) -> Resolved:
    for k, v in values.items():
        setattr(r, k, v)
    return r.done()


# ------------------------------------------------------------------------------------------------ 00 .. 02
def environment(params: Mapping[str, Any]) -> Resolved:
    """Chapter 00. ``MATMUL_SIZE="auto"``: 8192 on a GPU, 512 on a CPU; a smoke run times 256 x 256, twice.
    Returns ``device``, ``threads``, ``track``."""
    r, smoke = _start("00_environment", params)
    device = _device(r)
    r.auto("MATMUL_SIZE", 8192 if device.type == "cuda" else 512)
    if smoke:
        r.smoke_sizes(MATMUL_SIZE=256, MATMUL_REPEATS=2)
    threads = r.set_threads()
    return _attrs(r, device=device, threads=threads, track=_track(r))


def data(params: Mapping[str, Any]) -> Resolved:
    """Chapter 01. A smoke run shows fewer and smaller images; on the GPU track it prepares a stand-in archive in
    Imagenette's layout. Returns ``track``, ``download`` and ``data_dir`` (the GPU track's folder)."""
    r, smoke = _start("01_data", params)
    if smoke:
        r.smoke_sizes(GRID_PER_CLASS=4, PHOTO_SIZE=64, MESSY_IMAGES=8, MESSY_SIZE=32)
    r.manual_seed(0)
    r.set_threads()
    track, download = _gpu_route(r, smoke)
    data_dir, _ = _gpu_paths(r, smoke, latents=False)
    if smoke and track == "gpu" and r.get("IMAGENETTE_ARCHIVE") is None:
        _standins(r)
    return _attrs(r, track=track, download=download, data_dir=data_dir)


def latents(params: Mapping[str, Any]) -> Resolved:
    """Chapter 02. Its ``"auto"`` sizes are a GPU's (256 px, 512 images, batch 32, 8 compared) or a CPU's (128 px,
    8, 4, 1); a smoke run encodes 8 images of 32 px, and on the GPU track a stand-in archive with a tiny VAE.
    Returns ``device``, ``gpu``, ``precision`` (the encoder's), ``threads``, ``work`` (the scratch folder),
    ``track``, ``download`` (the VAE's), ``data_dir``, ``latents_dir`` and ``stand`` (the stand-ins, or None)."""
    from dit_core.runtime import resolve_precision

    r, smoke = _start("02_latents", params)
    device = _device(r)
    gpu = device.type == "cuda"
    for name, on_gpu, on_cpu in (("IMAGE_SIZE", 256, 128), ("NUM_IMAGES", 512, 8), ("BATCH_SIZE", 32, 4),
                                 ("COMPARE_IMAGES", 8, 1)):
        r.auto(name, on_gpu if gpu else on_cpu)
    download = r.note_auto("DOWNLOAD_VAE", gpu if r.get("DOWNLOAD_VAE") == "auto" else bool(r.get("DOWNLOAD_VAE")))
    download = download and not smoke
    if smoke:
        r.smoke_sizes(IMAGE_SIZE=32, NUM_IMAGES=8, BATCH_SIZE=4, SHOW_IMAGES=2, COMPARE_IMAGES=1)
    precision = r.note_auto("PRECISION", resolve_precision(r.get("PRECISION"), device, "vae"))
    r.manual_seed(0)
    threads = r.set_threads()
    track = _track(r)
    data_dir, latents_dir = _gpu_paths(r, smoke)
    stand = None
    if smoke and track == "gpu":
        stand = _standins(r)
        r.smoke_sizes(GPU_IMAGE_SIZE=32, GPU_BATCH_SIZE=8, RECON_IMAGES=4)
    return _attrs(r, device=device, gpu=gpu, precision=precision, threads=threads, work=Path(r.get("WORK_DIR")),
                  track=track, download=download, data_dir=data_dir, latents_dir=latents_dir, stand=stand)


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


def _reader(r: Resolved) -> Path:
    """``READER_DIR``, the folder of the reader's own code (:mod:`dit_book.reader`), and its cell magics
    ``%%answer`` and ``%%solution``, added to the running IPython (outside IPython nothing is added)."""
    from . import reader

    reader.register()
    return Path(r.get("READER_DIR"))


def model(params: Mapping[str, Any]) -> Resolved:
    """Chapter 03. ``DEVICE="auto"``: the first CUDA GPU when there is one, else the CPU (the chapter reads
    ``DEVICE`` itself, so its resolved name is a change); a smoke run times the attention backends on DiT-S/4 at
    64 px, batch 2, once. Adds the ``%%answer`` and ``%%solution`` magics of exercises 4 to 9. Returns ``device``
    and ``reader_dir``."""
    r, smoke = _start("03_model", params)
    device = _device(r, write=True)
    r.need("BENCH_MODEL", "BENCH_IMAGE_SIZE", "BENCH_BATCH", "BENCH_REPEATS")
    if smoke:
        r.smoke_sizes(BENCH_MODEL="DiT-S/4", BENCH_IMAGE_SIZE=64, BENCH_BATCH=2, BENCH_REPEATS=1)
    r.set_threads()
    r.manual_seed(0)
    return _attrs(r, device=device, reader_dir=_reader(r))


def diffusion(params: Mapping[str, Any]) -> Resolved:
    """Chapter 04. A smoke run uses 50 digits, 4 samples, two samplers and 10 DPM-Solver++ steps. Adds the
    exercises' ``%%answer`` and ``%%solution`` magics. Returns the digits: ``points``, ``labels`` (the first
    ``NUM_POINTS``, which the exact denoiser knows) and ``held_out`` (200 real digits after them, which it never
    sees), and ``reader_dir``."""
    r, smoke = _start("04_diffusion", params)
    r.need("NUM_POINTS", "NUM_SAMPLES", "SAMPLERS", "DPM_STEPS")
    if smoke:
        r.smoke_sizes(NUM_POINTS=50, NUM_SAMPLES=4, SAMPLERS=["50", "ddim10"], DPM_STEPS=10)
    r.set_threads()
    r.manual_seed(0)
    points, labels = digits(r.get("NUM_POINTS"))
    held_out, _ = digits(200, start=r.get("NUM_POINTS"))
    return _attrs(r, points=points, labels=labels, held_out=held_out, reader_dir=_reader(r))


def training(params: Mapping[str, Any]) -> Resolved:
    """Chapter 05. A smoke run trains the tiny DiT for 20 steps in ``<OUT_DIR>/smoke_run`` and the reader's DiT
    for 30. Adds the exercises' ``%%answer`` and ``%%solution`` magics. Returns the digits (``x_all``, ``y_all``),
    :data:`TINY` (``tiny``), ``out_dir``, whose ``demo`` folder, for the small demonstrations, starts empty, and
    ``reader_dir``."""
    r, smoke = _start("05_training", params)
    out_dir, my_steps = r.need("OUT_DIR", "MY_DIT_STEPS")
    r.need("RUN_DIR", "MAX_STEPS", "SAMPLE_EVERY", "EVAL_PER_CLASS")
    if smoke:
        r.smoke_sizes(RUN_DIR=f"{out_dir}/smoke_run", MAX_STEPS=20, SAMPLE_EVERY=10, EVAL_PER_CLASS=2,
                      MY_DIT_STEPS=min(my_steps, 30))
    r.set_threads()
    out = Path(out_dir)
    r.clear(out / "demo")
    x_all, y_all = digits()
    return _attrs(r, out_dir=out, tiny=dict(TINY), x_all=x_all, y_all=y_all, reader_dir=_reader(r))


# ------------------------------------------------------------------------------------------------ 05b
#: The tiny DiT of a smoke run of chapter 05b's own-folder run (section 5b.3): chapter 05's, without progress bars.
OWN_TINY = dict(TINY, progress=False)


def your_data(params: Mapping[str, Any]) -> Resolved:
    """Chapter 05b. A smoke run trains 10 steps of a tiny DiT on a made-up folder of 8 files a class and, on the GPU
    track, a few seconds at 32 px on stand-ins (a made-up archive, a tiny VAE). Returns ``track``, ``download``,
    ``data_dir``, ``latents_dir``, ``out_dir``, ``own_overrides`` (the settings a smoke run adds to the own-folder
    run), ``gpu_image_size`` and ``calibration_steps``."""
    r, smoke = _start("05b_your_data", params)
    (out_dir,) = r.need("OUT_DIR")
    if smoke:
        r.smoke_sizes(OWN_RUN_DIR=out_dir + "/smoke_own_run", OWN_MAX_STEPS=10, OWN_PER_CLASS=8,
                      OWN_SEARCH_PER_CLASS=2)
    r.set_threads()
    track, download = _gpu_route(r, smoke)
    data_dir, latents_dir = _gpu_paths(r, smoke)
    if smoke:  # the GPU track at toy size: 32 px stand-in data, a tiny VAE and a tiny DiT, a few seconds of training
        r.smoke_sizes(GPU_RUN_DIR=out_dir + "/smoke_gpu_run", TRAIN_MINUTES=0.05, TRAIN_STEPS=None,
                      GPU_SAMPLE_EVERY=2)
        if track == "gpu":
            _standins(r, vae=True)
    return _attrs(r, track=track, download=download, data_dir=data_dir, latents_dir=latents_dir,
                  out_dir=Path(out_dir), own_overrides=dict(OWN_TINY) if smoke else {}, **_gpu_sizes(smoke))


# ------------------------------------------------------------------------------------------------ 06
def memory_and_speed(params: Mapping[str, Any]) -> Resolved:
    """Chapter 06. ``"auto"``: DiT-XL/2 at batch 32 with the compiled rungs, each rung in its own process, on a GPU;
    the digits profile's model at batch 64 in this process on a CPU. A smoke run times one step of a tiny pixel
    model. Returns ``device``, ``gpu``, ``threads``, ``spec`` (the ladder's :class:`~dit_core.measure.bench.BenchSpec`)
    and ``shape`` (its model's shape)."""
    from dit_core.measure import bench
    from dit_core.runtime import resolve_device

    r, smoke = _start("06_memory_and_speed", params)
    image_size, steps, sample_steps, card = r.need("IMAGE_SIZE", "STEPS", "SAMPLE_STEPS", "CARD_GIB")
    threads = r.set_threads(r.get("THREADS"))
    device = resolve_device(r.get("DEVICE"))
    r.note_auto("DEVICE", str(device))
    gpu = device.type == "cuda"
    model_name = r.auto("MODEL", "DiT-XL/2" if gpu else "digits")
    batch = r.auto("BATCH_SIZE", 32 if gpu else 64)
    for name in ("INCLUDE_COMPILE", "ISOLATE"):
        r.auto(name, gpu)
    spec = bench.resolve_spec(bench.BenchSpec(model=model_name, image_size=image_size, batch_size=batch, steps=steps,
                                              device=str(device), threads=threads, sample_steps=sample_steps,
                                              vae="stabilityai/sd-vae-ft-ema",
                                              memory_limit_gib=None if card == "auto" else float(card)))
    if smoke:  # a tiny pixel-space model, one timed step, no compilation, no subprocesses
        spec = bench.BenchSpec(model="tiny", pixel=True, image_size=8, batch_size=8, steps=1, warmup=1, device="cpu",
                               threads=threads, sample_steps=2, sample_batch=2,
                               shape=dict(depth=2, hidden_size=64, num_heads=4, patch_size=2, input_size=8,
                                          in_channels=1, num_classes=10))
        r.smoke_sizes(INCLUDE_COMPILE=False, ISOLATE=False, CARDS_GIB=[12, 24, 80])
    return _attrs(r, device=device, gpu=gpu, threads=threads, spec=spec, shape=bench.model_shape(spec))


# ------------------------------------------------------------------------------------------------ 07, 07b, 07c
def sampling(params: Mapping[str, Any]) -> Resolved:
    """Chapter 07. A smoke run trains a 30-step digits model and samples a few images at few steps; on the GPU track
    it makes stand-ins for every download (a made-up archive, a tiny VAE, a tiny DiT in the official format, random
    Inception weights) and computes FIDs of 10 samples; the reader's DiT, when chapter 5 has not trained it, trains
    for 30 steps. Adds the ``%%answer`` and ``%%solution`` magics of the guidance exercise. Returns ``track``,
    ``download``, ``data_dir``, ``latents_dir``, ``device``, ``amp`` (the autocast precision), ``out_dir``
    (created), ``gpu_image_size``, ``calibration_steps``, ``reader_dir`` and ``digits`` (the images and labels the
    reader's DiT trains on when chapter 5's is missing)."""
    from dit_core.runtime import resolve_precision

    r, smoke = _start("07_sampling", params)
    (out_dir,) = r.need("OUT_DIR")
    if smoke:  # tiny settings: a 30-step model, a few images, two sweep points
        r.smoke_sizes(RUN_DIR=out_dir + "/smoke_run", TRAIN_STEPS=30, PER_CLASS=2, SWEEP_PER_CLASS=1, STEPS=5,
                      ANIMATION_STEPS=5, CFG_SWEEP=[1.0, 4.0], STEP_SWEEP=[2, 5],
                      SWEEP_SAMPLERS=["ddim", "dpm-solver++"], MY_DIT_STEPS=min(r.get("MY_DIT_STEPS"), 30))
    r.set_threads()
    track, download = _gpu_route(r, smoke)
    data_dir, latents_dir = _gpu_paths(r, smoke)
    if smoke:  # the GPU track at toy size: a few sampler steps, a handful of FID samples
        r.smoke_sizes(GPU_RUN_DIR=out_dir + "/smoke_gpu_run", TRAIN_MINUTES=0.05, PICTURE_STEPS=3,
                      SAMPLER_RACE=[["ddpm", 3], ["ddim", 2], ["dpm-solver++", 2]], FID_SAMPLES=10, FID_STEPS=2,
                      GPU_BATCH=10)
        if track == "gpu":
            _standins(r, vae=True, official=True)
    device = _device(r)
    amp = r.note_auto("PRECISION", resolve_precision(r.get("PRECISION"), device))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return _attrs(r, track=track, download=download, data_dir=data_dir, latents_dir=latents_dir, device=device,
                  amp=amp, out_dir=out, **_gpu_sizes(smoke), reader_dir=_reader(r), digits=digits())


def converging(params: Mapping[str, Any]) -> Resolved:
    """Chapter 07b. A smoke run re-measures 30 steps of a tiny model. Returns ``live_overrides``, the model settings
    the live runs add to the profile (none at the chapter's defaults)."""
    r, smoke = _start("07b_converging_faster", params)
    overrides = {}
    if smoke:
        r.smoke_sizes(LIVE_STEPS=30, LIVE_EVAL_EVERY=15, LIVE_PER_CLASS=3, LIVE_EVAL_STEPS=5)
        overrides = dict(depth=2, hidden_size=64, repa_depth=1, repa_projector_dim=32)
    r.set_threads()
    r.manual_seed(0)
    return _attrs(r, live_overrides=overrides)


#: A smoke run's tiny DiT in chapter 7c (its live runs and the GPU track's runs).
FINDINGS_SMOKE_DIT = dict(depth=1, hidden_size=32, num_heads=2)


def paper_findings(params: Mapping[str, Any]) -> Resolved:
    """Chapter 7c. One CPU thread here (a model this small runs faster on one; the live runs take one core each).
    A smoke run trains 10 steps of a tiny DiT; on the GPU track it makes stand-ins for the downloads (a made-up
    Imagenette archive, a tiny VAE, random Inception weights) and runs two designs and two models of the GPU studies
    at 32 px, 2 steps of a tiny DiT each, scored once. Returns ``track``, ``download``, ``data_dir``,
    ``latents_dir``, ``device``, ``out_dir`` (created), ``live_overrides`` (the model settings the live runs add: a
    tiny DiT in a smoke run), ``gpu_image_size`` and ``gpu_overrides`` (the same for the GPU studies)."""
    r, smoke = _start("07c_paper_findings", params)
    (out_dir,) = r.need("OUT_DIR")
    live_overrides = {}
    if smoke:
        r.smoke_sizes(LIVE_STEPS=10, LIVE_EVAL_EVERY=5, LIVE_PER_CLASS=2, LIVE_EVAL_STEPS=3, LIVE_JOBS=1)
        live_overrides = dict(FINDINGS_SMOKE_DIT)
    r.set_threads(1)
    r.manual_seed(0)
    track, download = _gpu_route(r, smoke)
    data_dir, latents_dir = _gpu_paths(r, smoke)
    if smoke:  # the GPU track at toy size: 32 px stand-ins, patches that fit 4x4 latents, two steps a run
        r.smoke_sizes(GPU_BLOCKS_MODEL="DiT-S/2", GPU_DESIGNS=["adaln-zero", "in-context"],
                      GPU_SCALING_MODELS=["DiT-S/4", "DiT-S/2"], GPU_STEPS=2, GPU_EVAL_EVERY=2, GPU_FID_SAMPLES=4,
                      GPU_FID_STEPS=2, GPU_BATCH=4, GPU_OUT_DIR=out_dir + "/smoke_gpu_runs")
        if track == "gpu":
            stand = _standins(r, vae=True)
            if r.get("INCEPTION") == "auto":
                r.set("INCEPTION", str(stand["inception"]), STANDIN)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")   # the GPU track's studies run there
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    gpu_overrides = dict(FINDINGS_SMOKE_DIT, num_workers=0, mixed_precision="fp32", tf32=False) if smoke else {}
    return _attrs(r, track=track, download=download, data_dir=data_dir, latents_dir=latents_dir, device=device,
                  out_dir=out, live_overrides=live_overrides, gpu_image_size=32 if smoke else 256,
                  gpu_overrides=gpu_overrides)


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


def troubleshooting(params: Mapping[str, Any]) -> Resolved:
    """Chapter 08. Clears the chapter's ``runs/`` and ``bad-data/`` (only what it writes), exports the digits as an
    ImageFolder and opens them as 8 x 8 grey images, one CPU thread (at this size more threads only add overhead).
    A smoke run: 16 steps of 16 images. Returns ``out``, ``runs_dir``, ``digits_dir``, ``digits`` and ``runs`` (a
    :class:`SmallRuns`)."""
    from dit_core.data import export_digits
    from dit_core.latents import open_dataset

    r, smoke = _start("08_troubleshooting", params)
    if smoke:
        r.smoke_sizes(STEPS=16, BATCH_SIZE=16)
    out_dir, steps, batch, tiny, device = r.need("OUT_DIR", "STEPS", "BATCH_SIZE", "TINY_DIT", "DEVICE")
    r.set_threads(1)
    r.manual_seed(0)
    out = Path(out_dir)
    runs_dir = out / "runs"
    for scratch in (runs_dir, out / "bad-data"):
        r.clear(scratch)
    digits_dir = export_digits(out / "data" / "digits")
    digits = open_dataset(digits_dir, image_size=8, mode="L", flip=False)
    return _attrs(r, out=out, runs_dir=runs_dir, digits_dir=digits_dir, digits=digits,
                  runs=SmallRuns(runs_dir, digits_dir, digits, tiny, steps, batch, device))


# ------------------------------------------------------------------------------------------------ 09, appendix
def beyond_one_gpu(params: Mapping[str, Any]) -> Resolved:
    """Chapter 09. Clears the chapter's ``runs/`` and exports the digits. A smoke run: 4 steps of 16 images.
    Returns ``out_dir`` and ``digits`` (the folder)."""
    from dit_core.data import export_digits

    r, smoke = _start("09_beyond_one_gpu", params)
    if smoke:
        r.smoke_sizes(STEPS=4, BATCH_SIZE=16)
    out_dir = Path(r.get("OUT_DIR"))
    r.clear(out_dir / "runs")
    return _attrs(r, out_dir=out_dir, digits=export_digits(out_dir / "data" / "digits"))


def tutorial_claims(params: Mapping[str, Any]) -> Resolved:
    """The appendix. Reads the DiT-XL/2 ladder recorded on an H200 (``GPU_RESULTS="auto"``: the repository's
    ``benchmarks/results``). A smoke run: 3 training steps. Returns ``rows`` (the ladder's rows by rung; empty when
    the record is missing), ``ladder_path``, ``shape`` (DiT-XL/2's) and ``static`` (its fp32 weights, gradients,
    AdamW moments and EMA, in bytes)."""
    import dit_core
    from dit_core.measure import memory

    r, smoke = _start("appendix_tutorial_claims", params)
    if smoke:
        r.smoke_sizes(STEPS=3)
    r.set_threads()
    r.manual_seed(0)
    (results,) = r.need("GPU_RESULTS")
    folder = (Path(dit_core.__file__).resolve().parent.parent / "benchmarks" / "results" if results == "auto"
              else Path(results))
    r.note_auto("GPU_RESULTS", str(folder))
    ladder_path = folder / "nvidia-h200-dit-xl2.json"
    ladder = json.loads(ladder_path.read_text()) if ladder_path.is_file() else None
    rows = {r_["rung"]: r_ for run in ladder["results"] for r_ in run["rows"]} if ladder else {}
    shape = memory.ModelShape.from_name("DiT-XL/2")
    floor = memory.estimate(shape, micro_batch=1, precision="fp32")
    return _attrs(r, rows=rows, ladder_path=ladder_path if ladder else None, folder=folder, shape=shape,
                  static=floor.weights + floor.grads + floor.optimizer + floor.ema)

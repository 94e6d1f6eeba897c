"""The setup of chapters 3, 4 and 5 (the model, the diffusion process, training), one call per chapter.

Each call takes the chapter's parameters, replaces the costly ones by tiny values in a smoke run (the tests'
``SMOKE = True``), sets torch's threads and seed, prints what runs where, and returns what the chapter uses, so
that the chapter's setup cell stays a few lines and its parameters cell is the one place of every knob::

    from dit_book.chapters_model import setup_diffusion_chapter

    ch = setup_diffusion_chapter(SMOKE, num_points=300, num_samples=20, samplers=["250", "ddim50"], dpm_steps=20)
    ch.points.shape, ch.samplers      # (300, 1, 8, 8) digits in [-1, 1]; the samplers to run
"""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import torch

import dit_core
from dit_core.runtime import set_threads

#: Chapter 5's demonstrations (and, in a smoke run, its main run): a DiT of 2 blocks of width 64.
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


def resolve_device(device: str) -> str:
    """``"auto"``: the first CUDA GPU when there is one, else the CPU; anything else as given."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def setup_model_chapter(smoke: bool, device: str, bench_model: str, bench_image_size: int, bench_batch: int,
                        bench_repeats: int) -> tuple:
    """Chapter 3: ``(device, bench_model, bench_image_size, bench_batch, bench_repeats)``, the attention
    benchmark's settings (DiT-S/4 at 64 px, batch 2, one repeat in a smoke run)."""
    device = resolve_device(device)
    if smoke:
        bench_model, bench_image_size, bench_batch, bench_repeats = "DiT-S/4", 64, 2, 1
    set_threads()
    torch.manual_seed(0)
    print("dit_core", dit_core.__version__, "| torch", torch.__version__, "| device", device)
    return device, bench_model, bench_image_size, bench_batch, bench_repeats


def setup_diffusion_chapter(smoke: bool, num_points: int, num_samples: int, samplers: list, dpm_steps: int):
    """Chapter 4: its sizes (50 digits, 4 samples, two samplers, 10 DPM-Solver++ steps in a smoke run) and its
    digits: ``points``, ``labels`` (the first ``num_points``, which the exact denoiser knows) and ``held_out``
    (200 real digits after them, which it never sees)."""
    if smoke:
        num_points, num_samples, samplers, dpm_steps = 50, 4, ["50", "ddim10"], 10
    set_threads()
    torch.manual_seed(0)
    points, labels = digits(num_points)
    held_out, _ = digits(200, start=num_points)
    return SimpleNamespace(num_points=num_points, num_samples=num_samples, samplers=list(samplers),
                           dpm_steps=dpm_steps, points=points, labels=labels, held_out=held_out)


def setup_training_chapter(smoke: bool, *, run_dir: str, max_steps: int | None, sample_every: int,
                           eval_per_class: int, my_dit_steps: int, out_dir: str):
    """Chapter 5: its settings (a 20-step main run of the tiny DiT in ``<out_dir>/smoke_run``, 30 steps of the
    reader's DiT in a smoke run), the digits (``x_all``, ``y_all``), :data:`TINY`, and a fresh
    ``<out_dir>/demo`` for the small demonstrations."""
    if smoke:
        run_dir, max_steps, sample_every, eval_per_class = f"{out_dir}/smoke_run", 20, 10, 2
        my_dit_steps = min(my_dit_steps, 30)
    set_threads()
    out = Path(out_dir)
    shutil.rmtree(out / "demo", ignore_errors=True)
    x_all, y_all = digits()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads, CUDA: {torch.cuda.is_available()}")
    return SimpleNamespace(run_dir=run_dir, max_steps=max_steps, sample_every=sample_every,
                           eval_per_class=eval_per_class, my_dit_steps=my_dit_steps, out_dir=out,
                           tiny=dict(TINY), x_all=x_all, y_all=y_all)

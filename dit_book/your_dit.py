"""The reader's DiT, end to end: trained by their training step (chapter 5), saved as a ``dit_core`` checkpoint,
sampled with their DDIM step and guidance and scored (chapter 7), and published as a live page of its own.

Everything here runs the reader's code as :func:`dit_book.reader.load` assembles it (``yours``): their DiT class,
``training_step``, ``ddim_step`` and ``guided_fn``, the book's solution standing in for a part they have not
written. Nothing here re-implements them; what it adds is the plumbing around them:

* :func:`train`: the minimal loop of section 5.2, a random batch of digits per step and ``yours.training_step``,
  on ``yours.DiT`` at :data:`SIZE`, started from ``dit_core``'s initial weights (drawn first, then loaded into the
  reader's classes, which replaces whatever their ``__init__`` set: the start does not depend on how many random
  numbers it drew), with an EMA of decay 0.99; it records whose code made the model (:data:`MADE_BY`,
  :func:`made_by`);
* :func:`save` and :func:`load`: a training checkpoint in ``dit_core``'s layout (``model``, ``ema``, ``config``),
  which :func:`dit_core.load_dit` and :func:`dit_core.sample.load_model` open as they are (the parameter names are
  the official ones by construction: the checker of chapter 3 loads ``dit_core``'s weights into the reader's
  classes), and which :func:`load` opens into the reader's classes;
* :func:`sample`: DDIM with ``yours.ddim_step`` and ``yours.guided_fn`` over the steps
  :func:`dit_core.sample.generate` takes, from the starting noise it draws for the same seed (sample ``i`` from a
  generator seeded with ``seed + i``), so that the two can be compared number for number;
* :func:`publish`: one HTML file with a live sampler of the model (:func:`dit_book.browser.standalone_page`),
  exported from the reader's own classes. The page samples with the library's loops (``generate``'s DDIM and DDPM,
  run by ONNX Runtime Web), not with the reader's DDIM step and guidance, which :func:`sample` runs.

Chapter 7 trains the model itself (:func:`ensure`) when chapter 5's checkpoint is missing, and says so.
"""

from __future__ import annotations

import contextlib
import copy
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from . import reader

#: The reader's DiT of section 5.2: 2 blocks of width 64 on the 8x8 digits, patches of 2, a learned variance.
SIZE = dict(input_size=8, patch_size=2, in_channels=1, num_classes=10, depth=2, hidden_size=64, num_heads=2)
#: The noise schedule of the digits (chapter 5.1).
SCHEDULE = "squaredcos_cap_v2"
#: The checkpoint's file name in the reader's folder.
CHECKPOINT = "your_dit.pt"
#: The minimal loop's settings: a batch of 64, AdamW at a constant 5e-3, an EMA of decay 0.99 (a short run's).
BATCH, LR, EMA_DECAY = 64, 5e-3, 0.99
#: How the page and chapter 7 sample it by default: DDIM, 50 steps, guidance 2 (the digits profile's).
SAMPLER_STEPS, CFG_SCALE = 50, 2.0
#: The parts whose code made a trained model: the DiT's, the training step and the ``q_sample`` that the book's step
#: calls. The sampler's parts (the DDIM step, guidance) act only when the model is sampled.
MADE_BY = (*reader.MODEL_PARTS, "q_sample", "training_step")


@dataclass
class Trained:
    """A trained model of the reader's: the model, its EMA, the loss of every step, the seconds the loop took, and
    whose each part of the code that made it was (:data:`MADE_BY`, from :attr:`dit_book.reader.Yours.parts`)."""

    model: torch.nn.Module
    ema: torch.nn.Module
    losses: list[float]
    seconds: float
    steps: int
    parts: dict = field(default_factory=dict)


def diffusion(learn_sigma: bool = True):
    """The training diffusion of the reader's DiT: 1000 steps of the digits' cosine schedule."""
    from dit_core.diffusion import create_diffusion

    return create_diffusion("", noise_schedule=SCHEDULE, learn_sigma=learn_sigma)


def config() -> dict:
    """The ``dit_core`` DiT arguments of the reader's DiT (:data:`SIZE`, the paper's label dropout of 0.1, adaLN-Zero
    blocks), which rebuild it from its checkpoint or its ONNX file."""
    from dit_core.models import DiT

    with torch.device("meta"):
        return DiT(**SIZE).config()


@contextlib.contextmanager
def threads(n: int | None = 1):
    """torch's CPU threads set to ``n`` inside the block (``None``: unchanged), as they were after it. A DiT this small
    runs faster on one thread than on two (600 training steps: 18 s against 27 s on a 2-core CPU), and far faster
    when other work shares the cores."""
    before = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def train(yours, x, y, *, steps: int, batch: int = BATCH, lr: float = LR, ema_decay: float = EMA_DECAY,
          seed: int = 0, progress: bool = True, cpu_threads: int | None = 1) -> Trained:
    """Train ``yours.DiT`` with ``yours.training_step`` on the images ``x`` (``(N, 1, 8, 8)`` in [-1, 1]) and labels
    ``y`` for ``steps`` steps of a random batch each, from one generator seeded with ``seed`` (the batches and the
    step's draws). ``cpu_threads``: torch's CPU threads during the loop (:func:`threads`); ``None`` keeps them."""
    from tqdm.auto import tqdm

    from dit_core.models import DiT

    torch.manual_seed(seed)
    initial = DiT(**SIZE).state_dict()                 # dit_core's initialisation: Xavier, N(0, 0.02), zeros,
    model = yours.DiT(**SIZE)                          # drawn before the reader's __init__ draws anything
    model.load_state_dict(initial)                     # replaces whatever that __init__ set
    model.eval()                                       # eval(): the step drops the labels itself
    ema = copy.deepcopy(model).requires_grad_(False)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    process = diffusion()
    g = torch.Generator().manual_seed(seed)
    losses, start = [], time.perf_counter()
    with threads(cpu_threads):
        for _ in tqdm(range(steps), desc="your DiT", disable=not progress):
            idx = torch.randint(len(x), (batch,), generator=g)                # a random batch of digits
            losses.append(float(yours.training_step(model, ema, opt, process, x[idx], y[idx], g, ema_decay)))
    parts = {p: r for p, r in getattr(yours, "parts", {}).items() if p in MADE_BY}
    return Trained(model, ema, losses, time.perf_counter() - start, steps, parts)


def made_by(config: dict) -> str:
    """Whose code made the model of a checkpoint (its ``config``, as :func:`load` returns it): a sentence with the
    titles of the reader's parts and of the book's solutions that stood in."""
    parts = {p: whose for p, whose in config.get("yours", {}).get("parts", {}).items() if p in MADE_BY}
    mine = [reader.PARTS[p].title for p, whose in parts.items() if whose == "yours"]
    books = [reader.PARTS[p].title for p, whose in parts.items() if whose != "yours"]
    if not mine:
        return "made by the book's solutions alone (none of your parts yet)"
    return f"made by your {', '.join(mine)}" + (f"; the book's solutions stood in for {', '.join(books)}"
                                                 if books else "")


def save(path, trained: Trained) -> Path:
    """Write ``trained`` as a ``dit_core`` training checkpoint (atomically): the weights, the EMA (which samplers
    prefer), and a ``config`` with the model's arguments, the noise schedule, the class names, the sampling
    defaults and, under ``yours``, whose each part of the code that made it was (:data:`MADE_BY`) and how it
    trained."""
    from dit_core.checkpoint import atomic_save

    parts = {p: ("yours" if r.yours else f"the book's ({r.reason})") for p, r in trained.parts.items()}
    ckpt = {
        "model": trained.model.state_dict(),
        "ema": trained.ema.state_dict(),
        "step": trained.steps,
        "config": {
            "model_config": config(), "noise_schedule": SCHEDULE, "diffusion_steps": 1000, "objective": "ddpm",
            "classes": [str(d) for d in range(SIZE["num_classes"])], "data_kind": "pixels",
            "sample_sampler": "ddim", "sample_steps": SAMPLER_STEPS, "sample_cfg_scale": CFG_SCALE,
            "yours": {"parts": parts, "steps": trained.steps, "batch": BATCH, "lr": LR, "ema_decay": EMA_DECAY,
                      "final_loss": trained.losses[-1] if trained.losses else None,
                      "seconds": round(trained.seconds, 1)},
        },
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_save(ckpt, path)


def load(path, yours, *, weights: str = "ema"):
    """The reader's DiT (``yours.DiT``) with the ``weights`` (``"ema"`` or ``"model"``) of the checkpoint ``path``,
    in eval mode, and the checkpoint's ``config``."""
    from dit_core.checkpoint import read_checkpoint

    ckpt = read_checkpoint(path)
    cfg = ckpt["config"]["model_config"]
    model = yours.DiT(**{k: cfg[k] for k in ("input_size", "patch_size", "in_channels", "hidden_size", "depth",
                                               "num_heads", "mlp_ratio", "class_dropout_prob", "num_classes",
                                               "learn_sigma")})
    model.load_state_dict(ckpt[weights])
    return model.eval(), ckpt["config"]


def ensure(folder, yours, x, y, *, steps: int, progress: bool = True) -> tuple[Path, str]:
    """The checkpoint of the reader's DiT in ``folder`` (chapter 5's); trained here for ``steps`` steps with
    ``yours.training_step`` and saved when it is missing. Returns its path and a sentence saying which."""
    path = Path(folder) / CHECKPOINT
    if path.is_file():
        return path, f"your DiT from {path} (chapter 5 trained it)"
    trained = train(yours, x, y, steps=steps, progress=progress)
    save(path, trained)
    return path, (f"no {path} (chapter 5 writes it): your DiT trained here, {steps} steps in {trained.seconds:.0f} s "
                  "with the training step the line above names, and saved there")


def _ddim(process, steps: int):
    """The respaced process of DDIM with ``steps`` steps, as :func:`dit_core.sample.generate` builds it."""
    from dit_core.diffusion.respace import SpacedDiffusion, training_steps
    from dit_core.sample.samplers import ddim_timesteps

    return SpacedDiffusion(use_timesteps=ddim_timesteps(training_steps(process), steps), betas=process.betas,
                           model_mean_type=process.model_mean_type, model_var_type=process.model_var_type,
                           loss_type=process.loss_type)


def noise(count: int, shape, seed: int) -> torch.Tensor:
    """The starting noise :func:`dit_core.sample.generate` draws for ``count`` samples: sample ``i`` from a CPU
    generator seeded with ``seed + i``."""
    return torch.stack([torch.randn(tuple(shape), generator=torch.Generator().manual_seed(seed + i))
                        for i in range(count)])


@torch.no_grad()
def sample(model, labels, yours, *, steps: int = SAMPLER_STEPS, cfg_scale: float = CFG_SCALE, seed: int = 0,
           process=None) -> torch.Tensor:
    """DDIM with the reader's step and guidance: ``steps`` steps of ``yours.ddim_step`` on ``yours.guided_fn(model,
    cfg_scale)``'s noise prediction, from the noise :func:`noise` draws; ``(N, C, H, W)`` float32, not clipped
    (the reader's step has no clipping of ``x0_hat``: compare with ``generate(..., clip_denoised=False)``)."""
    process = process or diffusion(model.learn_sigma)
    spaced = _ddim(process, steps)
    labels = torch.as_tensor(labels)
    x = noise(len(labels), (model.in_channels, model.input_size, model.input_size), seed)
    model_fn = yours.guided_fn(model, cfg_scale)
    ab, ab_prev = spaced.alphas_cumprod, spaced.alphas_cumprod_prev
    for k in reversed(range(spaced.num_timesteps)):
        t = torch.full((len(x),), int(spaced.timestep_map[k]))
        eps = model_fn(x, t, labels)[:, : model.in_channels]
        x = yours.ddim_step(x, eps, float(ab[k]), float(ab_prev[k])).to(x.dtype)   # a float64 step: back to float32
    return x


def publish(model, path, *, title: str = "Your DiT, live", intro: str = "", runtime=None, cfg_scale: float = CFG_SCALE,
            steps: int = SAMPLER_STEPS, name: str = "your-dit"):
    """One HTML file at ``path`` that samples ``model`` (the reader's) in a browser, opened from disk, without a
    kernel: its ONNX export (the reader's own classes, rebuilt as ``dit_core``'s DiT from :func:`config`), the
    sampling tables of the digits' schedule and ONNX Runtime Web, inlined (:func:`dit_book.browser.write_standalone`;
    the runtime comes from ``make vendor``). The page samples with the library's loops, not the reader's DDIM step
    and guidance. Returns the :class:`~dit_book.browser.LiveSampler` (for the book's page, which links to the file)
    and the file's path, or None with the reason when ONNX Runtime Web is not there."""
    from .browser import live_sampler, runtime_folder, write_standalone

    widget = live_sampler(model, diffusion(model.learn_sigma), name=name, config=config(), cfg_scale=cfg_scale,
                          steps=steps, note="Your DiT's weights, sampled with the library's DDIM and DDPM loops.")
    try:
        runtime = runtime_folder(runtime)
    except FileNotFoundError as err:
        return widget, None, str(err)
    return widget, write_standalone(widget, path, runtime=runtime, title=title, intro=intro), ""

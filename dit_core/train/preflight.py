"""Pre-flight: the settings that cannot work for *this* run, named before the first step, each with its fix.

A configuration can be valid (every key has a legal value, :func:`dit_core.train.config.validate`) and still
be unable to give a result on the data at hand. The paper's recipe is made for 400K steps on 1.28M images;
moved to 150 steps on 360 pictures, it trains without a word and samples noise, because its EMA (decay
0.9999, an average over the last ~10,000 steps) still holds 98.5 % of the random initial weights at the end.
:func:`preflight` compares the settings with the run's length and the dataset and returns a list of
:class:`Finding`: what is wrong, in numbers, the config key to change, and the change.

Findings are warnings unless the run is certain to fail (``level="error"``: e.g. an image side that the
patch size does not divide, which stops the model's construction, or a sample grid class that does not
exist, which stops the run at its first grid after all its training). The function is pure: it reads the
config and a few facts about the dataset (:class:`DatasetFacts`), opens nothing, and never changes either.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import torch

from .config import ConfigError, TrainConfig

#: DiT's learning rate (AdamW, constant, batch 256); small models tolerate more, with a warm-up.
USUAL_LR = 1e-4
#: Without a warm-up, a learning rate this many times :data:`USUAL_LR` or more is flagged.
NO_WARMUP_FACTOR = 10.0
#: Above this, even with a warm-up, AdamW on a transformer is far outside any measured working range.
MAX_LR = 1e-2
#: Share of the random initial weights that the EMA may still hold at the end of a run.
EMA_INITIAL_SHARE = 0.05
#: Fewer passes over the data than this is "a handful".
MIN_EPOCHS = 5.0
#: A run shorter than this share of a profile's ``reference_steps`` is flagged: the profile's figures do not
#: hold for it (small-images on a slow CPU: 1,120 steps, 41 % against 84 % at 3,968; small-images-recipe.md).
REFERENCE_SHARE = 0.75


@dataclass(frozen=True)
class Finding:
    """One setting that cannot work as it is: ``level`` ("warning" or "error"), the config ``key`` to
    change, the ``message`` (what goes wrong, in this run's numbers) and the ``fix`` (a command-line change)."""

    level: str
    key: str
    message: str
    fix: str

    def __str__(self) -> str:
        return f"{self.level}: {self.message} Fix: {self.fix}"


@dataclass(frozen=True)
class DatasetFacts:
    """What pre-flight needs to know about the training data (the trainer knows all of it after opening it).

    ``num_images``: items the run trains on (after ``subset``); ``num_classes``: 0 when unconditional;
    ``sample_shape``: ``(C, H, W)`` of the model's input (pixels, or latents of side image_size / 8);
    ``is_latent``: whether those are VAE latents. For an image folder, two optional facts from a look at a
    few files' headers (:meth:`of` reads them): ``grey_share``, the share of greyscale files, and
    ``median_side``, the median short side of the files in pixels (None: not known). ``folder``: what the
    folder's probe found (:class:`dit_core.data.probe.FolderProbe` as a dict, with ``flip``, the flips the dataset
    uses), when the run probed it (``flip: auto``, ``crop: object``).
    """

    num_images: int
    num_classes: int
    sample_shape: tuple[int, int, int]
    is_latent: bool = False
    grey_share: float | None = None
    median_side: int | None = None
    folder: dict | None = field(default=None, compare=False)

    @classmethod
    def of(cls, dataset, num_classes: int | None = None, probe: int = 64) -> "DatasetFacts":
        """The facts of a dataset as the trainer opens it (``len``, ``num_classes``, ``sample_shape``), and,
        for an image folder (a ``samples`` list of ``(path, label)``), the headers of ``probe`` files spread
        evenly over it (headers only: milliseconds)."""
        base = getattr(dataset, "dataset", dataset)  # a Subset's dataset
        shape = getattr(base, "sample_shape", None) or tuple(dataset[0][0].shape)
        classes = getattr(base, "num_classes", 0) if num_classes is None else num_classes
        grey, side = _probe(getattr(base, "samples", None), probe)
        found = getattr(base, "probe", None)
        folder = None
        if found is not None:
            flip = getattr(base, "flip", None)
            folder = {**found.to_dict(), "flip": sorted(flip) if isinstance(flip, frozenset) else flip}
        return cls(len(dataset), int(classes), tuple(int(s) for s in shape), hasattr(base, "latent_shape"),
                   grey, side, folder)


def _probe(samples, count: int) -> tuple[float | None, int | None]:
    """Share of greyscale files and median short side among ``count`` files of ``samples`` (None, None when
    there are no files or none of them opens)."""
    if not samples or count < 1:
        return None, None
    from PIL import Image

    picks = sorted({round(i * (len(samples) - 1) / max(1, count - 1)) for i in range(min(count, len(samples)))})
    modes, sides = [], []
    for i in picks:
        try:
            with Image.open(samples[i][0]) as img:  # reads the header only
                modes.append(img.mode)
                sides.append(min(img.size))
        except Exception:  # noqa: BLE001 - a bad file is the dataset check's business, not pre-flight's
            continue
    if not sides:
        return None, None
    grey = sum(m in ("L", "1", "I;16", "I;16L", "I;16B", "I", "F", "LA") for m in modes) / len(modes)
    return grey, int(sorted(sides)[len(sides) // 2])


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _patch_size(cfg: TrainConfig) -> int | None:
    if cfg.patch_size is not None:
        return cfg.patch_size
    try:
        return int(cfg.model.rsplit("/", 1)[1])
    except (IndexError, ValueError):
        return None


def _model_width(name: str) -> int | None:
    from ..models import model_kwargs

    try:
        return int(model_kwargs(name)["hidden_size"])
    except ValueError:
        return None


def preflight(cfg: TrainConfig, facts: DatasetFacts, *, budgeted: bool = False) -> list[Finding]:
    """Every finding for ``cfg`` on data described by ``facts`` (an empty list: nothing to say). ``budgeted``:
    ``cfg.max_steps`` is the length a time budget decided (:func:`dit_core.train.loop.recheck_for_length`),
    not the configured cap."""
    return [*_ema(cfg), *_data(cfg, facts), *_reference(cfg, budgeted), *_learning_rate(cfg), *_guidance(cfg, facts),
            *_shapes(cfg, facts), *_images(cfg, facts), *_folder(cfg, facts), *_grids(cfg, facts)]


def _warn(key: str, message: str, fix: str, level: str = "warning") -> Finding:
    return Finding(level, key, message, fix)


def _conditional(cfg: TrainConfig, facts: DatasetFacts) -> bool:
    return cfg.class_cond and facts.num_classes > 0


def _ema(cfg: TrainConfig) -> list[Finding]:
    """The EMA: an average over ~1/(1 - decay) steps must fit in the run."""
    steps = cfg.max_steps
    if not (cfg.ema_decay > 0 and not cfg.ema_warmup and steps > 0):
        return []
    initial = cfg.ema_decay ** steps  # weight of the random initial weights in the EMA after the run
    if initial <= EMA_INITIAL_SHARE:
        return []
    horizon = 1.0 / (1.0 - cfg.ema_decay)
    suggest = 1.0 - 5.0 / steps  # the initial weights' share falls to e^-5 (0.7 %)
    decay = (f"--ema-decay {math.floor(suggest * 10000) / 10000:g} or lower" if suggest > 0
             else "--ema-decay 0 (the EMA is then the model itself)")  # a run of 5 steps or fewer
    return [_warn("ema_decay",
                  f"ema_decay {cfg.ema_decay} averages over the last ~{horizon:,.0f} steps, but the run has "
                  f"{steps:,}: at its end the EMA, which every sample grid and dit-sample use, still holds "
                  f"{100 * initial:.1f} % of the random initial weights, so its samples are mostly noise.",
                  f"--ema-warmup true (the decay ramps up as (1+n)/(10+n), so the average never reaches back "
                  f"before the run), or {decay}.")]


def _data(cfg: TrainConfig, facts: DatasetFacts) -> list[Finding]:
    """The data: batch against dataset, passes over the data."""
    found, steps, n = [], cfg.max_steps, facts.num_images
    if n > 0 and cfg.batch_size > n:
        fit = 2 ** int(math.log2(n)) if n >= 1 else 1
        found.append(_warn(
            "batch_size",
            f"batch_size {cfg.batch_size} is larger than the dataset ({n:,} images): every batch holds the "
            f"same images more than once, so a step costs more and teaches no more than a batch of {n:,}.",
            f"--batch-size {fit} (and more --max-steps for the same number of images seen)."))
    if n > 0 and steps > 0:
        epochs = steps * cfg.batch_size / n
        if epochs < MIN_EPOCHS:
            need = math.ceil(20 * n / cfg.batch_size)
            found.append(_warn(
                "max_steps",
                f"{steps:,} steps of {cfg.batch_size} images see each of the {n:,} images only ~{epochs:.1f} "
                f"times; a diffusion model needs many passes (each pass draws other noise levels), so its "
                f"samples will not yet show the data.",
                f"--max-steps {need:,} (about 20 passes over the data)."))
    return found


def _reference(cfg: TrainConfig, budgeted: bool) -> list[Finding]:
    """A profile measured at more steps than this run gets."""
    ref, steps = cfg.reference_steps, cfg.max_steps
    if not (ref > 0 and 0 < steps < REFERENCE_SHARE * ref):
        return []
    if budgeted:  # a time budget's plan: steps per minute as this machine measured them
        minutes = math.ceil(cfg.max_minutes * ref / steps)
        why = f"the time budget ({cfg.max_minutes:g} min) fits only {steps:,} steps on this machine"
        fix = (f"--max-minutes {minutes} (about {ref:,} steps at the speed measured here), or expect "
               f"rougher samples than the figures in the profile's YAML.")
    else:
        why = f"the run has {steps:,} steps"
        fix = f"--max-steps {ref:,}, or expect rougher samples than the figures in the profile's YAML."
    return [_warn("reference_steps",
                  f"{why}, {100 * steps / ref:.0f} % of the {ref:,} this profile's figures were measured at: on a "
                  f"short run the samples are much worse than those figures (they still improve steeply with "
                  f"steps there).", fix)]


def _learning_rate(cfg: TrainConfig) -> list[Finding]:
    """The learning rate: its size, its warm-up, its schedule."""
    found, steps = [], cfg.max_steps
    if cfg.warmup_steps == 0 and cfg.lr >= NO_WARMUP_FACTOR * USUAL_LR:
        warm = max(100, min(1000, steps // 20))
        found.append(_warn(
            "warmup_steps",
            f"lr {cfg.lr:g} is {cfg.lr / USUAL_LR:.0f}x DiT's {USUAL_LR:g} and starts without a warm-up: "
            f"Adam's first steps, taken before its moment estimates settle, are then large enough to "
            f"diverge or to leave the model in a poor state it recovers from slowly.",
            f"--warmup-steps {warm} (a linear ramp), or --lr {USUAL_LR:g}."))
    if cfg.lr > MAX_LR:
        found.append(_warn(
            "lr",
            f"lr {cfg.lr:g} is more than {MAX_LR:g}, far above any setting AdamW is known to train a "
            f"transformer with (DiT: {USUAL_LR:g}; the small CPU profiles: 2e-3 to 3e-3 with a warm-up).",
            f"--lr {min(3e-3, MAX_LR):g} with --warmup-steps of a few hundred."))
    if steps > 0 and cfg.warmup_steps >= steps:
        found.append(_warn(
            "warmup_steps",
            f"warmup_steps {cfg.warmup_steps:,} is not shorter than the run ({steps:,} steps): the learning "
            f"rate never reaches lr {cfg.lr:g}.",
            f"--warmup-steps {max(1, steps // 10):,} (a tenth of the run)."))
    if cfg.lr_schedule == "cosine" and cfg.min_lr > cfg.lr:
        found.append(_warn(
            "min_lr",
            f"min_lr {cfg.min_lr:g} is above lr {cfg.lr:g}: the cosine schedule would raise the learning "
            f"rate instead of lowering it.",
            f"--min-lr {cfg.lr / 10:g} (a tenth of lr)."))
    return found


def _guidance(cfg: TrainConfig, facts: DatasetFacts) -> list[Finding]:
    """Guidance needs the null class."""
    shows_grids = cfg.sample_at_end or cfg.sample_every > 0
    if not (_conditional(cfg, facts) and cfg.class_dropout_prob == 0 and cfg.sample_cfg_scale != 1 and shows_grids):
        return []
    return [_warn("class_dropout_prob",
                  f"the sample grids use classifier-free guidance (sample_cfg_scale {cfg.sample_cfg_scale:g}), "
                  f"but class_dropout_prob 0 never trains the null class it needs: guided samples mix in an "
                  f"untrained label embedding.",
                  "--class-dropout-prob 0.1 (DiT's), or --sample-cfg-scale 1 for unguided grids.")]


def _shapes(cfg: TrainConfig, facts: DatasetFacts) -> list[Finding]:
    """Shapes: the patch size must divide the model's input, a patch must fit in a token, latents keep their size."""
    found, p, side = [], _patch_size(cfg), facts.sample_shape[-1]
    if p and side % p:
        what = f"latents of side {side} (image_size / 8)" if facts.is_latent else f"images of side {side}"
        good = [s for s in range(side - side % p, side + p + 1, p) if s > 0][:2]
        fix = (f"--patch-size {max(d for d in (1, 2, 4, 8) if side % d == 0)}"
               + ("" if facts.is_latent else f", or --image-size {' or '.join(str(s) for s in good)}"))
        found.append(_warn("patch_size", f"patch size {p} does not divide the model's input, {what}: the model "
                                         f"cannot cut it into patches.", fix + ".", level="error"))
    width = cfg.hidden_size if cfg.hidden_size is not None else _model_width(cfg.model)
    channels = facts.sample_shape[0]
    if p and width and width < p * p * channels:
        found.append(_warn(
            "hidden_size",
            f"each {p}x{p} patch of {channels} channels holds {p * p * channels} numbers, more than the token "
            f"width {width}: the patch embedding cannot pass the noise through, so the model cannot predict "
            f"it (measured: 32 px RGB at patch 8 and width 128 sampled pure noise after 2,400 steps).",
            f"--patch-size {max(d for d in (1, 2, 4) if d * d * channels <= width) if channels <= width else 1} "
            f"or --hidden-size {p * p * channels * 2} or more."))
    if facts.is_latent and cfg.image_size != 8 * side:
        found.append(_warn(
            "image_size",
            f"image_size {cfg.image_size} is not what the latents were made at: they are {side}x{side}, "
            f"i.e. {8 * side} px images, and the run trains at that size whatever image_size says.",
            f"--image-size {8 * side}, or extract latents at {cfg.image_size} px (dit-extract-latents "
            f"--image-size {cfg.image_size})."))
    return found


def _images(cfg: TrainConfig, facts: DatasetFacts) -> list[Finding]:
    """The images themselves: grey files trained as colour, small files blown up."""
    if facts.is_latent:
        return []
    found, p, side = [], _patch_size(cfg), facts.sample_shape[-1]
    if facts.grey_share == 1.0 and facts.sample_shape[0] == 3:
        found.append(_warn(
            "channels",
            "every image looked at is greyscale, but the run trains on 3 colour channels: the model learns "
            "three copies of each grey value (3x the input per patch, for nothing).",
            "--channels 1."))
    elif facts.grey_share == 0.0 and facts.sample_shape[0] == 1:
        found.append(_warn("channels", "the images are in colour, but the run trains on 1 grey channel: the "
                                       "samples will be grey.", "--channels 3, if colour matters."))
    if facts.median_side is not None and facts.median_side < side:
        smaller = [s for s in (32, 48, 64, 96, 128, 256) if s <= facts.median_side and p and s % p == 0]
        found.append(_warn(
            "image_size",
            f"the images are small (median short side {facts.median_side} px) and the run trains at "
            f"{side} px: they are blown up with bicubic, so the model learns blur and pays for pixels that "
            f"hold no detail.",
            f"--image-size {smaller[-1]}." if smaller else "--image-size at most the images' own size."))
    return found


#: A centre crop that cuts the object of more than this share of the files is flagged (with ``crop: adm``).
CUT_WARNING = 0.1


def _folder(cfg: TrainConfig, facts: DatasetFacts) -> list[Finding]:
    """What the folder's probe found against settings chosen by hand: flips on classes a mirror changes, a centre
    crop that cuts many objects."""
    probe, found = facts.folder, []
    if not probe:
        return found
    changed = _changed(probe)
    if cfg.flip is True and changed:
        found.append(_warn(
            "flip", f"flip true mirrors every class, but a classifier tells files of {_names(changed)} from their "
                    f"mirror images ({_shares(changed)} of held-out files): the model learns their mirror images as "
                    f"the class and draws them mirrored about half the time.",
            "--flip auto (flips only for the classes a mirror leaves unchanged), or --flip false."))
    cut = probe.get("centre_cut", 0.0)
    if cfg.crop == "adm" and cut > CUT_WARNING and probe.get("located"):
        found.append(_warn(
            "crop", f"the centre crop cuts the object of {_pct(cut)} of the files (of {probe['located']:,} looked at: "
                    f"files wider or taller than square with the object to one side); the model learns cut objects "
                    f"as part of the data.",
            "--crop object (the square placed where the object is)."))
    return found


def _changed(probe: dict) -> dict:
    """The classes of a probe (as a dict) that a mirror changes, with the share of mirror images told apart."""
    from ..data.probe import FolderProbe

    found = FolderProbe.from_dict(probe)
    return {c: found.mirror[c] for c in found.asymmetric()}


def _names(shares: dict) -> str:
    names = list(shares)
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _pct(share: float) -> str:
    return f"{100 * share:.0f} %"


def _shares(shares: dict) -> str:
    lo, hi = min(shares.values()), max(shares.values())
    return _pct(lo) if round(lo, 2) == round(hi, 2) else f"{100 * lo:.0f}-{_pct(hi)}"


def decisions(cfg: TrainConfig, facts: DatasetFacts) -> list[str]:
    """What the folder's probe decided for this run and why, one line per setting (empty without a probe):
    the flips of ``flip: auto``, per class where classes differ; the crop and the share of files whose object the
    centre crop would cut; the objects' size at the training size."""
    from ..data.probe import MIRROR_THRESHOLD

    probe = facts.folder
    if not probe:
        return []
    lines = []
    mirror = probe.get("mirror") or {}
    if cfg.flip == "auto" and mirror:
        changed = _changed(probe)
        kept = {c: a for c, a in mirror.items() if c not in changed}
        how = (f"a classifier fitted in {probe.get('seconds', 0):.0f} s told held-out files from their mirror images "
               f"(chance: 50 %; {_pct(MIRROR_THRESHOLD)} or more: a mirror changes the class)")
        if not changed:
            lines.append(f"flip: on for every class ({_shares(kept)} told apart: {how}).")
        elif not kept:
            lines.append(f"flip: off for every class ({_shares(changed)} told apart: {how}).")
        else:
            lines.append(f"flip: on for {_names(kept)} ({_shares(kept)} told apart), off for {_names(changed)} "
                         f"({_shares(changed)}): {how}.")
    if probe.get("located"):
        cut = probe.get("centre_cut", 0.0)
        crop = ("a square of the short side placed where the object is (crop: object)" if cfg.crop == "object"
                else "the centre square (crop: adm)")
        lines.append(f"crop: {crop}; the centre crop would cut the object of {_pct(cut)} of the "
                     f"{probe['located']:,} files looked at; no object stands out in {_pct(probe.get('no_object', 0))}.")
        if probe.get("object_size") and probe.get("image_size"):
            px = probe["object_size"] * probe["image_size"]
            lines.append(f"objects: a median {_pct(probe['object_size'])} of the square's side, {px:.1f} px at the "
                         f"training size of {probe['image_size']} px.")
    return lines


def format_decisions(lines: list[str]) -> str:
    return "\n".join(f"pre-flight decided {line}" for line in lines)


def _grids(cfg: TrainConfig, facts: DatasetFacts) -> list[Finding]:
    """Sample grids: one before the end, and only of classes the data has."""
    found, steps = [], cfg.max_steps
    if cfg.sample_every > steps > 0:
        fix = f"--sample-every {max(1, steps // 4):,} (four grids during the run)"
        also = "" if cfg.sample_at_end else " and sample_at_end is false, so the run writes no grid at all"
        found.append(_warn("sample_every",
                           f"sample_every {cfg.sample_every:,} is longer than the run ({steps:,} steps): no grid "
                           f"shows progress before the end{also}.", fix + "."))
    shows_grids = cfg.sample_at_end or cfg.sample_every > 0
    if _conditional(cfg, facts) and cfg.sample_classes is not None and shows_grids:
        bad = [c for c in cfg.sample_classes if not (isinstance(c, int) and 0 <= c < facts.num_classes)]
        if bad:
            found.append(_warn(
                "sample_classes",
                f"sample_classes {bad[:5]} are not classes of this dataset (0..{facts.num_classes - 1}): the "
                f"run would stop at its first sample grid, after training up to it.",
                f"--sample-classes with numbers in 0..{facts.num_classes - 1}, or leave it unset.",
                level="error"))
    return found


def format_findings(findings: list[Finding]) -> str:
    """One paragraph per finding, errors first, for the terminal and the run log."""
    ordered = sorted(findings, key=lambda f: f.level != "error")
    return "\n".join(f"pre-flight {f.level} [{f.key}]: {f.message}\n    fix: {f.fix}" for f in ordered)


def errors(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.level == "error"]


# ----------------------------------------------------------------------------------------------------------
# What the training loop calls
# ----------------------------------------------------------------------------------------------------------


def check_before_training(cfg: TrainConfig, dataset, num_classes: int, show: bool = True) -> list:
    """Pre-flight : print what the folder's probe decided (:func:`decisions`) and what cannot work in this run,
    with the key and the fix, before the first step; raise a :class:`ConfigError` for the findings that are certain to fail. Every
    process checks (the check is pure and reads a few file headers), so all of them stop together; only the
    main process prints. Returns the findings."""
    if cfg.debug:  # the facts of the whole dataset, not of --debug's subset
        dataset = dataset.dataset if isinstance(dataset, torch.utils.data.Subset) else dataset
    facts = DatasetFacts.of(dataset, num_classes)
    findings = preflight(cfg, facts)
    fatal = errors(findings)
    if fatal:
        raise ConfigError("pre-flight: this run cannot work:\n" + format_findings(fatal))
    decided = decisions(cfg, facts)
    if decided and show:
        print(format_decisions(decided), flush=True)
    if findings and show:
        print(format_findings(findings), flush=True)
    return findings


def recheck_for_length(planned: TrainConfig, steps: int, dataset, num_classes: int, shown: list, monitor) -> list:
    """Pre-flight again once a time budget has fixed the run's length (the checks that count steps could not
    know it before the first step): writes the findings not shown before; returns all of them."""
    if planned.debug or steps >= planned.max_steps:  # the cap, which the first check saw, rules: nothing new
        return shown
    findings = preflight(dataclasses.replace(planned, max_steps=steps), DatasetFacts.of(dataset, num_classes),
                         budgeted=True)
    new = [f for f in findings if f not in shown and f.level == "warning"]
    if new:
        monitor.write(format_findings(new))
    return findings

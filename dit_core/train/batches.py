"""What each training step sees, as a pure function of the seed and the step number.

A DiT training step needs, for every image of the global batch: which image (the data order), the random
numbers of its augmentation (the flip, the VAE posterior draw of a latent), a timestep ``t``, the noise
``eps`` and whether its label is dropped for guidance. Here all of them are computed from ``(seed, step)``
and the image's position ``k`` in the global batch, never from a generator whose state drifts along:

* **exact resume** — a restarted run recomputes the numbers of step 1001 from the step counter alone, so
  the data order needs no sampler state and a resumed run equals an uninterrupted one bit for bit;
* **the same run on 1 or N processes, with or without accumulation** — every process draws the numbers of
  the whole global batch and keeps its slice, so image ``k`` gets the same noise whichever process or
  micro-batch it lands in (the official code seeds each rank differently, which gives an equally good
  but different run for every world size).

The data order is a fresh permutation of the dataset per epoch; position ``p`` of the endless stream is
image ``perm_{p // N}[p % N]``. Step ``s`` takes the ``batch_size`` positions after the ``samples_seen``
of the previous steps; process ``r`` of ``W`` takes, for micro-batch ``a``, the global-batch slots
``(a W + r) m ... (a W + r + 1) m - 1`` with ``m`` the micro-batch size.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from . import distributed
from .config import ConfigError

# Separate streams, so that changing one use of randomness never shifts another.
STREAM_ORDER, STREAM_ITEMS, STREAM_STEP = 1, 2, 3


def derive_seed(*keys: int) -> int:
    """A well-mixed 63-bit seed from a tuple of non-negative integers (numpy's SeedSequence hashing)."""
    words = np.random.SeedSequence([int(k) for k in keys]).generate_state(2, dtype=np.uint32)
    return (int(words[0]) << 31) ^ int(words[1])


def generator(*keys: int) -> torch.Generator:
    """A CPU generator seeded from ``keys``: the same keys give the same numbers on every machine."""
    return torch.Generator().manual_seed(derive_seed(*keys))


class DataOrder:
    """The endless stream of dataset indices: one seeded permutation per epoch."""

    def __init__(self, num_items: int, seed: int):
        if num_items < 1:
            raise ValueError("the dataset is empty")
        self.num_items = num_items
        self.seed = seed
        self._epoch, self._perm = -1, None

    def permutation(self, epoch: int) -> torch.Tensor:
        if epoch != self._epoch:
            self._epoch = epoch
            self._perm = torch.randperm(self.num_items, generator=generator(self.seed, STREAM_ORDER, epoch))
        return self._perm

    def indices(self, start: int, count: int) -> list[int]:
        """Dataset indices at stream positions ``start .. start + count - 1``."""
        out = []
        for p in range(start, start + count):
            out.append(int(self.permutation(p // self.num_items)[p % self.num_items]))
        return out


def item_seeds(seed: int, step: int, batch_size: int) -> list[int]:
    """One seed per image of step ``step``'s global batch, for the dataset's own randomness (flips, the
    latent posterior draw): :class:`SeededItems` runs ``dataset[i]`` under it."""
    g = generator(seed, STREAM_ITEMS, step)
    return torch.randint(0, 2**62, (batch_size,), generator=g).tolist()


@dataclass
class StepDraws:
    """The diffusion's random numbers for a whole global batch: timesteps, noise and label drops."""

    t: torch.Tensor  # (B,) long, uniform over 0 .. T-1
    noise: torch.Tensor  # (B, C, H, W) standard normal
    drop: torch.Tensor  # (B,) bool, True: the label becomes the null class

    def slice(self, sl: slice) -> "StepDraws":
        return StepDraws(self.t[sl], self.noise[sl], self.drop[sl])


def step_draws(seed: int, step: int, batch_size: int, sample_shape, num_timesteps: int,
               dropout_prob: float) -> StepDraws:
    """Draw ``t ~ U{0..T-1}``, ``eps ~ N(0, I)`` and the label drops for step ``step`` (on the CPU, so that
    every device and process count sees the same numbers)."""
    g = generator(seed, STREAM_STEP, step)
    t = torch.randint(0, num_timesteps, (batch_size,), generator=g)
    noise = torch.randn((batch_size, *sample_shape), generator=g)
    drop = torch.rand((batch_size,), generator=g) < dropout_prob
    return StepDraws(t, noise, drop)


def micro_slice(batch_size: int, grad_accum: int, world_size: int, rank: int, micro: int) -> slice:
    """The global-batch slots of micro-batch ``micro`` on process ``rank``."""
    m = batch_size // (grad_accum * world_size)
    start = (micro * world_size + rank) * m
    return slice(start, start + m)


class SeededItems(torch.utils.data.Dataset):
    """Wrap a dataset so that item ``(index, seed)`` is ``dataset[index]`` computed with torch's generator
    seeded by ``seed``: its flip and posterior draw become a function of the item, not of the worker or the
    order of reading. The caller's random state is left untouched."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, item):
        index, seed = item
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            x, y, *extra = self.dataset[index]  # extra: e.g. the teacher features that come with a latent
        return (x, int(y), *extra)


class MicroBatches:
    """The batch sampler of one process: lists of ``(index, item_seed)`` for every micro-batch of every step
    from ``start_step``, the stream starting at position ``samples_seen``. Used as a DataLoader
    ``batch_sampler``, so workers load ahead while the order stays exact."""

    def __init__(self, order: DataOrder, seed: int, batch_size: int, grad_accum: int, world_size: int,
                 rank: int, start_step: int, end_step: int, samples_seen: int):
        self.order, self.seed = order, seed
        self.batch_size, self.grad_accum = batch_size, grad_accum
        self.world_size, self.rank = world_size, rank
        self.start_step, self.end_step, self.samples_seen = start_step, end_step, samples_seen

    def __len__(self) -> int:
        return max(0, self.end_step - self.start_step) * self.grad_accum

    def step_items(self, step: int) -> list[tuple[int, int]]:
        """All ``(index, seed)`` pairs of the global batch of ``step``."""
        position = self.samples_seen + (step - self.start_step) * self.batch_size
        indices = self.order.indices(position, self.batch_size)
        return list(zip(indices, item_seeds(self.seed, step, self.batch_size)))

    def __iter__(self):
        for step in range(self.start_step, self.end_step):
            items = self.step_items(step)
            for micro in range(self.grad_accum):
                yield items[micro_slice(self.batch_size, self.grad_accum, self.world_size, self.rank, micro)]


# ----------------------------------------------------------------------------------------------------------
# The micro-batches of a run: from a DataLoader, or from memory
# ----------------------------------------------------------------------------------------------------------

#: A dataset is kept in memory (``preload: auto``) when its items take less than this many bytes as float32.
PRELOAD_MAX_BYTES = 2**28


def _base(dataset):
    return dataset.dataset if isinstance(dataset, torch.utils.data.Subset) else dataset


def is_deterministic(dataset) -> bool:
    """True when ``dataset[i]`` is always the same tensor (no flip, no latent posterior draw)."""
    return not getattr(_base(dataset), "flip", False) and not getattr(_base(dataset), "sample", False)


def flips_only(dataset) -> bool:
    """True when ``dataset[i]`` varies only by a horizontal flip (an image folder with ``flip`` on): its items
    can be kept in memory unflipped and flipped per item (:func:`flipped_batch`)."""
    base = _base(dataset)
    return bool(getattr(base, "flip", False)) and not getattr(base, "sample", False) and hasattr(base, "load")


def unflipped(dataset):
    """The same dataset with flips off (a shallow copy; the caller's dataset is left as it is)."""
    import copy

    if isinstance(dataset, torch.utils.data.Subset):
        return torch.utils.data.Subset(unflipped(dataset.dataset), dataset.indices)
    view = copy.copy(dataset)
    view.flip = False
    return view


def item_flips(seeds) -> torch.Tensor:
    """Whether each item is flipped: the first draw of torch's generator seeded with the item's seed, as
    :class:`SeededItems` reading an image folder decides it (``torch.rand(()) < 0.5``)."""
    return torch.tensor([bool(torch.rand((), generator=torch.Generator().manual_seed(int(s))) < 0.5) for s in seeds],
                        dtype=torch.bool)


def flipped_batch(x_all: torch.Tensor, y_all: torch.Tensor, items, flip=True) -> tuple[torch.Tensor, torch.Tensor]:
    """A micro-batch ``items`` (``(index, seed)`` pairs) from unflipped preloaded tensors, each image flipped as
    the data loader would have flipped it: the same batches, without decoding the files at every step. ``flip``:
    the dataset's (True, or the set of labels whose files flip)."""
    index = [i for i, _ in items]
    x, flips = x_all[index], item_flips([s for _, s in items])
    if flip is not True:
        from ..data.images import flips_label

        flips &= torch.tensor([flips_label(flip, int(y)) for y in y_all[index]], dtype=torch.bool)
    flips = flips.to(x_all.device)
    return torch.where(flips[:, None, None, None], x.flip(-1), x), y_all[index]


def preload(dataset, device: torch.device):
    """Every item of a small deterministic dataset, as two tensors on ``device``."""
    xs, ys = zip(*(dataset[i] for i in range(len(dataset))))
    return torch.stack(xs).to(device), torch.as_tensor(ys, dtype=torch.long).to(device)


def micro_batches(dataset, sampler: MicroBatches, sample_shape, *, preload_mode: str, num_workers: int,
                  device: torch.device, worker_init_fn=None):
    """The iterator of ``(x, y, ...)`` micro-batches that ``sampler`` lists (items of ``sample_shape``). Small
    datasets are kept in memory (``preload_mode``: auto, true, false), decoded once; an image folder with flips
    is kept unflipped and each item flipped from its seed, exactly as the data loader would (measured: 13 % of
    the step spent decoding 32 px files at 1.6 steps/s on one core). Otherwise a DataLoader with ``num_workers`` reads them, seeded per item
    (:class:`SeededItems`), so the batches are the same either way."""
    use = preload_mode == "true" or (preload_mode == "auto" and (is_deterministic(dataset) or flips_only(dataset))
                                     and len(dataset) * 4 * int(np.prod(sample_shape)) < PRELOAD_MAX_BYTES)
    if use and flips_only(dataset):
        x_all, y_all = preload(unflipped(dataset), device)
        flip = _base(dataset).flip
        return (flipped_batch(x_all, y_all, items, flip) for items in sampler)
    if use:
        if not is_deterministic(dataset):
            raise ConfigError("preload keeps one copy of every item, which would freeze random flips; use "
                             "--flip false or --preload false")
        x_all, y_all = preload(dataset, device)
        return ((x_all[[i for i, _ in items]], y_all[[i for i, _ in items]]) for items in sampler)
    loader = torch.utils.data.DataLoader(
        SeededItems(dataset), batch_sampler=sampler, num_workers=num_workers, pin_memory=device.type == "cuda",
        persistent_workers=False, worker_init_fn=worker_init_fn,
        # its own generator: creating the iterator then draws nothing from torch's global one
        generator=torch.Generator().manual_seed(derive_seed(sampler.seed, sampler.rank, 13)),
    )
    return iter(loader)


# ----------------------------------------------------------------------------------------------------------
# The dataset a run names
# ----------------------------------------------------------------------------------------------------------


def open_training_data(cfg, out: Path, procs):
    """The dataset named by the config: latents, an ImageFolder, or the digits (exported on first use)."""
    from ..latents import open_dataset

    path = cfg.latents_path or cfg.data_path
    if path is None:
        raise ConfigError(
            "no training data: pass --data-path ROOT (an ImageFolder: ROOT/<class>/<image>), --latents-path DIR "
            "(pre-extracted latents), or use --config digits, which needs no data"
        )
    if cfg.latents_path is None and str(cfg.data_path) == "digits":
        from ..data import export_digits

        path = out / "data" / "digits"
        if procs.is_main:
            export_digits(path)
        distributed.barrier(procs)
    path = Path(path).expanduser()
    if not path.exists():
        flag = "--latents-path" if cfg.latents_path else "--data-path"
        raise FileNotFoundError(
            f"training data not found: {flag} {str(path)!r} does not exist. Pass the folder that holds one "
            "sub-folder per class (ROOT/<class>/<image>, or ROOT/train/<class>/<image>), or a latent "
            "extraction folder; `dit-data check ROOT` checks an image folder."
        )
    mode = "L" if cfg.channels == 1 else "RGB"
    from ..data.probe import apply_probe  # flip auto, crop object: what the folder itself says (pre-flight reports it)

    dataset = open_dataset(path, image_size=cfg.image_size, mode=mode, flip=cfg.flip is not False, split=None,
                           center_crop=cfg.crop)
    return apply_probe(cfg, dataset, out, procs)


def describe(dataset) -> tuple[tuple[int, int, int], int]:
    """``(sample_shape, num_classes)`` of a dataset (attributes, else read off the first item)."""
    shape = getattr(dataset, "sample_shape", None) or tuple(dataset[0][0].shape)
    num_classes = getattr(dataset, "num_classes", None)
    if num_classes is None:
        raise ConfigError("the dataset must have a num_classes attribute (0 for unlabelled data)")
    if len(shape) != 3 or shape[1] != shape[2]:
        raise ConfigError(f"DiT trains on square (C, H, W) inputs; the dataset gives {shape}")
    return tuple(int(s) for s in shape), int(num_classes)

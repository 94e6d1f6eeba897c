"""The exponential moving average of the weights, which DiT samples from.

After every optimizer step, ``ema = decay * ema + (1 - decay) * weights`` (Peebles & Xie 2023, Sec. 4:
"an exponential moving average of DiT weights ... with a decay of 0.9999"; all their results use it). The
average of the last ~1 / (1 - decay) steps is smoother than any single iterate and gives clearly better
samples. With 0.9999 it averages the last ~10k steps: right for 400k-step runs, far too slow for a
few-thousand-step run on a laptop, where ``warmup`` ramps the decay up as ``min(decay, (1 + n) / (10 + n))``
after ``n`` steps, so the average never reaches further back than the run itself.

**Every N steps** (``ema_every``). The update can run every ``N`` optimizer steps with the decay raised to
the power ``N``: ``ema = decay^N * ema + (1 - decay^N) * weights``. Unrolled over the blocks of ``N`` steps,
the per-step average gives block ``b`` back from now the weight ``decay^(N b) (1 - decay^N)`` in total,
spread over its ``N`` iterates; the every-N average gives the same total weight to the block, all on its last
iterate. So every block of the past counts exactly as much in both, and the two averages differ only by where
inside a block the weight sits: for iterates that move slowly (a drift) around which the optimizer's noise
averages out, their expectations differ by the drift over less than ``N`` steps, against a window of
``1 / (1 - decay)`` = 10,000 steps. What ``N`` buys is speed where an update is dear: with the EMA on the
CPU every update copies all weights over PCIe.

**On the CPU** (``ema_device: cpu``, for small cards). The weights are copied into pinned host memory,
allocated once (:class:`HostStaging`), with asynchronous copies queued after the optimizer step on the GPU's
stream; the host waits for exactly those copies (a CUDA event) before the ``lerp`` reads them. A plain
``tensor.to("cpu")`` would be correct too (a blocking copy), but allocates pageable memory for every update.
PyTorch's pinned-memory allocator rounds every request up to a power of two, so one buffer per tensor would cost
up to twice the weights' size (3.56 GB for the 2.70 GB of DiT-XL/2's weights), and so would one flat buffer
(4 GiB = 4.29 GB); the staging packs the tensors into a few blocks whose sizes are powers of two already
(:func:`staging_layout`: 2.75 GB for DiT-XL/2, computed from the tensor sizes).

**Skipped steps**. The trainer's NaN guard decides on the device whether a step counts
(:mod:`dit_core.train.guard`); the EMA then uses ``weight = (1 - decay) * ok``, which is 0 for a skipped step,
so no host-device synchronisation is needed to skip the update.

**One kernel or one per tensor.** ``torch._foreach_lerp_`` has a fused form (a few kernel launches for all
tensors) only for a weight that is a Python number; a weight held in a device tensor takes its list form, which
runs one ``lerp`` per tensor (about 300 launches for DiT-XL/2), since reading the number on the host would make
the CPU wait for the GPU. So the update passes a Python number whenever the host knows the weight: every update
that is not masked by the guard's verdict (the official step, optimizers that read the verdict, the EMA on the
CPU), and a device tensor only for the masked update of the trainer's sync-free step.
"""

from __future__ import annotations

import copy
import warnings

import torch


def create_ema(model: torch.nn.Module, device: str | torch.device | None = None) -> torch.nn.Module:
    """A frozen copy of ``model`` (optionally on another device, e.g. the CPU to save GPU memory)."""
    ema = copy.deepcopy(model)
    if device is not None:
        ema = ema.to(device)
    ema.requires_grad_(False)
    return ema.eval()


def ema_decay_at(updates: int, decay: float, warmup: bool) -> float:
    """The decay used for update number ``updates`` (counting from 0)."""
    return min(decay, (1 + updates) / (10 + updates)) if warmup else decay


#: Size of one pinned block of :class:`HostStaging` (a power of two: the pinned allocator rounds to one).
STAGING_BLOCK_BYTES = 256 << 20
#: Alignment of each tensor inside a block, in bytes.
STAGING_ALIGN = 512


def _pow2_ceil(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def staging_layout(params: list[torch.Tensor], block_bytes: int = STAGING_BLOCK_BYTES) -> dict:
    """Where each tensor of ``params`` goes in the pinned blocks of :class:`HostStaging` (no memory is touched:
    meta tensors work).

    Tensors of one dtype are packed first-fit by decreasing size into blocks of ``block_bytes`` (or of the
    largest tensor's size rounded up to a power of two, if larger), each at an offset aligned to
    :data:`STAGING_ALIGN` bytes; each block is then shrunk to the power of two that holds what it received, the
    size the pinned allocator gives it anyway. Returns ``blocks`` (``(dtype, bytes)`` per block), ``places``
    (``(block, element offset)`` per tensor, in the order of ``params``), ``pinned_bytes`` (their sum),
    ``tensor_bytes`` and ``per_tensor_bytes`` (what one pinned buffer per tensor would take, each rounded to a power
    of two).
    """
    def aligned(n: int) -> int:
        return -(-n // STAGING_ALIGN) * STAGING_ALIGN

    sizes = [p.numel() * p.element_size() for p in params]
    by_dtype: dict[torch.dtype, list[int]] = {}
    for i, p in enumerate(params):
        by_dtype.setdefault(p.dtype, []).append(i)
    blocks: list[list] = []  # [dtype, capacity, used]
    places: list[tuple[int, int] | None] = [None] * len(params)
    for dtype, members in by_dtype.items():
        first = len(blocks)
        capacity = max(int(block_bytes), _pow2_ceil(max(aligned(sizes[i]) for i in members)))
        for i in sorted(members, key=lambda j: -sizes[j]):
            need = aligned(sizes[i])
            for b in range(first, len(blocks)):
                if blocks[b][2] + need <= blocks[b][1]:
                    break
            else:
                blocks.append([dtype, capacity, 0])
                b = len(blocks) - 1
            places[i] = (b, blocks[b][2] // params[i].element_size())
            blocks[b][2] += need
    sized = [(dtype, _pow2_ceil(used)) for dtype, _, used in blocks]
    return {"blocks": sized, "places": places, "pinned_bytes": sum(n for _, n in sized),
            "tensor_bytes": sum(sizes), "per_tensor_bytes": sum(_pow2_ceil(n) for n in sizes if n)}


class HostStaging:
    """Pinned host memory that receives the model's weights for an EMA kept on the CPU.

    The buffers (one per tensor of ``params``, :attr:`buffers`) are views into a few pinned blocks laid out by
    :func:`staging_layout`, so the pinned memory is the weights' size (:attr:`pinned_bytes`), not the up-to-twice
    that power-of-two rounding of one buffer per tensor would take. ``fetch(params)`` queues one asynchronous
    device-to-host copy per tensor on the current stream (after the optimizer step that produced the weights),
    waits for those copies only, and returns the buffers.

    ``pin``: None pins when CUDA is available and a tensor of ``params`` is on a CUDA device; False never pins
    (ordinary memory, plain copies: the path a machine without CUDA takes). Where pinning fails (no CUDA in this
    build of torch, or the page-locked memory refused), the blocks are ordinary memory and a warning says so;
    the copies are then blocking, and the EMA the same.
    """

    def __init__(self, params: list[torch.Tensor], pin: bool | None = None, block_bytes: int = STAGING_BLOCK_BYTES):
        if pin is None:
            pin = torch.cuda.is_available() and any(p.device.type == "cuda" for p in params)
        layout = staging_layout(params, block_bytes)
        self.blocks = []
        for dtype, nbytes in layout["blocks"]:
            numel = nbytes // torch.empty((), dtype=dtype).element_size()
            block = None
            if pin:
                try:
                    block = torch.empty(numel, dtype=dtype, device="cpu", pin_memory=True)
                except RuntimeError as err:
                    warnings.warn(f"the EMA's staging memory could not be pinned ({str(err).splitlines()[0][:200]}); "
                                  "using ordinary memory: each EMA update then copies the weights with a blocking "
                                  "copy (slower, the same numbers)", stacklevel=2)
                    pin = False
            if block is None:
                block = torch.empty(numel, dtype=dtype, device="cpu")
            self.blocks.append(block)
        self.buffers = [self.blocks[b][offset:offset + p.numel()].view(p.shape)
                        for p, (b, offset) in zip(params, layout["places"])]
        self.pinned = bool(pin)
        self.pinned_bytes = layout["pinned_bytes"]

    def fetch(self, params: list[torch.Tensor], extra: torch.Tensor | None = None):
        """Copies of ``params`` (and of the small tensor ``extra``) on the CPU, complete when this returns."""
        for buf, p in zip(self.buffers, params):
            buf.copy_(p.detach(), non_blocking=self.pinned)
        extra_cpu = extra.to("cpu", non_blocking=self.pinned) if extra is not None else None
        if self.pinned:
            done = torch.cuda.Event()
            done.record()  # on the current stream, behind the copies
            done.synchronize()  # the host waits for the copies, nothing else
        return self.buffers, extra_cpu


@torch.no_grad()
def update_ema(ema: torch.nn.Module, model: torch.nn.Module, decay: float | torch.Tensor,
               staging: HostStaging | None = None) -> None:
    """``ema <- decay * ema + (1 - decay) * model`` for every parameter (the fixed ``pos_embed`` too; it does
    not change). One fused ``lerp`` over all tensors. ``decay`` may be a tensor on the model's device (a step the
    guard rejected passes 1.0: no change). With the EMA on another device (the CPU) the weights are copied
    there first, through ``staging`` (pinned buffers) when given, else with blocking copies; either way the
    copies are complete before the update reads them."""
    ema_params = list(ema.parameters())
    params = [p.detach() for p in model.parameters()]
    if len(ema_params) != len(params):
        raise ValueError("the EMA model and the model have different parameter lists")
    weight = 1.0 - decay
    if ema_params and ema_params[0].device != params[0].device:
        if staging is not None:
            params, cpu_weight = staging.fetch(params, weight if torch.is_tensor(weight) else None)
            weight = cpu_weight if cpu_weight is not None else weight
        else:
            params = [p.to(ema_params[0].device) for p in params]  # blocking copies
            weight = weight.to(ema_params[0].device) if torch.is_tensor(weight) else weight
    if not ema_params:
        return
    if torch.is_tensor(weight) and weight.device.type == "cpu":
        weight = float(weight)  # a CPU number: reading it costs no synchronisation
    if torch.is_tensor(weight):
        # a weight on the device (the guard's mask): no foreach lerp takes one device scalar, so the list form with
        # that tensor for every parameter, one lerp per tensor (a Python number would be read on the host: a
        # synchronisation)
        torch._foreach_lerp_(ema_params, params, [weight.to(ema_params[0].dtype)] * len(ema_params))
    else:
        torch._foreach_lerp_(ema_params, params, float(weight))  # the fused form: a Python number


class EmaUpdater:
    """Keeps ``ema`` following ``model`` during training: every ``every`` optimizer steps, with the decay
    raised to ``every`` (see the module docstring), masked by the guard's verdict on the device.

    ``updates`` counts the updates applied (a tensor on the model's device, so that counting a masked update
    needs no synchronisation; the warmup reads it). ``ema`` may live on another device than ``model``. While
    no update has been masked, the host keeps the same count, and the decay goes to the update as a Python number
    (the fused form of the lerp, see the module docstring).
    """

    def __init__(self, ema: torch.nn.Module, model: torch.nn.Module, decay: float, warmup: bool = False,
                 every: int = 1):
        if every < 1:
            raise ValueError(f"ema_every must be >= 1, got {every}")
        self.ema, self.model, self.decay, self.warmup, self.every = ema, model, decay, warmup, every
        self.device = next(model.parameters()).device
        # float64 where the device has it, so that decay^N and 1 - decay keep their digits
        self.dtype = torch.float32 if self.device.type == "mps" else torch.float64
        self.updates = torch.zeros((), dtype=torch.int64, device=self.device)
        self.host_updates: int | None = 0  # the same count on the host; None once a masked update happened
        on_other = next(ema.parameters()).device != self.device
        self.staging = HostStaging([p for p in model.parameters()]) if on_other else None

    def due(self, step: int) -> bool:
        """Whether the optimizer step ``step`` (counted from 0) ends with an EMA update."""
        return (step + 1) % self.every == 0

    def decay_now(self) -> torch.Tensor:
        """The decay of the next update, as a tensor on the device: ``decay_at(steps)^every``."""
        if not self.warmup:
            return torch.full((), self.decay ** self.every, dtype=self.dtype, device=self.device)
        n = (self.updates * self.every).to(self.dtype)
        return torch.clamp((1 + n) / (10 + n), max=self.decay) ** self.every

    def __call__(self, step: int, ok: torch.Tensor | None = None) -> None:
        """After optimizer step ``step``: update the EMA if it is due; ``ok`` (a device bool) masks it."""
        if not self.due(step):
            return
        if ok is None and self.host_updates is not None:  # the host knows the decay: a Python number
            decay = ema_decay_at(self.host_updates * self.every, self.decay, self.warmup) ** self.every
            self.host_updates += 1
            self.updates += 1
        else:
            decay = self.decay_now()
            if ok is not None:
                decay = torch.where(ok, decay, torch.ones_like(decay))
                self.updates += ok.to(self.updates.dtype)
                self.host_updates = None  # the count is on the device now
            else:
                self.updates += 1
        update_ema(self.ema, self.model, decay, self.staging)

    def state(self) -> int:
        """The update count, for checkpoints (reads the device)."""
        return int(self.updates)

    def load(self, updates: int) -> None:
        self.updates.fill_(int(updates))
        self.host_updates = int(updates)

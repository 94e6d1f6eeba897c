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

**On the CPU** (``ema_device: cpu``, for small cards). The weights are copied into pinned host buffers,
allocated once (:class:`HostStaging`), with asynchronous copies queued after the optimizer step on the GPU's
stream; the host waits for exactly those copies (a CUDA event) before the ``lerp`` reads them. A plain
``tensor.to("cpu")`` would be correct too (a blocking copy), but allocates pageable memory for every update.

**Skipped steps**. The trainer's NaN guard decides on the device whether a step counts
(:mod:`dit_core.train.guard`); the EMA then uses ``weight = (1 - decay) * ok``, which is 0 for a skipped step,
so no host-device synchronisation is needed to skip the update.
"""

from __future__ import annotations

import copy

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


class HostStaging:
    """Pinned host buffers that receive the model's weights for an EMA kept on the CPU.

    ``fetch(params)`` queues one asynchronous device-to-host copy per tensor on the current stream (after the
    optimizer step that produced the weights), waits for those copies only, and returns the buffers. On a
    machine without CUDA the buffers are ordinary memory and the copies are plain ones.
    """

    def __init__(self, params: list[torch.Tensor]):
        pin = torch.cuda.is_available() and any(p.device.type == "cuda" for p in params)
        self.buffers = [torch.empty(p.shape, dtype=p.dtype, device="cpu", pin_memory=pin) for p in params]
        self.pinned = pin

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
        # no foreach lerp takes one tensor weight: the list form with that tensor for every parameter (a scalar
        # weight would be read on the host, a synchronisation)
        torch._foreach_lerp_(ema_params, params, [weight.to(ema_params[0].dtype)] * len(ema_params))
    else:
        torch._foreach_lerp_(ema_params, params, weight)


class EmaUpdater:
    """Keeps ``ema`` following ``model`` during training: every ``every`` optimizer steps, with the decay
    raised to ``every`` (see the module docstring), masked by the guard's verdict on the device.

    ``updates`` counts the updates applied (a tensor on the model's device, so that counting a masked update
    needs no synchronisation; the warmup reads it). ``ema`` may live on another device than ``model``.
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
        decay = self.decay_now()
        if ok is not None:
            decay = torch.where(ok, decay, torch.ones_like(decay))
            self.updates += ok.to(self.updates.dtype)
        else:
            self.updates += 1
        update_ema(self.ema, self.model, decay, self.staging)

    def state(self) -> int:
        """The update count, for checkpoints (reads the device)."""
        return int(self.updates)

    def load(self, updates: int) -> None:
        self.updates.fill_(int(updates))

"""The NaN/Inf guard: a step whose loss or gradients are not finite is skipped, not applied.

One NaN in an optimizer step spreads through AdamW's moments into every weight and then into the EMA: the
run is lost and, worse, the next checkpoint overwrites the last good one. So before each update the step
checks the (process-averaged) loss and the global gradient norm. A bad step is skipped (no optimizer step,
no EMA update; the weights stay as they were) and reported with its step number and reason. After
``max_bad_steps`` bad steps in a row the run stops with :class:`TrainingDiverged` and a diagnosis.

With fp16 and a gradient scaler, an overflowing gradient is part of normal operation: the scaler halves
the loss scale and the step is skipped. Those skips are counted but only become a failure once the scale
has fallen below 1 (the gradients overflow without any scaling, so something is really wrong).

**No synchronisation on the hot path.** Reading a GPU number in Python (``float(loss)``) makes the CPU wait
until the GPU has finished everything queued so far, so the CPU can no longer run ahead and queue the next
step while the GPU computes; done every step, the GPU idles between steps. So :meth:`NanGuard.check` keeps its
verdict and its counters (bad steps, bad steps in a row, the step that tripped the limit, the last reason) in
tensors on the device and returns the verdict as a device tensor; the step uses it without reading it (the
fused AdamW kernel skips its update when given ``found_inf``, the EMA update is masked). The loop calls
:meth:`NanGuard.read` (one synchronisation) only when it logs, saves a checkpoint or stops: skipped steps are
then reported, and a run of ``max_bad_steps`` bad steps stops the run within at most ``log_every`` steps of
the last one. Nothing is lost by waiting: skipped steps change no weights. Optimizers that cannot skip on the
device (PyTorch's non-fused AdamW, bitsandbytes' 8-bit AdamW) read the verdict every step instead, as before.
"""

from __future__ import annotations

import math

import torch


class TrainingDiverged(RuntimeError):
    """Training produced non-finite losses or gradients too many steps in a row."""


# The integer counters, one tensor: bad steps in all, bad steps since the last read, the first and the last of
# those (1-based step numbers), bad steps in a row (fp16 overflows neither count nor break a row), the step at
# which the row first reached max_bad_steps (0: never), two flags of the last bad step, the last step checked.
_SKIPPED, _SINCE, _FIRST, _LAST, _ROW, _TRIP, _BAD_INPUTS, _OVERFLOW, _CHECKED = range(9)


class NanGuard:
    def __init__(self, max_bad_steps: int, lr: float, precision: str, grad_clip: float,
                 device: torch.device | str = "cpu"):
        self.max_bad_steps = max(1, int(max_bad_steps))
        self.lr, self.precision, self.grad_clip = lr, precision, grad_clip
        self.device = torch.device(device)
        self._ints = torch.zeros(9, dtype=torch.int64, device=self.device)
        self._last = torch.full((3,), math.nan, dtype=torch.float32, device=self.device)  # loss, norm, scale
        self.skipped = 0  # bad steps so far, as of the last read
        self.in_a_row: list[tuple[int, str]] = []  # the row that stopped the run (for the diagnosis)
        self.pending: list[str] = []  # reports of skipped steps not yet shown
        self.last_ok = True  # the verdict on the last step checked, as of the last read

    def check(self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor, bad_inputs: torch.Tensor | bool = False,
              loss_scale: torch.Tensor | None = None) -> torch.Tensor:
        """Judge step ``step`` (0-based) on the device: returns a bool tensor, True for a good step, and
        updates the counters, all without synchronising."""
        loss, norm = loss.detach().float(), grad_norm.detach().float()
        loss_ok = torch.isfinite(loss)
        ok = loss_ok & torch.isfinite(norm)
        bad = ~ok
        if loss_scale is not None:  # an fp16 overflow the scaler handles: skipped but not a failure
            overflow = bad & loss_ok & (loss_scale.float() >= 1.0)
        else:
            overflow = torch.zeros_like(bad)
        counted = bad & ~overflow
        n = self._ints
        bad_i = bad.long()
        row = torch.where(counted, n[_ROW] + 1, torch.where(bad, n[_ROW], torch.zeros_like(n[_ROW])))
        number = step + 1
        self._ints = torch.stack([
            n[_SKIPPED] + bad_i,
            n[_SINCE] + bad_i,
            torch.where(bad & (n[_SINCE] == 0), number, n[_FIRST]),
            torch.where(bad, number, n[_LAST]),
            row,
            torch.where((n[_TRIP] == 0) & (row >= self.max_bad_steps), number, n[_TRIP]),
            torch.where(bad, torch.as_tensor(bad_inputs, device=self.device).long(), n[_BAD_INPUTS]),
            torch.where(bad, overflow.long(), n[_OVERFLOW]),
            torch.full_like(n[_CHECKED], number),
        ])
        scale = loss_scale.float() if loss_scale is not None else torch.full_like(loss, math.nan)
        self._last = torch.where(bad, torch.stack([loss, norm, scale]), self._last)
        return ok

    def read(self) -> list[str]:
        """Read the counters (one wait for the device): report the steps skipped since the last read (also kept
        in :attr:`pending`), and raise :class:`TrainingDiverged` when ``max_bad_steps`` came in a row."""
        ints = self._ints.tolist()
        since = ints[_SINCE]
        self.skipped = ints[_SKIPPED]
        self.last_ok = ints[_LAST] != ints[_CHECKED] or ints[_CHECKED] == 0
        messages = []
        if since:
            loss, norm, scale = self._last.tolist()
            reason = self._reason(loss, norm, scale, bool(ints[_BAD_INPUTS]), bool(ints[_OVERFLOW]))
            first, last = ints[_FIRST], ints[_LAST]
            if since == 1:
                messages.append(f"step {last}: skipped ({reason}); weights unchanged")
            else:
                messages.append(f"steps {first} to {last}: {since} skipped, the last (step {last}) because "
                                f"{reason}; weights unchanged")
            self._ints[_SINCE] = 0
            self._ints[_FIRST] = 0
        self.pending += messages
        if ints[_TRIP]:
            trip = ints[_TRIP]
            reason = self._reason(*self._last.tolist(), bool(ints[_BAD_INPUTS]), False)
            self.in_a_row = [(s, reason) for s in range(trip - self.max_bad_steps + 1, trip + 1)]
            raise TrainingDiverged(self.diagnosis(bool(ints[_BAD_INPUTS]), noticed=ints[_LAST]))
        return messages

    def take_messages(self) -> list[str]:
        out, self.pending = self.pending, []
        return out

    @staticmethod
    def _reason(loss: float, norm: float, scale: float, bad_inputs: bool, overflow: bool) -> str:
        if overflow:
            return f"fp16 gradient overflow at loss scale {scale:g} (the scaler lowers it and retries)"
        reason = f"loss is {loss}" if not math.isfinite(loss) else \
            f"gradient norm is {norm} with a finite loss {loss:.4g}"
        if bad_inputs:
            reason += "; the input batch itself holds NaN/Inf values"
        return reason

    def diagnosis(self, bad_inputs: bool, noticed: int | None = None) -> str:
        steps = ", ".join(str(s) for s, _ in self.in_a_row)
        lines = [
            f"training stopped: {len(self.in_a_row)} steps in a row had non-finite values (steps {steps}"
            + (f"; noticed at step {noticed}, the guard is read when the loop logs" if noticed and
               self.in_a_row and noticed != self.in_a_row[-1][0] else "") + ").",
            f"last reason: {self.in_a_row[-1][1]}.",
            "The weights were not updated by those steps, so the last checkpoint is intact.",
            "Likely causes and fixes:",
        ]
        if bad_inputs:
            lines.append("  - the data: a batch holds NaN/Inf; check the dataset (dit-data check, or the "
                         "verify() of a latent extraction)")
        if self.precision == "fp16":
            lines.append("  - fp16 overflow: train in bf16 (--mixed-precision bf16) where the GPU supports it, "
                         "or in fp32")
        lines.append(f"  - a learning rate too high for this batch (lr={self.lr:g}): lower --lr or add "
                     "--warmup-steps")
        if not self.grad_clip:
            lines.append("  - gradient spikes: clip them with --grad-clip 1.0")
        lines.append("Resume from the last checkpoint with the fix: dit-train ... --resume true")
        return "\n".join(lines)

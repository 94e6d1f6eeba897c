"""The NaN/Inf guard: a step whose loss or gradients are not finite is skipped, not applied.

One NaN in an optimizer step spreads through AdamW's moments into every weight and then into the EMA: the
run is lost and, worse, the next checkpoint overwrites the last good one. So before each update the loop
checks the (process-averaged) loss and the global gradient norm. A bad step is skipped (no optimizer step,
no EMA update; the weights stay as they were), with a message that says which step and why. After
``max_bad_steps`` bad steps in a row the run stops with :class:`TrainingDiverged` and a diagnosis.

With fp16 and a gradient scaler, an overflowing gradient is part of normal operation: the scaler halves
the loss scale and the step is skipped. Those skips are counted but only become a failure once the scale
has fallen below 1 (the gradients overflow without any scaling, so something is really wrong).
"""

from __future__ import annotations

import math


class TrainingDiverged(RuntimeError):
    """Training produced non-finite losses or gradients too many steps in a row."""


class NanGuard:
    def __init__(self, max_bad_steps: int, lr: float, precision: str, grad_clip: float):
        self.max_bad_steps = max(1, int(max_bad_steps))
        self.lr, self.precision, self.grad_clip = lr, precision, grad_clip
        self.in_a_row: list[tuple[int, str]] = []
        self.skipped = 0

    def check(self, step: int, loss: float, grad_norm: float, loss_scale: float | None = None,
              bad_inputs: bool = False) -> str | None:
        """Return None for a good step, else the reason to skip it (and count it).

        ``step`` is the 0-based index of the step; messages use the same number as the progress bar
        (``step + 1``). Raises :class:`TrainingDiverged` after ``max_bad_steps`` counted failures in a row.
        """
        if math.isfinite(loss) and math.isfinite(grad_norm):
            self.in_a_row = []
            return None
        self.skipped += 1
        if not math.isfinite(loss):
            reason = f"loss is {loss}"
        else:
            reason = f"gradient norm is {grad_norm} with a finite loss {loss:.4g}"
        if bad_inputs:
            reason += "; the input batch itself holds NaN/Inf values"
        scaler_overflow = loss_scale is not None and math.isfinite(loss) and loss_scale >= 1.0
        if scaler_overflow:
            reason = f"fp16 gradient overflow at loss scale {loss_scale:g} (the scaler lowers it and retries)"
        else:
            self.in_a_row.append((step + 1, reason))
        if len(self.in_a_row) >= self.max_bad_steps:
            raise TrainingDiverged(self.diagnosis(bad_inputs))
        return reason

    def diagnosis(self, bad_inputs: bool) -> str:
        steps = ", ".join(str(s) for s, _ in self.in_a_row)
        lines = [
            f"training stopped: {len(self.in_a_row)} steps in a row had non-finite values (steps {steps}).",
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

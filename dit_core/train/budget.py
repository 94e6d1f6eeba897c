"""A training time budget (``max_minutes``): as many steps as fit in the minutes given, on whatever machine.

A profile tuned on one machine says "3,400 steps"; on a CPU with bf16 instructions or on a GPU the same steps
take a fraction of the time, on a slower CPU more. With ``max_minutes`` the run instead measures its own
speed in its first steps and fixes its length once, before the learning rate leaves its warm-up:

1. steps ``0 .. SETTLE-1`` run untimed (the first steps allocate memory, warm caches, compile);
2. steps ``SETTLE .. end`` are timed, ``end = max(SETTLE + MIN_TIMED, min(warmup_steps, SETTLE + MAX_TIMED))``;
3. after step ``end`` the run's length becomes
   ``end + floor((max_minutes * 60 - seconds spent so far) / seconds per timed step)``,
   never more than ``max_steps`` (so ``--max-steps`` still caps a budgeted run, and a short ``--max-steps``
   wins) and never fewer than the steps already done.

The steps before the decision are warm-up steps, whose learning rate does not depend on the run's length, so
fixing the length late changes nothing that already happened: the run is the run that would have been
configured with that ``max_steps`` from the start (the cosine decay then ends at it). The decision is
recorded in the run's ``config.yaml`` (under ``run: budget_steps``) and in every checkpoint, and a resumed run
keeps it rather than measuring again, so an interrupted run ends at the same step with the same schedule as
an uninterrupted one. (A run stopped before the decision measures again when it resumes; to train a budgeted
run on past its length, resume it with ``--max-minutes 0 --max-steps N``.)

The budget covers the training steps; the sample grids and checkpoints written along the way come on top
(they are seconds each), so a profile leaves them some room (``small-images`` asks for 9 minutes, and its
guidance search after training takes about half a minute more). The length
is an estimate: on a shared machine the speed varies (windows of 50 steps took 204 to 275 ms a step on the
2-core CPU this was measured on). If the steps become slower than measured, the run ends when its minutes are
spent, before the planned length (with the usual last checkpoint and grid, and a note in the log); resuming it
trains on to the planned length with the same schedule.
"""

from __future__ import annotations

import contextlib
import math
from time import perf_counter as _clock  # one name, so that tests can give the budget a clock

from . import distributed

#: Untimed first steps.
SETTLE = 3
#: Timed steps: at least this many ...
MIN_TIMED = 5
#: ... and at most this many (fewer when the warm-up ends sooner). A long window averages over the speed's
#: ups and downs on a shared machine (measured on a 2-core CPU: windows of 50 steps between 204 and 275 ms a step).
MAX_TIMED = 200
#: Steps between two looks at the clock for the deadline (under torchrun each look is a collective).
CHECK_EVERY = 10


def decision_step(warmup_steps: int) -> int:
    """The step count after which the length is fixed (see the module docstring)."""
    return max(SETTLE + MIN_TIMED, min(int(warmup_steps), SETTLE + MAX_TIMED))


def planned_steps(minutes: float, cap: int, done: int, spent_s: float, step_s: float) -> int:
    """The run's length: ``done`` steps taken in ``spent_s`` seconds, ``step_s`` seconds per step from now on,
    ``minutes`` in all, at most ``cap``, at least ``done``."""
    if step_s <= 0 or not math.isfinite(step_s):
        raise ValueError(f"seconds per step must be a positive number, got {step_s}")
    more = math.floor(max(0.0, minutes * 60.0 - spent_s) / step_s)
    return int(max(done, min(int(cap), done + more)))


class TimeBudget:
    """The decision of one run. ``minutes``: the budget (0: none); ``cap``: the configured ``max_steps``;
    ``start_step``: where this session starts (a resumed run); ``planned``: a length decided before (from the
    checkpoint), which is kept. ``sync`` waits for the device (a GPU runs ahead of the Python loop).

    Time counts the training steps only: what the loop does inside :meth:`pause` (sample grids, checkpoints)
    is left out of both the measured speed and the deadline."""

    def __init__(self, minutes: float, cap: int, warmup_steps: int, start_step: int = 0,
                 planned: int | None = None, sync=None):
        self.minutes, self.cap = float(minutes or 0.0), int(cap)
        # a decision from before is kept while the budget is on; --max-minutes 0 drops it (max_steps rules)
        self.planned = None if planned is None or not self.minutes else min(int(planned), self.cap)
        self.sync = sync or (lambda: None)
        self.start_step = start_step
        self.first = start_step + SETTLE  # timing starts after this many steps of this session
        self.end = max(self.first + MIN_TIMED, decision_step(warmup_steps))
        self.t_session = _clock()
        self.t_first = None
        self.paused = 0.0  # seconds spent in pause()
        self.step_s = None  # measured seconds per step (None: not measured in this session)

    @property
    def active(self) -> bool:
        return self.minutes > 0

    @property
    def pending(self) -> bool:
        """Whether the length is still to be decided."""
        return self.active and self.planned is None

    def elapsed(self) -> float:
        """Seconds of training steps in this session so far."""
        return _clock() - self.t_session - self.paused

    @contextlib.contextmanager
    def pause(self):
        """A context that keeps its time out of the budget (grids, checkpoints)."""
        start = _clock()
        try:
            yield
        finally:
            self.paused += _clock() - start

    def after_step(self, step: int) -> int | None:
        """Call after each step (``step``: steps done); returns the run's length once, when it is decided."""
        if not self.pending or step < self.first:
            return None
        if step == self.first:
            self.sync()
            self.t_first = self.elapsed()
            return None
        if step < self.end:
            return None
        self.sync()
        now = self.elapsed()
        self.step_s = (now - self.t_first) / (step - self.first)
        # an earlier session's steps (a run resumed before the decision) count at this session's speed
        spent = now + self.start_step * self.step_s
        self.planned = planned_steps(self.minutes, self.cap, step, spent, self.step_s)
        return self.planned

    def spent(self) -> bool:
        """Whether the session that decided the length has used up its minutes (the machine became slower than
        it measured): the loop then ends the run early. A resumed session runs on to the planned length."""
        return self.step_s is not None and self.elapsed() + self.start_step * self.step_s >= 60.0 * self.minutes

    def describe(self) -> str:
        """One line for the log, after the decision."""
        return (f"time budget {self.minutes:g} min: {self.step_s * 1000:.0f} ms a step (steps {self.first + 1}-"
                f"{self.end}), so {self.planned} steps" + (" (the max_steps cap)" if self.planned == self.cap else ""))

    def check(self, step: int, max_steps: int, procs) -> tuple[int | None, str | None]:
        """What the loop calls after each step (``step``: steps done): ``(length, message)``, the run's new length
        and a line for the log when it changes here, else ``(None, None)``. The length is fixed once, at the end
        of the timed window (under torchrun the slowest process's length holds for all), and cut to ``step``
        when the minutes are spent (by the main process's clock: only it writes the grids and checkpoints that
        the budget leaves out, the others wait for it meanwhile), so that all processes end together."""
        decided = self.after_step(step)
        if decided is not None:
            self.planned = int(-distributed.max_over_processes(-decided, procs))
            return self.planned, self.describe()
        if self.step_s is None or step >= max_steps or step % CHECK_EVERY:
            return None, None
        if distributed.max_over_processes(float(self.spent()) if procs.is_main else 0.0, procs):
            return step, (f"time budget {self.minutes:g} min spent at step {step} of {max_steps} (the steps became "
                          f"slower than measured): the run ends here; --resume true trains on to step {max_steps}")
        return None, None

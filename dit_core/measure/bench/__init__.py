"""Speed and memory of DiT training, measured: the fast-DiT ladder, sampling throughput, MFU.

- :mod:`.rungs`: what is measured: the workload (:class:`BenchSpec`) and the ladder's rungs, as data;
- :mod:`.ladder`: each rung's training step (the step ``dit-train`` runs) timed, its memory read, the planner
  checked; :func:`run_benchmark` runs the whole ladder;
- :mod:`.isolate`: one rung in a fresh process, so that its peak memory is its own;
- :mod:`.timings`: sampling throughput and the optimizer and EMA timings;
- :mod:`.report`: the results as tables.

``dit-bench`` is the command line (:mod:`dit_core.cli.bench`, also ``python -m dit_core.cli.bench``).
"""

from .isolate import measure_rung_isolated
from .ladder import (
    DEVICE_PEAK_TFLOPS,
    add_ratios,
    check_activations,
    device_peak_tflops,
    environment,
    make_step,
    measure_planned,
    measure_rung,
    run_benchmark,
)
from .report import format_record, format_summary, format_table, save_result
from .rungs import (HARDWARE_RUNGS, RUNGS, BenchSpec, Rung, as_rung, default_rungs, model_shape, profile_shape,
                    resolve_spec)
from .timings import measure_optimizers, measure_sampling

__all__ = [
    "BenchSpec", "DEVICE_PEAK_TFLOPS", "HARDWARE_RUNGS", "RUNGS", "Rung", "add_ratios", "as_rung", "check_activations",
    "default_rungs", "device_peak_tflops", "environment", "format_record", "format_summary", "format_table",
    "make_step", "measure_optimizers", "measure_planned", "measure_rung", "measure_rung_isolated",
    "measure_sampling", "model_shape", "profile_shape", "resolve_spec", "run_benchmark", "save_result",
]

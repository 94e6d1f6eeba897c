"""Training DiT on one GPU (and beyond): the loop, its configuration, checkpoints and exact resume.

- :mod:`.config`       the plain-data :class:`TrainConfig`, profiles (``dit_core/configs/*.yaml``), validation
- :mod:`.spelling`     keys and values as users write them: aliases of the official code, text to typed values
- :mod:`.loop`         :func:`train`, the loop itself, read top to bottom
- :mod:`.step`         the training step (micro-batches, loss, backward, the checked update), also what
                       ``dit-bench`` times
- :mod:`.batches`      data order and per-sample random numbers as functions of ``(seed, step)``
- :mod:`.budget`       a time budget (``max_minutes``): the run's length from its own measured speed
- :mod:`.grids`        sample grids of the EMA model during training
- :mod:`.ema`          the exponential moving average of the weights
- :mod:`.guard`        the NaN/Inf guard (its verdict stays on the device)
- :mod:`.preempt`      SIGTERM, SIGUSR1 and Ctrl-C: save at the next step boundary and stop cleanly
- :mod:`.state`        checkpoints with everything needed to resume exactly
- :mod:`.monitor`      progress bar, metrics.jsonl, TensorBoard, summary
- :mod:`.distributed`  torchrun + DistributedDataParallel

``dit-train`` (and ``python -m dit_core.train``) is the command line, :mod:`dit_core.cli.train`. Importing this
package does not import torch (:func:`train` is loaded when first used), so the command line can set up the
process (OpenMP's thread waiting, see :func:`dit_core.cli.train.main`) before torch starts.

Example::

    from dit_core.train import make_config, train
    summary = train(make_config("digits", {"out": "runs/digits"}))
"""

from .config import ConfigError, TrainConfig, make_config

__all__ = ["ConfigError", "TrainConfig", "TrainingDiverged", "make_config", "train"]


def __getattr__(name):
    if name == "train":  # the loop imports torch: loaded on first use
        from .loop import train

        return train
    if name == "TrainingDiverged":  # so does the guard
        from .guard import TrainingDiverged

        return TrainingDiverged
    raise AttributeError(f"module 'dit_core.train' has no attribute {name!r}")

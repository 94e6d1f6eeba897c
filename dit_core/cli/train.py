"""``dit-train``: the command line of the trainer.

    dit-train --config digits --out runs/digits                 # the CPU default: exports the digits itself
    dit-train --config rtx3090-24gb --latents-path LATENTS --out runs/xl
    dit-train --config runs/xl/config.yaml --resume true        # continue a run
    torchrun --standalone --nproc_per_node 4 -m dit_core.train --config a100-80gb --latents-path LATENTS --out runs/xl4

On a CPU, ``cpu_processes`` (0: one per usable core) makes ``dit-train`` start that many processes itself, through
PyTorch's own launcher: the same as ``torchrun --standalone --nproc_per_node N --local-ranks-filter 0 -m
dit_core.train ...`` with ``OMP_NUM_THREADS`` set to the usable cores over N (:func:`run_processes`). A small DiT
keeps one CPU core busy but not two (its matrix products are too small for torch's threads to share well), so two
processes of one thread each train faster than one process of two threads; the processes compute what one
process computes (:mod:`dit_core.train.distributed`), so the run is the same run.

``--config`` takes a bundled profile name or a YAML file; every other ``--key value`` overrides one config
key (``--key=value`` works too, a bare ``--flag`` means true). Hyphens and underscores are the same, and the
spellings of the official ``train.py`` and of the single-GPU tutorials are accepted (``--global-batch-size``,
``--results-dir``, ``--gradient_accumulation_steps``, ``--use_checkpoint``, ...). ``dit-train --help`` lists
every key. Before the run starts, ``dit-train`` prints every setting of the profile that the command line changed
(old -> new), and says so when a model name or size key resizes the profile's model, whose other settings were
tuned for its own size (:mod:`dit_core.train.overrides`; recorded in ``<out>/config.yaml`` under ``run:``).

Stopping: SIGTERM, SIGUSR1 (what clusters and spot instances send before they stop a job) and Ctrl-C save a
checkpoint at the end of the step in progress and stop; the exit status is then 128 + the signal number (143,
138, 130), as for a process killed by it, so that a job script sees an unfinished run. A second Ctrl-C stops at
once (exit status 130, the last checkpoint intact). Exit status 2: a configuration, data or checkpoint error or
a full disk (the message says what to do); 3: training diverged (NaN/Inf).
"""

from __future__ import annotations

import os
import sys

from dit_core.train.config import ConfigError, TrainConfig, canonical, field_types, help_text, make_config, profiles
from dit_core.train.overrides import Overrides, find_overrides

USAGE = "usage: dit-train [--config PROFILE_OR_YAML] [--out DIR] [--key value ...]"


def parse_args(argv: list[str]) -> tuple[str | None, dict]:
    """Split ``argv`` into the profile and a dict of overrides (keys already checked and canonical)."""
    profile, overrides, i = None, {}, 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--") or arg == "--":
            raise ConfigError(f"unexpected argument {arg!r}: settings are given as --key value")
        key, has_value, value = arg[2:].partition("=")
        if not has_value:
            if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                value, i = argv[i + 1], i + 1
            else:
                value = None
        i += 1
        if key.replace("-", "_") in ("config", "profile"):
            if value is None:
                raise ConfigError(f"--config needs a profile ({', '.join(profiles())}) or a YAML path")
            profile = value
            continue
        name = canonical(key)
        if value is None:
            if bool not in field_types(name):
                raise ConfigError(f"--{key} needs a value")
            value = "true"
        overrides[name] = value
    return profile, overrides


def planned_processes(cfg: TrainConfig, usable: int | None = None) -> int:
    """How many processes ``dit-train`` should start for ``cfg``: 1 unless the run is on the CPU, was not
    started by torchrun, and ``cpu_processes`` asks for more (0: one per usable core). Each process needs at
    least one image of every micro-batch, and the batch must split evenly."""
    if "WORLD_SIZE" in os.environ or cfg.cpu_processes == 1 or cfg.debug:
        return 1
    from dit_core.runtime import resolve_device, usable_cores

    if resolve_device(cfg.device).type != "cpu":
        return 1
    n = cfg.cpu_processes or (usable if usable is not None else usable_cores())
    per_step = cfg.batch_size // max(1, cfg.grad_accum)
    n = min(n, per_step)
    while n > 1 and per_step % n:
        n -= 1
    return max(1, n)


def run_processes(n: int, argv: list[str], usable: int | None = None) -> int:
    """Train in ``n`` processes on this machine through ``torch.distributed.run`` (torchrun), rank 0's output on
    the terminal. SIGTERM, SIGINT (Ctrl-C) and SIGHUP reach the launcher, which passes the signal on to every
    process and waits for them to save (:mod:`dit_core.train.preempt`). Returns the exit status: 0, the first
    failing process's, or 128 + the signal's number."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    from dit_core.runtime import usable_cores

    threads = max(1, (usable if usable is not None else usable_cores()) // n)
    os.environ["OMP_NUM_THREADS"] = str(threads)  # the launcher passes it on to the processes
    print(f"dit-train: {n} processes on the CPU, {threads} thread(s) each (torchrun, DDP over gloo; cpu_processes: 1 "
          "trains in one)", flush=True)
    # the launcher looks at its processes once a second (not ten times): on a small machine every core trains
    args = get_args_parser().parse_args(["--standalone", f"--nproc-per-node={n}", "--local-ranks-filter=0",
                                         "--monitor-interval=1", "--module", "dit_core.train", *argv])
    try:
        run(args)
    except ChildFailedError as err:
        code = next(iter(err.failures.values())).exitcode
        return code if code > 0 else 128 - code  # a death by signal N: 128 + N, as a shell reports it
    except SignalException as err:
        return 128 + int(err.sigval)
    return 0


def config_from_args(argv: list[str]) -> TrainConfig:
    return resolve_args(argv)[0]


def resolve_args(argv: list[str]) -> tuple[TrainConfig, Overrides]:
    """The run's config, and what the command line changed in its profile (:mod:`dit_core.train.overrides`)."""
    profile, overrides = parse_args(argv)
    cfg = make_config(profile, overrides)
    return cfg, find_overrides(profile, overrides, cfg)


def main(argv: list[str] | None = None) -> int:
    # CPU threads that wait for work sleep instead of spinning. With the default (spinning) policy, 2 torch
    # threads on a 2-core machine that also runs anything else were measured 8x slower than 1 thread (4.5 s
    # vs 0.7 s per digits step); passive waiting made 2 threads faster than 1 (0.43 s). OpenMP reads the
    # setting when torch is first imported, so it is made here, where the process starts and before anything
    # imports torch (this module imports only the plain-data config); an explicit setting wins.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    argv = sys.argv[1:] if argv is None else list(argv)
    if any(a in ("-h", "--help") for a in argv):
        print(USAGE + "\n\nProfiles: " + ", ".join(profiles()) + "\n\nConfig keys:\n" + help_text())
        return 0
    try:
        cfg, overrides = resolve_args(argv)
    except (ConfigError, FileNotFoundError) as err:
        print(f"dit-train: error: {err}", file=sys.stderr)
        return 2
    processes = planned_processes(cfg)
    if processes > 1:
        return run_processes(processes, argv)
    if os.environ.get("RANK", "0") == "0":  # one process says it (under torchrun, each one trains)
        for line in overrides.lines(cfg):
            print(line, flush=True)
    from dit_core.atomic import DiskFullError
    from dit_core.checkpoint import CheckpointError
    from dit_core.train.guard import TrainingDiverged
    from dit_core.train.loop import train
    from dit_core.train.preempt import exit_code

    try:
        summary = train(cfg, overrides=overrides)
    except (ConfigError, FileNotFoundError, CheckpointError, DiskFullError) as err:
        print(f"dit-train: error: {err}", file=sys.stderr)
        return 2
    except TrainingDiverged as err:
        print(f"dit-train: {err}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        print("dit-train: stopped at once by Ctrl-C; every checkpoint written before is intact", file=sys.stderr)
        return 130
    return exit_code(summary.get("interrupted"))


if __name__ == "__main__":
    sys.exit(main())

"""``dit-train``: the command line of the trainer.

    dit-train --config digits --out runs/digits                 # the CPU default: exports the digits itself
    dit-train --config rtx3090-24gb --latents-path LATENTS --out runs/xl
    dit-train --config runs/xl/config.yaml --resume true        # continue a run
    torchrun --nproc_per_node 4 -m dit_core.train --config a100-80gb --latents-path LATENTS --out runs/xl4

``--config`` takes a bundled profile name or a YAML file; every other ``--key value`` overrides one config
key (``--key=value`` works too, a bare ``--flag`` means true). Hyphens and underscores are the same, and the
spellings of the official ``train.py`` and of the single-GPU tutorials are accepted (``--global-batch-size``,
``--results-dir``, ``--gradient_accumulation_steps``, ``--use_checkpoint``, ...). ``dit-train --help`` lists
every key.

Stopping: SIGTERM, SIGUSR1 (what clusters and spot instances send before they stop a job) and Ctrl-C save a
checkpoint at the end of the step in progress and stop; the exit status is then 128 + the signal number (143,
138, 130), as for a process killed by it, so that a job script sees an unfinished run. A second Ctrl-C stops at
once (exit status 130, the last checkpoint intact). Exit status 2: a configuration, data or checkpoint error or
a full disk (the message says what to do); 3: training diverged (NaN/Inf).
"""

from __future__ import annotations

import os
import sys

from dit_core.train.config import ConfigError, TrainConfig, _types, canonical, help_text, make_config, profiles

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
            if bool not in _types(name):
                raise ConfigError(f"--{key} needs a value")
            value = "true"
        overrides[name] = value
    return profile, overrides


def config_from_args(argv: list[str]) -> TrainConfig:
    profile, overrides = parse_args(argv)
    return make_config(profile, overrides)


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
        cfg = config_from_args(argv)
    except (ConfigError, FileNotFoundError) as err:
        print(f"dit-train: error: {err}", file=sys.stderr)
        return 2
    from dit_core.train.launch import planned_processes, run_processes

    processes = planned_processes(cfg)
    if processes > 1:
        return run_processes(processes, argv)
    from dit_core.atomic import DiskFullError
    from dit_core.checkpoint import CheckpointError
    from dit_core.train.guard import TrainingDiverged
    from dit_core.train.loop import train
    from dit_core.train.preempt import exit_code

    try:
        summary = train(cfg)
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

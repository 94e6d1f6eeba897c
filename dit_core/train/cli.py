"""``dit-train``: the command line of the trainer.

    dit-train --config digits --out runs/digits                 # the CPU default: exports the digits itself
    dit-train --config rtx3090-24gb --latents-path LATENTS --out runs/xl
    dit-train --config runs/xl/config.yaml --resume true        # continue a run
    torchrun --nproc_per_node 4 -m dit_core.train --config a100-80gb --latents-path LATENTS --out runs/xl4

``--config`` takes a bundled profile name or a YAML file; every other ``--key value`` overrides one config
key (``--key=value`` works too, a bare ``--flag`` means true). Hyphens and underscores are the same, and the
spellings of the official code and the tutorials are accepted (``--gradient_accumulation_steps``,
``--use_checkpoint``, ``--mixed_precision fp16``, ``--feature-path``, ...). ``dit-train --help`` lists every key.
"""

from __future__ import annotations

import sys

from ..checkpoint import CheckpointError
from .config import ConfigError, TrainConfig, _types, canonical, help_text, make_config, profiles

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
        if key.replace("-", "_") == "unconditional":
            overrides["class_cond"] = "false" if value in (None, "true", "1", "yes") else "true"
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
    argv = sys.argv[1:] if argv is None else list(argv)
    if any(a in ("-h", "--help") for a in argv):
        print(USAGE + "\n\nProfiles: " + ", ".join(profiles()) + "\n\nConfig keys:\n" + help_text())
        return 0
    try:
        cfg = config_from_args(argv)
    except (ConfigError, FileNotFoundError) as err:
        print(f"dit-train: error: {err}", file=sys.stderr)
        return 2
    from .guard import TrainingDiverged
    from .loop import train

    try:
        train(cfg)
    except (ConfigError, FileNotFoundError, CheckpointError) as err:
        print(f"dit-train: error: {err}", file=sys.stderr)
        return 2
    except TrainingDiverged as err:
        print(f"dit-train: {err}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Atomic file writes: a crash or a kill at any moment leaves either the old file or the new one, never half.

Every file the library writes for later reading (checkpoints, latent shards and manifests, run configs,
benchmark records) goes through :func:`atomic_write`: write a temporary file in the same folder, flush and
fsync it, then rename it over the target (a rename within one file system is atomic). The temporary names
start with ``.<name>.tmp-`` so that a folder's clean-up can recognise what a killed writer left behind.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import IO, Callable


def atomic_write(path: str | os.PathLike, write: Callable[[IO], object], binary: bool = True) -> Path:
    """Call ``write(f)`` on a temporary file beside ``path``, fsync it, then rename it over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb" if binary else "w") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` atomically."""
    return atomic_write(path, lambda f: f.write(text), binary=False)

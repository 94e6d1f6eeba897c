"""The shared reference files (``shared/reference``: the official state-dict layout, FACTS.md), found where they are.

CI clones the repository with ``shared/`` beside the clone, so they are at ``<clone>/../shared/reference``;
a copy of the working tree may carry ``shared/`` inside it; ``DIT_SHARED_REFERENCE`` names another folder. Tests
that need a file and do not find it skip, and the reason lists the places looked in.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def places() -> list[Path]:
    """The folders searched, in order."""
    found = [Path(os.environ["DIT_SHARED_REFERENCE"])] if os.environ.get("DIT_SHARED_REFERENCE") else []
    return found + [REPO.parent / "shared" / "reference", REPO / "shared" / "reference"]


def reference_file(name: str) -> Path | None:
    """The first ``name`` in :func:`places`, or None."""
    return next((p / name for p in places() if (p / name).is_file()), None)


def skip_reason(name: str) -> str:
    return (f"shared/reference/{name} not found (looked in {', '.join(str(p) for p in places())}); CI clones the "
            "repository with shared/ beside it, or set DIT_SHARED_REFERENCE")

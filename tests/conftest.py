"""Shared pytest setup.

Threads: 2-core machines slow down badly when torch oversubscribes the cores, so the suite pins
OMP_NUM_THREADS / MKL_NUM_THREADS (unless the caller already did) before anything imports torch.
Notebook kernels started by the tests inherit the same settings.
"""

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("MKL_NUM_THREADS", "2")

import pytest  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
BOOK_DIR = REPO_ROOT / "book"


@pytest.fixture(scope="session")
def python3_kernel(tmp_path_factory):
    """The name of a Jupyter kernel ("python3") that runs this interpreter, with the repository importable.

    A kernelspec written to a temporary folder at the front of JUPYTER_PATH wins over any user-level or
    system "python3" kernel that might point at another Python. Kernels get DIT_SMOKE=1 as well, so
    ``dit_book.smoke_mode()`` agrees with the injected ``SMOKE = True``.
    """
    root = tmp_path_factory.mktemp("jupyter")
    spec_dir = root / "kernels" / "python3"
    spec_dir.mkdir(parents=True)
    pythonpath = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (dit-core tests)",
        "language": "python",
        "env": {"PYTHONPATH": pythonpath, "DIT_SMOKE": "1"},
        "metadata": {"debugger": False},
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec, indent=1))
    old = os.environ.get("JUPYTER_PATH")
    os.environ["JUPYTER_PATH"] = os.pathsep.join(p for p in (str(root), old) if p)
    yield "python3"
    if old is None:
        os.environ.pop("JUPYTER_PATH", None)
    else:
        os.environ["JUPYTER_PATH"] = old

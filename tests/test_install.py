"""The project installs from a copy of itself: the route book/intro.md gives for Colab and other machines.

The project has no public address to install from, so a reader brings a clone or an archive
(``git archive --format=zip -o dit-one-gpu.zip HEAD``) and runs ``pip install`` in it. The slow test does the
same as far as an offline machine allows: it archives the working tree (uncommitted changes to tracked files
included, through ``git stash create``, which touches nothing), unpacks it in a temporary folder, builds a wheel
from it without network, installs that wheel with ``--no-deps`` into a fresh virtual environment, lends the new
environment this one's third-party packages (torch, numpy, ...) through a ``.pth`` file, and then, from outside
the repository, imports ``dit_core`` (which must come from the new environment) and runs ``dit-models`` and a
profile lookup. About 30 s on 2 cores.

A fast test checks that no file names an address for the project itself, which does not exist.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO_ROOT), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def _archive_working_tree(dest: Path) -> str:
    """Unpack ``git archive`` of the working tree (tracked files, with their uncommitted changes) into ``dest``."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed: cannot archive the working tree")
    try:
        if _git("rev-parse", "--is-inside-work-tree") != "true":
            pytest.skip(f"{REPO_ROOT} is not a git work tree")
    except subprocess.CalledProcessError:
        pytest.skip(f"{REPO_ROOT} is not a git work tree")
    ref = _git("stash", "create") or "HEAD"
    tar = dest.parent / "src.tar"
    subprocess.run(["git", "-C", str(REPO_ROOT), "archive", "--format=tar", "-o", str(tar), ref], check=True)
    with tarfile.open(tar) as archive:
        archive.extractall(dest, filter="data")
    return ref


@pytest.mark.slow
def test_a_clean_archive_installs_into_a_fresh_environment(tmp_path):
    src = tmp_path / "dit-one-gpu"
    _archive_working_tree(src)
    assert (src / "pyproject.toml").is_file() and (src / "dit_core" / "configs" / "digits.yaml").is_file()
    assert not (src / ".venv").exists() and not (src / "_build").exists(), "the archive must hold sources only"

    quiet = dict(check=True, capture_output=True, text=True, timeout=300)
    wheels = tmp_path / "wheels"
    # setuptools comes from this environment (--no-build-isolation): no network is needed
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                    "-q", "-w", str(wheels), str(src)], **quiet)
    wheel = next(wheels.glob("dit_core-*.whl"))

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], **quiet)
    python = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index",
                    "-q", str(wheel)], **quiet)
    purelib = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  **quiet).stdout.strip())
    # torch and the other dependencies from this environment, searched after the new one's own packages
    (purelib / "zz_borrowed_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["OMP_NUM_THREADS"] = "1"
    run = dict(quiet, cwd=tmp_path, env=env)
    where = subprocess.run([str(python), "-c", "import dit_core; print(dit_core.__file__)"], **run).stdout.strip()
    assert Path(where).resolve().is_relative_to(venv.resolve()), (
        f"dit_core was imported from {where}, not from the fresh environment {venv}")
    book = subprocess.run([str(python), "-c", "import dit_book; print(dit_book.__file__)"], **run).stdout.strip()
    assert Path(book).resolve().is_relative_to(venv.resolve()), f"dit_book was imported from {book}"
    out = subprocess.run([str(venv / "bin" / "dit-models")], **run).stdout
    assert "DiT-XL/2" in out and "675,129,632" in out, out
    profiles = subprocess.run([str(python), "-c", "from dit_core.train.config import profiles; print(profiles())"],
                              **run).stdout
    assert "digits" in profiles and "rtx3090-24gb" in profiles, profiles


#: Files that a reader or a packager reads addresses from.
LINKED_FILES = ["README.md", "pyproject.toml", "_config.yml", "environment.yml", "book/references.bib"]


def test_no_address_is_given_for_the_project_itself():
    pages = [REPO_ROOT / f for f in LINKED_FILES] + sorted((REPO_ROOT / "book").glob("*.md"))
    pages += sorted((REPO_ROOT / "book").glob("*.ipynb"))
    own = re.compile(r"https?://[^\s\"')>]*dit-one-gpu[^\s\"')>]*", re.I)
    found = {p.relative_to(REPO_ROOT).as_posix(): own.findall(p.read_text()) for p in pages if p.is_file()}
    found = {k: v for k, v in found.items() if v}
    assert not found, (
        f"addresses for the project, which has none: {found}; tell the reader to bring a clone or an archive "
        "(book/intro.md, 'Running it')")

"""Stage the book with already-executed notebooks, so that it builds without running any chapter again.

    python .ci/smoke_book.py EXECUTED_DIR STAGE_DIR

``EXECUTED_DIR`` holds ``<stem>.smoke.ipynb`` for every ``book/<stem>.ipynb``: the notebooks that the smoke
tests executed with ``SMOKE = True`` (``make smoke SMOKE_OUTPUT_DIR=...``, as ``make book-smoke`` and CI
run it); ``<stem>.ipynb`` (e.g. executed by papermill at the full defaults) is taken as well. ``STAGE_DIR`` receives a copy of the book's sources (``_config.yml`` with execution switched off,
``_toc.yml``, ``book/`` with the executed notebooks in place of the committed ones) and a link to
``.vendor``. ``jupyter-book build STAGE_DIR --path-output .`` then writes the HTML to ``_build/html``
in a minute, instead of executing every chapter a second time: CI's quick build for the browser test
(tests/test_browser.py). ``make book`` is the real build: it executes every chapter at its default.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import nbformat
import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]


def executed_copy(executed: Path, stem: str) -> Path | None:
    for name in (f"{stem}.smoke.ipynb", f"{stem}.ipynb"):
        if (executed / name).is_file():
            return executed / name
    return None


def stage(executed: Path, out: Path) -> list[str]:
    notebooks = sorted((REPO_ROOT / "book").glob("*.ipynb"))
    missing = [nb.stem for nb in notebooks if executed_copy(executed, nb.stem) is None]
    if missing:
        raise SystemExit(f"smoke_book: no executed notebook in {executed} for {missing}; run "
                         f"`make smoke SMOKE_OUTPUT_DIR={executed}` first")
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(REPO_ROOT / "book", out / "book", ignore=shutil.ignore_patterns("*.ipynb", "__pycache__"))
    for nb in notebooks:
        executed_nb = nbformat.read(executed_copy(executed, nb.stem), as_version=4)
        nbformat.write(executed_nb, out / "book" / nb.name)
    config = yaml.safe_load((REPO_ROOT / "_config.yml").read_text())
    config["execute"]["execute_notebooks"] = "off"
    if any(executed_copy(executed, nb.stem).name.endswith(".smoke.ipynb") for nb in notebooks):
        config["title"] = f"{config.get('title', '')} (smoke build)".strip()
    (out / "_config.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    shutil.copy(REPO_ROOT / "_toc.yml", out / "_toc.yml")
    (out / ".vendor").symlink_to(REPO_ROOT / ".vendor", target_is_directory=True)
    return [nb.name for nb in notebooks]


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    names = stage(Path(argv[0]).resolve(), Path(argv[1]).resolve())
    print(f"smoke_book: staged {len(names)} executed notebooks in {argv[1]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

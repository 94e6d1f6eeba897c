"""Repository hygiene that keeps `make book` and the smoke runs green without executing anything.

* every chapter notebook has one `parameters` cell that sets ``SMOKE = False`` (tests/test_notebooks.py),
* notebooks are committed without outputs (fix: ``python -m dit_core.book strip-outputs book/*.ipynb``),
* notebooks name the ``python3`` kernel that papermill and jupyter-book start,
* ``_toc.yml`` lists every page in book/ in chapter order, and every file it lists exists,
* every citation in the book has an entry in book/references.bib.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml

nbformat = pytest.importorskip("nbformat")

REPO_ROOT = Path(__file__).resolve().parents[1]
BOOK_DIR = REPO_ROOT / "book"
NOTEBOOKS = sorted(BOOK_DIR.glob("*.ipynb"))
PAGES = sorted(BOOK_DIR.glob("*.md")) + NOTEBOOKS
STRIP_HINT = "python -m dit_core.book strip-outputs book/*.ipynb"


def _read(notebook: Path):
    return nbformat.read(notebook, as_version=4)


def _toc_files(node) -> list[str]:
    """All `file:` / `root:` entries of a Jupyter Book _toc.yml, in reading order."""
    found = []
    if isinstance(node, dict):
        for key in ("root", "file"):
            if isinstance(node.get(key), str):
                found.append(node[key])
        for value in node.values():
            if isinstance(value, (dict, list)):
                found.extend(_toc_files(value))
    elif isinstance(node, list):
        for item in node:
            found.extend(_toc_files(item))
    return found


def _strip_suffix(entry: str) -> str:
    return re.sub(r"\.(ipynb|md)$", "", entry)


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_has_parameters_cell_with_smoke_false(notebook):
    nb = _read(notebook)
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1, (
        f"{notebook.name}: needs exactly one cell tagged `parameters` (found {len(tagged)}); it holds "
        f"SMOKE = False and every cost setting"
    )
    cell = tagged[0]
    assert cell.cell_type == "code", f"{notebook.name}: the `parameters` cell must be a code cell"
    tree = ast.parse(cell.source)
    smoke = [
        node.value for node in tree.body
        if isinstance(node, (ast.Assign, ast.AnnAssign))
        and any(isinstance(t, ast.Name) and t.id == "SMOKE"
                for t in (node.targets if isinstance(node, ast.Assign) else [node.target]))
    ]
    assert smoke, f"{notebook.name}: the `parameters` cell must define `SMOKE = False` (the smoke tests set it True)"
    assert isinstance(smoke[-1], ast.Constant) and smoke[-1].value is False, (
        f"{notebook.name}: SMOKE must default to False in the `parameters` cell (the book runs the full default)"
    )


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_committed_without_outputs(notebook):
    nb = _read(notebook)
    dirty = [i for i, c in enumerate(nb.cells)
             if c.cell_type == "code" and (c.outputs or c.execution_count is not None)]
    assert not dirty, f"{notebook.name}: cells {dirty} have outputs or execution counts; run `{STRIP_HINT}`"
    assert "widgets" not in nb.metadata, f"{notebook.name}: saved widget state in metadata; run `{STRIP_HINT}`"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_uses_python3_kernel(notebook):
    nb = _read(notebook)
    name = nb.metadata.get("kernelspec", {}).get("name")
    assert name == "python3", (
        f"{notebook.name}: kernelspec name is {name!r}; set it to 'python3' (the kernel jupyter-book and "
        f"papermill start) in the notebook metadata"
    )


def test_toc_lists_every_page_in_order_and_only_existing_files():
    toc = yaml.safe_load((REPO_ROOT / "_toc.yml").read_text())
    assert toc.get("format") == "jb-book", "_toc.yml: format must be jb-book (Jupyter Book 1.x)"
    entries = [_strip_suffix(e) for e in _toc_files(toc)]
    assert entries and entries[0] == "book/intro", "_toc.yml: the root page must be book/intro"
    missing = [e for e in entries if not any((REPO_ROOT / (e + s)).is_file() for s in (".ipynb", ".md"))]
    assert not missing, f"_toc.yml lists files that do not exist: {missing}"
    assert len(entries) == len(set(entries)), f"_toc.yml lists a file twice: {entries}"
    pages = [p.relative_to(REPO_ROOT).with_suffix("").as_posix() for p in PAGES]
    unlisted = sorted(set(pages) - set(entries))
    assert not unlisted, f"pages in book/ missing from _toc.yml (add them in chapter order): {unlisted}"
    chapters = [e for e in entries if (REPO_ROOT / (e + ".ipynb")).is_file()]
    assert chapters == sorted(chapters), f"_toc.yml: chapters must be listed in file-name order: {chapters}"


def test_book_config_executes_and_fails_on_errors():
    config = yaml.safe_load((REPO_ROOT / "_config.yml").read_text())
    execute = config["execute"]
    assert execute["execute_notebooks"] == "force" and execute["allow_errors"] is False
    assert config["only_build_toc_files"] is True
    for bib in config["bibtex_bibfiles"]:
        assert (REPO_ROOT / bib).is_file(), f"_config.yml: bibtex file {bib} does not exist"


def test_every_citation_has_a_bibliography_entry():
    keys = set(re.findall(r"^@\w+\{([^,\s]+),", (BOOK_DIR / "references.bib").read_text(), re.M))
    cite = re.compile(r"\{cite(?::[a-z]+)?\}`([^`]+)`")
    unknown = {}
    for page in PAGES:
        if page.suffix == ".ipynb":
            text = "\n".join(c.source for c in _read(page).cells if c.cell_type == "markdown")
        else:
            text = page.read_text()
        for group in cite.findall(text):
            for key in (k.strip() for k in group.split(",")):
                if key not in keys:
                    unknown.setdefault(page.name, []).append(key)
    assert not unknown, f"citations without an entry in book/references.bib: {unknown}"
    bibliographies = [p.name for p in PAGES if "{bibliography}" in p.read_text()]
    assert bibliographies == ["intro.md"], (
        f"exactly one {{bibliography}} directive, in book/intro.md, is expected; found in {bibliographies}"
    )

"""Repository hygiene that keeps `make book` and the smoke runs green without executing anything.

* every chapter notebook has one `parameters` cell that sets ``SMOKE = False`` (tests/test_notebooks.py),
* notebooks are committed without outputs (fix: ``python -m dit_book strip-outputs book/*.ipynb``),
* notebooks name the ``python3`` kernel that papermill and jupyter-book start,
* ``_toc.yml`` lists every page in book/ in chapter order, and every file it lists exists,
* every citation in the book has an entry in book/references.bib,
* every chapter starts with its "Running this chapter" box and ends with What to remember, Exercises (with
  hidden solutions) and Next,
* the repository speaks to its users: no word of how it was made (a numbered session or round, "until
  recently") in the README, the book, the library, the profiles or the benchmarks; experiment histories live in
  the records of benchmarks/results,
* the README stays a README (at most 150 lines) and every profile reads as settings (at most 60 lines).
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
STRIP_HINT = "python -m dit_book strip-outputs book/*.ipynb"


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


# ------------------------------------------------------------------------------------------------ chapter shape
#: Every chapter of _toc.yml (a notebook) starts and ends the same way:
#: * its title alone in the first cell, then the "Running this chapter" box: a code cell tagged ``remove-input`` that
#:   calls ``chapter_box("<its own stem>")`` (``python -m dit_book add-box book/NN.ipynb`` inserts it);
#: * near the end "## What to remember" with 3 to 6 points, then "## Exercises" (its cell and the markdown cells up
#:   to Next): at least three, each ``**Exercise N ...**`` followed by its solution in a dropdown admonition (hidden
#:   behind a toggle in the HTML),
#:   at least one marked "(predict, then measure)": it changes code or a parameter and predicts a measured outcome;
#: * and last "## Next".
EXERCISE = re.compile(r"^\*\*Exercise (\d+)(?: \(([^)]*)\))?\.\*\*", re.M)
SOLUTION = re.compile(r"^(`{3,}|:{3,})\{admonition\} Solution\n:class: dropdown\n", re.M)


def _toc_chapters() -> list[Path]:
    toc = yaml.safe_load((REPO_ROOT / "_toc.yml").read_text())
    entries = [_strip_suffix(e) for e in _toc_files(toc)]
    return [REPO_ROOT / f"{e}.ipynb" for e in entries if (REPO_ROOT / f"{e}.ipynb").is_file()]


CHAPTERS = _toc_chapters()


def _heading_cells(nb, heading: str) -> list[int]:
    return [i for i, c in enumerate(nb.cells) if c.cell_type == "markdown"
            and re.search(rf"^{re.escape(heading)}\s*$", c.source, re.M)]


def _section(source: str, heading: str) -> str:
    """The text under ``heading`` in a cell, up to the next heading of any level."""
    after = source.split(heading, 1)[1]
    return re.split(r"^#{1,6} ", after, maxsplit=1, flags=re.M)[0]


@pytest.mark.parametrize("notebook", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_chapter_starts_with_its_running_box(notebook):
    from dit_book.timings import BOX_TAGS, box_stem

    nb = _read(notebook)
    fix = f"run `python -m dit_book add-box book/{notebook.name}`"
    first = nb.cells[0]
    assert first.cell_type == "markdown" and first.source.startswith("# ") and "\n" not in first.source.strip(), (
        f"{notebook.name}: the first cell must hold the chapter's title alone (# ...); {fix}")
    box = nb.cells[1]
    assert box.cell_type == "code" and box_stem(box.source) is not None, (
        f"{notebook.name}: the cell after the title must be the 'Running this chapter' box; {fix}")
    assert box_stem(box.source) == notebook.stem, (
        f"{notebook.name}: its box shows chapter {box_stem(box.source)!r}; call chapter_box({notebook.stem!r})")
    assert set(BOX_TAGS) <= set(box.metadata.get("tags", [])), (
        f"{notebook.name}: tag the box cell {BOX_TAGS} so that the HTML shows the box, not its code")
    boxes = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and box_stem(c.source)]
    assert boxes == [1], f"{notebook.name}: exactly one box cell, right after the title (found at cells {boxes})"


@pytest.mark.parametrize("notebook", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_chapter_ends_with_remember_exercises_and_next(notebook):
    nb = _read(notebook)
    remember, exercises, nxt = (_heading_cells(nb, h) for h in ("## What to remember", "## Exercises", "## Next"))
    assert len(remember) == 1, f"{notebook.name}: needs one '## What to remember' section (found {len(remember)})"
    assert len(exercises) == 1, f"{notebook.name}: needs one '## Exercises' cell (found {len(exercises)})"
    assert nxt == [len(nb.cells) - 1], f"{notebook.name}: the last cell must be '## Next' (where to go from here)"
    assert remember[0] < exercises[0] < nxt[0], (
        f"{notebook.name}: the ending reads 'What to remember', 'Exercises', 'Next', in that order")

    points = re.findall(r"^[*-] ", _section(nb.cells[remember[0]].source, "## What to remember"), re.M)
    assert 3 <= len(points) <= 6, f"{notebook.name}: 'What to remember' has {len(points)} points; keep 3 to 6"

    # the "## Exercises" cell and the markdown cells after it, up to "## Next": an implement-it exercise may have a
    # cell of its own, followed by the cell to write in and its folded solution
    text = "\n\n".join(c.source for c in nb.cells[exercises[0]:nxt[0]] if c.cell_type == "markdown")
    found = EXERCISE.findall(text)
    numbers = [int(n) for n, _ in found]
    assert len(found) >= 3, f"{notebook.name}: {len(found)} exercises; at least three (**Exercise N.** ...)"
    assert numbers == list(range(1, len(found) + 1)), f"{notebook.name}: exercises numbered {numbers}"
    assert any("predict, then measure" in kind for _, kind in found), (
        f"{notebook.name}: at least one exercise must change code or a parameter and predict a measured outcome; "
        "mark it '**Exercise N (predict, then measure).**'")
    # each exercise is followed by its own solution, before the next exercise
    pieces = EXERCISE.split(text)[1:]
    bodies = pieces[2::3]
    unsolved = [n for n, body in zip(numbers, bodies) if len(SOLUTION.findall(body)) != 1]
    assert not unsolved, (
        f"{notebook.name}: exercises {unsolved} need one solution each, hidden in the HTML: a fenced "
        "'{admonition} Solution' directive with ':class: dropdown' right after the exercise")
    for body in bodies:
        fence = SOLUTION.search(body).group(1)
        assert re.search(rf"^{re.escape(fence)}\s*$", body[SOLUTION.search(body).end():], re.M), (
            f"{notebook.name}: a solution's {fence} fence is not closed")


IMPLEMENT_IT = re.compile(r"^\*\*Exercise \d+ \(implement it\)\.\*\*", re.M)


@pytest.mark.parametrize("notebook", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_an_implement_it_solution_is_folded_after_the_books_code(notebook):
    """An implement-it exercise is followed by the cell to write in (``%%answer``) and the book's code
    (``%%solution``, folded); its solution's words come after those, in a markdown cell of their own that Jupyter
    folds (``jupyter.source_hidden``) and the HTML hides (the dropdown): a reader writing the part sees neither."""
    nb = _read(notebook)
    problems = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown" or not IMPLEMENT_IT.search(cell.source):
            continue
        name = f"cell {cell.get('id')}"
        if SOLUTION.search(cell.source):
            problems.append(f"{name}: its solution sits in the exercise's cell, which Jupyter shows")
            continue
        later = nb.cells[i + 1:]
        k = next((j for j, c in enumerate(later) if c.cell_type == "markdown"), len(later))
        if not any(c.cell_type == "code" and c.source.startswith("%%solution") for c in later[:k]):
            problems.append(f"{name}: no %%solution cell between the exercise and its solution")
        if k == len(later) or not SOLUTION.match(later[k].source):
            problems.append(f"{name}: the markdown cell after its code cells is not its solution dropdown")
        elif not later[k].metadata.get("jupyter", {}).get("source_hidden"):
            problems.append(f"{name}: its solution cell {later[k].get('id')} is not folded in Jupyter "
                            "(metadata jupyter.source_hidden: true)")
    assert not problems, f"{notebook.name}: " + "; ".join(problems)


def test_the_shape_check_catches_a_chapter_without_an_ending(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# 99. Example"),
                nbformat.v4.new_code_cell("x = 1"),
                nbformat.v4.new_markdown_cell("## What to remember\n\n* one\n* two\n"),
                nbformat.v4.new_markdown_cell("## Exercises\n\n**Exercise 1.** Why?\n\n**Exercise 2.** How?\n")]
    path = tmp_path / "99_example.ipynb"
    nbformat.write(nb, path)
    with pytest.raises(AssertionError, match="the cell after the title must be the 'Running this chapter' box"):
        test_chapter_starts_with_its_running_box(path)
    with pytest.raises(AssertionError, match="the last cell must be '## Next'"):
        test_chapter_ends_with_remember_exercises_and_next(path)
    nb.cells.append(nbformat.v4.new_markdown_cell("## Next\n\nChapter 100."))
    nbformat.write(nb, path)
    with pytest.raises(AssertionError, match="has 2 points"):
        test_chapter_ends_with_remember_exercises_and_next(path)
    from dit_book.timings import add_box

    assert add_box(path) and not add_box(path)
    test_chapter_starts_with_its_running_box(path)


def test_the_bibliography_parses():
    """A bibliography entry without its closing brace (a merge left one) stops the whole book build."""
    pybtex = pytest.importorskip("pybtex.database", reason="pybtex comes with the book's extra (jupyter-book)")
    entries = pybtex.parse_file(str(BOOK_DIR / "references.bib"), bib_format="bibtex").entries
    keys = set(re.findall(r"^@\w+\{([^,\s]+),", (BOOK_DIR / "references.bib").read_text(), re.M))
    assert set(entries) == keys


# ------------------------------------------------------------------------------------------------ words and sizes
#: Words about how the project was made, not about what it does: a numbered session or round ("session 22",
#: "sessions 8-22", "round 3") and "until recently". Histories of experiments go into one record per study in
#: benchmarks/results (question, machine, date, command, figures, conclusion), named by date.
MAKING = re.compile(r"(?<![-\w])(?:sessions?|rounds?)[ -]\d+|\buntil recently\b", re.I)
README_MAX_LINES = 150
PROFILE_MAX_LINES = 60


def _user_facing_files() -> list[Path]:
    files = [REPO_ROOT / "README.md", *BOOK_DIR.glob("*.md"), *NOTEBOOKS]
    files += [p for p in (REPO_ROOT / "dit_core").rglob("*") if p.suffix in (".py", ".yaml")]
    files += [p for p in (REPO_ROOT / "dit_book").rglob("*") if p.suffix == ".py"]
    files += [p for p in (REPO_ROOT / "benchmarks").rglob("*") if p.suffix in (".py", ".sh", ".md", ".json")]
    return sorted(p for p in files if p.is_file() and "__pycache__" not in p.parts)


def _making_hits(path: Path) -> list[str]:
    if path.suffix == ".ipynb":
        lines = [line for c in _read(path).cells for line in c.source.splitlines()]
    else:
        lines = path.read_text(errors="replace").splitlines()
    rel = path.relative_to(REPO_ROOT).as_posix()
    return [f"{rel}:{i}: {m.group(0)!r} in {line.strip()[:100]!r}" for i, line in enumerate(lines, 1)
            for m in [MAKING.search(line)] if m]


def test_no_word_of_how_the_project_was_made():
    hits = [hit for path in _user_facing_files() for hit in _making_hits(path)]
    assert not hits, (
        "words about how the project was made (say what is, quote the current result and name its record in "
        "benchmarks/results; the history goes into that record, dated):\n" + "\n".join(hits))


def test_the_making_pattern():
    for said in ("Session 22 measured", "sessions 8-22", "the session-17 model", "round 3 of it", "until recently"):
        assert MAKING.search(said), said
    for fine in ("--rounds 3", "median of 5 alternating rounds", "round(x, 2)", "rounded to 3 digits",
                 "a session with the GPU", "2026-12-06, a 2-core Xeon"):
        assert not MAKING.search(fine), fine


def test_the_readme_is_short():
    lines = (REPO_ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines; keep it at most {README_MAX_LINES} (what it is, quick start, what you "
        "get, the GPU quick start, the layout, how to write a chapter): details go into the book and the records")


@pytest.mark.parametrize("profile", sorted((REPO_ROOT / "dit_core" / "configs").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_profile_reads_as_settings(profile):
    lines = profile.read_text().splitlines()
    assert len(lines) <= PROFILE_MAX_LINES, (
        f"{profile.name} has {len(lines)} lines; keep a profile at most {PROFILE_MAX_LINES}: its settings, one short "
        "comment per non-obvious one, and the name of the record in benchmarks/results that holds the figures")


CHAPTER_MAX_WORDS = 3500


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_chapter_is_sized_for_reading(notebook):
    """At most 3,500 words of prose (the markdown cells' words); experiment histories go into records."""
    words = sum(len(c.source.split()) for c in _read(notebook).cells if c.cell_type == "markdown")
    assert words <= CHAPTER_MAX_WORDS, (
        f"{notebook.name} has {words} words of prose; keep a chapter at most {CHAPTER_MAX_WORDS}: split it by "
        "concept, or move what is a study's history into its record in benchmarks/results")


def test_the_library_never_imports_the_books_helpers():
    """``dit_core`` trains, samples and measures without the book: the book's helpers (``dit_book``) import the
    library, never the other way round."""
    uses = [f"{p.relative_to(REPO_ROOT)}:{n}" for p in sorted((REPO_ROOT / "dit_core").rglob("*.py"))
            for n, line in enumerate(p.read_text().splitlines(), 1)
            if re.match(r"\s*(from|import)\s+dit_book\b", line)]
    assert not uses, f"dit_core imports dit_book at {uses}; move the code the library needs into dit_core"


# ------------------------------------------------------------------------------------------------ the first cells
#: A chapter's setup (its first code cell after ``parameters``) holds at most this many lines besides imports:
#: the track, smoke sizes, stand-ins and download routes live in ``dit_book.setup``, out of the reader's way.
SETUP_MAX_LINES = 12


def setup_lines(source: str) -> int:
    """Lines of a cell besides its imports: blank lines, lines that hold only a comment and every line of an import
    statement (continuation lines included) are not counted; every other physical line is, however short."""
    imports = set()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            imports.update(range(node.lineno, node.end_lineno + 1))
    return sum(1 for i, line in enumerate(source.splitlines(), 1)
               if line.strip() and not line.strip().startswith("#") and i not in imports)


def _setup_cell(nb):
    at = next(i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", []))
    return next((c for c in nb.cells[at + 1:] if c.cell_type == "code"), None)


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_the_setup_cell_is_short(notebook):
    cell = _setup_cell(_read(notebook))
    n = setup_lines(cell.source) if cell is not None else 0
    assert n <= SETUP_MAX_LINES, (
        f"{notebook.name}: the first code cell after `parameters` has {n} lines besides imports; keep it at most "
        f"{SETUP_MAX_LINES}: put the track choice, smoke sizes, stand-ins and download routes in one function of "
        "dit_book/setup.py that returns what the chapter uses")


def test_setup_lines_counts_code_not_imports_or_comments():
    source = ("import os\nfrom dit_core.data import (a,\n    b)\n\n# a comment\nx = 1  # counted\n"
              "print(x,\n      os.sep)\n")
    assert setup_lines(source) == 3


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_gpu_track_knobs_come_after_the_readers(notebook):
    """A parameters cell with ``TRACK`` lists the reader's knobs first, then one comment line ``# GPU track`` with
    ``TRACK`` and the GPU track's knobs below it."""
    cell = next(c for c in _read(notebook).cells if "parameters" in c.metadata.get("tags", []))
    lines = cell.source.splitlines()
    if not any(re.match(r"TRACK\s*=", line) for line in lines):
        return
    marks = [i for i, line in enumerate(lines) if line.strip() == "# GPU track"]
    assert len(marks) == 1, f"{notebook.name}: the parameters cell needs one line `# GPU track` (found {len(marks)})"
    before = [line for line in lines[:marks[0]] if re.match(r"(TRACK\s*=|\w+\s*=.*#\s*GPU track)", line)]
    assert not before, f"{notebook.name}: GPU-track knobs above the `# GPU track` line: {before}"


GOALS = re.compile(r"\A\*\*After this chapter you can\*\*\n\n(?P<bullets>(?:- .+\n(?:  .+\n)*)+)\n"
                   r"\*\*It assumes\*\* [^\n]+(?:\n[^\n]+)*\Z")


@pytest.mark.parametrize("notebook", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_chapter_says_what_the_reader_can_do_after_it(notebook):
    """Right after the running box, a markdown cell ``goals``: "**After this chapter you can**", two to four
    bullets, and "**It assumes** ..." in one sentence."""
    cells = _read(notebook).cells
    goals = [i for i, c in enumerate(cells) if c.get("id") == "goals"]
    assert goals == [2] and cells[2].cell_type == "markdown", (
        f"{notebook.name}: needs a markdown cell with id `goals` right after the running box (found at {goals})")
    m = GOALS.match(cells[2].source.strip() + "")
    assert m, (f"{notebook.name}: the `goals` cell must read '**After this chapter you can**', a blank line, "
               "2 to 4 bullets ('- ...'), a blank line, and '**It assumes** ...' (one sentence)")
    bullets = re.findall(r"^- ", m.group("bullets"), re.M)
    assert 2 <= len(bullets) <= 4, f"{notebook.name}: the `goals` cell has {len(bullets)} bullets; keep 2 to 4"


def test_the_goals_format():
    good = "**After this chapter you can**\n\n- one;\n- two,\n  on two lines.\n\n**It assumes** chapter 1,\nwrapped."
    assert GOALS.match(good)
    for bad in (good.replace("**It assumes** chapter 1,\nwrapped.", ""), good.replace("you can**", "you will**"),
                good.replace("- one;\n", "one;\n"), good + "\n\nMore text."):
        assert not GOALS.match(bad), bad

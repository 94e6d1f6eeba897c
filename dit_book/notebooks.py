"""What a chapter notebook needs besides the library: smoke mode, and notebooks committed without outputs.

Each chapter's ``parameters`` cell defines ``SMOKE = False`` plus its cost knobs; the smoke tests
(tests/test_notebooks.py) inject ``SMOKE = True`` with papermill, and :func:`smoke_mode` lets a reader or a quick
book build ask for the same tiny settings through the ``DIT_SMOKE`` environment variable.

Command line: ``python -m dit_book strip-outputs book/*.ipynb`` clears outputs before a commit;
``python -m dit_book add-box book/NN.ipynb`` adds a chapter's "Running this chapter" box, and
``python -m dit_book timings record|intro|show`` keeps the chapters' run times (:mod:`.timings`,
:mod:`.intro_tables`).
"""

from __future__ import annotations

import os
from pathlib import Path

SMOKE_ENV = "DIT_SMOKE"
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}


def smoke_mode(default: bool = False) -> bool:
    """Whether a notebook should pick tiny settings (a few steps, a tiny model).

    Reads the ``DIT_SMOKE`` environment variable ("1"/"true"/"yes"/"on" or "0"/"false"/"no"/"off");
    returns ``default`` when it is unset. A chapter combines it with its parameter:
    ``SMOKE = SMOKE or smoke_mode()``.
    """
    value = os.environ.get(SMOKE_ENV)
    if value is None:
        return bool(default)
    value = value.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(
        f"{SMOKE_ENV}={os.environ[SMOKE_ENV]!r} is not a yes/no value; set it to 1 (tiny settings) or 0 (full)"
    )


def strip_outputs(path) -> bool:
    """Clear outputs, execution counts and saved widget state of one notebook in place.

    Returns True when the file changed. Notebooks are committed without outputs (tests/test_hygiene.py).
    """
    import nbformat

    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    before = nbformat.writes(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
        for key in ("execution", "papermill", "collapsed", "scrolled"):
            cell.metadata.pop(key, None)
    for key in ("widgets", "papermill"):
        nb.metadata.pop(key, None)
    if nbformat.writes(nb) == before:
        return False
    nbformat.write(nb, path)
    return True


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m dit_book", description="Keep the chapter notebooks clean.")
    sub = parser.add_subparsers(dest="command", required=True)
    strip = sub.add_parser("strip-outputs", help="clear outputs of notebooks in place (before a commit)")
    strip.add_argument("notebooks", nargs="+", type=Path)
    box = sub.add_parser("add-box", help="insert the 'Running this chapter' box after a chapter's title")
    box.add_argument("notebooks", nargs="+", type=Path)
    sub.add_parser("timings", help="chapter run times (record a build's, rewrite the intro's table): "
                                   "python -m dit_book timings --help", add_help=False)
    args, rest = parser.parse_known_args(argv)
    if args.command == "timings":
        from .intro_tables import main as timings_main

        return timings_main(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    for nb in args.notebooks:
        if not nb.is_file():
            parser.error(f"{nb}: no such notebook")
        if args.command == "add-box":
            from .timings import add_box

            print(f"{nb}: {'box added' if add_box(nb) else 'already has its box'}")
        else:
            print(f"{nb}: {'stripped' if strip_outputs(nb) else 'already clean'}")
    return 0

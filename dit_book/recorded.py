"""A recorded run's result, shown where a chapter at its defaults does not train the run itself.

Chapter 05b does not train the ``small-images`` profile when the book is built (its 9.5 minutes of training would
double the build), so on a CPU build it shows the run of the profile's record instead: its sample grid, committed
as ``book/figures/<name>.png``, and beside it ``book/figures/<name>.json`` with what the record says of that run
(machine, date, commands, steps, the judge's accuracy). The box says in its title that this is the record's result,
not a run of this build. The figures are the record's own (``benchmarks/results/<record>``, the section named in the
JSON); tests/test_book_setup.py checks that the record still says them.

Example::

    from dit_book.recorded import recorded_run
    recorded_run("small-images-recipe-samples")    # the grid and its facts, as HTML in a notebook
"""

from __future__ import annotations

import base64
import html
import json
import re
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
FIGURES = REPO_ROOT / "book" / "figures"


def _find(name: str, suffix: str) -> Path:
    """``book/figures/<name><suffix>`` of the repository, or ``figures/`` beside a copy of the book (the working
    directory is book/ when a chapter runs)."""
    for folder in (FIGURES, Path.cwd() / "figures"):
        if (folder / f"{name}{suffix}").is_file():
            return folder / f"{name}{suffix}"
    raise FileNotFoundError(f"no recorded run {name!r}: {FIGURES / (name + suffix)} is missing; it comes with the "
                            "repository (book/figures/), next to the record it belongs to")


def percent(share: float) -> str:
    """``0.933`` -> ``"93.3 %"``, as the records write shares."""
    return f"{100 * share:.1f} %"


class RecordedRun:
    """The grid of a recorded run and its facts: HTML in Jupyter and in the built book, text elsewhere."""

    def __init__(self, name: str):
        self.name = name
        self.facts = json.loads(_find(name, ".json").read_text())
        self.image = _find(name, ".png")

    def lines(self) -> list[tuple[str, str]]:
        """``(label, sentence)`` pairs, plain text with ``code`` in backticks."""
        f = self.facts
        judge = f["judge"]
        per_class = ", ".join(f"{k} {100 * v:.0f} %" for k, v in judge["per_class"].items())
        return [
            ("From the record", f"`benchmarks/results/{f['record']}`, section {f['section']}: a run of the record, "
                                "not of this build."),
            ("Machine", f"{f['machine']}; {f['date']}."),
            ("Commands", "; ".join(f"`{c}`" for c in f["commands"]) + "."),
            ("Training", f"{f['steps']:,} steps of `{f['profile']}` (seed {f['seed']}) in {f['train_seconds']:,.0f} s "
                         f"({f['note']})."),
            ("The judge", f"{percent(judge['right'])} of {judge['samples']} samples show the "
                          f"{judge.get('asked', 'shape')} asked for ({per_class}"
                          + (f"; one clean piece: {percent(judge['clean'])}" if "clean" in judge else "")
                          + (f"; drawn mirrored: {judge['mirrored']}" if "mirrored" in judge else "")
                          + (f"; the judge's ceiling: {percent(judge['ceiling'])}" if "ceiling" in judge else "")
                          + f"; chance {percent(judge['chance'])})."),
            ("The grid", f"{f['grid']}."),
        ]

    def png(self) -> bytes:
        return self.image.read_bytes()

    def __repr__(self) -> str:
        return (f"Recorded result ({self.image.name})\n"
                + "\n".join(f"  {k}: {v}" for k, v in self.lines()))

    def _repr_html_(self) -> str:
        def inline(text: str) -> str:
            return re.sub(r"`(.+?)`", r"<code>\1</code>", html.escape(text, quote=False))

        data = base64.b64encode(self.png()).decode()
        items = "".join(f"<li><strong>{html.escape(k)}</strong>: {inline(v)}</li>" for k, v in self.lines())
        return (f'<div class="admonition note dit-recorded-run" data-name="{html.escape(self.name)}">'
                f'<p class="admonition-title">The record\'s result, not a run of this build</p>'
                f'<p><img src="data:image/png;base64,{data}" alt="{html.escape(self.facts["grid"])}" '
                f'style="image-rendering: pixelated; max-width: 100%"></p><ul class="simple">{items}</ul></div>')


def recorded_run(name: str) -> RecordedRun:
    """The recorded run ``name`` (``book/figures/<name>.png`` and ``.json``)."""
    return RecordedRun(name)

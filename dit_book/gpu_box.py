"""What a GPU-track result cell shows when the book is built without a GPU.

A chapter's GPU-track cells (samples and FID of Imagenette models, DiT-XL/2 measured on the card) run only with
a CUDA GPU. On a CPU build they must not print a random-weights picture or a meaningless FID next to the real
results of the CPU track, nor leave a hole. They show :func:`gpu_only` instead: a box labelled **Runs on a GPU**
that says what the cell shows on the GPU track and what the last GPU run of the chapter recorded:

* a ``make book`` on a GPU machine (the chapter's ``gpu`` entry in ``book/_timings.json``): its time, date,
  commit and machine;
* a run of ``benchmarks/gpu_track.sh`` (``benchmarks/results/*-gpu-track.json``, dry runs left out): the chapter's
  time and peak GPU memory. That script runs the chapters on stand-ins for the downloads (random weights), so its
  records hold time and memory only, never pictures or FIDs;
* records of related GPU measurements that the cell names (``related=``, files in ``benchmarks/results/``);

and, when there is none, says that the cell is **not yet measured on a GPU**.

Example (the last lines of a GPU-track cell)::

    if track == "gpu":
        ...                                  # the real work, on the card
    else:
        display(gpu_only("07_sampling", "samples of your DiT-B/2 and of the official DiT-XL/2"))
"""

from __future__ import annotations

import html
import os
import re
from pathlib import Path

from .timings import RESULTS, format_seconds, gpu_track_records, load

_STEM = re.compile(r"^[0-9A-Za-z][\w-]*$")


class GpuOnly:
    """The "Runs on a GPU" box: HTML in Jupyter and in the built book, text elsewhere."""

    def __init__(self, stem: str, what: str, data: dict | None = None, results: str | os.PathLike = RESULTS,
                 related: tuple[str, ...] = ()):
        self.stem = stem
        self.what = what.strip()
        self.results = Path(results)
        data = load() if data is None else data
        self.book_entry = data.get("chapters", {}).get(stem, {}).get("gpu")
        self.track_rows = [(rec, rec["chapters"][stem]) for rec in gpu_track_records(self.results)
                           if isinstance(rec["chapters"].get(stem), dict)]
        self.related = tuple(related)

    @property
    def measured(self) -> bool:
        """True when a GPU run of this chapter is on record."""
        return bool(self.book_entry) or any(not row.get("error") for _, row in self.track_rows)

    def records(self) -> list[str]:
        """One sentence per GPU record of the chapter (plain text, ``code`` in backticks), newest kind first."""
        out = []
        e = self.book_entry
        if e:
            out.append(f"the chapter ran in {format_seconds(e['seconds'])} by {e.get('how', '`make book`')} on "
                       f"{e.get('date', '?')} (commit {e.get('commit', '?')}), {e.get('machine', '?')}.")
        for rec, row in self.track_rows:
            where = f"`benchmarks/results/{rec['file']}`"
            if row.get("error"):
                out.append(f"`benchmarks/gpu_track.sh` on an {rec.get('gpu', '?')} on {rec.get('date', '?')} stopped "
                           f"in this chapter ({row['error']}); {where}.")
                continue
            figures = []
            if row.get("wall_s") is not None:
                figures.append(f"ran in {format_seconds(float(row['wall_s']))}")
            if row.get("wall_at_defaults_s") is not None:
                figures.append(f"~{float(row['wall_at_defaults_s']) / 60:.0f} min at the chapter's defaults")
            if isinstance(row.get("peak_allocated_gib"), (int, float)):
                figures.append(f"peak {row['peak_allocated_gib']:.1f} GiB allocated")
            out.append(f"`benchmarks/gpu_track.sh` on an {rec.get('gpu', '?')} on {rec.get('date', '?')}: "
                       + (", ".join(figures) or "no figures") + f" ({where}; stand-ins of the downloads with random "
                       f"weights: time and memory only, no pictures or FID).")
        return out

    def lines(self) -> list[tuple[str, str]]:
        """``(label, sentence)`` pairs of the box."""
        records = self.records()
        rows = [("On the GPU track", self.what if self.what.endswith(".") else self.what + ".")]
        if records:
            rows += [("Last GPU run", r) for r in records]
        else:
            rows.append(("Last GPU run", "not yet measured on a GPU."))
        if self.related:
            rows.append(("Related GPU records", ", ".join(f"`benchmarks/results/{r}`" for r in self.related) + "."))
        rows.append(("Here", "this build has no CUDA GPU, so the cell did not run; `TRACK = \"gpu\"` in the "
                             "`parameters` cell runs it on a machine with one."))
        return rows

    def __repr__(self) -> str:
        return "Runs on a GPU\n" + "\n".join(f"  {k}: {v}" for k, v in self.lines())

    def _repr_html_(self) -> str:
        def inline(text: str) -> str:
            return re.sub(r"`(.+?)`", r"<code>\1</code>", html.escape(text, quote=False))

        items = "".join(f"<li><strong>{html.escape(k)}</strong>: {inline(v)}</li>" for k, v in self.lines())
        return (f'<div class="admonition attention dit-gpu-only" data-chapter="{html.escape(self.stem)}">'
                f'<p class="admonition-title">Runs on a GPU</p><ul class="simple">{items}</ul></div>')


def gpu_only(stem: str, what: str, *, related: tuple[str, ...] | list[str] = (), data: dict | None = None,
             results: str | os.PathLike = RESULTS) -> GpuOnly:
    """The box a GPU-track cell shows on a build without a GPU.

    ``stem``: the chapter (``"07_sampling"``); ``what``: what the cell shows on the GPU track, in a sentence;
    ``related``: file names in ``benchmarks/results/`` of GPU measurements behind the cell (they must exist);
    ``data`` and ``results``: the timings file's content and the records folder (the repository's by default).
    """
    if not isinstance(stem, str) or not _STEM.match(stem) or stem.endswith(".ipynb"):
        raise ValueError(f"gpu_only: stem must be a chapter's file name without folder or suffix, such as "
                         f"'07_sampling'; got {stem!r}")
    if not isinstance(what, str) or not what.strip():
        raise ValueError("gpu_only: say in `what` what the cell shows on the GPU track (a sentence), e.g. "
                         "'samples of the official DiT-XL/2 at guidance 4.0'")
    related = tuple(related)
    missing = [r for r in related if Path(results).is_dir() and not (Path(results) / r).is_file()]
    if missing:
        raise FileNotFoundError(f"gpu_only: no record {missing} in {results}; name files of benchmarks/results/")
    return GpuOnly(stem, what, data=data, results=results, related=related)

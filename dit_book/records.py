"""What each profile gives you, read from the study records in ``benchmarks/results/``.

Every study the project runs is one record there: a Markdown file (question, machine, date, command, the
figures, the conclusion) and, where the figures are quoted elsewhere, a JSON file with them. The README and the
introduction (``book/intro.md``) show one table of what each training profile gives: its hardware, its time or
speed, one current result, and the record behind it. That table is generated here from the JSON records, as the
chapter table's run times are generated from ``book/_timings.json`` (:mod:`dit_book.timings`), and a test
(``tests/test_records.py``) checks that both files hold exactly what :func:`render_file` writes.

* :func:`profile_rows` reads the records; a profile whose record is missing says "not measured yet".
* :func:`render_table` writes the Markdown table: with links to the records in the README, with the records'
  paths in the book (whose build does not include ``benchmarks/``).
* :func:`update` rewrites the table between the two markers of a file;
  ``python -m dit_book.records`` does it for README.md and book/intro.md.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS = REPO_ROOT / "benchmarks" / "results"
README = REPO_ROOT / "README.md"
INTRO = REPO_ROOT / "book" / "intro.md"
BEGIN = "<!-- profile table: generated from benchmarks/results by `python -m dit_book.records` -->"
END = "<!-- end of the profile table -->"

#: The records every README, chapter and profile may name (one per study).
RECORDS = ("small-images-recipe.md", "converging-faster.md", "cpu-vs-official.md", "gpu-ladder-h200.md",
           "planner-check-h200.md", "tutorial-claims.md", "digits-profile.md")

#: The table's rows, in order: every profile in dit_core/configs, with the hardware it is made for.
HARDWARE = {
    "digits": "any CPU; 2 cores, 4 GB of RAM",
    "small-images": "any CPU",
    "imagenette-b2": "the GPU track: one GPU with bf16, 12 GB and up",
    "imagenette-b2-fp16": "the GPU track on cards without bf16 (T4, V100)",
    "rtx3060-12gb": "RTX 3060, 12 GB",
    "rtx3090-24gb": "RTX 3090 / 4090, 24 GB",
    "a100-40gb": "A100, 40 GB",
    "a100-80gb": "A100, 80 GB",
    "h100-80gb": "H100, 80 GB",
}
#: The capped planner-check rows that stand for a profile's card (allocator cap in GiB).
CARD_CAPS = {"a100-40gb": 40.0, "a100-80gb": 80.0, "h100-80gb": 80.0}
NOT_MEASURED = "not measured yet"


@dataclass(frozen=True)
class ProfileRow:
    profile: str
    hardware: str
    time: str
    result: str
    record: str | None  # a record's file name in benchmarks/results, or None


def _load(name: str, results: Path) -> dict | None:
    path = results / name
    if not path.is_file():
        return None
    return json.loads(path.read_text())


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def _span(values: list[float], fmt) -> str:
    lo, hi = min(values), max(values)
    return fmt(lo) if fmt(lo) == fmt(hi) else f"{fmt(lo)}-{fmt(hi)}"


def _digits(results: Path) -> ProfileRow:
    rec = _load("digits-profile.json", results)
    if rec is None:
        return ProfileRow("digits", HARDWARE["digits"], "-", NOT_MEASURED, None)
    runs = rec["runs"]
    minutes = _span([r["train_seconds"] / 60 for r in runs], lambda m: f"{m:.1f}")
    right = _span([r["class_accuracy"] for r in runs], lambda x: f"{100 * x:.1f}")
    return ProfileRow(
        "digits", HARDWARE["digits"],
        f"{runs[0]['steps']:,} steps in {minutes} min on {rec['hardware']}",
        f"{right} % of samples are the digit asked for ({len(runs)} runs, {runs[0]['samples']} samples each)",
        "digits-profile.md")


def _small_images(results: Path) -> ProfileRow:
    rec = _load("small-images-recipe.json", results)
    if rec is None:
        return ProfileRow("small-images", HARDWARE["small-images"], "-", NOT_MEASURED, None)
    runs = rec["runs"]
    steps = _span([r["steps"] for r in runs], lambda s: f"{s:,}")
    right = _span([r["right_150"] for r in runs], lambda x: f"{100 * x:.1f}")
    return ProfileRow(
        "small-images", HARDWARE["small-images"],
        f"a 9.5-minute budget: {steps} steps on {rec['hardware']}",
        f"{right} % of generated shapes are the shape asked for ({len(runs)} runs, 150 samples each; chance 33 %)",
        "small-images-recipe.md")


def _gpu_track(profile: str, results: Path) -> ProfileRow:
    from .timings import gpu_track_records

    for rec in gpu_track_records(results):
        row = rec["chapters"].get("05b_your_data") or rec["chapters"].get("05_training")
        if row and not row.get("error") and row.get("wall_at_defaults_s"):
            return ProfileRow(profile, HARDWARE[profile], f"one chapter run: {row['wall_at_defaults_s'] / 60:.0f} min "
                                                          f"on an {rec['gpu']}", "DiT-B/2 trained on Imagenette",
                              rec["file"])
    return ProfileRow(profile, HARDWARE[profile], "15 minutes a chapter run (`TRAIN_MINUTES`)", NOT_MEASURED, None)


def _trainer_profile(profile: str, results: Path) -> ProfileRow | None:
    rec = _load("nvidia-h200-profiles.json", results)
    for row in (rec or {}).get("rows", []):
        if row["profile"] == profile and row["status"] == "ok" and row.get("steady_images_per_s"):
            return ProfileRow(profile, HARDWARE[profile],
                              f"DiT-XL/2: {row['steady_images_per_s']:.0f} img/s on an {rec['gpu']}",
                              f"`dit-train` peaks at {row['peak_memory_gb']:.1f} GiB with the memory capped at "
                              f"{row['limit_gib']:g} GiB", "gpu-ladder-h200.md")
    return None


def _planner_choice(profile: str, results: Path) -> ProfileRow | None:
    rec = _load("nvidia-h200-planner-check.json", results)
    for row in (rec or {}).get("rows", []):
        if row.get("memory_limit_gib") == CARD_CAPS.get(profile) and row["status"] == "ok" and row.get("rung") == "planned":
            return ProfileRow(profile, HARDWARE[profile],
                              f"DiT-XL/2: {row['images_per_s']:.0f} img/s on an {rec['gpu']}",
                              f"its micro-batch and checkpointing peak at {row['peak_bytes'] / 2**30:.1f} GiB with the "
                              f"memory capped at {row['memory_limit_gib']:g} GiB", "planner-check-h200.md")
    return None


def profile_rows(results: str | os.PathLike = RESULTS) -> list[ProfileRow]:
    """One row per profile of :data:`HARDWARE`, from the records in ``results``."""
    results = Path(results)
    rows = []
    for profile in HARDWARE:
        if profile == "digits":
            row = _digits(results)
        elif profile == "small-images":
            row = _small_images(results)
        elif profile.startswith("imagenette"):
            row = _gpu_track(profile, results)
        else:
            row = _trainer_profile(profile, results) or _planner_choice(profile, results)
        rows.append(row or ProfileRow(profile, HARDWARE[profile], "-", NOT_MEASURED, None))
    return rows


def render_table(rows: list[ProfileRow], link_prefix: str | None = "benchmarks/results/") -> str:
    """The Markdown table. ``link_prefix``: records as links under it (the README), or None: as paths (the book)."""
    lines = ["| profile | hardware | time | result | record |", "|---|---|---|---|---|"]
    for r in rows:
        if r.record is None:
            record = "-"
        elif link_prefix is None:
            record = f"`{r.record}`"
        else:
            record = f"[{r.record}]({link_prefix}{r.record})"
        lines.append(f"| `{r.profile}` | {r.hardware} | {r.time} | {r.result} | {record} |")
    return "\n".join(lines)


def render_file(text: str, link_prefix: str | None, results: str | os.PathLike = RESULTS,
                name: str = "the file") -> str:
    """``text`` with the table between :data:`BEGIN` and :data:`END` rewritten from the records."""
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise ValueError(f"{name}: needs the profile table's markers once each, in this order:\n{BEGIN}\n{END}")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n\n{render_table(profile_rows(results), link_prefix)}\n\n{END}{tail}"


#: The files that show the table, and how each names a record.
TARGETS = {README: "benchmarks/results/", INTRO: None}


def update(path: str | os.PathLike, link_prefix: str | None, results: str | os.PathLike = RESULTS) -> bool:
    """Rewrite the profile table of ``path`` from the records; True if the file changed."""
    path = Path(path)
    before = path.read_text()
    after = render_file(before, link_prefix, results, name=path.name)
    if after != before:
        path.write_text(after)
    return after != before


def main(argv=None) -> int:
    import argparse

    argparse.ArgumentParser(prog="python -m dit_book.records",
                            description="Rewrite the profile table of README.md and book/intro.md from the "
                                        "records in benchmarks/results.").parse_args(argv)
    for path, prefix in TARGETS.items():
        print(f"records: {path.relative_to(REPO_ROOT)} {'updated' if update(path, prefix) else 'already up to date'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

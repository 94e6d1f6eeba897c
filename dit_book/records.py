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
           "planner-check-h200.md", "tutorial-claims.md", "digits-profile.md", "browser-sampler.md",
           "paper-findings.md", "own-images.md")

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
#: The capped planner-check rows that stand for a profile's card (allocator cap in GiB): these profiles are the
#: planner's choice for that cap, so the row measured under it is the profile's own setup.
CARD_CAPS = {"rtx3090-24gb": 24.0, "a100-40gb": 40.0, "a100-80gb": 80.0, "h100-80gb": 80.0}
#: The card each GPU profile is named for, as dit_core.measure.estimates knows it (for the estimate beside the
#: H200's measurement).
PROFILE_CARD = {"rtx3060-12gb": "RTX 3060", "rtx3090-24gb": "RTX 3090", "a100-40gb": "A100 40GB",
                "a100-80gb": "A100 80GB", "h100-80gb": "H100 SXM"}
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
        f"{right} % the digit asked for, on that CPU ({len(runs)} runs x {runs[0]['samples']} samples)",
        "digits-profile.md")


def _small_images(results: Path) -> ProfileRow:
    rec = _load("small-images-recipe.json", results)
    if rec is None:
        return ProfileRow("small-images", HARDWARE["small-images"], "-", NOT_MEASURED, None)
    def measured(runs: list[dict], hardware: str) -> tuple[str, str]:
        steps = _span([r["steps"] for r in runs], lambda s: f"{s:,}")
        right = _span([r["right_150"] for r in runs], lambda x: f"{100 * x:.1f}")
        return f"{steps} steps on {hardware}", f"{right} % on {hardware.split(' with')[0]}"

    time, result = measured(rec["runs"], rec["hardware"])
    for other in rec.get("other_machines", []):
        t2, r2 = measured(other["runs"], other["hardware"])
        time, result = f"{time}; {t2}", f"{result}; {r2}"
    return ProfileRow(
        "small-images", HARDWARE["small-images"], f"a 9.5-minute budget: {time}",
        f"the shape asked for: {result} (3 runs x 150 samples a CPU; chance 33 %)",
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
            from dit_core.measure.estimates import mfu_of

            ips, cap = row["steady_images_per_s"], row["limit_gib"]
            return ProfileRow(profile, HARDWARE[profile],
                              f"{ips:.0f} img/s on an {_short(rec['gpu'])} capped at {cap:g} GiB"
                              f"{_card_estimate(profile, mfu_of(ips, 989.0))}",
                              f"{row['peak_memory_gb']:.1f} GiB peak on that {_short(rec['gpu'])} (a `dit-train` run)",
                              "gpu-ladder-h200.md")
    return None


def _short(gpu: str) -> str:
    """``"NVIDIA H200"`` -> ``"H200"``."""
    return gpu.removeprefix("NVIDIA ")


def _card_estimate(profile: str, mfu: float) -> str:
    """``; an A100 80GB: ~118 img/s (estimate)``: the named card's speed at the MFU the H200 measured."""
    from dit_core.measure import estimates

    name = PROFILE_CARD.get(profile)
    if name is None:
        return ""
    ips = estimates.training_estimate(name, mfu=mfu)["images_per_s"]
    return f" ({name}: ~{ips:.0f}, estimate)"


def _planner_choice(profile: str, results: Path) -> ProfileRow | None:
    rec = _load("nvidia-h200-planner-check.json", results)
    for row in (rec or {}).get("rows", []):
        if row.get("memory_limit_gib") == CARD_CAPS.get(profile) and row["status"] == "ok" and row.get("rung") == "planned":
            from dit_core.measure.estimates import mfu_of

            cap, ips = row["memory_limit_gib"], row["images_per_s"]
            blocks = row.get("checkpointed_blocks") or 0
            setup = f"{row['batch_size']} x {256 // row['batch_size']}, " + (
                f"{blocks} blocks checkpointed" if blocks else "no checkpointing")
            return ProfileRow(profile, HARDWARE[profile],
                              f"{ips:.0f} img/s on an {_short(rec['gpu'])} capped at {cap:g} GiB"
                              f"{_card_estimate(profile, mfu_of(ips, 989.0))}",
                              f"{row['peak_bytes'] / 2**30:.1f} GiB peak on that {_short(rec['gpu'])}: a `dit-bench` "
                              f"step of its {setup} (not `dit-train`)",
                              "planner-check-h200.md")
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
            row = _planner_choice(profile, results) or _trainer_profile(profile, results)
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


# ----------------------------------------------------------------------------------------------------------
# Figures quoted in prose: each beside the record it comes from
# ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Quote:
    """A figure a page states in its prose, and the same figure as its record states it.

    ``says`` must occur in the page's prose and ``record_says`` in the record (both compared with whitespace and
    Markdown emphasis folded, so line breaks do not matter). When a record is rerun and its figure changes, the
    record's sentence changes and the quote fails until the page says the new figure too.
    """

    page: str  # a path under the repository root: a chapter notebook, README.md, book/intro.md
    says: str
    record: str  # a file of benchmarks/results
    record_says: str


#: The headline figures of the README and the chapters that no generated table carries. A page that quotes a
#: record's figure adds a line here; tests/test_records.py checks every line against both files.
QUOTES = (
    Quote("README.md", "at 3.2x the step of the official `train.py`", "gpu-ladder-h200.md",
          "every trick but checkpointing makes the DiT-XL/2 step 3.2x the official `train.py` step"),
    Quote("book/05_training.ipynb", "with three training seeds, 53, 75 and 78 % of the samples showed the requested "
          "shape with Muon against 41, 53 and 62 % with AdamW", "small-images-recipe.md",
          "53.3 / 75.3 / 78.0 % against 41.3 / 52.7 / 62.0 % of 150"),
    Quote("book/05_training.ipynb", "AdamW 88.0 / 90.0 % of 150 / 300 against 90.7 / 89.3 %", "small-images-recipe.md",
          "AdamW instead of Muon | 88.0 / 90.0 %"),
    Quote("book/05_training.ipynb", "the `small-images` step then takes 189 ms instead of 232 ms", "small-images-recipe.md",
          "189 against 232 ms a step"),
    Quote("book/05b_your_data.ipynb", "96.8 % of the letters, 98.8 % of the textures and 86.0 % of the shapes in the "
          "class asked for (mean of three training seeds; the judges' ceilings 100, 99.2 and 99.8 %), against 67.5 %",
          "own-images.md", "the letters 96.8 %, the textures 98.8 % and the shapes 86.0 % (mean of three training "
          "seeds; ceilings 100, 99.2 and 99.8 %); the old profile 67.5 % on the letters"),
    Quote("book/05b_your_data.ipynb", "drawn pointing the wrong way in 44.7 % of their samples", "own-images.md",
          "the arrows drawn mirrored in 44.7 % of their samples"),
    Quote("dit_core/configs/small-images.yaml", "the fewest steps measured to pass 90 % (92.7 % at 2,854",
          "small-images-recipe.md", "| the same | 2 | 2,854 | 193 ms | 92.7 % (91.3 %)"),
    Quote("README.md", "bit for bit on the CPU and in a bf16 run killed at step 50 on an H200", "gpu-ladder-h200.md",
          "with SIGKILL at step 50 and resumed: largest weight difference to the unbroken run 0.0 (bit-exact)"),
    Quote("book/08_troubleshooting.ipynb", "killed a bf16 run at step 50 and its resumed run also ended bit for bit "
          "equal to the unbroken one", "gpu-ladder-h200.md",
          "with SIGKILL at step 50 and resumed: largest weight difference to the unbroken run 0.0 (bit-exact)"),
    Quote("book/06_memory_and_speed.ipynb", "within -1.2 % to +1.2 % of `max_memory_allocated`, except one rung (all "
          "tricks but checkpointing) where it predicted 14 % more than was used", "planner-check-h200.md",
          "within -1.2 % to +1.2 % of the measured peak whenever latents are pre-extracted or TF32 is on (one rung "
          "+14 %, on the safe side)"),
    Quote("book/06_memory_and_speed.ipynb", "peaked 12-30 GiB above the prediction, which was 25-67 % below the peak",
          "planner-check-h200.md", "predictions 12-67 % below the measured peak"),
    Quote("book/06_memory_and_speed.ipynb", "the planner's choices for 24, 40 and 80 GiB ran under those caps at 212, "
          "292 and 375 img/s", "gpu-ladder-h200.md", "the planner's choices ran at 212, 292 and 375 img/s"),
    Quote("book/07_sampling.ipynb", "measured 99.0 % of 200 samples class-correct at guidance 2 against 84.0 % without "
          "guidance", "digits-profile.md", "the profile's guidance): 99.0 % (two classes at 95 %, the others 100 %); "
          "without guidance (`--cfg-scale 1`, the command's default): 84.0 %"),
    Quote("book/07b_converging_faster.ipynb", "90.0 % and 90.7 % of 150 samples in the requested class against 93.3 % "
          "and 95.3 % for the velocity", "small-images-recipe.md",
          "90.0 / 87.7 % and 90.7 / 88.3 % (seeds 0 / 1) against 93.3 / 90.3 % and 95.3 / 89.7 %"),
    Quote("book/07c_paper_findings.ipynb", "FD 1.30 and 76.5 % of samples in their class at 800 steps",
          "paper-findings.md", "1.30 and 76.5 % for cross-attention with its context normalised"),
    Quote("book/07c_paper_findings.ipynb", "against 3.90 and 46.5 % unnormalised on the same machine",
          "paper-findings.md", "FD 3.90 against 4.48, accuracy 46.5 against 43.0 %"),
    Quote("book/07c_paper_findings.ipynb", "84 % of samples in their class at 800 steps, against 78 % for in-context "
          "and 60.5 % for adaLN", "paper-findings.md", "84 % [84, 88.5] of samples in their class, against 1.23 and "
          "78 % for in-context, 1.32 and 60.5 % for adaLN"),
    Quote("book/07c_paper_findings.ipynb", "Its final FD, 0.59, lies below the real floor (0.67)", "paper-findings.md",
          "Its final FD, 0.59, lies below the real floor (0.67)"),
    Quote("book/07c_paper_findings.ipynb", "adaLN-Zero leads by the median accuracy from step 600", "paper-findings.md",
          "the highest median accuracy from step 600 on"),
    Quote("book/07c_paper_findings.ipynb", "(at step 300, 35 % against 14 %)", "paper-findings.md",
          "(at step 300 35.0 % [26.0, 42.0] against adaLN-Zero's 14.0 % [14.0, 20.0])"),
    Quote("book/07c_paper_findings.ipynb", "d2w64/2 draws the right digit 12.5 % of the time", "paper-findings.md",
          "(d2w64/2 at 12.5 % accuracy)"),
    Quote("book/07c_paper_findings.ipynb", "d2w64/2 7.07 against d3w96/4 1.45 at 1.1x the Gflops", "paper-findings.md",
          "| d2w64/2 | 16 | 1.73 | 0.18 M | 199 | 7.07 [6.93, 7.18]"),
    Quote("book/07c_paper_findings.ipynb", "$r = -0.62$ between log Gflops and log FD at the last step",
          "paper-findings.md", "(r = -0.62 at 600 steps, and positive before step 300, against -0.94 computed from "
          "Table 4)"),
    Quote("book/07c_paper_findings.ipynb", "(d4w128/4, 352 Gflop, against 2,288 for d3w96/1)", "paper-findings.md",
          "reaches FD 1.0 for the least training compute (352 Gflop against 2,288 for d3w96/1)"),
    Quote("book/07c_paper_findings.ipynb", "three seeds, 101 minutes of CPU in all", "paper-findings.md",
          "6,075 s (101 minutes) in all"),
)


def prose(path: str | os.PathLike) -> str:
    """The text a reader reads: a notebook's markdown cells (or a Markdown file), whitespace and ``**`` folded."""
    import re

    path = Path(path)
    if path.suffix == ".ipynb":
        cells = json.loads(path.read_text())["cells"]
        text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    else:
        text = path.read_text()
    return re.sub(r"\s+", " ", text.replace("**", ""))


def check_quotes(quotes=QUOTES, root: str | os.PathLike = REPO_ROOT, results: str | os.PathLike = RESULTS) -> list[str]:
    """The quotes whose page or record no longer says the figure (empty when all hold)."""
    wrong = []
    for q in quotes:
        page, record = prose(Path(root) / q.page), prose(Path(results) / q.record)
        if " ".join(q.says.split()) not in page:
            wrong.append(f"{q.page} no longer says {q.says!r} (record {q.record})")
        if " ".join(q.record_says.split()) not in record:
            wrong.append(f"{q.record} no longer says {q.record_says!r}, which {q.page} quotes as {q.says!r}")
    return wrong


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

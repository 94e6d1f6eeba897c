"""How long each chapter takes: measured by ``make book``, kept in ``book/_timings.json``, shown in the
"Running this chapter" box at the top of every chapter and in the introduction's chapter table.

* **CPU time, measured.** ``make book`` executes every chapter (Jupyter Book 1.x through myst-nb, which keeps each
  notebook's execution time in the Sphinx environment, ``_build/.doctrees/environment.pickle``: the data behind
  the "Execution times of this build" table at the end of the introduction). Right after the build,
  ``python -m dit_book timings record --since T`` reads the times of the notebooks executed after ``T`` (the
  build's start) and writes them into ``book/_timings.json``, each with its date, commit and machine, then rewrites
  the time columns of the introduction's chapter table from that file (:func:`render_intro`; the command and the
  route table beside it are :mod:`dit_book.intro_tables`). Commit both files: the next build's boxes and table
  show them. A build on a machine with a CUDA GPU records GPU times instead.
* **GPU time, measured or estimated.** In this order: a ``make book`` on a GPU machine (the file's ``gpu``
  entries); a record of ``benchmarks/gpu_track.sh`` (``benchmarks/results/*-gpu-track.json``: the GPU track at
  full size with stand-ins for the downloads, its training and FID sampling extrapolated to the chapter's
  defaults); otherwise an **estimate** (:func:`gpu_time`): :func:`gpu_estimates` on a 24 GB card (an RTX 4090:
  the H200's measured speeds scaled by the card's bf16 peak, :func:`dit_book.track.costs`, and for chapter 7c
  :func:`dit_book.findings_gpu.plan`) plus a minute of start-up for the GPU-track chapters, the measured CPU time
  as an upper bound for chapters without GPU work.
* :func:`chapter_box` renders the box (a code cell tagged ``remove-input`` right after each chapter's title:
  ``python -m dit_book add-box book/NN_name.ipynb`` inserts it); the tests check that the boxes and the
  introduction say what the file says (tests/test_intro.py, tests/test_hygiene.py).
"""

from __future__ import annotations

import datetime as _dt
import html
import json
import os
import pickle
import platform
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
TIMINGS = REPO_ROOT / "book" / "_timings.json"
INTRO = REPO_ROOT / "book" / "intro.md"
RESULTS = REPO_ROOT / "benchmarks" / "results"
BUILD_ENV = Path(".doctrees") / "environment.pickle"  # under the build folder (_build)

#: The card of the GPU estimates: the GPU track's 24 GB card.
ESTIMATE_CARD = "NVIDIA GeForce RTX 4090"
#: Added to the estimated GPU work of a GPU-track chapter: kernel start, imports, building models, the CPU-side
#: cells. An allowance, not a measurement.
START_UP_S = 60.0
#: Chapters with GPU work that :func:`gpu_estimates` does not cover: (seconds, what it is), estimates.
OTHER_GPU_WORK = {
    "06_memory_and_speed": (300.0, "DiT-XL/2 measured on the card, compilation included"),
}
#: What each chapter's GPU estimate comes from, where it is not :func:`dit_book.track.costs`.
ESTIMATED_BY = {"07c_paper_findings": "`dit_book.findings_gpu.plan`: its two studies sized together to fit one cell"}
#: What comes on top of a chapter's GPU time (downloads), or what most of it is. The chapter that trains on the
#: GPU track (the one :func:`dit_book.track.costs` gives the training budget) gets :func:`training_note`.
GPU_NOTES = {
    "01_data": "+ Imagenette, 342 MB",
    "02_latents": "+ the VAE, 335 MB",
    "06_memory_and_speed": "DiT-XL/2, compilation included",
    "07_sampling": "+ DiT-XL/2, 2.7 GB, and Inception, 91 MB",
}
DOWNLOADS_NOTE = "+ 3.5 GB of downloads"
_BOX_CALL = re.compile(r"""chapter_box\(\s*["']([\w-]+)["']\s*\)""")


# ------------------------------------------------------------------------------------------------ the file
def load(path: str | os.PathLike | None = None) -> dict:
    """The timings file (``book/_timings.json``; in a copy of the book without the repository, ``_timings.json``
    in the working directory, which is book/ when a chapter runs). An empty record when there is none."""
    candidates = [Path(path)] if path is not None else [TIMINGS, Path.cwd() / "_timings.json"]
    for candidate in candidates:
        if candidate.is_file():
            return json.loads(candidate.read_text())
    return {"chapters": {}}


def save(data: dict, path: str | os.PathLike = TIMINGS) -> None:
    from dit_core.atomic import atomic_write_text

    atomic_write_text(Path(path), json.dumps(data, indent=1, sort_keys=False) + "\n")


def build_times(build_dir: str | os.PathLike = "_build", since: float | None = None) -> dict[str, dict]:
    """``{stem: {"seconds", "executed_at"}}`` of the notebooks a Jupyter Book build executed (after ``since``, a
    Unix time), read from the Sphinx environment that myst-nb stores its execution data in."""
    env_path = Path(build_dir) / BUILD_ENV
    if not env_path.is_file():
        raise FileNotFoundError(f"{env_path}: no Sphinx environment; build the book first (`make book`)")
    with open(env_path, "rb") as f:
        env = pickle.load(f)  # noqa: S301 - the build's own file
    times = {}
    for docname, meta in getattr(env, "nb_metadata", {}).items():
        data = meta.get("exec_data") or {}
        if not data.get("succeeded") or data.get("runtime") is None or data.get("method") in (None, "off"):
            continue
        if since is not None and (data.get("mtime") or 0) < since:
            continue  # executed by an earlier build (Sphinx kept that page)
        times[Path(docname).name] = {"seconds": round(float(data["runtime"]), 1),
                                     "executed_at": float(data.get("mtime") or 0)}
    return times


def git_commit(repo: str | os.PathLike = REPO_ROOT) -> str:
    """The short commit of ``repo`` (``+dirty`` when the tree has changes), or ``unknown`` outside git."""
    try:
        out = subprocess.run(["git", "-C", str(repo), "describe", "--always", "--dirty=+dirty", "--abbrev=7"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"


def machine() -> dict:
    """The machine a build ran on: processor, cores, the thread setting, and its CUDA GPU if any."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = None
    try:
        import torch

        if torch.cuda.is_available():
            gpu = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "gpu": gpu}


def describe_machine(m: dict) -> str:
    if m.get("description"):
        return m["description"]
    threads = f", OMP_NUM_THREADS={m['omp_num_threads']}" if m.get("omp_num_threads") else ""
    gpu = f", {m['gpu']}" if m.get("gpu") else ", no GPU"
    return f"{m.get('cpu', '?')}, {m.get('cores', '?')} cores{threads}{gpu}"


def record(build_dir: str | os.PathLike = "_build", since: float | None = None,
           path: str | os.PathLike = TIMINGS, machine_info: dict | None = None, commit: str | None = None) -> dict:
    """Write the execution times of a build into the timings file (only the notebooks it executed; the others
    keep their entries). On a machine with a CUDA GPU the times go under ``gpu``, otherwise under ``cpu``.
    Returns ``{stem: seconds}`` of what was recorded."""
    times = build_times(build_dir, since)
    data = load(path) if Path(path).is_file() else {"chapters": {}}
    m = machine_info or machine()
    kind = "gpu" if m.get("gpu") else "cpu"
    commit = commit or git_commit()
    for stem, t in sorted(times.items()):
        date = _dt.datetime.fromtimestamp(t["executed_at"] or _dt.datetime.now().timestamp(), _dt.timezone.utc)
        data.setdefault("chapters", {}).setdefault(stem, {})[kind] = {
            "seconds": t["seconds"], "date": date.strftime("%Y-%m-%d"), "commit": commit,
            "machine": describe_machine(m), "how": "`make book`"}
    save(data, path)
    return {stem: t["seconds"] for stem, t in times.items()}


# ------------------------------------------------------------------------------------------------ formats
def format_seconds(seconds: float) -> str:
    """``4 s``, ``48 s``, ``1.8 min``, ``12.0 min``."""
    return f"{seconds:.0f} s" if seconds < 59.5 else f"{seconds / 60:.1f} min"


def format_gpu(seconds: float, estimate: bool) -> str:
    """``< 1 min``, ``~1 min``, ``~16 min`` for estimates; measured times as :func:`format_seconds`."""
    if not estimate:
        return format_seconds(seconds)
    if seconds <= 60:
        return "< 1 min"
    return f"~{max(1, round(seconds / 60)):.0f} min"


# ------------------------------------------------------------------------------------------------ the times
def cpu_entry(stem: str, data: dict | None = None) -> dict | None:
    """The measured CPU entry of a chapter (``seconds``, ``date``, ``commit``, ``machine``, ...), or None."""
    data = load() if data is None else data
    return data.get("chapters", {}).get(stem, {}).get("cpu")


@dataclass(frozen=True)
class GpuTime:
    seconds: float
    measured: bool
    source: str  # where the figure comes from, in a sentence
    note: str = ""  # downloads on top, or what most of the time is

    @property
    def text(self) -> str:
        return format_gpu(self.seconds, estimate=not self.measured)


def training_note(stem: str) -> str:
    """"15 of them training" for the chapter whose GPU-track estimate is the training budget, else ""."""
    from . import track

    minutes = track.DEFAULTS["train_minutes"]
    costs = track.costs(track.card_peak(ESTIMATE_CARD))
    return f"{minutes:.0f} of them training" if costs.get(stem) == 60.0 * minutes else ""


def gpu_track_records(results: str | os.PathLike = RESULTS) -> list[dict]:
    """The records of ``benchmarks/gpu_track.sh`` on a real GPU (dry runs left out), newest first."""
    records = []
    for p in sorted(Path(results).glob("*gpu-track*.json")):
        try:
            rec = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if not rec.get("dry_run") and isinstance(rec.get("chapters"), dict):
            records.append(dict(rec, file=p.name))
    return sorted(records, key=lambda r: r.get("date", ""), reverse=True)


def gpu_estimates(peak: float) -> dict[str, float]:
    """ESTIMATED GPU seconds of each GPU-track chapter on a card of ``peak`` TFLOP/s (start-up and downloads not
    included): :func:`dit_book.track.costs`, and chapter 7c's study cell as :func:`dit_book.findings_gpu.plan` sizes
    it for that card."""
    from . import findings_gpu, track

    return {**track.costs(peak), "07c_paper_findings": findings_gpu.chapter_seconds(peak)}


def gpu_time(stem: str, data: dict | None = None, results: str | os.PathLike = RESULTS) -> GpuTime:
    """A chapter's time on one GPU: measured by ``make book`` on a GPU machine, else measured by
    ``benchmarks/gpu_track.sh``, else estimated (see the module docstring)."""
    from . import track

    data = load() if data is None else data
    note = GPU_NOTES.get(stem) or training_note(stem)
    entry = data.get("chapters", {}).get(stem, {}).get("gpu")
    if entry:
        return GpuTime(entry["seconds"], True, f"measured by {entry.get('how', '`make book`')} on {entry['date']} "
                                               f"(commit {entry['commit']}), {entry['machine']}", note)
    for rec in gpu_track_records(results):
        row = rec["chapters"].get(stem)
        if row and not row.get("error") and row.get("wall_at_defaults_s"):
            return GpuTime(float(row["wall_at_defaults_s"]), True,
                           f"measured on an {rec['gpu']} by `benchmarks/gpu_track.sh` on {rec.get('date', '?')} "
                           f"(stand-ins of the downloads' sizes; training and FID sampling extrapolated to the "
                           f"chapter's defaults; `benchmarks/results/{rec['file']}`)", note)
    costs = gpu_estimates(track.card_peak(ESTIMATE_CARD))
    card = ESTIMATE_CARD.replace("NVIDIA GeForce ", "")
    if stem in costs:
        how = ESTIMATED_BY.get(stem, "`dit_book.track.costs`")
        return GpuTime(costs[stem] + START_UP_S, False,
                       f"an estimate for an {card} (24 GB): the H200's measured speeds scaled by the card's bf16 peak "
                       f"({how}), plus a minute of start-up", note)
    if stem in OTHER_GPU_WORK:
        seconds, what = OTHER_GPU_WORK[stem]
        return GpuTime(seconds, False, f"an estimate for an {card} (24 GB): {what}", note)
    cpu = cpu_entry(stem, data)
    bound = cpu["seconds"] if cpu else START_UP_S
    return GpuTime(bound, False, "an estimate: no GPU-track work, so at most its CPU time", note)


# ------------------------------------------------------------------------------------------------ the box
class ChapterBox:
    """What the first cell of a chapter displays: HTML in Jupyter and in the built book, text elsewhere."""

    def __init__(self, stem: str, data: dict | None = None):
        self.stem = stem
        self.data = load() if data is None else data
        self.cpu = cpu_entry(stem, self.data)
        self.gpu = gpu_time(stem, self.data)

    def lines(self) -> list[tuple[str, str]]:
        """``(label, sentence)`` pairs, plain text with ``code`` in backticks."""
        if self.cpu:
            c = self.cpu
            cpu = (f"**{format_seconds(c['seconds'])}**, measured by {c.get('how', '`make book`')} on {c['date']} "
                   f"(commit {c['commit']}), {c['machine']}.")
            if c.get("note"):
                cpu += f" {c['note']}"
        else:
            cpu = "not measured yet: the next `make book` records it (`book/_timings.json`)."
        g = self.gpu
        gpu = f"**{g.text}**, {g.source}."
        if g.note and g.note.startswith("+"):
            gpu += f" Downloads: {g.note[1:].strip()}."
        return [("CPU", cpu), ("One GPU", gpu),
                ("Settings", "what the chapter costs is set in its `parameters` cell; `SMOKE = True` there picks the "
                             "tiny settings the tests run.")]

    def __repr__(self) -> str:
        return "Running this chapter\n" + "\n".join(f"  {k}: {v.replace('**', '')}" for k, v in self.lines())

    def _repr_html_(self) -> str:
        def inline(text: str) -> str:
            text = html.escape(text, quote=False)
            text = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", text)
            return re.sub(r"`(.+?)`", r"<code>\1</code>", text)

        items = "".join(f"<li><strong>{html.escape(k)}</strong>: {inline(v)}</li>" for k, v in self.lines())
        return (f'<div class="admonition note dit-running-box" data-chapter="{html.escape(self.stem)}">'
                f'<p class="admonition-title">Running this chapter</p><ul class="simple">{items}</ul></div>')


def chapter_box(stem: str) -> ChapterBox:
    """The "Running this chapter" box of chapter ``stem`` (e.g. ``"05_training"``), from ``book/_timings.json``."""
    return ChapterBox(stem)


BOX_SOURCE = 'from dit_book import chapter_box\n\nchapter_box("{stem}")'
BOX_TAGS = ["remove-input"]


def box_stem(source: str) -> str | None:
    """The stem a box cell's source names, or None when it is not a box cell."""
    m = _BOX_CALL.search(source)
    return m.group(1) if m else None


def add_box(notebook: str | os.PathLike) -> bool:
    """Insert the box cell right after the chapter's title (the first markdown cell; a title that shares its cell
    with text is split off into a cell of its own). Returns False when the notebook already has its box."""
    import nbformat

    notebook = Path(notebook)
    nb = nbformat.read(notebook, as_version=4)
    if any(c.cell_type == "code" and box_stem(c.source) for c in nb.cells):
        return False
    first = next((i for i, c in enumerate(nb.cells) if c.cell_type == "markdown"), None)
    if first is None or not nb.cells[first].source.lstrip().startswith("# "):
        raise ValueError(f"{notebook}: its first markdown cell must start with the chapter's title (# ...)")
    title_cell = nb.cells[first]
    title, _, rest = title_cell.source.lstrip().partition("\n")
    at = first + 1
    ids = {c.get("id") for c in nb.cells}
    if rest.strip():
        title_cell.source = rest.lstrip("\n")
        nb.cells.insert(first, nbformat.v4.new_markdown_cell(title))
        if "title" not in ids:
            nb.cells[first].id = "title"
        at = first + 1
    cell = nbformat.v4.new_code_cell(BOX_SOURCE.format(stem=notebook.stem), metadata={"tags": list(BOX_TAGS)})
    if "running-box" not in ids:
        cell.id = "running-box"
    nb.cells.insert(at, cell)
    nbformat.write(nb, notebook)
    return True


# ------------------------------------------------------------------------------------------------ the intro
def intro_cells(stem: str, data: dict | None = None) -> tuple[str, str]:
    """The CPU and GPU cells of chapter ``stem``'s row in the introduction's chapter table."""
    data = load() if data is None else data
    cpu = cpu_entry(stem, data)
    g = gpu_time(stem, data)
    gpu = g.text + (" (measured" if g.measured else " (estimate") + (f"; {g.note})" if g.note else ")")
    return (format_seconds(cpu["seconds"]) if cpu else "not measured yet"), gpu


def intro_total(stems: list[str], data: dict | None = None) -> tuple[str, str]:
    data = load() if data is None else data
    cpu = [cpu_entry(s, data) for s in stems]
    measured = [c["seconds"] for c in cpu if c]
    cpu_text = f"{format_seconds(sum(measured))} of notebooks" + ("" if len(measured) == len(stems) else
                                                                   f" ({len(stems) - len(measured)} not measured)")
    gpus = [gpu_time(s, data) for s in stems]
    gpu_text = f"~{sum(g.seconds for g in gpus) / 60:.0f} min ({DOWNLOADS_NOTE})"
    return cpu_text, gpu_text


_ROW = re.compile(r"^\|(?P<head>(?:[^|]*\|){3})(?P<cpu>[^|]*)\|(?P<gpu>[^|]*)\|\s*$")


def render_intro(text: str, data: dict | None = None) -> str:
    """``text`` (the introduction) with the time cells of its chapter table ("## The chapters") rewritten."""
    data = load() if data is None else data
    head, sep, rest = text.partition("## The chapters")
    if not sep:
        raise ValueError("book/intro.md has no '## The chapters' section")
    section, nxt, tail = rest.partition("\n## ")
    lines, stems = section.split("\n"), []
    for i, line in enumerate(lines):
        link = re.search(r"\]\(([\w-]+)\.ipynb\)", line)
        m = _ROW.match(line)
        if m and link:
            stems.append(link.group(1))
            cpu, gpu = intro_cells(link.group(1), data)
            lines[i] = f"|{m.group('head')} {cpu} | {gpu} |"
    for i, line in enumerate(lines):
        m = _ROW.match(line)
        if m and "**all**" in line:
            cpu, gpu = intro_total(stems, data)
            lines[i] = f"|{m.group('head')} {cpu} | {gpu} |"
    return head + sep + "\n".join(lines) + nxt + tail

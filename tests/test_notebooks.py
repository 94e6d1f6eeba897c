"""Smoke runs of every chapter notebook (book/*.ipynb) through papermill, with reduced parameters.

The convention that lets a new chapter be covered just by adding its notebook:

* The notebook has one code cell tagged ``parameters`` (papermill's tag) that defines ``SMOKE = False`` and
  every cost knob (profile, steps, batch, image size, device, data/output folders).
* When ``SMOKE`` is True the notebook itself picks tiny settings (a few steps, a tiny model), so it finishes
  in well under ``DEFAULT_BUDGET_S`` on 2 CPU cores. The test injects ``SMOKE = True``
  (``COMMON_PARAMS``); the kernel also sees ``DIT_SMOKE=1`` (``dit_book.smoke_mode()``).
* ``SMOKE_PARAMS`` below may override more knobs for one notebook (keyed by file stem); every name there
  must exist in that notebook's parameters cell, or the test fails and names it.
* The GPU track: a notebook whose parameters cell defines ``TRACK = "auto"`` has cells that run only on the GPU
  track (a CUDA GPU). ``test_notebook_smoke_gpu_track`` runs each of them a second time with ``TRACK = "gpu"``
  forced on the CPU: at smoke size the notebook makes its own stand-ins for every download (a small archive in
  Imagenette's layout, a tiny saved VAE, a tiny checkpoint in the official format, random Inception weights;
  ``dit_book.track.standins``), so each GPU cell runs, line for line, before a GPU reader meets it.
* The kernel's working directory is ``<tmp>/book``, a scratch mirror of the repository layout: relative
  paths such as ``../data/digits`` or ``outputs/`` behave as in the book build but never touch the tree.
  Chapters must not rely on another chapter having run: each creates what it needs when it is missing.

``make smoke`` runs only these tests; set SMOKE_OUTPUT_DIR to keep the executed notebooks.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

papermill = pytest.importorskip("papermill")
nbformat = pytest.importorskip("nbformat")

pytestmark = pytest.mark.notebook

# Injected into every notebook whose parameters cell defines the name.
COMMON_PARAMS = {"SMOKE": True}
# Extra per-notebook overrides, keyed by notebook stem, e.g. {"05_training": {"MAX_STEPS": 20}}.
SMOKE_PARAMS: dict[str, dict] = {}
# The GPU track forced on the CPU (see above), for every notebook that declares TRACK.
GPU_TRACK_PARAMS = {"TRACK": "gpu"}
GPU_TRACK_NOTEBOOKS = ["00_environment", "01_data", "02_latents", "05b_your_data", "07_sampling",
                       "07c_paper_findings"]
# Wall-clock budget of one smoke run (kernel start included), per notebook stem; default below.
TIME_BUDGET_S: dict[str, float] = {}
DEFAULT_BUDGET_S = 300.0  # a guard against SMOKE settings that grew, not a speed test: ~2 min is usual on 2 cores
CELL_TIMEOUT_S = 600

BOOK_DIR = Path(__file__).resolve().parents[1] / "book"
NOTEBOOKS = sorted(BOOK_DIR.glob("*.ipynb"))


def declared_parameters(notebook: Path) -> dict:
    """Names (and papermill's view of the defaults) defined in the notebook's ``parameters`` cell."""
    return papermill.inspect_notebook(str(notebook))


def smoke_parameters(notebook: Path, overrides: dict | None = None) -> dict:
    """COMMON_PARAMS (for the names the notebook declares) merged with its per-notebook overrides."""
    declared = declared_parameters(notebook)
    params = {k: v for k, v in COMMON_PARAMS.items() if k in declared}
    extra = SMOKE_PARAMS.get(notebook.stem, {}) if overrides is None else overrides
    unknown = sorted(set(extra) - set(declared))
    if unknown:
        raise ValueError(
            f"{notebook.name}: smoke overrides {unknown} are not defined in its `parameters` cell "
            f"(it defines {sorted(declared)}); fix SMOKE_PARAMS in tests/test_notebooks.py or the notebook"
        )
    params.update(extra)
    return params


def run_notebook(notebook: Path, workdir: Path, parameters: dict, kernel_name: str,
                 suffix: str = "smoke") -> tuple[Path, float]:
    """Execute ``notebook`` with ``parameters`` and cwd ``workdir/book``; return (executed copy, seconds)."""
    cwd = workdir / "book"
    cwd.mkdir(parents=True, exist_ok=True)
    keep = os.environ.get("SMOKE_OUTPUT_DIR")
    out_dir = Path(keep) if keep else workdir
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"{notebook.stem}.{suffix}.ipynb"
    start = time.perf_counter()
    papermill.execute_notebook(
        str(notebook),
        str(out),
        parameters=parameters,
        kernel_name=kernel_name,
        cwd=str(cwd),
        execution_timeout=CELL_TIMEOUT_S,
        progress_bar=False,
        log_output=False,
    )
    return out, time.perf_counter() - start


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_smoke(notebook, tmp_path, python3_kernel):
    params = smoke_parameters(notebook)
    assert params.get("SMOKE") is True, (
        f"{notebook.name}: its `parameters` cell must define SMOKE = False (see tests/test_notebooks.py)"
    )
    _, seconds = run_notebook(notebook, tmp_path, params, python3_kernel)
    budget = TIME_BUDGET_S.get(notebook.stem, DEFAULT_BUDGET_S)
    assert seconds <= budget, (
        f"{notebook.name}: smoke run took {seconds:.0f} s, over its {budget:.0f} s budget; "
        f"make its SMOKE settings smaller (or raise TIME_BUDGET_S[{notebook.stem!r}] with a reason)"
    )


@pytest.mark.parametrize("stem", GPU_TRACK_NOTEBOOKS)
def test_notebook_smoke_gpu_track(stem, tmp_path, python3_kernel):
    notebook = BOOK_DIR / f"{stem}.ipynb"
    params = {**smoke_parameters(notebook), **GPU_TRACK_PARAMS}
    assert "TRACK" in declared_parameters(notebook), f"{notebook.name}: its parameters cell must define TRACK"
    _, seconds = run_notebook(notebook, tmp_path, params, python3_kernel, suffix="smoke-gpu")
    budget = TIME_BUDGET_S.get(stem, DEFAULT_BUDGET_S)
    assert seconds <= budget, f"{notebook.name} (GPU track): smoke run took {seconds:.0f} s, over its {budget:.0f} s"


def test_every_notebook_with_a_gpu_track_is_run_on_it():
    declaring = sorted(p.stem for p in NOTEBOOKS if "TRACK" in declared_parameters(p))
    assert declaring == sorted(GPU_TRACK_NOTEBOOKS), "update GPU_TRACK_NOTEBOOKS in tests/test_notebooks.py"


# ------------------------------------------------------------------------------------- the harness itself
def _make_notebook(path: Path, parameters_src: str, *cells: str) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    nb.cells.append(nbformat.v4.new_code_cell(parameters_src, metadata={"tags": ["parameters"]}))
    nb.cells.extend(nbformat.v4.new_code_cell(src) for src in cells)
    nbformat.write(nb, path)
    return path


def test_harness_injects_smoke_values_and_mirrors_layout(tmp_path, python3_kernel, monkeypatch):
    src = tmp_path / "src"
    src.mkdir()
    nb = _make_notebook(
        src / "99_example.ipynb",
        "SMOKE = False\nSTEPS = 100_000\nDATA_DIR = '../data'",
        "import os, pathlib\n"
        "from dit_book import smoke_mode\n"
        "steps = 3 if SMOKE else STEPS\n"
        "pathlib.Path(DATA_DIR).mkdir(parents=True, exist_ok=True)\n"
        "pathlib.Path(DATA_DIR, 'marker.txt').write_text(f'{SMOKE} {steps} {smoke_mode()} {os.getcwd()}')",
    )
    monkeypatch.setitem(SMOKE_PARAMS, "99_example", {"STEPS": 7})  # ignored by the notebook when SMOKE
    params = smoke_parameters(nb)
    assert params == {"SMOKE": True, "STEPS": 7}

    work = tmp_path / "work"
    out, seconds = run_notebook(nb, work, params, python3_kernel)
    smoke, steps, env_smoke, cwd = (work / "data" / "marker.txt").read_text().split(" ", 3)
    assert (smoke, steps, env_smoke) == ("True", "3", "True")
    assert Path(cwd).resolve() == (work / "book").resolve()
    executed = nbformat.read(out, as_version=4)
    injected = [c for c in executed.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert len(injected) == 1 and "STEPS = 7" in injected[0].source
    assert not (BOOK_DIR.parent / "data" / "marker.txt").exists()
    assert seconds < DEFAULT_BUDGET_S


def test_harness_rejects_unknown_override_and_notebook_without_smoke(tmp_path):
    nb = _make_notebook(tmp_path / "98_plain.ipynb", "STEPS = 10", "x = STEPS")
    assert smoke_parameters(nb, overrides={}) == {}  # no SMOKE declared: nothing injected
    with pytest.raises(ValueError, match=r"\['STESP'\] are not defined"):
        smoke_parameters(nb, overrides={"STESP": 1})


def test_harness_reports_the_failing_cell(tmp_path, python3_kernel):
    nb = _make_notebook(tmp_path / "97_broken.ipynb", "SMOKE = False", "raise RuntimeError('boom in cell 2')")
    with pytest.raises(papermill.PapermillExecutionError, match="boom in cell 2"):
        run_notebook(nb, tmp_path / "work", {"SMOKE": True}, python3_kernel)


# ------------------------------------------------------------------------------------- the reader's own code
#: A reader's q_sample, right and written otherwise than the book's (a float32 table, indexed, then shaped).
READERS_Q_SAMPLE = '''
def q_sample(x0, t, noise, alpha_bar):
    root, rest = alpha_bar.sqrt().float(), (1 - alpha_bar).sqrt().float()
    return root[t].view(-1, 1, 1, 1) * x0 + rest[t].view(-1, 1, 1, 1) * noise
'''


def test_chapter_5_trains_what_a_reader_wrote(tmp_path, python3_kernel):
    """A reader's files in READER_DIR before chapter 5 runs (its smoke run): their parts are what trains, the
    chapter says so, and the checkpoint it saves for chapter 7 records whose each part was."""
    from dit_book import reader

    folder = tmp_path / "outputs" / "reader"  # READER_DIR, "../outputs/reader" from the kernel's book/
    folder.mkdir(parents=True)
    reader.path_of(folder, "q_sample").write_text(READERS_Q_SAMPLE)
    reader.path_of(folder, "training_step").write_text(reader.book_source("training_step"))
    reader.path_of(folder, "dit_block").write_text(  # a slip: the MLP branch without its gate
        reader.book_source("dit_block").replace("gate2[:, None] * self.mlp", "self.mlp"))
    notebook = BOOK_DIR / "05_training.ipynb"
    out, _ = run_notebook(notebook, tmp_path, smoke_parameters(notebook), python3_kernel, suffix="reader")
    cells = {c.get("id"): c for c in nbformat.read(out, as_version=4).cells}
    said = "".join(o.get("text", "") for o in cells["minloop-code"].outputs if o.get("output_type") == "stream")
    assert "yours: q_sample, training step;" in said, said[:400]
    assert "the book's solution (fails its check): adaLN-Zero block" in said
    import torch

    saved = torch.load(folder / "your_dit.pt", weights_only=True)["config"]["yours"]["parts"]
    assert saved["q_sample"] == saved["training_step"] == "yours"
    assert saved["dit_block"] == "the book's (fails its check)" and saved["dit"] == "the book's (not written)"

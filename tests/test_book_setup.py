"""dit_book.setup: each chapter's set-up reads its parameters, changes nothing in them, and says what this run changes.

The chapters' smoke runs (tests/test_notebooks.py) execute these functions inside the notebooks; here each is called
on the chapter's own ``parameters`` cell, read with ``ast`` (the cell is not run), at its defaults on this CPU and in
a smoke run on both tracks, with the stand-ins of the downloads replaced by a fake that records what it was asked for.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import torch

from dit_book import setup

BOOK = Path(__file__).resolve().parents[1] / "book"
#: The chapter each function sets up: every chapter of the book has one.
CHAPTERS = {"00_environment": setup.environment, "01_data": setup.data, "02_latents": setup.latents,
            "03_model": setup.model, "04_diffusion": setup.diffusion, "05_training": setup.training,
            "05b_your_data": setup.your_data, "06_memory_and_speed": setup.memory_and_speed,
            "07_sampling": setup.sampling, "07b_converging_faster": setup.converging,
            "07c_paper_findings": setup.paper_findings, "08_troubleshooting": setup.troubleshooting,
            "09_beyond_one_gpu": setup.beyond_one_gpu, "appendix_tutorial_claims": setup.tutorial_claims}


def _literal(node: ast.AST):
    """A parameter's value: a Python literal, or ``dict(key=literal, ...)``."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict" and not node.args:
        return {kw.arg: _literal(kw.value) for kw in node.keywords}
    return ast.literal_eval(node)


def parameters(stem: str, **changes) -> dict:
    """The names a chapter's parameters cell assigns and their values, read from its source without running it
    (every value there is a literal), with ``changes``."""
    nb = json.loads((BOOK / f"{stem}.ipynb").read_text())
    cell = next(c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", []))
    names: dict = {}
    for node in ast.parse("".join(cell["source"])).body:
        assert isinstance(node, ast.Assign) and len(node.targets) == 1, f"{stem}: a parameter is not `NAME = literal`"
        target, value = node.targets[0], node.value
        if isinstance(target, ast.Tuple):
            names.update(zip((t.id for t in target.elts), (_literal(v) for v in value.elts)))
        else:
            names[target.id] = _literal(value)
    return {**names, **changes}


def run(stem: str, params: dict) -> setup.Resolved:
    """The chapter's set-up on a copy of ``params``, checked not to write into them."""
    before = {k: (list(v) if isinstance(v, list) else dict(v) if isinstance(v, dict) else v) for k, v in params.items()}
    ch = CHAPTERS[stem](params)
    assert params == before, f"{stem}: the set-up wrote into the notebook's names"
    return ch


@pytest.fixture
def book_dir(tmp_path, monkeypatch):
    """A scratch book/ to run in (the functions write relative to it, as the chapters do), without DIT_SMOKE."""
    monkeypatch.delenv("DIT_SMOKE", raising=False)
    monkeypatch.setattr(setup, "set_threads", lambda n=None: 1)  # the test process keeps its own threads
    (tmp_path / "book").mkdir()
    monkeypatch.chdir(tmp_path / "book")
    return tmp_path / "book"


@pytest.fixture
def fake_standins(monkeypatch, tmp_path):
    calls = []

    def standins(folder, **kwargs):
        calls.append(folder)
        root = tmp_path / "fake-standins"
        return {"archive": root / "imagenette2-320.tgz", "vae": root / "vae", "official": root / "DiT-XL-2-256x256.pt",
                "inception": root / "inception.pth"}

    monkeypatch.setattr(setup.tracks, "standins", standins)
    return calls


def test_every_chapter_has_a_set_up_applied_in_one_visible_line():
    """Every chapter's first code cell after ``parameters`` calls its function of dit_book.setup with its names,
    then applies what it returns in one line; nothing else hands the notebook's names to the set-up."""
    chapters = sorted(p.stem for p in BOOK.glob("*.ipynb"))
    assert sorted(CHAPTERS) == chapters, "a chapter without a set-up function here (or one that no longer exists)"
    for stem, function in CHAPTERS.items():
        nb = json.loads((BOOK / f"{stem}.ipynb").read_text())
        at = next(i for i, c in enumerate(nb["cells"]) if "parameters" in c.get("metadata", {}).get("tags", []))
        cell = "".join(next(c for c in nb["cells"][at + 1:] if c["cell_type"] == "code")["source"])
        lines = [line.split("#")[0].strip() for line in cell.splitlines()]
        call = f"ch = setup.{function.__name__}(globals())"
        assert call in lines, f"{stem}: its set-up cell does not call `{call}`"
        assert lines[lines.index(call) + 1] == "globals().update(ch.changes)", \
            f"{stem}: `globals().update(ch.changes)` must follow the set-up call"
        everywhere = "".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
        assert everywhere.count("globals()") == 2, f"{stem}: globals() is handed to something besides its set-up"


@pytest.mark.parametrize("stem", sorted(CHAPTERS))
def test_every_chapter_sets_up_from_its_own_parameters(stem, book_dir, fake_standins, capsys):
    """At the defaults on this CPU, and in a smoke run: the function finds every name it reads and writes none of
    them; a default run changes only knobs that are ``"auto"``; a smoke run changes at least one knob; the printed
    line names every change."""
    defaults = parameters(stem)
    ch = run(stem, dict(defaults))
    changed = {k for k in ch.changes if defaults[k] != "auto"}
    assert changed == set(), f"{stem}: a default run changed {changed}"
    assert set(ch.reasons) == set(ch.changes) and set(ch.reasons.values()) <= {setup.AUTO}
    assert not fake_standins, f"{stem}: a default run on the CPU track made stand-ins"
    smoke = run(stem, parameters(stem, SMOKE=True))
    assert smoke.changes and set(smoke.changes) <= set(defaults), f"{stem}: a smoke run changes no knob"
    assert setup.SMOKE_RUN in smoke.reasons.values()
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed[-1] == str(smoke)
    for name in smoke.changes:
        assert f"{name} " in printed[-1], f"{stem}: the printed line does not name {name}"


def test_the_printed_line_says_what_changed_and_why(book_dir, fake_standins):
    ch = run("07_sampling", parameters("07_sampling", SMOKE=True, TRACK="gpu"))
    line = str(ch)
    assert line.startswith("smoke run: RUN_DIR ../runs/digits -> outputs/07_sampling/smoke_run, TRAIN_STEPS None -> 30")
    assert "PER_CLASS 20 -> 2" in line and "stand-ins: VAE stabilityai/sd-vae-ft-ema -> " in line
    assert "auto: TRACK = gpu" not in line  # TRACK was forced to "gpu", not resolved from "auto"
    assert "torch: 1 CPU thread" in line
    auto = run("07_sampling", parameters("07_sampling"))
    assert str(auto).startswith("auto: TRACK = cpu, DOWNLOAD = False") and auto.changes == {}


def test_smoke_mode_comes_from_the_environment_too(book_dir, monkeypatch):
    monkeypatch.setenv("DIT_SMOKE", "1")
    ch = run("00_environment", parameters("00_environment"))
    assert ch.changes["SMOKE"] is True and ch.reasons["SMOKE"] == "DIT_SMOKE set"
    assert (ch.changes["MATMUL_SIZE"], ch.changes["MATMUL_REPEATS"]) == (256, 2)
    assert str(ch).startswith("DIT_SMOKE set: SMOKE False -> True | smoke run: MATMUL_SIZE auto -> 256")


def test_environment_resolves_auto_by_device(book_dir):
    ch = run("00_environment", parameters("00_environment", DEVICE="cpu", TRACK="cpu"))
    assert ch.changes == {"MATMUL_SIZE": 512} and ch.device == torch.device("cpu") and ch.track == "cpu"
    gpu = run("00_environment", parameters("00_environment", DEVICE="cuda"))  # a device name is resolved, never touched
    assert gpu.device.type == "cuda" and gpu.changes == {"MATMUL_SIZE": 8192}
    assert run("00_environment", parameters("00_environment", DEVICE="cpu", MATMUL_SIZE=1024)).changes == {}


def test_chapter_03_writes_the_device_it_reads(book_dir):
    ch = run("03_model", parameters("03_model"))
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert ch.changes == {"DEVICE": expected} and ch.device == torch.device(expected)
    assert run("03_model", parameters("03_model", DEVICE="cpu")).changes == {}
    smoke = run("03_model", parameters("03_model", SMOKE=True, DEVICE="cpu"))
    assert smoke.changes == {"BENCH_MODEL": "DiT-S/4", "BENCH_IMAGE_SIZE": 64, "BENCH_REPEATS": 1}  # batch: 2 already


def test_chapter_04_gives_the_digits_its_toy_model_knows(book_dir):
    ch = run("04_diffusion", parameters("04_diffusion", SMOKE=True))
    assert ch.changes["NUM_POINTS"] == 50 and ch.points.shape == (50, 1, 8, 8) and ch.held_out.shape == (200, 1, 8, 8)
    assert float(ch.points.min()) >= -1 and float(ch.points.max()) <= 1 and ch.labels.shape == (50,)
    assert ch.seed == 0


def test_chapter_05_clears_only_its_demo_folder(book_dir):
    params = parameters("05_training")
    demo = Path(params["OUT_DIR"]) / "demo"
    (demo / "old").mkdir(parents=True)
    (Path(params["OUT_DIR"]) / "keep").mkdir()
    ch = run("05_training", params)
    assert not demo.exists() and (Path(params["OUT_DIR"]) / "keep").exists() and ch.cleared == [str(demo)]
    assert "cleared outputs/05_training/demo" in str(ch)
    assert ch.x_all.shape == (1797, 1, 8, 8) and ch.tiny == setup.TINY and ch.changes == {}
    smoke = run("05_training", parameters("05_training", SMOKE=True))
    assert smoke.changes == {"RUN_DIR": "outputs/05_training/smoke_run", "MAX_STEPS": 20, "SAMPLE_EVERY": 10,
                             "EVAL_PER_CLASS": 2, "MY_DIT_STEPS": 30}
    assert smoke.cleared == []  # nothing left to clear


def test_a_missing_parameter_is_named(book_dir):
    params = parameters("07_sampling")
    del params["DOWNLOAD"]
    with pytest.raises(KeyError, match=r"\['DOWNLOAD'\].*add it there"):
        setup.sampling(params)


def test_the_gpu_track_in_a_smoke_run_puts_stand_ins_in_place_of_downloads(book_dir, fake_standins):
    ch = run("07_sampling", parameters("07_sampling", SMOKE=True, TRACK="gpu"))
    changes = ch.changes
    assert ch.track == "gpu" and ch.download is False and fake_standins == [setup.STANDINS]
    assert changes["VAE"].endswith("vae") and Path(changes["OFFICIAL_CKPT"]).name == "DiT-XL-2-256x256.pt"
    assert Path(changes["INCEPTION"]).name == "inception.pth" and changes["CHECKSUM"] is False
    assert Path(changes["IMAGENETTE_ARCHIVE"]).name == "imagenette2-320.tgz"
    assert {ch.reasons[k] for k in ("VAE", "OFFICIAL_CKPT", "INCEPTION", "CHECKSUM")} == {setup.STANDIN}
    assert (ch.gpu_image_size, ch.calibration_steps, changes["FID_SAMPLES"]) == (32, 2, 10)
    assert ch.data_dir.name == "imagenette-smoke"  # stand-in data never passes for the real thing
    # what the reader gave is kept: an archive of their own, an official checkpoint named by path
    mine = run("07_sampling", parameters("07_sampling", SMOKE=True, TRACK="gpu", IMAGENETTE_ARCHIVE="my.tgz",
                                         OFFICIAL_CKPT="my.pt"))
    assert not {"IMAGENETTE_ARCHIVE", "CHECKSUM", "OFFICIAL_CKPT"} & set(mine.changes)


def test_chapter_01_makes_stand_ins_only_without_an_archive(book_dir, fake_standins):
    run("01_data", parameters("01_data", SMOKE=True, TRACK="gpu", IMAGENETTE_ARCHIVE="mine.tgz"))
    assert fake_standins == []
    ch = run("01_data", parameters("01_data", SMOKE=True, TRACK="gpu"))
    assert fake_standins and ch.changes["CHECKSUM"] is False and ch.download is False
    assert (ch.changes["GRID_PER_CLASS"], ch.changes["MESSY_IMAGES"]) == (4, 8)


def test_the_gpu_track_downloads_only_outside_smoke_runs(book_dir):
    ch = run("01_data", parameters("01_data", TRACK="gpu"))
    assert ch.download is True and ch.data_dir == Path("../data/imagenette")
    assert "auto: DOWNLOAD = True, DATA_DIR = ../data/imagenette" in str(ch)
    assert run("01_data", parameters("01_data", TRACK="gpu", DOWNLOAD=False)).download is False
    assert run("01_data", parameters("01_data", TRACK="cpu")).download is False


def test_chapter_02_sizes_by_device(book_dir, fake_standins):
    ch = run("02_latents", parameters("02_latents", DEVICE="cpu"))
    assert ch.changes == {"IMAGE_SIZE": 128, "NUM_IMAGES": 8, "BATCH_SIZE": 4, "COMPARE_IMAGES": 1}
    assert ch.gpu is False and ch.download is False and ch.stand is None and ch.precision == "fp32"
    smoke = run("02_latents", parameters("02_latents", SMOKE=True, TRACK="gpu", DEVICE="cpu"))
    c = smoke.changes
    assert smoke.stand is not None and (c["IMAGE_SIZE"], c["GPU_IMAGE_SIZE"], c["RECON_IMAGES"]) == (32, 32, 4)


def test_chapter_05b_smoke_run_trains_a_tiny_model_in_its_own_folders(book_dir, fake_standins):
    params = parameters("05b_your_data", SMOKE=True, TRACK="gpu")
    ch = run("05b_your_data", params)
    c = ch.changes
    assert c["OWN_RUN_DIR"].startswith(params["OUT_DIR"]) and c["GPU_RUN_DIR"].startswith(params["OUT_DIR"])
    assert (c["OWN_MAX_STEPS"], c["OWN_PER_CLASS"], c["OWN_SEARCH_PER_CLASS"]) == (10, 8, 2)
    assert ch.own_overrides == setup.OWN_TINY
    assert c["VAE"].endswith("vae")
    default = run("05b_your_data", parameters("05b_your_data"))
    assert default.own_overrides == {} and (default.gpu_image_size, default.calibration_steps) == (256, 50)


def test_chapter_06_sizes_the_ladder_for_the_device(book_dir):
    ch = run("06_memory_and_speed", parameters("06_memory_and_speed", DEVICE="cpu"))
    assert ch.changes == {"MODEL": "digits", "BATCH_SIZE": 64, "INCLUDE_COMPILE": False, "ISOLATE": False}
    assert (ch.spec.batch_size, ch.spec.device, ch.gpu) == (64, "cpu", False)
    smoke = run("06_memory_and_speed", parameters("06_memory_and_speed", SMOKE=True))
    assert smoke.spec.model == "tiny" and smoke.changes["CARDS_GIB"] == [12, 24, 80]


def test_chapter_07c_runs_tiny_studies_in_a_smoke_run(book_dir, fake_standins):
    ch = run("07c_paper_findings", parameters("07c_paper_findings"))
    assert ch.changes == {} and ch.live_overrides == {} and ch.gpu_overrides == {} and ch.gpu_image_size == 256
    assert ch.threads == 1 and ch.out_dir.is_dir()
    smoke = run("07c_paper_findings", parameters("07c_paper_findings", SMOKE=True, TRACK="gpu"))
    c = smoke.changes
    assert (c["LIVE_STEPS"], c["GPU_STEPS"], c["GPU_BATCH"]) == (10, 2, 4) and c["GPU_OUT_DIR"].endswith("smoke_gpu_runs")
    assert smoke.live_overrides == setup.FINDINGS_SMOKE_DIT and smoke.gpu_image_size == 32
    assert Path(c["INCEPTION"]).name == "inception.pth" and c["VAE"].endswith("vae") and c["CHECKSUM"] is False


def test_chapter_08_small_runs_train_and_keep_their_logs(book_dir):
    params = parameters("08_troubleshooting", SMOKE=True)
    ch = run("08_troubleshooting", params)
    assert ch.runs_dir == Path(params["OUT_DIR"]) / "runs" and len(ch.digits) > 1000
    (ch.runs_dir / "old").mkdir(parents=True)
    again = run("08_troubleshooting", params)  # a rerun starts from clean scratch folders, and says so
    assert not (ch.runs_dir / "old").exists() and again.cleared == [str(ch.runs_dir)]
    summary = ch.runs.run("tiny", max_steps=3, batch_size=8)
    cfg = __import__("yaml").safe_load((ch.runs_dir / "tiny" / "config.yaml").read_text())
    assert summary["steps"] == 3 and (cfg["batch_size"], cfg["lr"], cfg["depth"]) == (8, 1e-3, params["TINY_DIT"]["depth"])
    losses = ch.runs.losses("tiny")
    assert sorted(losses) == [1, 2, 3] and all(v == v for v in losses.values())
    assert (ch.runs_dir / "tiny" / "log.txt").read_text().strip()  # the console lines went here, not to the page


def test_the_appendix_reads_the_h200_ladder(book_dir):
    ch = run("appendix_tutorial_claims", parameters("appendix_tutorial_claims"))
    assert ch.rows and {"baseline", "ckpt", "amp", "all"} <= set(ch.rows)
    params = 675_129_632  # DiT-XL/2 at 256 px, pos_embed included
    assert 19.9 * params < ch.static < 20.1 * params  # 20 bytes a parameter: weights, gradients, AdamW, EMA
    missing = run("appendix_tutorial_claims", parameters("appendix_tutorial_claims", GPU_RESULTS=str(book_dir)))
    assert missing.rows == {} and missing.ladder_path is None


# ------------------------------------------------------------------------------------------------ chapter 05b's record
def test_chapter_05b_shows_the_records_own_run():
    """The grid and facts that chapter 05b shows on a build without a run of its own are the record's: the record's
    section names the image and says every figure of the box."""
    from dit_book.recorded import percent, recorded_run

    run = recorded_run("small-images-recipe-samples")
    facts = run.facts
    record = (Path(__file__).resolve().parents[1] / "benchmarks" / "results" / facts["record"]).read_text()
    section = record.split(f"\n## {facts['section']}. ", 1)[1].split("\n## ", 1)[0]
    judge = facts["judge"]
    per_class = " / ".join(f"{100 * judge['per_class'][k]:.0f}" for k in ("circle", "square", "triangle"))
    for figure in (run.image.name, facts["date"], f"{facts['steps']:,}", f"{facts['train_seconds']:,} s",
                   percent(judge["right"]), f"({percent(judge['clean'])})", f"{per_class} %", f"of {judge['samples']}"):
        assert figure in section, f"{facts['record']}, section {facts['section']}, no longer says {figure!r}"
    png = run.png()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) < 100_000  # a small committed image
    html = run._repr_html_()
    assert "not a run of this build" in html and "data:image/png;base64," in html and facts["machine"] in html
    assert "not of this build" in repr(run)
    with pytest.raises(FileNotFoundError, match="no recorded run 'nope'"):
        recorded_run("nope")

"""dit_book.setup: each chapter's setup call reads its parameters cell, writes back what a run uses, returns the rest.

The chapters' smoke runs (tests/test_notebooks.py) execute these functions inside the notebooks; here each is
called on the chapter's own ``parameters`` cell, at its defaults on this CPU and in a smoke run on both tracks,
with the stand-ins of the downloads replaced by a fake that records what it was asked for.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import torch

from dit_book import setup

BOOK = Path(__file__).resolve().parents[1] / "book"
#: The chapter each function sets up.
CHAPTERS = {"00_environment": setup.environment, "01_data": setup.data, "02_latents": setup.latents,
            "05b_your_data": setup.your_data, "06_memory_and_speed": setup.memory_and_speed,
            "07_sampling": setup.sampling, "07b_converging_faster": setup.converging,
            "08_troubleshooting": setup.troubleshooting, "09_beyond_one_gpu": setup.beyond_one_gpu,
            "appendix_tutorial_claims": setup.tutorial_claims}


def parameters(stem: str, **changes) -> dict:
    """The names a chapter's parameters cell defines, at their defaults (the cell executed), with ``changes``."""
    nb = json.loads((BOOK / f"{stem}.ipynb").read_text())
    cell = next(c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", []))
    source = "".join(cell["source"])
    ast.parse(source)
    names: dict = {}
    exec(compile(source, f"{stem}:parameters", "exec"), {}, names)  # noqa: S102 - the book's own cell
    return {**names, **changes}


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


@pytest.mark.parametrize("stem", sorted(CHAPTERS))
def test_every_chapter_sets_up_from_its_own_parameters(stem, book_dir, fake_standins):
    """At the defaults on this CPU, and in a smoke run: the function finds every name it reads, and a default run
    changes no knob that is not ``"auto"`` (SMOKE aside)."""
    defaults = parameters(stem)
    params = dict(defaults)
    CHAPTERS[stem](params)
    changed = {k for k in defaults if params[k] != defaults[k] and defaults[k] != "auto"}
    assert changed == set(), f"{stem}: a default run changed {changed}"
    assert not fake_standins, f"{stem}: a default run on the CPU track made stand-ins"
    smoke = parameters(stem, SMOKE=True)
    CHAPTERS[stem](smoke)
    assert smoke["SMOKE"] is True


def test_smoke_mode_comes_from_the_environment_too(book_dir, monkeypatch):
    monkeypatch.setenv("DIT_SMOKE", "1")
    params = parameters("00_environment")
    setup.environment(params)
    assert params["SMOKE"] is True and (params["MATMUL_SIZE"], params["MATMUL_REPEATS"]) == (256, 2)


def test_environment_resolves_auto_by_device(book_dir):
    cpu = parameters("00_environment", DEVICE="cpu", TRACK="cpu")
    ch = setup.environment(cpu)
    assert cpu["MATMUL_SIZE"] == 512 and ch.device == torch.device("cpu") and ch.track == "cpu"
    gpu = parameters("00_environment", DEVICE="cuda")  # a device name is resolved, never touched
    assert setup.environment(gpu).device.type == "cuda" and gpu["MATMUL_SIZE"] == 8192
    given = parameters("00_environment", DEVICE="cpu", MATMUL_SIZE=1024)
    setup.environment(given)
    assert given["MATMUL_SIZE"] == 1024


def test_a_missing_parameter_is_named(book_dir):
    params = parameters("07_sampling")
    del params["DOWNLOAD"]
    with pytest.raises(KeyError, match=r"\['DOWNLOAD'\].*add it there"):
        setup.sampling(params)


def test_the_gpu_track_in_a_smoke_run_puts_stand_ins_in_place_of_downloads(book_dir, fake_standins):
    params = parameters("07_sampling", SMOKE=True, TRACK="gpu")
    ch = setup.sampling(params)
    assert ch.track == "gpu" and ch.download is False and fake_standins == [setup.STANDINS]
    assert params["VAE"].endswith("vae") and Path(params["OFFICIAL_CKPT"]).name == "DiT-XL-2-256x256.pt"
    assert Path(params["INCEPTION"]).name == "inception.pth" and params["CHECKSUM"] is False
    assert Path(params["IMAGENETTE_ARCHIVE"]).name == "imagenette2-320.tgz"
    assert (ch.gpu_image_size, ch.calibration_steps, params["FID_SAMPLES"]) == (32, 2, 10)
    assert ch.data_dir.name == "imagenette-smoke"  # stand-in data never passes for the real thing
    # what the reader gave is kept: an archive of their own, an official checkpoint named by path
    mine = parameters("07_sampling", SMOKE=True, TRACK="gpu", IMAGENETTE_ARCHIVE="my.tgz", OFFICIAL_CKPT="my.pt")
    setup.sampling(mine)
    assert (mine["IMAGENETTE_ARCHIVE"], mine["CHECKSUM"], mine["OFFICIAL_CKPT"]) == ("my.tgz", True, "my.pt")


def test_chapter_01_makes_stand_ins_only_without_an_archive(book_dir, fake_standins):
    setup.data(parameters("01_data", SMOKE=True, TRACK="gpu", IMAGENETTE_ARCHIVE="mine.tgz"))
    assert fake_standins == []
    params = parameters("01_data", SMOKE=True, TRACK="gpu")
    ch = setup.data(params)
    assert fake_standins and params["CHECKSUM"] is False and ch.download is False
    assert (params["GRID_PER_CLASS"], params["MESSY_IMAGES"]) == (4, 8)


def test_the_gpu_track_downloads_only_outside_smoke_runs(book_dir):
    ch = setup.data(parameters("01_data", TRACK="gpu"))
    assert ch.download is True and ch.data_dir == Path("../data/imagenette")
    assert setup.data(parameters("01_data", TRACK="gpu", DOWNLOAD=False)).download is False
    assert setup.data(parameters("01_data", TRACK="cpu")).download is False


def test_chapter_02_sizes_by_device(book_dir, fake_standins):
    cpu = parameters("02_latents", DEVICE="cpu")
    ch = setup.latents(cpu)
    assert (cpu["IMAGE_SIZE"], cpu["NUM_IMAGES"], cpu["BATCH_SIZE"], cpu["COMPARE_IMAGES"]) == (128, 8, 4, 1)
    assert ch.gpu is False and ch.download is False and ch.stand is None and ch.precision == "fp32"
    smoke = parameters("02_latents", SMOKE=True, TRACK="gpu", DEVICE="cpu")
    ch = setup.latents(smoke)
    assert ch.stand is not None and (smoke["IMAGE_SIZE"], smoke["GPU_IMAGE_SIZE"], smoke["RECON_IMAGES"]) == (32, 32, 4)


def test_chapter_05b_smoke_run_trains_a_tiny_model_in_its_own_folders(book_dir, fake_standins):
    params = parameters("05b_your_data", SMOKE=True, TRACK="gpu")
    ch = setup.your_data(params)
    assert params["OWN_RUN_DIR"].startswith(params["OUT_DIR"]) and params["GPU_RUN_DIR"].startswith(params["OUT_DIR"])
    assert params["OWN_MAX_STEPS"] == 10 and ch.own_overrides == setup.OWN_TINY and params["VAE"].endswith("vae")
    default = setup.your_data(parameters("05b_your_data"))
    assert default.own_overrides == {} and (default.gpu_image_size, default.calibration_steps) == (256, 50)


def test_chapter_06_sizes_the_ladder_for_the_device(book_dir):
    params = parameters("06_memory_and_speed", DEVICE="cpu")
    ch = setup.memory_and_speed(params)
    assert (params["MODEL"], params["BATCH_SIZE"], params["INCLUDE_COMPILE"], params["ISOLATE"]) == ("digits", 64, False, False)
    assert (ch.spec.batch_size, ch.spec.device, ch.gpu) == (64, "cpu", False)
    smoke = parameters("06_memory_and_speed", SMOKE=True)
    assert setup.memory_and_speed(smoke).spec.model == "tiny" and smoke["CARDS_GIB"] == [12, 24, 80]


def test_chapter_08_small_runs_train_and_keep_their_logs(book_dir):
    params = parameters("08_troubleshooting", SMOKE=True)
    ch = setup.troubleshooting(params)
    assert ch.runs_dir == Path(params["OUT_DIR"]) / "runs" and len(ch.digits) > 1000
    (ch.runs_dir / "old").mkdir(parents=True)
    setup.troubleshooting(params)  # a rerun starts from clean scratch folders
    assert not (ch.runs_dir / "old").exists()
    summary = ch.runs.run("tiny", max_steps=3, batch_size=8)
    cfg = __import__("yaml").safe_load((ch.runs_dir / "tiny" / "config.yaml").read_text())
    assert summary["steps"] == 3 and (cfg["batch_size"], cfg["lr"], cfg["depth"]) == (8, 1e-3, params["TINY_DIT"]["depth"])
    losses = ch.runs.losses("tiny")
    assert sorted(losses) == [1, 2, 3] and all(v == v for v in losses.values())
    assert (ch.runs_dir / "tiny" / "log.txt").read_text().strip()  # the console lines went here, not to the page


def test_the_appendix_reads_the_h200_ladder(book_dir):
    ch = setup.tutorial_claims(parameters("appendix_tutorial_claims"))
    assert ch.rows and {"baseline", "ckpt", "amp", "all"} <= set(ch.rows)
    params = 675_129_632  # DiT-XL/2 at 256 px, pos_embed included
    assert 19.9 * params < ch.static < 20.1 * params  # 20 bytes a parameter: weights, gradients, AdamW, EMA
    missing = setup.tutorial_claims(parameters("appendix_tutorial_claims", GPU_RESULTS=str(book_dir)))
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

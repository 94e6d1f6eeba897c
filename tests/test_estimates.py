"""One set of numbers: the training-time table (dit_core.measure.estimates) against its sources and the pages.

* every measured utilisation in the table equals the GPU record it names (benchmarks/results/*.json);
* the FLOPs per image are the ones the library's counter gives, the cards' peaks the ones of facts.md §8, and
  each profile's configuration is the one its anchor measured;
* the estimates are the arithmetic the module's docstring states;
* the pages use the table: a markdown page that quotes a training time holds the table verbatim, a notebook that
  quotes one computes it with the module (chapter 06 prints the table), and no page keeps its own table of GPU
  peaks.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from dit_core.measure import estimates as est

nbformat = pytest.importorskip("nbformat")

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS = REPO_ROOT / "benchmarks" / "results"
BOOK = REPO_ROOT / "book"
PAGES = sorted(BOOK.glob("*.md")) + sorted(BOOK.glob("*.ipynb"))

def _json(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


# ------------------------------------------------------------------------------------------ the sources
def test_anchors_are_the_recorded_measurements():
    ladder = _json("nvidia-h200-dit-xl2.json")
    rows = {r["rung"]: r for run in ladder["results"] for r in run["rows"]}
    best = rows["all-no-ckpt"]
    assert est.ANCHORS["best-rung"].mfu == pytest.approx(best["mfu"], abs=5e-5)
    assert est.ANCHORS["best-rung"].images_per_s == pytest.approx(best["images_per_s"], abs=0.01)

    planner = {r["label"]: r for r in _json("nvidia-h200-planner-check.json")["rows"]}
    for key in ("80gb", "40gb", "24gb-planned"):
        anchor = est.ANCHORS[key]
        label = anchor.record.split("row '", 1)[1].rstrip("'")
        row = planner[label]
        assert anchor.mfu == pytest.approx(est.mfu_of(row["images_per_s"], 989.0), abs=5e-5), key
        assert anchor.images_per_s == pytest.approx(row["images_per_s"], abs=0.05), key
        setup = row["plan"]["setup"]
        assert (anchor.micro_batch, anchor.grad_accum, anchor.checkpointed_blocks) == (
            setup["micro_batch"], setup["grad_accum"], setup["checkpointed"]), key

    profiles = {r["profile"]: r for r in _json("nvidia-h200-profiles.json")["rows"]}
    steady = profiles["rtx3090-24gb"]["steady_images_per_s"]
    anchor = est.ANCHORS["24gb-profile"]
    assert anchor.images_per_s == pytest.approx(steady, abs=0.05)
    assert anchor.mfu == pytest.approx(est.mfu_of(steady, 989.0), abs=5e-5)

    sampling = next(run["sampling"] for run in ladder["results"] if "sampling" in run)
    assert est.SAMPLING_ANCHOR.images_per_s == pytest.approx(sampling["images_per_s"], abs=5e-4)
    assert est.SAMPLING_ANCHOR.mfu == pytest.approx(
        sampling["images_per_s"] * sampling["model_tflop_per_image"] / 989.0, abs=5e-5)
    assert sampling["model_tflop_per_image"] == pytest.approx(2 * 250 * 2 * est.FORWARD_GMACS_XL2_256 / 1e3,
                                                              abs=1e-3)
    # the records were measured against the H200's peak, which the card table gives
    assert ladder["results"][0]["environment"]["peak_bf16_tflops"] == est.card("H200").peak_tflops


def test_flops_per_image_are_the_counters():
    from dit_core.measure.flops import forward_macs, meta_model

    gmacs = forward_macs(meta_model("DiT-XL/2", image_size=256)) / 1e9
    assert est.FORWARD_GMACS_XL2_256 == pytest.approx(gmacs, abs=5e-4)
    recorded = _json("nvidia-h200-dit-xl2.json")["results"][0]["model"]["train_gflop_per_image"]
    assert est.TRAIN_GFLOP_PER_IMAGE == pytest.approx(recorded, abs=5e-3)


def test_card_peaks_are_the_dense_bf16_figures():
    # facts.md §8: dense = half the datasheets' sparse figures; GeForce cards at the fp32-accumulate rate
    expected = {"H100 SXM": 989.0, "H100 PCIe": 756.0, "H200": 989.0, "A100 80GB": 312.0, "A100 40GB": 312.0,
                "RTX 4090": 165.2, "RTX 3090": 71.0, "RTX 3060": 25.5}
    assert {c.name: c.peak_tflops for c in est.CARDS} == expected
    # the GA10x rule that derives the 3060's figure gives the 3090's published one (82 SMs, 1.695 GHz)
    assert est._ampere_geforce_peak(82, 1.695) == pytest.approx(71.0, rel=0.01)
    assert "derived" in est.card("RTX 3060").peak_source
    assert est.peak_tflops("NVIDIA H100 PCIe") == 756.0
    assert est.peak_tflops("NVIDIA H100 80GB HBM3") == 989.0
    assert est.peak_tflops("NVIDIA H200") == 989.0
    assert est.peak_tflops("NVIDIA A100-SXM4-40GB") == 312.0
    assert est.peak_tflops("NVIDIA GeForce RTX 3060") == 25.5
    assert est.peak_tflops("Tesla T4") is None
    with pytest.raises(ValueError, match="unknown card 'RTX 9999'; known: H100 PCIe"):
        est.card("RTX 9999")


def test_each_profile_runs_the_configuration_its_anchor_measured():
    for c in est.CARDS:
        if c.profile is None:
            continue
        cfg = yaml.safe_load((REPO_ROOT / "dit_core" / "configs" / f"{c.profile}.yaml").read_text())
        accum = cfg.get("grad_accum", 1)
        micro = cfg["batch_size"] // accum
        ckpt = cfg.get("grad_checkpointing", False)
        blocks = 28 if ckpt is True else int(ckpt or 0)
        assert c.configuration.startswith(f"{micro} x {accum}"), (c.name, c.configuration)
        assert ("every block checkpointed" in c.configuration) == (blocks == 28), c.name
        anchor = est.ANCHORS[c.anchor]
        measured = (anchor.micro_batch, anchor.grad_accum, anchor.checkpointed_blocks)
        if c.note:  # a stand-in (another optimizer, EMA place or layout than was measured), said so in the table
            assert "not measured" in c.note, c.name
        else:
            assert measured == (micro, accum, blocks), (
                f"{c.name}: profile {c.profile} runs {micro} x {accum} with {blocks} blocks checkpointed, but its "
                f"anchor measured {measured}; anchor it on a measurement of that configuration")


# ------------------------------------------------------------------------------------------ the arithmetic
def test_training_estimate_is_work_over_peak_times_mfu():
    row = est.training_estimate("H100 SXM")
    work = 400_000 * 256 * 711.726e9  # FLOP
    assert row["days"] == pytest.approx(work / (989e12 * 0.2701) / 86_400, rel=1e-4)
    assert row["images_per_s"] == pytest.approx(989e12 * 0.2701 / 711.726e9, rel=1e-4)
    # a PCIe H100 is slower by its peak alone, a 40 GB A100 by its configuration too
    assert est.training_estimate("H100 PCIe")["days"] / row["days"] == pytest.approx(989 / 756)
    assert est.training_estimate("A100 40GB")["days"] / est.training_estimate("A100 80GB")["days"] == (
        pytest.approx(0.2701 / 0.2103))
    assert est.training_estimate("RTX 3090", steps=1000, mfu=0.5)["seconds"] == pytest.approx(
        1000 * 256 * 711.726e9 / (71e12 * 0.5), rel=1e-4)
    with pytest.raises(ValueError, match="H200 has no profile anchor"):
        est.training_estimate("H200")


def test_published_single_a100_figures_against_the_estimate():
    fast_dit = est.PUBLISHED["fast-DiT, A100 80GB"]["images_per_s"]
    assert fast_dit == pytest.approx(107.52)
    assert est.mfu_of(fast_dit, 312.0) == pytest.approx(0.245, abs=5e-4)
    # fast-DiT ran with checkpointing (its MFU carries the recomputation): our estimate for the a100-80gb
    # configuration (no checkpointing) must be faster, but not by more than recomputation could explain
    ours = est.training_estimate("A100 80GB")["images_per_s"]
    assert fast_dit < ours < fast_dit * 4 / 3


def test_sampling_estimate():
    seconds = est.sampling_seconds_per_image("H200")
    assert seconds == pytest.approx(1 / est.SAMPLING_ANCHOR.images_per_s, rel=1e-3)  # back to the measurement
    assert est.sampling_seconds_per_image("H200", steps=25) == pytest.approx(seconds / 10)
    assert est.sampling_seconds_per_image("H200", guided=False) == pytest.approx(seconds / 2)


def test_format_days():
    assert est.format_days(3.16) == "~3.2 days"
    assert est.format_days(12.9) == "~13 days"
    assert est.format_days(84.3) == "~84 days (~12 weeks)"


# ------------------------------------------------------------------------------------------ the pages
def _texts(page: Path) -> tuple[str, str]:
    """(prose, code) of a page: a markdown page is all prose; a notebook's markdown and code cells apart."""
    if page.suffix == ".md":
        return page.read_text(), ""
    nb = nbformat.read(page, as_version=4)
    prose = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    return prose, code


_TIME = re.compile(r"(?<![\w.])\d+(?:\.\d+)?\s*(?:days?|weeks?)\b")
_CARD = r"(?:RTX\s?\d{4}|A100|H100|H200)"
#: a dict literal or mapping in code from a card name to a number: a page's own table of peaks
_PEAK_DICT = re.compile(r"[\"'][^\"'\n]*" + _CARD + r"[^\"'\n]*[\"']\s*:\s*\d")
#: prose of the form "RTX 3060 (51 TFLOP/s" or "H100, 989 TFLOP/s": a card with its peak
_PEAK_PROSE = re.compile(r"(" + _CARD + r"(?:\s?(?:SXM|PCIe|80GB|40GB))?)[,:]?\s*\(?~?(\d+(?:\.\d+)?)\s*TFLOP/s")


def _quotes_training_time(prose: str, code: str) -> bool:
    return bool(_TIME.search(prose)) or "86400" in code.replace("_", "") or re.search(r"\bdays\b", code) is not None


def _uses_the_module(code: str) -> bool:
    return bool(re.search(r"(?:from dit_core\.measure import[^\n]*\bestimates\b|dit_core\.measure\.estimates)", code))


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_pages_use_the_table(page):
    prose, code = _texts(page)
    problems = []
    if _quotes_training_time(prose, code):
        if page.suffix == ".md":
            table = est.markdown_table()
            if table not in prose:
                problems.append("quotes training times but does not hold `python -m dit_core.measure.estimates`'s "
                                "table verbatim")
            allowed = set(_TIME.findall(table))
            stray = sorted(set(_TIME.findall(prose)) - allowed)
            if stray:
                problems.append(f"quotes times that are not in the table: {stray}")
        elif not _uses_the_module(code):
            problems.append("quotes training times without computing them with dit_core.measure.estimates")
    own = _PEAK_DICT.findall(code)
    if own:
        problems.append(f"keeps its own GPU peaks in code ({own[:3]}); use dit_core.measure.estimates.CARDS")
    for name, value in _PEAK_PROSE.findall(prose):
        c = est.card_for_device(name)
        if c is not None and abs(float(value) - c.peak_tflops) > 0.051 * c.peak_tflops:
            problems.append(f"gives {name} a peak of {value} TFLOP/s; the table says {c.peak_tflops:g} ({c.name})")
    assert not problems, f"book/{page.name}: " + "; ".join(problems)


def test_the_page_check_catches_a_wrong_page():
    wrong_page = "| H100 (989 TFLOP/s) | ~340 | ~3.5 days |\n| RTX 3060 (51 TFLOP/s) | ~9 weeks |"
    assert _quotes_training_time(wrong_page, "")
    assert est.markdown_table() not in wrong_page
    assert [(n, v) for n, v in _PEAK_PROSE.findall(wrong_page)] == [("H100", "989"), ("RTX 3060", "51")]
    assert abs(51 - est.card_for_device("RTX 3060").peak_tflops) > 1
    wrong_code = 'peaks = {"RTX 3060": 51, "H100": 989}\nprint(f"{x / 86400:.1f} days")'
    assert _PEAK_DICT.findall(wrong_code) and _quotes_training_time("", wrong_code) and not _uses_the_module(wrong_code)
    assert _uses_the_module("from dit_core.measure import estimates\n")

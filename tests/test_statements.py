"""Statements the book makes that its own code can check: a section a page points to exists, a figure computed from
a schedule or the planner is the one the page prints, a GPU profile is the setting the planner chooses for its card.

Figures that come from a measurement are bound to their record by ``dit_book.records.QUOTES``
(tests/test_records.py); the ones here come from code, so the code is the record.
"""

import json
import re
from pathlib import Path

import numpy as np
import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
BOOK = REPO_ROOT / "book"


def _markdown(path: Path) -> str:
    if path.suffix == ".ipynb":
        cells = json.loads(path.read_text())["cells"]
        return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    return path.read_text()


def _pages() -> list[Path]:
    return sorted(BOOK.glob("*.ipynb")) + sorted(BOOK.glob("*.md")) + [REPO_ROOT / "README.md"]


def _headings() -> set[str]:
    """The numbers of every numbered heading of the chapters: ``7b.5`` for ``## 7b.5 Masked training``."""
    found = set()
    for nb in BOOK.glob("*.ipynb"):
        found |= set(re.findall(r"(?m)^#{1,4} (\d+[a-c]?(?:\.\d+)?)\.? ", _markdown(nb)))
    return found


SECTION_REF = re.compile(r"\b[Ss]ections? (\d+[a-c]?\.\d+)|§ ?(\d+[a-c]?\.\d+)")


def section_references(text: str) -> list[str]:
    return [a or b for a, b in SECTION_REF.findall(text)]


def test_the_section_finder_reads_the_ways_pages_write_sections():
    assert section_references("as section 7b.5 measures; Section 5.2 and § 6.9, sections 0.3") == \
        ["7b.5", "5.2", "6.9", "0.3"]
    assert "7b.5" in _headings() and "6.9" in _headings()
    assert "7b.99" not in _headings()


def test_every_section_a_page_points_to_exists():
    headings = _headings()
    missing = [f"{page.relative_to(REPO_ROOT)}: section {ref}" for page in _pages()
               for ref in section_references(_markdown(page)) if ref not in headings]
    assert not missing, "pages point to sections no chapter has (renumber the reference):\n" + "\n".join(missing)


# -------------------------------------------------------------------------------------------------- noise schedules
def _first_step_below_one_percent_snr(schedule: str) -> int:
    """The timestep, counted from 1 as the chapters count it, where the SNR first falls below 1 %."""
    from dit_core.diffusion.schedule import get_named_beta_schedule

    alpha_bar = np.cumprod(1.0 - get_named_beta_schedule(schedule, 1000))
    return int(np.argmax(alpha_bar / (1.0 - alpha_bar) < 0.01)) + 1


@pytest.mark.parametrize("page, pattern", [
    ("book/05_training.ipynb", r"falls below 1 % after\s+\$t \\approx (\d+)\$.*?stays above 1 % until\s+\$t \\approx (\d+)\$"),
    ("benchmarks/results/digits-profile.md", r"1 % signal-to-noise after t = (\d+).*?until t = (\d+)"),
    ("dit_core/configs/digits.yaml", r"1% signal-to-noise after t = (\d+)()"),
])
def test_the_snr_thresholds_a_page_quotes_are_the_schedules(page, pattern):
    text = _markdown(REPO_ROOT / page)
    match = re.search(pattern, re.sub(r"\s+", " ", text).replace("# ", ""))
    assert match, f"{page} no longer states where the SNR falls below 1 % (update this test's pattern)"
    linear, cosine = match.groups()
    assert int(linear) == _first_step_below_one_percent_snr("linear"), page
    if cosine:
        assert int(cosine) == _first_step_below_one_percent_snr("cosine"), page


# -------------------------------------------------------------------------------------------------- utilisation
def test_fast_dits_utilisation_as_chapter_5_quotes_it():
    """24.5 % counts the model's FLOPs only; with the forward that checkpointing recomputes it is about 33 %."""
    from dit_core.measure.estimates import FORWARD_GMACS_XL2_256, PUBLISHED, card, mfu_of

    pub = PUBLISHED["fast-DiT, A100 80GB"]
    peak = card(pub["card"]).peak_tflops
    model_only = mfu_of(pub["images_per_s"], peak)
    with_recompute = mfu_of(pub["images_per_s"], peak, gflop_per_image=8 * FORWARD_GMACS_XL2_256)
    text = re.sub(r"\s+", " ", _markdown(BOOK / "05_training.ipynb"))
    assert f"{100 * model_only:.1f} % MFU counting the model's 712 GFLOP an image" in text
    assert f"(about {100 * with_recompute:.0f} % with the forward that checkpointing recomputes)" in text


# -------------------------------------------------------------------------------------------------- checkpointing
def test_chapter_6_checkpointing_savings_are_the_planners():
    from dit_core.measure.memory import activation_bytes
    from dit_core.measure.memory.estimator import ModelShape

    shape = ModelShape.from_name("DiT-XL/2")
    text = re.sub(r"\s+", " ", _markdown(BOOK / "06_memory_and_speed.ipynb"))
    for precision, where in (("bf16", " an image on the H200"), ("fp32", ", by `dit-plan`")):
        full = activation_bytes(shape, precision, "sdpa", 0).per_sample / 2**20
        ckpt = activation_bytes(shape, precision, "sdpa", shape.depth).per_sample / 2**20
        said = f"{full / ckpt:.0f}x" + (" smaller in bf16" if precision == "bf16" else " in fp32")
        assert f"{said} ({full:.1f} against {ckpt:.1f} MiB{where}" in text, (precision, said)


# -------------------------------------------------------------------------------------------------- GPU profiles
@pytest.mark.parametrize("profile, card", [("rtx3060-12gb", 12), ("rtx3090-24gb", 24), ("a100-40gb", 40),
                                           ("a100-80gb", 80), ("h100-80gb", 80)])
def test_each_gpu_profile_is_the_planners_choice_for_its_card(profile, card):
    """A profile that trains slower than what ``dit-plan`` picks for the same card has to say why: none does."""
    from dit_core.measure.memory import config_setup, fitting_plan
    from dit_core.train import make_config

    shape, setup = config_setup(make_config(profile))
    chosen, _ = fitting_plan(shape, card, setup.micro_batch * setup.grad_accum, setup.precision, setup.attn)
    assert chosen.fits
    keys = ("micro_batch", "grad_accum", "checkpointed", "optimizer", "ema")
    ours, planners = ({k: getattr(s, k) for k in keys} for s in (setup, chosen.setup))
    if ours != planners:  # allowed where the profile names the planner's choice and says why not
        said = re.sub(r"\s*#\s*", " ", (REPO_ROOT / "dit_core" / "configs" / f"{profile}.yaml").read_text())
        why = f"not the planner's choice of {planners['checkpointed']} of {shape.depth} blocks"
        assert {**ours, "checkpointed": 0} == {**planners, "checkpointed": 0} and why in said, (
            f"{profile} is {ours}, the planner chooses {planners} for {card} GiB: make the profile the planner's "
            f"choice, or say in its comments why not ('{why}', with the figure that decided)")

"""The introduction's route by hardware: which chapters to run on a laptop, a 12 GB, a 24 GB and a 40-80 GB card,
what they cost there, and what the reader has at the end.

Generated like the chapter table beside it (:mod:`dit_book.timings`) and from the same sources: CPU times measured
by ``make book`` (``book/_timings.json``); GPU times measured where a GPU has run a chapter on that card, otherwise
**estimated** the way the chapter table estimates them (:func:`dit_book.timings.gpu_estimates`: the H200's measured
speeds scaled by the card's dense 16-bit peak, chapter 7c's studies as :func:`dit_book.findings_gpu.plan` sizes them
for the card, a minute of start-up per GPU-track chapter, :data:`dit_book.timings.OTHER_GPU_WORK`, and the CPU time
as the bound of chapters without GPU work), here for each card of :data:`ROUTES` instead of the table's one.
``python -m dit_book timings intro`` (and so ``make book``) rewrites the table between the markers of :data:`BEGIN`
and :data:`END` (:mod:`dit_book.intro_tables`); tests/test_intro.py checks it.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from . import timings, track

BEGIN = "<!-- route table: generated from book/_timings.json and dit_book.track by `python -m dit_book timings intro` -->"
END = "<!-- end of the route table -->"


@dataclass(frozen=True)
class Route:
    hardware: str                # the row's name
    cards: tuple[str, ...]       # cards the times are given for (names as torch reports them); () for the CPU
    end: str                     # what the reader has at the end, after what every route gives
    next_profiles: tuple[str, ...] = ()   # the profiles of dit_core/configs for DiT-XL/2 on that hardware


ROUTES = (
    Route("a laptop, no GPU", (), "your own digits DiT, trained (chapter 5), sampled and scored (7); your "
          "folder, trained briefly (5b)"),
    Route("12 GB", ("NVIDIA GeForce RTX 3060",), "", ("rtx3060-12gb",)),
    Route("24 GB", ("NVIDIA GeForce RTX 3090", "NVIDIA GeForce RTX 4090"), "", ("rtx3090-24gb",)),
    Route("40-80 GB", ("NVIDIA A100", "NVIDIA H100 SXM"), "", ("a100-40gb", "a100-80gb", "h100-80gb")),
)


def short(card: str) -> str:
    return card.replace("NVIDIA GeForce ", "").replace("NVIDIA ", "")


def chapter_seconds(stem: str, card: str, data: dict) -> tuple[float, bool]:
    """``(seconds, measured)`` of chapter ``stem`` on ``card``: a GPU measurement that names the card, else the
    chapter table's estimate (:func:`dit_book.timings.gpu_time`) made for this card."""
    measured = timings.gpu_time(stem, data)
    if measured.measured and short(card).lower() in measured.source.lower():
        return measured.seconds, True
    costs = timings.gpu_estimates(track.card_peak(card))
    if stem in costs:
        return costs[stem] + timings.START_UP_S, False
    if stem in timings.OTHER_GPU_WORK:
        return timings.OTHER_GPU_WORK[stem][0], False
    cpu = timings.cpu_entry(stem, data)
    return (cpu["seconds"] if cpu else timings.START_UP_S), False


def _minutes(seconds: float) -> str:
    return f"~{max(1, round(seconds / 60)):.0f}"


def _cpu_cells(stems: list[str], data: dict) -> tuple[str, str]:
    entries = [timings.cpu_entry(s, data) for s in stems]
    known = [e for e in entries if e]
    total = timings.format_seconds(sum(e["seconds"] for e in known))
    machine = Counter(e["machine"].split(",")[0] + f", {e['machine'].split(',')[1].strip()}" for e in known
                      ).most_common(1)[0][0] if known else "?"
    missing = len(stems) - len(known)
    when = f"measured on an {machine}" + (f"; {missing} not measured yet" if missing else "")
    return f"all {len(stems)}", f"{total} ({when})"


def _both(values: list[str]) -> str:
    """``a / b`` for the cards of a row, or one value when they agree."""
    return values[0] if len(set(values)) == 1 else " / ".join(values)


def _gpu_cells(route: Route, stems: list[str], data: dict, first: bool) -> tuple[str, str, str, str]:
    from dit_core.train import make_config

    cfg = make_config("imagenette-b2")
    costs = timings.gpu_estimates(track.card_peak(route.cards[0]))
    heavy = [s for s in stems if costs.get(s, 0.0) > 60.0]
    totals, per_chapter, steps, fid = [], {s: [] for s in heavy}, [], []
    estimated = False
    for card in route.cards:
        seconds = {s: chapter_seconds(s, card, data) for s in stems}
        estimated |= not all(m for _, m in seconds.values())
        totals.append(_minutes(sum(t for t, _ in seconds.values())))
        for s in heavy:
            per_chapter[s].append(_minutes(seconds[s][0]))
        peak = track.card_peak(card)
        rate = track.train_images_per_s(cfg.model, peak) * 60 * track.DEFAULTS["train_minutes"] / cfg.batch_size
        steps.append(f"~{float(f'{rate:.2g}'):,.0f}")  # an estimate: two significant digits
        fid.append(f"{track.fid_samples_within(peak):,}")
    split = ", ".join(f"{s.split('_')[0]} {_both(v)}" for s, v in per_chapter.items())
    time = f"{' / '.join(totals)} min ({'estimate' if estimated else 'measured'}: {split})"
    nxt = "next: " + ", ".join(f"`{p}`" for p in route.next_profiles)
    if first:
        gpu_track = ", ".join(s.split("_")[0] for s in stems if s in costs)
        chapters = f"all {len(stems)}; {gpu_track} take the GPU track"
        end = (f"Imagenette latents; a {cfg.model} after {track.DEFAULTS['train_minutes']:.0f} minutes ({_both(steps)} "
               f"steps, estimate), longer at each re-run; its FID beside the official DiT-XL/2's ({_both(fid)} "
               f"samples); {nxt}")
    else:
        chapters = "the same"
        end = f"{_both(steps)} steps (estimate), {_both(fid)} FID samples; {nxt}"
    return f"{route.hardware}: {' / '.join(short(c) for c in route.cards)}", chapters, time, end


def table(stems: list[str], data: dict | None = None) -> str:
    """The route table, as markdown, for the chapters ``stems`` (the notebooks of _toc.yml, in order)."""
    data = timings.load() if data is None else data
    rows = ["| hardware | chapters, in order | time | at the end you have |", "|---|---|---|---|"]
    first = True
    for route in ROUTES:
        if route.cards:
            rows.append("| " + " | ".join(_gpu_cells(route, stems, data, first)) + " |")
            first = False
        else:
            chapters, time = _cpu_cells(stems, data)
            rows.append(f"| {route.hardware} | {chapters}, on the CPU track | {time} | {route.end} |")
    return "\n".join(rows)


def toc_stems(toc_path=None) -> list[str]:
    """The chapters of _toc.yml that are notebooks, in order (the rows of the introduction's chapter table)."""
    import yaml

    toc_path = toc_path or timings.REPO_ROOT / "_toc.yml"
    toc = yaml.safe_load(open(toc_path).read())
    return [c["file"].split("/")[-1] for c in toc.get("chapters", [])
            if "file" in c and (timings.REPO_ROOT / f"{c['file']}.ipynb").is_file()]


def render_routes(text: str, data: dict | None = None, stems: list[str] | None = None) -> str:
    """``text`` (the introduction) with the table between :data:`BEGIN` and :data:`END` regenerated; unchanged when
    the markers are not there."""
    pattern = re.compile(re.escape(BEGIN) + r"\n.*?\n" + re.escape(END), re.S)
    if not pattern.search(text):
        return text
    body = table(stems or toc_stems(), data)
    return pattern.sub(lambda _: f"{BEGIN}\n\n{body}\n\n{END}", text, count=1)

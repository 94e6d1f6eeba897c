"""The book's front page stays true to the book: every chapter and every profile is on it, no placeholder left.

book/intro.md is what a reader meets first: DiT in one picture (a figure drawn for the book), its chapter map
(with the time each chapter takes) listing every chapter of _toc.yml, its table of profiles listing every profile
in dit_core/configs (generated from the records: tests/test_records.py), the bibliography and the
execution-statistics table of the build; and it stays short enough to read first.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
INTRO = REPO_ROOT / "book" / "intro.md"


def _chapters() -> list[str]:
    """The notebooks of _toc.yml (chapters and appendix; pages such as the notation page are not in the map)."""
    toc = yaml.safe_load((REPO_ROOT / "_toc.yml").read_text())
    return [Path(c["file"]).name for c in toc.get("chapters", [])
            if "file" in c and (REPO_ROOT / f"{c['file']}.ipynb").is_file()]


def _table_rows(text: str, heading: str) -> list[str]:
    """The table rows (lines starting with '|') of the section under ``## heading``."""
    section = text.split(f"## {heading}", 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("|")]


def test_chapter_map_links_every_chapter_with_both_times():
    text = INTRO.read_text()
    rows = _table_rows(text, "The chapters")
    linked = re.findall(r"\]\(([\w-]+)\.ipynb\)", "\n".join(rows))
    missing = [s for s in linked if not (REPO_ROOT / "book" / f"{s}.ipynb").is_file()]
    assert not missing, f"book/intro.md: the chapter map links notebooks that book/ does not hold: {missing}"
    for stem in _chapters():
        row = [r for r in rows if f"]({stem}.ipynb)" in r]
        assert row, f"book/intro.md: the chapter map has no row linking {stem}.ipynb; add one (with its times)"
        cells = [c.strip() for c in row[0].strip("|").split("|")]
        assert len(cells) == 5 and all(cells[3:]), (
            f"book/intro.md: the row of {stem} needs 5 columns, the last two the CPU and GPU times: {row[0]}"
        )
    assert linked == _chapters(), f"book/intro.md: the chapter map is not in _toc.yml order: {linked}"


def test_every_profile_is_described():
    text = INTRO.read_text()
    rows = "\n".join(_table_rows(text, "The profiles"))
    profiles = sorted(p.stem for p in (REPO_ROOT / "dit_core" / "configs").glob("*.yaml"))
    assert profiles, "no profiles found in dit_core/configs"
    missing = [p for p in profiles if f"`{p}`" not in rows]
    assert not missing, f"book/intro.md: the profile table ('The profiles') lacks {missing}"


def test_it_opens_with_dit_in_one_picture():
    """The first section is the pipeline figure, an SVG drawn for the book that a browser can size and that says
    what it shows (training: image, VAE, latent, noise, DiT, loss; sampling: noise, DiT N times, decoder)."""
    import xml.etree.ElementTree as ET

    text = INTRO.read_text()
    first = re.findall(r"^## (.+)$", text, re.M)[0]
    assert first == "DiT in one picture", f"book/intro.md: the first section must be 'DiT in one picture', not {first!r}"
    figure = re.search(r"```\{figure\} (\S+)", text.split("## DiT in one picture", 1)[1])
    assert figure, "book/intro.md: 'DiT in one picture' opens with a {figure} directive"
    svg = (INTRO.parent / figure.group(1)).resolve()
    assert svg.suffix == ".svg" and svg.is_file(), f"book/intro.md: the figure {figure.group(1)} is not an SVG file"
    assert "_static" not in svg.parts, "the figure is the book's own drawing, not a vendored file in _static"
    root = ET.parse(svg).getroot()
    assert float(root.get("width")) > 0 and float(root.get("height")) > 0, (
        f"{svg.name}: give the <svg> a width and a height, or the browser cannot size the image")
    words = " ".join(t.strip() for t in root.itertext()).lower()
    for word in ("image", "vae encoder", "latent", "noise", "dit", "loss", "applied n times", "vae decoder"):
        assert word in words, f"{svg.name}: the pipeline figure does not show {word!r}"


def _prose_words(text: str) -> int:
    """Words of the page outside code blocks, directives and HTML comments."""
    text = re.sub(r"```.*?```", " ", text, flags=re.S)
    text = re.sub(r"<!--.*?-->", " ", text, flags=re.S)
    return len(re.findall(r"[A-Za-z0-9][\w'.,%/-]*", text))


def test_it_stays_short():
    words = _prose_words(INTRO.read_text())
    assert words <= 1500, f"book/intro.md has {words} words (tables included); keep it at most 1,500"


def test_the_hardware_arithmetic_is_not_in_the_intro():
    """Peaks, MFU and accumulate rates belong to chapter 06; the intro gives the idea and the map."""
    text = INTRO.read_text()
    found = [w for w in ("MFU", "TFLOP/s", "fp32-accumulate", "sparsity") if w in text]
    assert not found, f"book/intro.md: hardware arithmetic belongs to chapter 06, found {found}"


def test_no_placeholders_and_the_generated_sections_are_there():
    text = INTRO.read_text()
    leftovers = re.findall(r"\b(?:TIME_\w+|TODO|TBD|XXX)\b", text)
    assert not leftovers, f"book/intro.md: placeholders left: {sorted(set(leftovers))}"
    assert "```{bibliography}" in text, "book/intro.md must hold the bibliography"
    assert "```{nb-exec-table}" in text, "book/intro.md must show the execution times of the build"


# ------------------------------------------------------------------------------------------------ run times
# The chapter table's time columns and every chapter's "Running this chapter" box come from book/_timings.json,
# which `make book` rewrites after each build (dit_book/timings.py).
from dit_book import timings  # noqa: E402

TIMINGS = REPO_ROOT / "book" / "_timings.json"


def test_intro_time_columns_are_the_timings_file():
    data = timings.load(TIMINGS)
    rows = _table_rows(INTRO.read_text(), "The chapters")
    for stem in _chapters():
        cells = [c.strip() for c in next(r for r in rows if f"]({stem}.ipynb)" in r).strip("|").split("|")]
        assert tuple(cells[3:]) == timings.intro_cells(stem, data), (
            f"book/intro.md: the times of {stem} ({cells[3:]}) are not book/_timings.json's "
            f"{timings.intro_cells(stem, data)}; run `python -m dit_book timings intro`")
    total = [c.strip() for c in next(r for r in rows if "**all**" in r).strip("|").split("|")]
    assert tuple(total[3:]) == timings.intro_total(_chapters(), data), (
        "book/intro.md: the 'all' row is not the sum of book/_timings.json; run `python -m dit_book timings intro`")
    assert timings.render_intro(INTRO.read_text(), data) == INTRO.read_text()


def test_every_recorded_time_says_where_it_comes_from():
    data = timings.load(TIMINGS)
    for stem, kinds in data["chapters"].items():
        for kind, entry in kinds.items():
            missing = {"seconds", "date", "commit", "machine", "how"} - set(entry)
            assert kind in ("cpu", "gpu") and not missing and entry["seconds"] > 0, (
                f"book/_timings.json, {stem} ({kind}): incomplete entry, missing {missing}")
    # a chapter that no `make book` has run yet (a new one) is shown as such until the next build records it
    unmeasured = [s for s in _chapters() if timings.cpu_entry(s, data) is None]
    assert all(timings.intro_cells(s, data)[0] == "not measured yet" for s in unmeasured)


def test_the_box_shows_the_file():
    from html import escape

    data = timings.load(TIMINGS)
    for stem in _chapters():
        box = timings.ChapterBox(stem, data)
        entry = timings.cpu_entry(stem, data)
        html = box._repr_html_()
        assert "Running this chapter" in html and f'data-chapter="{stem}"' in html
        if entry is None:  # a new chapter until the next make book records it
            assert "not measured yet" in html, stem
        else:
            assert f"<strong>{timings.format_seconds(entry['seconds'])}</strong>" in html, stem
            assert entry["commit"] in html and entry["date"] in html, stem
        gpu = timings.gpu_time(stem, data)
        assert f"<strong>{escape(gpu.text)}</strong>" in html and ("estimate" in html) == (not gpu.measured), stem
    # a chapter the file does not know yet says so, and the next make book fills it in
    assert "not measured yet" in repr(timings.ChapterBox("99_new_chapter", {"chapters": {}}))


def test_formats():
    assert [timings.format_seconds(s) for s in (4, 48.4, 59.4, 108, 720)] == ["4 s", "48 s", "59 s", "1.8 min",
                                                                             "12.0 min"]
    assert [timings.format_gpu(s, True) for s in (10, 60, 70, 960)] == ["< 1 min", "< 1 min", "~1 min", "~16 min"]
    assert timings.format_gpu(95, False) == "1.6 min"


def _fake_build(tmp_path, exec_data: dict) -> Path:
    """A build folder whose Sphinx environment holds myst-nb's execution data, as jupyter-book writes it."""
    import pickle
    import types

    env = types.SimpleNamespace(nb_metadata={doc: {"exec_data": d} for doc, d in exec_data.items()})
    path = tmp_path / "_build" / ".doctrees" / "environment.pickle"
    path.parent.mkdir(parents=True)
    path.write_bytes(pickle.dumps(env))
    return tmp_path / "_build"


def test_record_takes_the_builds_times(tmp_path):
    now = 1_800_000_000.0
    build = _fake_build(tmp_path, {
        "book/05_training": {"mtime": now + 100, "runtime": 123.456, "method": "force", "succeeded": True},
        "book/07_sampling": {"mtime": now - 5_000, "runtime": 99.0, "method": "force", "succeeded": True},  # older
        "book/08_troubleshooting": {"mtime": now + 50, "runtime": 7.0, "method": "force", "succeeded": False},
        "book/intro": {"mtime": now + 1},  # a page that was not executed
    })
    assert timings.build_times(build) == {"05_training": {"seconds": 123.5, "executed_at": now + 100},
                                          "07_sampling": {"seconds": 99.0, "executed_at": now - 5_000}}
    out = tmp_path / "_timings.json"
    out.write_text(TIMINGS.read_text())
    before = timings.load(out)
    cpu_machine = {"cpu": "Test CPU", "cores": 2, "omp_num_threads": "1", "gpu": None}
    recorded = timings.record(build, since=now, path=out, machine_info=cpu_machine, commit="abc1234")
    assert recorded == {"05_training": 123.5}
    after = timings.load(out)
    entry = after["chapters"]["05_training"]["cpu"]
    assert entry["seconds"] == 123.5 and entry["commit"] == "abc1234" and entry["how"] == "`make book`"
    assert "Test CPU, 2 cores, OMP_NUM_THREADS=1, no GPU" == entry["machine"]
    assert entry["date"] == "2027-01-15"  # the execution's own time (UTC), not today's
    assert after["chapters"]["07_sampling"] == before["chapters"]["07_sampling"]  # not executed by this build
    # the same build on a GPU machine records GPU times, which the box then calls measured
    timings.record(build, since=now, path=out, machine_info={**cpu_machine, "gpu": "NVIDIA H200"}, commit="abc1234")
    data = timings.load(out)
    assert data["chapters"]["05_training"]["cpu"] == entry
    gpu = timings.gpu_time("05_training", data)
    assert gpu.measured and gpu.seconds == 123.5 and "NVIDIA H200" in gpu.source
    with pytest.raises(FileNotFoundError, match="build the book first"):
        timings.build_times(tmp_path / "nowhere")


def test_gpu_time_prefers_measurements(tmp_path):
    data = {"chapters": {"03_model": {"cpu": {"seconds": 21}}}}
    empty = tmp_path / "results"
    empty.mkdir()
    from dit_book import track

    costs = track.costs(track.card_peak(timings.ESTIMATE_CARD))
    training = next(s for s, c in costs.items() if c == 60 * track.DEFAULTS["train_minutes"])
    est = timings.gpu_time(training, data, results=empty)
    assert not est.measured and "estimate" in est.source and est.seconds > 15 * 60  # 15 minutes of training
    assert est.note == "15 of them training"
    assert timings.gpu_time("03_model", data, results=empty).seconds == 21  # no GPU work: at most the CPU time
    record = {"gpu": "NVIDIA H200", "dry_run": False, "date": "2027-01-01",
              "chapters": {"05_training": {"wall_at_defaults_s": 955.0, "error": None},
                           "07_sampling": {"wall_at_defaults_s": 300.0, "error": "boom"}}}
    (empty / "nvidia-h200-gpu-track.json").write_text(__import__("json").dumps(record))
    (empty / "dry-run-cpu-gpu-track.json").write_text(__import__("json").dumps({**record, "dry_run": True}))
    measured = timings.gpu_time("05_training", data, results=empty)
    assert measured.measured and measured.seconds == 955.0 and "gpu_track.sh" in measured.source
    assert not timings.gpu_time("07_sampling", data, results=empty).measured  # a failed chapter is not a measurement


def test_render_intro_rewrites_only_the_time_columns():
    text = INTRO.read_text()
    data = timings.load(TIMINGS)
    changed = {"chapters": {**data["chapters"], "04_diffusion": {"cpu": {**data["chapters"]["04_diffusion"]["cpu"],
                                                                          "seconds": 75}}}}
    out = timings.render_intro(text, changed)
    diff = [(a, b) for a, b in zip(text.splitlines(), out.splitlines()) if a != b]
    assert len(diff) == 2 and "04_diffusion.ipynb" in diff[0][1] and "| 1.2 min |" in diff[0][1]
    assert "**all**" in diff[1][1]


# ------------------------------------------------------------------------------------------------ the routes
from dit_book import routes  # noqa: E402


def test_the_route_table_is_generated_from_the_same_sources():
    """The route by hardware is :mod:`dit_book.routes`' rendering of book/_timings.json and dit_book.track: a
    laptop, 12 GB, 24 GB and 40-80 GB, each GPU time called an estimate until a GPU measures it."""
    text = INTRO.read_text()
    assert routes.BEGIN in text and routes.END in text, "book/intro.md: the route table's markers are missing"
    data = timings.load(TIMINGS)
    assert routes.render_routes(text, data) == text, (
        "book/intro.md: the route table is not dit_book.routes' rendering; run `python -m dit_book timings intro`")
    rows = [r for r in text.split(routes.BEGIN, 1)[1].split(routes.END, 1)[0].splitlines() if r.startswith("| ")][1:]
    hardware = [r.strip("|").split("|")[0].strip() for r in rows]
    assert [h.split(":")[0] for h in hardware] == ["a laptop, no GPU", "12 GB", "24 GB", "40-80 GB"]
    for row in rows[1:]:
        assert ("estimate" in row) == any(not routes.chapter_seconds(s, c, data)[1] for r in routes.ROUTES
                                          for c in r.cards if row.split("|")[1].strip().startswith(r.hardware)
                                          for s in _chapters())


def test_the_routes_agree_with_the_chapter_table():
    """The laptop's time is the chapter table's CPU total; the RTX 4090 of the 24 GB route is the chapter table's
    card, so its time is the table's GPU total."""
    data = timings.load(TIMINGS)
    stems = _chapters()
    assert routes.toc_stems() == stems
    cpu_total, gpu_total = timings.intro_total(stems, data)
    laptop = routes.table(stems, data).splitlines()[2]
    assert cpu_total.split(" of ")[0] in laptop
    card = next(c for r in routes.ROUTES for c in r.cards if c == timings.ESTIMATE_CARD)
    total = sum(routes.chapter_seconds(s, card, data)[0] for s in stems)
    assert f"~{total / 60:.0f} min" == gpu_total.split(" (")[0]
    # a chapter measured on a card counts as measured there, and only there
    measured = {"chapters": {**data["chapters"], "07_sampling": {**data["chapters"].get("07_sampling", {}), "gpu": {
        "seconds": 600.0, "date": "2027-01-01", "commit": "abc1234", "machine": "AMD EPYC, 16 cores, NVIDIA H100 SXM",
        "how": "`make book`"}}}}
    assert routes.chapter_seconds("07_sampling", "NVIDIA H100 SXM", measured) == (600.0, True)
    assert routes.chapter_seconds("07_sampling", "NVIDIA A100", measured)[1] is False


def test_chapter_7c_is_on_the_gpu_track_priced_per_card():
    """7c's time on each card of the routes is its study cell as dit_book.findings_gpu.plan sizes it for that card
    (both studies against one cell budget), plus the start-up allowance; the route table names it on the GPU track
    and gives its time on each card."""
    from dit_book import findings_gpu, track

    data = timings.load(TIMINGS)
    text = routes.table(_chapters(), data)
    assert "07c take the GPU track" in text
    for route in routes.ROUTES:
        for card in route.cards:
            seconds, measured = routes.chapter_seconds("07c_paper_findings", card, data)
            plan = findings_gpu.plan(track.card_peak(card))
            if not measured:
                assert seconds == pytest.approx(plan["seconds"] + timings.START_UP_S)
            assert plan["seconds"] <= track.cell_budget()
    smallest = routes.ROUTES[1].cards[0]
    assert f"07c ~{routes.chapter_seconds('07c_paper_findings', smallest, data)[0] / 60:.0f})" in text.splitlines()[3]
    est = timings.gpu_time("07c_paper_findings", {"chapters": {}})
    assert "findings_gpu.plan" in est.source


def test_routes_and_timings_import_each_other_in_one_direction_only():
    """routes reads timings; timings never imports routes (nor the module that joins them), so there is no circle."""
    import ast
    from pathlib import Path

    def imported(module):
        tree = ast.parse(Path(module.__file__).read_text())
        names = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                names |= {node.module or ""} | {a.name for a in node.names}
            elif isinstance(node, ast.Import):
                names |= {a.name for a in node.names}
        return {n.rsplit(".", 1)[-1] for n in names}

    from dit_book import intro_tables

    assert "timings" in imported(routes) and not {"routes", "intro_tables"} & imported(timings)
    assert "intro_tables" not in imported(routes) and {"routes", "timings"} <= imported(intro_tables)

"""The study records in benchmarks/results, and the profile table the README and the introduction show from them.

Every study is one Markdown record (question, machine, date, command, figures, conclusion); the README and
book/intro.md carry one table of what each profile gives, generated from the records' JSON by
dit_book.records, as the chapter table's times are generated from book/_timings.json.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from dit_book import records

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS = REPO_ROOT / "benchmarks" / "results"
FIX = "run `python -m dit_book.records`"


@pytest.mark.parametrize("name", records.RECORDS)
def test_every_study_has_its_record(name):
    path = RESULTS / name
    assert path.is_file(), f"benchmarks/results/{name} is missing: chapters and the README name it"
    text = path.read_text()
    assert text.startswith("# "), f"{name}: starts with its title (# ...)"
    for part in ("**Question.**", "**Machine", "**Date", "**Command"):
        assert part in text, f"{name}: every record says its question, machine, date and command; {part} is missing"
    assert re.search(r"^\|---", text, re.M) or "```" in text, f"{name}: the figures (a table) are missing"
    assert "## Conclusion" in text, f"{name}: ends with '## Conclusion'"
    assert re.search(r"20\d\d-\d\d-\d\d", text), f"{name}: names the date of its measurements (YYYY-MM-DD)"


def test_records_name_only_files_that_exist():
    """A record, the README, the intro or a profile that names a record or a JSON file of benchmarks/results names
    one that is there (a rename leaves no dangling name behind)."""
    texts = {p: p.read_text() for p in [REPO_ROOT / "README.md", REPO_ROOT / "book" / "intro.md",
                                        *RESULTS.glob("*.md"), *(REPO_ROOT / "dit_core" / "configs").glob("*.yaml")]}
    names = {p.name for p in RESULTS.iterdir()}
    dangling = {}
    for path, text in texts.items():
        for name in re.findall(r"\b([\w.-]+\.(?:md|json))\b", text):
            looks_like_record = name in records.RECORDS or re.match(r"(nvidia|cpu|convergence|gpu|planner)-", name)
            if looks_like_record and name not in names:
                dangling.setdefault(path.relative_to(REPO_ROOT).as_posix(), []).append(name)
    assert not dangling, f"names of records that benchmarks/results does not hold: {dangling}"


def test_every_profile_has_a_row():
    profiles = sorted(p.stem for p in (REPO_ROOT / "dit_core" / "configs").glob("*.yaml"))
    assert sorted(records.HARDWARE) == profiles, (
        "dit_book/records.py: HARDWARE must list every profile of dit_core/configs (and no other); "
        f"profiles {profiles}, listed {sorted(records.HARDWARE)}")
    rows = records.profile_rows()
    assert [r.profile for r in rows] == list(records.HARDWARE)
    for r in rows:
        assert r.record is None or (RESULTS / r.record).is_file(), f"{r.profile}: its record {r.record} is missing"


@pytest.mark.parametrize("path", list(records.TARGETS), ids=lambda p: p.name)
def test_the_tables_are_the_records(path):
    text = path.read_text()
    assert text == records.render_file(text, records.TARGETS[path], name=path.name), (
        f"{path.relative_to(REPO_ROOT)}: the profile table is not what the records say; {FIX}")


def test_the_table_quotes_the_records(tmp_path):
    """The rows carry the records' own figures, and a profile without a record says so."""
    for name in ("digits-profile.json", "small-images-recipe.json", "nvidia-h200-profiles.json",
                 "nvidia-h200-planner-check.json"):
        (tmp_path / name).write_text((RESULTS / name).read_text())
    rows = {r.profile: r for r in records.profile_rows(tmp_path)}
    small = json.loads((RESULTS / "small-images-recipe.json").read_text())
    worst = min(r["right_150"] for r in small["runs"])
    assert f"{100 * worst:.1f}" in rows["small-images"].result and rows["small-images"].record == "small-images-recipe.md"
    zen3 = small["other_machines"][0]
    assert f"{100 * min(r['right_150'] for r in zen3['runs']):.1f}" in rows["small-images"].result
    planner = json.loads((RESULTS / "nvidia-h200-planner-check.json").read_text())
    capped = {r["memory_limit_gib"]: r for r in planner["rows"] if r.get("rung") == "planned"}
    for profile, cap in records.CARD_CAPS.items():
        row = rows[profile]
        assert f"{capped[cap]['images_per_s']:.0f} img/s on an H200 capped at {cap:g} GiB" in row.time
        assert "(not `dit-train`)" in row.result and row.record == "planner-check-h200.md", profile
        # the figure names its machine, and the card the profile is named for gets its own estimate beside it
        assert f"({records.PROFILE_CARD[profile]}: ~" in row.time and ", estimate)" in row.time, profile
    # two profiles with the same setup on different cards: the same measurement, different estimates
    assert rows["a100-80gb"].result == rows["h100-80gb"].result and rows["a100-80gb"].time != rows["h100-80gb"].time
    assert rows["rtx3060-12gb"].result == records.NOT_MEASURED and rows["rtx3060-12gb"].record is None

    # a changed figure changes the table; a removed record leaves "not measured yet"
    small["runs"][0]["right_150"] = 0.5
    (tmp_path / "small-images-recipe.json").write_text(json.dumps(small))
    assert "50.0-98.0 %" in records.profile_rows(tmp_path)[1].result
    (tmp_path / "digits-profile.json").unlink()
    digits = records.profile_rows(tmp_path)[0]
    assert digits.result == records.NOT_MEASURED and digits.record is None


def test_render_file_rewrites_only_the_table_and_needs_its_markers(tmp_path):
    text = f"# Title\n\nbefore\n\n{records.BEGIN}\n| old | table |\n{records.END}\n\nafter\n"
    out = records.render_file(text, None)
    assert out.startswith("# Title\n\nbefore\n\n") and out.endswith("\n\nafter\n") and "| old |" not in out
    assert "| `digits` |" in out and "`digits-profile.md`" in out  # paths in the book, links in the README
    assert "[digits-profile.md](benchmarks/results/digits-profile.md)" in records.render_file(text, "benchmarks/results/")
    with pytest.raises(ValueError, match="markers"):
        records.render_file("no table here", None, name="README.md")
    path = tmp_path / "page.md"
    path.write_text(text)
    assert records.update(path, None) and not records.update(path, None)


def test_every_profile_row_names_the_machine_beside_each_figure():
    for r in records.profile_rows():
        if r.record is None:
            continue
        for cell in (r.time, r.result):
            assert re.search(r"\bon (an?|one|that) ", cell), (r.profile, cell)


@pytest.mark.parametrize("quote", records.QUOTES, ids=lambda q: f"{Path(q.page).stem}:{q.says[:30]}")
def test_a_quoted_figure_is_its_records(quote):
    """The README's and the chapters' headline figures, each said by its record too (dit_book.records.QUOTES)."""
    assert quote.record in records.RECORDS, f"{quote.record}: not a record of dit_book.records.RECORDS"
    assert not records.check_quotes([quote]), records.check_quotes([quote])


def test_a_changed_record_or_page_fails_its_quote(tmp_path):
    quote = next(q for q in records.QUOTES if q.record == "digits-profile.md")
    (tmp_path / "book").mkdir()
    page, record = REPO_ROOT / quote.page, RESULTS / quote.record
    (tmp_path / quote.page).write_text(page.read_text())
    (tmp_path / quote.record).write_text(record.read_text())
    assert records.check_quotes([quote], tmp_path, tmp_path) == []
    # the record is rerun and says 97.5 % now: the chapter that still says 99.0 % fails
    (tmp_path / quote.record).write_text(record.read_text().replace("99.0 %", "97.5 %"))
    assert "digits-profile.md no longer says" in records.check_quotes([quote], tmp_path, tmp_path)[0]
    (tmp_path / quote.record).write_text(record.read_text())
    (tmp_path / quote.page).write_text(page.read_text().replace("84.0 %", "94.0 %"))
    assert "07_sampling.ipynb no longer says" in records.check_quotes([quote], tmp_path, tmp_path)[0]


def test_the_small_images_json_is_its_records_table():
    """The JSON behind the profile table holds the figures of the record's own tables (section 1 and section 7)."""
    small = json.loads((RESULTS / "small-images-recipe.json").read_text())
    text = records.prose(RESULTS / "small-images-recipe.md")
    for run in small["runs"]:
        assert f"| {run['seed']} | {run['steps_planned']:,} / {run['steps']:,}" in text, run
        assert f"{100 * run['right_150']:.1f} % ({100 * run['clean_150']:.1f} %)" in text, run
    for run in small["other_machines"][0]["runs"]:
        assert f"| {run['seed']} | {run['steps']:,} | {run['step_ms']} ms | {100 * run['right_150']:.1f} %" in text, run


def test_the_own_images_record_shows_its_json():
    """The own-images record's held-out tables are what ``benchmarks/own_images.py table`` writes from the JSON of
    every scored run, and each held-out folder has three training seeds of the profile it recommends."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("own_images", REPO_ROOT / "benchmarks" / "own_images.py")
    own_images = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(own_images)
    data = json.loads((RESULTS / "own-images.json").read_text())
    assert own_images.table(data["runs"], "heldout") in (RESULTS / "own-images.md").read_text(), (
        "own-images.md: paste the output of `python benchmarks/own_images.py table --json "
        "benchmarks/results/own-images.json` into section 3")
    new = {(r["kind"], r["seed"]) for r in data["runs"] if r["held_out"] and r["profile"] == "new"}
    assert new == {(k, s) for k in own_images.HELD_OUT for s in own_images.SEEDS}, sorted(new)

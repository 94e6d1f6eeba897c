"""The book's front page stays true to the book: every chapter and every profile is on it, no placeholder left.

book/intro.md is what a reader meets first: its chapter map (with the time each chapter takes) must list every
chapter of _toc.yml, its table of profiles every profile in dit_core/configs, and it must hold the bibliography
and the execution-statistics table of the build.
"""

from __future__ import annotations

import re
from pathlib import Path

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
    for stem in _chapters():
        row = [r for r in rows if f"]({stem}.ipynb)" in r]
        assert row, f"book/intro.md: the chapter map has no row linking {stem}.ipynb; add one (with its times)"
        cells = [c.strip() for c in row[0].strip("|").split("|")]
        assert len(cells) == 5 and all(cells[3:]), (
            f"book/intro.md: the row of {stem} needs 5 columns, the last two the CPU and GPU times: {row[0]}"
        )
    linked = re.findall(r"\]\(([\w-]+)\.ipynb\)", "\n".join(rows))
    assert linked == _chapters(), f"book/intro.md: the chapter map is not in _toc.yml order: {linked}"


def test_every_profile_is_described():
    text = INTRO.read_text()
    rows = "\n".join(_table_rows(text, "What you need"))
    profiles = sorted(p.stem for p in (REPO_ROOT / "dit_core" / "configs").glob("*.yaml"))
    assert profiles, "no profiles found in dit_core/configs"
    missing = [p for p in profiles if f"`{p}`" not in rows]
    assert not missing, f"book/intro.md: the profile table ('What you need') lacks {missing}"


def test_no_placeholders_and_the_generated_sections_are_there():
    text = INTRO.read_text()
    leftovers = re.findall(r"\b(?:TIME_\w+|TODO|TBD|XXX)\b", text)
    assert not leftovers, f"book/intro.md: placeholders left: {sorted(set(leftovers))}"
    assert "```{bibliography}" in text, "book/intro.md must hold the bibliography"
    assert "```{nb-exec-table}" in text, "book/intro.md must show the execution times of the build"

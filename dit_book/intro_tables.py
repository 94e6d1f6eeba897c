"""The introduction's generated tables, rewritten together: the time columns of the chapter table
(:func:`dit_book.timings.render_intro`) and the route table by hardware (:func:`dit_book.routes.render_routes`);
and ``python -m dit_book timings record|intro|show``, the command that records a build's run times and rewrites
them (``make book`` runs it after the build)."""

from __future__ import annotations

import os
from pathlib import Path

from .routes import render_routes
from .timings import INTRO, REPO_ROOT, TIMINGS, chapter_box, format_seconds, load, record, render_intro


def update_intro(path: str | os.PathLike = INTRO, data: dict | None = None) -> bool:
    """Rewrite the time cells of the introduction's chapter table, and its route table, from the timings file; True
    if it changed."""
    path = Path(path)
    before = path.read_text()
    after = render_routes(render_intro(before, data), data)
    if after != before:
        path.write_text(after)
    return after != before


def main(argv=None) -> int:
    import argparse
    import time

    parser = argparse.ArgumentParser(prog="python -m dit_book timings",
                                     description="Chapter run times: record a build's, rewrite the intro's table.")
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="after `make book`: the build's execution times into book/_timings.json")
    rec.add_argument("--build-dir", default="_build")
    rec.add_argument("--since", type=float, default=None, help="Unix time the build started (older runs are kept)")
    sub.add_parser("intro", help="rewrite the time columns of book/intro.md's chapter table from the file")
    sub.add_parser("show", help="print the box of every chapter")
    args = parser.parse_args(argv)
    if args.command == "record":
        recorded = record(args.build_dir, args.since)
        if not recorded:
            print(f"timings: the build in {args.build_dir} executed no notebook after "
                  f"{time.ctime(args.since) if args.since else 'its start'}; {TIMINGS.name} unchanged")
        for stem, seconds in recorded.items():
            print(f"timings: {stem:<28} {format_seconds(seconds)}")
    if args.command in ("record", "intro"):
        print(f"timings: {INTRO.relative_to(REPO_ROOT)} {'updated' if update_intro() else 'already up to date'}")
    if args.command == "show":
        for stem in sorted(load().get("chapters", {})):
            print(f"{stem}: {chapter_box(stem)!r}\n")
    return 0

"""The implement-it exercises of chapters 3, 4, 5 and 7, as the notebooks hold them: for every part of
dit_book.reader, a cell to write in (``%%answer <part>``, a stub with the solution's names and arguments, which
raises NotImplementedError) and the book's solution after it (``%%solution <part>``, folded in Jupyter and in the
HTML), whose code is the solution module's (dit_book/my_dit.py, dit_book/my_diffusion.py) as written; and
dit_book.my_dit stays a DiT that loads dit_core's weights and runs the samplers' interface."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import torch

from dit_book import my_dit, reader

BOOK = Path(__file__).resolve().parents[1] / "book"


def _definitions(source: str) -> dict[str, ast.AST]:
    """The top-level functions and classes of a piece of Python source, by name."""
    return {node.name: node for node in ast.parse(source).body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}


def _segments(source: str) -> dict[str, str]:
    return {name: ast.get_source_segment(source, node) for name, node in _definitions(source).items()}


def _cells(stem: str) -> dict[str, dict]:
    return {c.get("id"): c for c in json.loads((BOOK / f"{stem}.ipynb").read_text())["cells"]}


def _body(cell: dict, magic: str) -> str:
    """The cell's source after its first line, which must be ``magic``."""
    source = "".join(cell["source"])
    first, _, rest = source.partition("\n")
    assert first.strip() == magic, f"cell {cell.get('id')} starts with {first!r}, not {magic!r}"
    return rest


def _signatures(node: ast.AST) -> dict[str, str]:
    """A definition's arguments, and for a class each method's: what the reader's code must keep."""
    methods = [node] if isinstance(node, ast.FunctionDef) else [n for n in node.body if isinstance(n, ast.FunctionDef)]
    return {m.name: ast.unparse(m.args) for m in methods}


PARTS = list(reader.PARTS.values())


@pytest.mark.parametrize("part", PARTS, ids=[p.name for p in PARTS])
def test_every_part_has_a_stub_then_the_books_solution_folded(part):
    cells = _cells(part.chapter)
    ids = list(cells)
    answer, solution = cells.get(f"{part.name}-answer"), cells.get(f"{part.name}-solution")
    assert answer and solution, f"{part.chapter}: cells {part.name}-answer and {part.name}-solution are needed"
    assert ids.index(f"{part.name}-solution") == ids.index(f"{part.name}-answer") + 1, "the solution follows the stub"
    meta = solution["metadata"]
    assert meta.get("jupyter", {}).get("source_hidden") is True and "hide-input" in meta.get("tags", []), (
        f"{part.chapter}: {part.name}-solution must be folded in Jupyter (source_hidden) and in the HTML (hide-input)")
    assert not answer["metadata"].get("jupyter") and "hide-input" not in answer["metadata"].get("tags", [])

    solved = _body(solution, f"%%solution {part.name}")
    in_module = _segments(reader.book_source(part.name))
    in_cell = _segments(solved)
    assert set(in_cell) == set(part.names) == set(in_module), (part.name, sorted(in_cell), part.names)
    differ = [name for name in part.names if in_cell[name] != in_module[name]]
    assert not differ, (f"{differ} differ between {part.chapter}'s solution cell and dit_book/{part.solutions}.py; "
                        "copy the chapter's code into the module (or back)")

    stub = _body(answer, f"%%answer {part.name}")
    stubs, solutions = _definitions(stub), _definitions(solved)
    assert set(stubs) == set(part.names), f"{part.name}-answer defines {sorted(stubs)}, not {part.names}"
    for name in part.names:
        assert _signatures(stubs[name]) == _signatures(solutions[name]), f"{part.name}-answer: {name}'s arguments"
        raises = [n for n in ast.walk(stubs[name]) if isinstance(n, ast.Raise)
                  and "NotImplementedError" in ast.unparse(n.exc)]
        assert raises, f"{part.name}-answer: {name} must raise NotImplementedError until it is written"


def test_the_stubs_run_and_say_the_books_solution_stands_in(tmp_path):
    """Each chapter's stubs, run as a reader who writes nothing runs them: not written, nothing saved."""
    for part in PARTS:
        said = []
        verdict = reader.answer(part.name, _body(_cells(part.chapter)[f"{part.name}-answer"], f"%%answer {part.name}"),
                                {"READER_DIR": str(tmp_path)}, out=said.append)
        assert verdict.verdict == "stub", (part.name, verdict.message)
        assert "the book's solution stands in" in said[0]
    assert not list(tmp_path.glob("*.py"))


def test_chapter_5_trains_the_readers_dit_and_chapter_7_samples_it():
    five = "\n".join("".join(c["source"]) for c in _cells("05_training").values())
    assert "reader.load(READER_DIR" in five and "your_dit.train(" in five and "your_dit.save(" in five
    seven = "\n".join("".join(c["source"]) for c in _cells("07_sampling").values())
    assert "your_dit.ensure(" in seven and "your_dit.sample(" in seven and "your_dit.publish(" in seven


def test_the_readers_dit_runs_the_samplers_interface():
    from dit_core.models import DiT

    kwargs = dict(input_size=8, patch_size=2, in_channels=1, hidden_size=32, depth=2, num_heads=2, num_classes=10)
    torch.manual_seed(0)
    library = DiT(**kwargs).eval()
    mine = my_dit.DiT(**kwargs).eval()
    mine.load_state_dict(library.state_dict())
    x, t, y = torch.randn(3, 1, 8, 8), torch.tensor([0, 500, 999]), torch.tensor([1, 10, 3])
    with torch.no_grad():
        assert torch.equal(mine(x, t, y), library(x, t, y))
    assert (mine.in_channels, mine.input_size, mine.num_classes, mine.learn_sigma) == (1, 8, 10, True)

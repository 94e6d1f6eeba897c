"""dit_book.my_dit is the DiT that chapter 3's exercises build, as the chapter's solution cells write it, and the
model that chapter 5 trains: the two copies must stay the same code, and it must stay a DiT that loads dit_core's
weights."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import torch

from dit_book import my_dit

BOOK = Path(__file__).resolve().parents[1] / "book"


def _definitions(source: str) -> dict[str, str]:
    """The top-level functions and classes of a piece of Python source, by name, as written."""
    tree = ast.parse(source)
    return {node.name: ast.get_source_segment(source, node) for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.ClassDef))}


def _solution_cells(notebook: str) -> list[str]:
    cells = json.loads((BOOK / notebook).read_text())["cells"]
    return ["".join(c["source"]) for c in cells
            if c["cell_type"] == "code" and c.get("id", "").startswith("exercise-")]


def test_chapter_3_solutions_are_the_module():
    in_module = _definitions(Path(my_dit.__file__).read_text())
    in_chapter: dict[str, str] = {}
    for source in _solution_cells("03_model.ipynb"):
        in_chapter.update(_definitions(source))
    assert set(in_chapter) == set(in_module), (
        f"chapter 3's solution cells define {sorted(in_chapter)}, dit_book/my_dit.py {sorted(in_module)}")
    differ = [name for name in in_module if in_module[name] != in_chapter[name]]
    assert not differ, (f"{differ} differ between chapter 3's solution cells and dit_book/my_dit.py; copy the "
                        "chapter's code into the module (or back)")


def test_chapter_5_trains_the_readers_dit():
    sources = "\n".join("".join(c["source"]) for c in json.loads((BOOK / "05_training.ipynb").read_text())["cells"])
    assert "from dit_book import my_dit" in sources and "my_dit.DiT(" in sources


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

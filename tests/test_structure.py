"""The library's structure: no import loops among dit_core's modules, layers imported downwards only, no module
above 600 lines, light imports.

The import graph counts every ``import`` and ``from ... import`` in a module, at module level and inside
functions alike (a lazy import is still a dependency), each resolved to the dit_core module it names; a loop
is a strongly connected component of more than one module. ``python tests/test_structure.py`` prints the
graph's figures.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "dit_core"
MAX_LINES = 600


def modules(root: Path = PACKAGE) -> dict[str, tuple[Path, bool]]:
    """``{dotted name: (file, is a package __init__)}`` for every module below ``root``."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return out


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """``{module: the dit_core modules it imports}``, module-level and function-level imports alike."""
    mods = modules(root)
    edges: dict[str, set[str]] = {name: set() for name in mods}
    for name, (path, is_package) in mods.items():
        here = name if is_package else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = here.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
                for alias in node.names:  # `from package import module` names the module itself
                    targets.append(f"{base}.{alias.name}" if f"{base}.{alias.name}" in mods else base)
            for target in targets:
                while target and target not in mods:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    edges[name].add(target)
    return edges


def import_loops(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, loops = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                loops.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return loops


def test_the_loop_finder_finds_loops():
    assert import_loops({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert import_loops({"a": {"b"}, "b": set()}) == []


def test_no_import_loops():
    edges = import_graph()
    assert "dit_core.measure.bench.ladder" in edges["dit_core.measure.bench"]  # a package's own imports count
    loops = import_loops(edges)
    assert not loops, "import loops among dit_core modules: " + "; ".join(" <-> ".join(c) for c in loops)


#: The layers of dit_core, bottom to top: a module imports its own layer and those below, never one above.
#: Everything not named (models, diffusion, data, latents, teachers, sample, eval, checkpoint, ...) is the bottom
#: layer: the pieces a run is made of. Above it the trainer, then the tools that measure it, then the command lines.
LAYERS = ("dit_core.train", "dit_core.measure", "dit_core.cli")

#: ``python -m`` entry points that are a command line by name: ``python -m dit_core.train`` is ``dit-train``
#: (what torchrun starts), so it may import that command line and nothing else from above its package.
ENTRY_POINTS = {"dit_core.train.__main__": {"dit_core.cli.train"}}


def layer(module: str) -> int:
    """0 for the bottom layer, else 1 + the index of the first :data:`LAYERS` entry that holds ``module``."""
    return next((i + 1 for i, top in enumerate(LAYERS) if module == top or module.startswith(top + ".")), 0)


def upward_imports(edges: dict[str, set[str]]) -> list[str]:
    """``"a -> b"`` for every import of a higher layer, but the command line an entry point names."""
    return sorted(f"{a} -> {b}" for a, targets in edges.items() for b in targets
                  if layer(b) > layer(a) and b not in ENTRY_POINTS.get(a, ()))


def test_the_layer_check_finds_upward_imports():
    edges = {"dit_core.teachers": {"dit_core.train.distributed", "dit_core.models"},
             "dit_core.measure.bench.__main__": {"dit_core.cli.bench"},
             "dit_core.train.__main__": {"dit_core.cli.train"}, "dit_core.cli.train": {"dit_core.train.loop"}}
    assert upward_imports(edges) == ["dit_core.measure.bench.__main__ -> dit_core.cli.bench",
                                     "dit_core.teachers -> dit_core.train.distributed"]


def test_layers_import_downwards_only():
    """Data and feature code never imports the trainer, the measuring tools never import their command lines."""
    up = upward_imports(import_graph())
    assert not up, ("imports of a higher layer (move the shared piece down, or pass it in): " + "; ".join(up)
                    + f"; layers, bottom to top: the rest, {', '.join(LAYERS)}")


def test_no_module_above_600_lines():
    long = {str(path.relative_to(PACKAGE.parent)): n for path, _ in modules().values()
            if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules above {MAX_LINES} lines (split them by concept): {long}"


def test_imports_have_no_side_effects_and_stay_light():
    """Importing the library neither sets OpenMP's thread policy nor imports the trainer; the trainer's
    package and its command line import no torch, so dit-train can set the policy before torch starts."""
    code = (
        "import os, sys\n"
        "import dit_core.sample, dit_core.measure.bench\n"
        "assert 'OMP_WAIT_POLICY' not in os.environ, 'an import set OMP_WAIT_POLICY'\n"
        "assert 'dit_core.train.loop' not in sys.modules, 'dit_core.sample imports the trainer'\n"
        "for m in [m for m in sys.modules if m == 'torch' or m.startswith(('torch.', 'dit_core'))]:\n"
        "    del sys.modules[m]\n"
        "import dit_core.train, dit_core.cli.train\n"
        "assert 'torch' not in sys.modules, 'dit_core.train or dit-train imports torch at import time'\n"
        "dit_core.cli.train.main(['--help'])\n"
        "print(os.environ['OMP_WAIT_POLICY'])\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PACKAGE.parent), env.get("PYTHONPATH", "")) if p)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "PASSIVE"  # set by dit-train where the process starts


if __name__ == "__main__":
    graph = import_graph()
    loops = import_loops(graph)
    sizes = sorted((len(p.read_text().splitlines()), str(p.relative_to(PACKAGE.parent))) for p, _ in modules().values())
    print(f"{len(graph)} modules, {sum(map(len, graph.values()))} import edges, {len(loops)} import loops")
    for loop in loops:
        print("  loop:", " <-> ".join(loop))
    print(f"{sum(n for n, _ in sizes)} lines; largest: {sizes[-1][1]} ({sizes[-1][0]} lines)")

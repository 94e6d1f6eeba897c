"""The reader's own code: what they write in the exercises is what the book trains, samples, scores and publishes.

An implement-it exercise is a cell that starts with ``%%answer <part>``, holding a stub of the part (the names and
signatures to write, raising ``NotImplementedError``) that the reader fills in. Running the cell

1. runs it in a namespace of its own, which holds the imports of the chapter's solutions and the reader's parts
   written so far (the book's solution for each part not written yet), so that what runs is exactly what a later
   chapter assembles; then binds the names it defines in the notebook, as any cell would;
2. runs the part's checker (:mod:`dit_book.exercises`) and prints its verdict;
3. saves the cell, when it is not the unfilled stub (:func:`is_stub`: every function and method of the part still
   raises ``NotImplementedError``), as ``<READER_DIR>/<part>.py`` (one file per part; its first line a comment, so
   that its line numbers are the cell's), with the verdict in ``<READER_DIR>/checks.json``. A cell with some of
   its functions written is saved, and its verdict names those that still raise.

An error in the reader's code (when the cell runs, or when the checker calls it) is reported with its traceback,
the lines of the reader's cell included; inside IPython the cell then ends normally, so that "Run All" goes on with
the book's solution in place of the part, as the message says; outside IPython the error is raised.

``READER_DIR`` is a parameter of the chapters that use it (``"../outputs/reader"``, beside the book, outside the
package), read from the notebook's namespace. :func:`load` assembles the reader's code for a later chapter: each
part from its file where the reader wrote one that passes its check, the book's solution otherwise
(:mod:`dit_book.my_dit`, :mod:`dit_book.my_diffusion`) and where a file on record no longer runs, in one namespace,
and prints one line that says which parts are whose. A file placed in ``READER_DIR`` by hand is checked when it is
first loaded; a ``checks.json`` that is not a record of verdicts is read as none (with a warning), and every part
is checked again.

The solution of an exercise is a cell that starts with ``%%solution <part>``, folded in Jupyter (the cell's
``source_hidden`` metadata) and in the HTML (the ``hide-input`` tag). It runs the book's code in a copy of the
notebook's namespace (it reads the chapter's names and binds none, so it never overwrites the reader's) and prints
the checker's verdict on it. ``tests/test_my_dit.py`` keeps the solution cells equal to the solution modules.

:func:`register` adds both magics to the running IPython (the chapters' set-up does it); outside IPython nothing
changes. Example, in a notebook::

    %%answer q_sample
    def q_sample(x0, t, noise, alpha_bar):
        a = alpha_bar[t].reshape(-1, 1, 1, 1)
        return (a.sqrt() * x0 + (1 - a).sqrt() * noise).to(x0.dtype)

and in a later chapter::

    yours = reader.load(READER_DIR, ["q_sample", "training_step"])
"""

from __future__ import annotations

import ast
import datetime as _dt
import hashlib
import json
import os
import sys
import types
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

#: Where the chapters keep the reader's code (relative to book/, where a chapter runs): beside the book's outputs.
DEFAULT_FOLDER = "../outputs/reader"
#: The verdicts of the checks, by part: the source's SHA-256, "passed" or "failed", the checker's message.
CHECKS = "checks.json"
#: The notebook parameter that names the folder.
FOLDER_PARAMETER = "READER_DIR"


@dataclass(frozen=True)
class Part:
    """One piece of the reader's code: the names its cell defines, the checker that judges them, where the book's
    solution lives and what uses it downstream."""

    name: str                 # the part's name, as %%answer takes it
    title: str                # in words, for the lines the book prints
    chapter: str              # the chapter whose exercise asks for it
    names: tuple[str, ...]    # what the cell defines
    solutions: str            # the module of the book's solution: "my_dit" or "my_diffusion"
    check: Callable[[dict], str]
    used_by: str = ""         # what runs it downstream, a sentence for the reader ("" when nothing does)


def _check(name: str, *names: str, **kwargs) -> Callable[[dict], str]:
    def run(ns: dict) -> str:
        from . import exercises

        return getattr(exercises, name)(*(ns[n] for n in names), **kwargs)
    return run


_MODEL = "Chapter 5 trains your DiT with it; chapter 7 samples, scores and publishes that model."
#: Every part, in the order the chapters ask for them (a part may use the ones before it).
PARTS: dict[str, Part] = {p.name: p for p in (
    Part("patchify", "patchify", "03_model", ("patchify", "unpatchify"), "my_dit",
         _check("check_patchify", "patchify", "unpatchify"),
         "Your unpatchify turns your DiT's output tokens back into images when chapter 5 trains it and chapter 7 "
         "samples it; your patchify is checked only (the DiT cuts its patches with the library's PatchEmbed)."),
    Part("timestep_embedder", "timestep embedding", "03_model", ("timestep_embedding", "TimestepEmbedder"), "my_dit",
         _check("check_timestep_embedder", "timestep_embedding", "TimestepEmbedder"), _MODEL),
    Part("label_embedder", "label embedding", "03_model", ("LabelEmbedder",), "my_dit",
         _check("check_label_embedder", "LabelEmbedder"), _MODEL),
    Part("dit_block", "adaLN-Zero block", "03_model", ("modulate", "DiTBlock"), "my_dit",
         _check("check_dit_block", "DiTBlock"), _MODEL),
    Part("final_layer", "final layer", "03_model", ("FinalLayer",), "my_dit",
         _check("check_final_layer", "FinalLayer"), _MODEL),
    Part("dit", "DiT", "03_model", ("DiT",), "my_dit", _check("check_dit", "DiT"), _MODEL),
    Part("ddim_step", "DDIM step", "04_diffusion", ("ddim_step",), "my_diffusion",
         _check("check_ddim_step", "ddim_step"), "Chapter 7 samples your DiT with it."),
    Part("q_sample", "q_sample", "04_diffusion", ("q_sample",), "my_diffusion",
         _check("check_q_sample", "q_sample"), "Chapter 5's training steps noise the digits with it."),
    Part("simple_loss", "L_simple", "04_diffusion", ("simple_loss",), "my_diffusion",
         _check("check_simple_loss", "simple_loss"), "Chapter 5's step of a fixed-variance DiT trains with it."),
    Part("training_step", "training step", "05_training", ("training_step",), "my_diffusion",
         _check("check_training_step", "training_step", "DiT"),
         "Section 5.2 trains your DiT with it (and chapter 7 does, when chapter 5 has not run)."),
    Part("newton_schulz", "Newton-Schulz iteration", "05_training", ("newton_schulz",), "my_diffusion",
         _check("check_newton_schulz", "newton_schulz")),
    Part("simple_step", "fixed-variance training step", "05_training", ("simple_step",), "my_diffusion",
         _check("check_training_step", "simple_step", "DiT", learn_sigma=False)),
    Part("guidance", "guidance", "07_sampling", ("guided_fn",), "my_diffusion",
         _check("check_guidance", "guided_fn"), "Chapter 7 guides the samples of your DiT with it."),
)}

#: The parts of the model (chapter 3) and the parts a chapter runs.
MODEL_PARTS = tuple(p for p, part in PARTS.items() if part.chapter == "03_model")


def _part(name: str) -> Part:
    if name not in PARTS:
        raise KeyError(f"no part {name!r}: the parts are {', '.join(PARTS)}")
    return PARTS[name]


# ------------------------------------------------------------------------------------------------ the book's code
def _module_file(solutions: str) -> Path:
    return Path(__file__).resolve().parent / f"{solutions}.py"


def _tree(solutions: str) -> ast.Module:
    return ast.parse(_module_file(solutions).read_text(), filename=str(_module_file(solutions)))


def preamble() -> str:
    """The imports of the solution modules, which every part's namespace starts with (``__future__`` aside)."""
    lines: list[str] = []
    for solutions in ("my_dit", "my_diffusion"):
        source = _module_file(solutions).read_text()
        for node in _tree(solutions).body:
            if isinstance(node, (ast.Import, ast.ImportFrom)) and getattr(node, "module", "") != "__future__":
                segment = ast.get_source_segment(source, node)
                if segment not in lines:
                    lines.append(segment)
    return "\n".join(lines) + "\n"


def book_source(part: str) -> str:
    """The book's solution of ``part``: its definitions in the solution module, as written there."""
    p = _part(part)
    source = _module_file(p.solutions).read_text()
    nodes = {n.name: n for n in _tree(p.solutions).body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    return "\n\n\n".join(ast.get_source_segment(source, nodes[name]) for name in p.names) + "\n"


def _run_book(part: str, ns: dict) -> None:
    """Define the book's solution of ``part`` in ``ns``, compiled from its module's file (tracebacks point there)."""
    p = _part(part)
    tree = _tree(p.solutions)
    body = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name in p.names]
    exec(compile(ast.Module(body=body, type_ignores=[]), str(_module_file(p.solutions)), "exec"), ns)


def _namespace(name: str) -> dict:
    module = types.ModuleType(name, "the reader's code, assembled by dit_book.reader")
    ns = module.__dict__
    exec(compile(preamble(), "<the imports of the book's solutions>", "exec"), ns)
    return ns


# ------------------------------------------------------------------------------------------------ files
def folder_of(folder=None) -> Path:
    return Path(DEFAULT_FOLDER if folder is None else folder)


def path_of(folder, part: str) -> Path:
    """The reader's file of ``part``."""
    _part(part)
    return folder_of(folder) / f"{part}.py"


def header(part: str) -> str:
    """The first line of a saved part: a comment in place of the ``%%answer`` line, so that line numbers match."""
    p = _part(part)
    return f"# {p.title}: your code, from the %%answer {part} cell of chapter {p.chapter[:2]}\n"


def _digest(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()


def _records(folder) -> dict:
    """The verdicts on record, by part. A file that is not a record (not JSON, not an object of parts) or an entry
    that is not a verdict is read as no record, with a warning that says so: those parts are checked again, and the
    next verdict rewrites the file (atomically)."""
    path = folder_of(folder) / CHECKS
    if not path.is_file():
        return {}
    try:
        records = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        problem = f"is not readable JSON ({err})"
    else:
        if isinstance(records, dict):
            good = {part: r for part, r in records.items() if isinstance(r, dict) and isinstance(r.get("sha256"), str)
                    and r.get("verdict") in ("passed", "failed")}
            if len(good) < len(records):
                warnings.warn(f"{path}: the entries {', '.join(sorted(set(records) - set(good)))} are not verdicts; "
                              "read as no record, so those parts are checked again", stacklevel=2)
            return good
        problem = f"holds a JSON {type(records).__name__}, not a verdict for each part"
    warnings.warn(f"{path} {problem}: read as no record, so every part is checked again (and the file rewritten)",
                  stacklevel=2)
    return {}


def _record(folder, part: str, source: str, verdict: str, message: str) -> None:
    from dit_core.atomic import atomic_write_text

    records = _records(folder)
    records[part] = {"sha256": _digest(source), "verdict": verdict, "message": message,
                     "checked": _dt.datetime.now().isoformat(timespec="seconds")}
    folder_of(folder).mkdir(parents=True, exist_ok=True)
    atomic_write_text(folder_of(folder) / CHECKS, json.dumps(records, indent=1, sort_keys=True) + "\n")


def save(folder, part: str, cell: str) -> Path:
    """Write the body of an ``%%answer`` cell as the reader's file of ``part`` (atomically); returns its path."""
    from dit_core.atomic import atomic_write_text

    path = path_of(folder, part)
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write_text(path, header(part) + cell)


# ------------------------------------------------------------------------------------------------ checking
@dataclass
class Verdict:
    """What the checker said of a part: ``"passed"``, ``"failed"`` (with the checker's message), ``"error"`` (the
    code raised something else: the exception) or ``"stub"`` (it raised ``NotImplementedError``: not written)."""

    verdict: str
    message: str
    error: BaseException | None = None


def judge(part: str, ns: dict) -> Verdict:
    """Run the checker of ``part`` on the names of ``ns``."""
    p = _part(part)
    missing = [n for n in p.names if n not in ns]
    if missing:
        return Verdict("failed", f"the cell defines no {', '.join(missing)}: exercise {p.title!r} asks for "
                                 f"{', '.join(p.names)}")
    try:
        return Verdict("passed", p.check(ns))
    except NotImplementedError as err:
        return Verdict("stub", str(err))
    except AssertionError as err:
        return Verdict("failed", str(err))
    except Exception as err:  # noqa: BLE001 - the reader's code raised: reported with its traceback
        return Verdict("error", f"{type(err).__name__}: {err}", err)


def _raises_not_implemented(function: ast.FunctionDef) -> bool:
    return any(isinstance(s, ast.Raise) and s.exc is not None and "NotImplementedError" in ast.unparse(s.exc)
               for s in function.body)


def unwritten(part: str, cell: str) -> tuple[list[str], list[str]] | None:
    """Which of the part's functions and methods in ``cell`` still raise ``NotImplementedError`` in their body (not
    written yet), and which do not (written): two lists of names (``"DiTBlock.forward"`` for a method); None when
    the cell does not parse or leaves out a name the part asks for."""
    try:
        tree = ast.parse(cell)
    except SyntaxError:
        return None
    definitions = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}  # the last one
    if any(name not in definitions for name in _part(part).names):
        return None
    todo, done = [], []
    for name in _part(part).names:
        node = definitions[name]
        functions = [node] if isinstance(node, ast.FunctionDef) else [
            n for n in node.body if isinstance(n, ast.FunctionDef)]
        for f in functions:
            (todo if _raises_not_implemented(f) else done).append(name if f is node else f"{name}.{f.name}")
    return todo, done


def is_stub(part: str, cell: str) -> bool:
    """Whether ``cell`` is the part's stub, nothing of it written: every function and method of the part's names
    still raises ``NotImplementedError`` (the chapter's stub, whatever its comments and docstrings say). A cell with
    some of them written is not a stub: it is saved, and the names that still raise are named."""
    found = unwritten(part, cell)
    return found is not None and bool(found[0]) and not found[1]


def _exec_part(source: str, filename: str, ns: dict) -> None:
    """Run ``source`` in ``ns`` as the file ``filename`` (whose text a traceback then shows, saved or not)."""
    import linecache

    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(source, filename, "exec"), ns)


@dataclass
class Resolved:
    """Whose code each part is: ``"yours"``, or the book's with the reason (``"not written"``, ``"fails its
    check"``, ``"raises an error"``), and the checker's message."""

    part: str
    whose: str
    reason: str = ""
    message: str = ""

    @property
    def yours(self) -> bool:
        return self.whose == "yours"


def _resolve_into(ns: dict, folder, part: str) -> Resolved:
    """Define ``part`` in ``ns``: the reader's file when it passes its check (checked now when its verdict is not on
    record), else the book's solution."""
    path = path_of(folder, part)
    if path.is_file():
        source = path.read_text()
        record = _records(folder).get(part)
        if record is None or record.get("sha256") != _digest(source):
            trial = dict(ns)
            try:
                _exec_part(source, str(path), trial)
                verdict = judge(part, trial)
            except Exception as err:  # noqa: BLE001 - a file that does not even run: the book's stands in
                verdict = Verdict("error", f"{type(err).__name__}: {err}", err)
            _record(folder, part, source, "passed" if verdict.verdict == "passed" else "failed", verdict.message)
            record = _records(folder)[part]
        if record["verdict"] == "passed":
            try:
                _exec_part(source, str(path), ns)
            except Exception as err:  # noqa: BLE001 - it passed once, yet does not run now (an import, a name gone)
                _run_book(part, ns)
                return Resolved(part, "book's", "raises an error",
                                f"{path} passed its check but does not run now: {type(err).__name__}: {err}")
            return Resolved(part, "yours", message=record["message"])
        _run_book(part, ns)
        return Resolved(part, "book's", "fails its check", record["message"])
    _run_book(part, ns)
    return Resolved(part, "book's", "not written")


# ------------------------------------------------------------------------------------------------ loading
class Yours(types.SimpleNamespace):
    """The reader's code, assembled: every name of every part as an attribute (``yours.DiT``,
    ``yours.training_step``, ...), ``parts`` (part -> :class:`Resolved`) and ``line``, the sentence :func:`load`
    printed."""


def assemble(folder=None, parts=None, *, before: str | None = None) -> tuple[dict, dict[str, Resolved]]:
    """The namespace of the reader's code and whose each part is: every part in order (a part may use those before
    it), the reader's where it passes its check, the book's solution elsewhere. ``parts``: stop after the last of
    these (default: all); ``before``: stop before this part instead."""
    order = list(PARTS)
    if before is not None:
        last = order.index(_part(before).name) - 1
    else:
        last = max(order.index(_part(p).name) for p in parts) if parts else len(order) - 1
    ns = _namespace("your_code")
    resolved = {}
    for part in order[: last + 1]:
        resolved[part] = _resolve_into(ns, folder, part)
    return ns, resolved


def describe(resolved: dict[str, Resolved], parts=None) -> str:
    """One sentence: which of ``parts`` are the reader's and which the book's (and why)."""
    parts = list(parts or resolved)
    yours = [PARTS[p].title for p in parts if resolved[p].yours]
    groups: dict[str, list[str]] = {}
    for p in parts:
        if not resolved[p].yours:
            groups.setdefault(resolved[p].reason, []).append(PARTS[p].title)
    pieces = [f"yours: {', '.join(yours)}"] if yours else ["none of it yours yet"]
    pieces += [f"the book's solution ({reason}): {', '.join(titles)}" for reason, titles in groups.items()]
    return "; ".join(pieces)


def load(folder=None, parts=None, *, quiet: bool = False) -> Yours:
    """The reader's code for a later chapter (see the module docstring), as a :class:`Yours`; prints one line that
    says which of ``parts`` (default: all) are the reader's and which the book's."""
    parts = list(parts or PARTS)
    for p in parts:
        _part(p)
    ns, resolved = assemble(folder, parts)
    line = f"your code ({folder_of(folder)}): {describe(resolved, parts)}"
    if not quiet:
        print(line)
    names = {k: v for k, v in ns.items() if not k.startswith("__")}
    return Yours(**names, parts=resolved, line=line)


# ------------------------------------------------------------------------------------------------ the magics
#: Why a name the notebook knows is unknown in an ``%%answer`` cell.
_NAME_HINT = ("{err}: an %%answer cell runs on its own, as its saved file will in a later chapter. It sees the "
              "imports of the book's solutions (torch, nn, math, ...), your earlier parts, and what it defines itself, "
              "not the names of other cells: define or import the name in this cell.")


def _standing_in(folder, part: str) -> str:
    """What runs in a later chapter in place of an ``%%answer`` cell that saved nothing."""
    saved = _records(folder).get(part)
    if saved and saved["verdict"] == "passed" and path_of(folder, part).is_file():
        return f"your saved {path_of(folder, part)}, which passes its check, stands in for it"
    return "the book's solution stands in for it until you write it here and run the cell"


def _own_frames(tb):
    """``tb`` without its first frames in this module (the magic's plumbing): the reader's traceback starts at the
    checker or at their own code."""
    here = os.path.abspath(__file__)
    while tb is not None and tb.tb_next is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) == here:
        tb = tb.tb_next
    return tb


def _report(err: BaseException, shell) -> None:
    """Show the traceback of ``err`` (the reader's code raised it) in the running IPython, whose cell then ends
    normally: "Run All" goes on, with the book's solution in place of the part. (IPython reads a ``SyntaxError``
    from the exception being handled: the cell's own error is reported from its ``except`` block.)"""
    shell.showtraceback((type(err), err, _own_frames(err.__traceback__)), tb_offset=0)


def answer(part: str, cell: str, user_ns: dict, *, out=print, shell=None) -> Verdict:
    """What ``%%answer part`` does with a cell (see the module docstring); returns the checker's verdict.

    When the reader's code raises an error (in the cell itself or when the checker calls it), the message says what
    stands in for the part, and then: with ``shell`` (the running IPython, which the magic passes), its traceback is
    shown, lines of the reader's cell included, and the verdict returned, so that the chapter goes on with the book's
    solution; without one, the error is raised."""
    p = _part(part)
    folder = folder_of(user_ns.get(FOLDER_PARAMETER))
    ns, _ = assemble(folder, before=part)
    source = header(part) + cell  # the header stands where the %%answer line is: line numbers are the cell's
    try:
        _exec_part(source, str(path_of(folder, part)), ns)
    except Exception as err:  # noqa: BLE001 - the cell does not run: nothing saved, the error shown or raised
        verdict = Verdict("error", f"{type(err).__name__}: {err}", err)
        out(f"{p.title}: the cell raised {verdict.message}; nothing saved: {_standing_in(folder, part)}")
        if isinstance(err, NameError):
            out(_NAME_HINT.format(err=err))
        if shell is None:
            raise
        _report(err, shell)
        return verdict
    finally:
        user_ns.update({name: ns[name] for name in p.names if name in ns})
    verdict = judge(part, ns)
    if verdict.verdict == "stub":
        if is_stub(part, cell):
            standing = _standing_in(folder, part)
            out(f"{p.title}: not written in this cell; {standing}" if standing.startswith("your saved") else
                f"{p.title}: not written yet ({verdict.message or 'NotImplementedError'}); {standing}")
            return verdict
        todo = (unwritten(part, cell) or ([], []))[0]
        verdict = Verdict("failed", f"not finished: {' and '.join(todo) or 'something it calls'} still raise"
                                    f"{'s' if len(todo) < 2 else ''} NotImplementedError "
                                    f"({verdict.message or 'no message'})")
    path = save(folder, part, cell)
    _record(folder, part, source, "passed" if verdict.verdict == "passed" else "failed", verdict.message)
    if verdict.verdict == "passed":
        out(verdict.message)
        out(f"saved as yours in {path}. {p.used_by}".rstrip())
        return verdict
    out(f"{p.title}: {verdict.message}")
    out(f"saved in {path}, but it does not pass its check yet: the book's solution stands in for it until it does")
    if verdict.error is not None:
        if isinstance(verdict.error, NameError):
            out(_NAME_HINT.format(err=verdict.error))
        if shell is None:
            raise verdict.error
        _report(verdict.error, shell)
    return verdict


def solution(part: str, cell: str, user_ns: dict, *, out=print) -> str:
    """What ``%%solution part`` does: run the book's code of ``part`` in a copy of the notebook's namespace, with the
    book's solutions of the parts before it, and print the checker's verdict on it. Binds nothing in the notebook."""
    _part(part)
    ns = dict(user_ns)
    book = _namespace("the_books_code")
    for earlier in list(PARTS)[: list(PARTS).index(part)]:
        _run_book(earlier, book)
    ns.update({k: v for k, v in book.items() if not k.startswith("__")})
    exec(compile("\n" + cell, f"<the book's solution: {part}>", "exec"), ns)
    verdict = judge(part, ns)
    if verdict.verdict != "passed":
        raise AssertionError(f"the book's solution of {part} does not pass its check: {verdict.message}")
    message = verdict.message
    out("the book's " + message[len("your "):] if message.startswith("your ") else f"the book's solution: {message}")
    return message


def register(ipython=None) -> bool:
    """Add the ``%%answer`` and ``%%solution`` cell magics to IPython (the running one by default); False outside
    IPython."""
    if ipython is None:
        try:
            from IPython import get_ipython
        except ImportError:
            return False
        ipython = get_ipython()
    if ipython is None:
        return False

    def _answer(line, cell):
        answer(line.strip(), cell, ipython.user_ns, shell=ipython)

    def _solution(line, cell):
        solution(line.strip(), cell, ipython.user_ns)

    _answer.__doc__ = "%%answer PART: run, check and save your code of PART (dit_book.reader)."
    _solution.__doc__ = "%%solution PART: run the book's solution of PART and check it, binding nothing."
    ipython.register_magic_function(_answer, "cell", "answer")
    ipython.register_magic_function(_solution, "cell", "solution")
    return True


def load_ipython_extension(ipython) -> None:
    """``%load_ext dit_book.reader``."""
    register(ipython)


if __name__ == "__main__":  # pragma: no cover - a listing of the parts
    for p in PARTS.values():
        print(f"{p.name:<18} chapter {p.chapter[:2]}: {', '.join(p.names)}", file=sys.stdout)

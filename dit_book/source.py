"""Showing library code in the chapters: :func:`show_source` renders the code that actually runs.

The chapters never copy library code into cells; they call ``show_source(obj)`` (a class, function, method,
module, or the dotted name of one), which displays it syntax-highlighted with its file and line numbers.
"""

from __future__ import annotations

import html
import importlib
import inspect
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Source:
    """The source code of one object, with where it lives."""

    name: str  # qualified name, e.g. "dit_core.models.DiT.forward"
    path: str  # file, relative to the package's parent folder when inside it (e.g. "dit_core/models.py")
    first_line: int
    text: str

    @property
    def last_line(self) -> int:
        return self.first_line + max(len(self.text.splitlines()), 1) - 1

    @property
    def title(self) -> str:
        return f"{self.name}  ({self.path}, lines {self.first_line}-{self.last_line})"

    def __str__(self) -> str:
        return f"# {self.title}\n{self.text}"


class SourceView:
    """What a notebook displays: highlighted HTML (pygments, inline styles) or plain text."""

    def __init__(self, source: Source, collapsed: bool = False):
        self.source = source
        self.collapsed = collapsed

    def __repr__(self) -> str:
        return str(self.source)

    def _repr_html_(self) -> str:
        src = self.source
        try:
            from pygments import highlight
            from pygments.formatters import HtmlFormatter
            from pygments.lexers import PythonLexer

            formatter = HtmlFormatter(noclasses=True, style="default", linenos="inline",
                                      linenostart=src.first_line, nobackground=True)
            code = highlight(src.text, PythonLexer(), formatter)
        except ImportError:  # pygments comes with IPython; plain <pre> otherwise
            code = f"<pre>{html.escape(src.text)}</pre>"
        title = (f"<code>{html.escape(src.name)}</code> &mdash; <code>{html.escape(src.path)}</code>, "
                 f"lines {src.first_line}&ndash;{src.last_line}")
        # A fixed light background and dark text keep the inline-styled colours readable in dark themes too.
        body = (f'<div class="dit-source" style="background:#f8f8f8;color:#1f2328;border:1px solid #d0d7de;'
                f'border-radius:4px;padding:0.2em 0.8em;overflow-x:auto;font-size:0.85em">{code}</div>')
        if self.collapsed:
            return f"<details><summary>{title}</summary>{body}</details>"
        return f'<div style="margin:0.3em 0">{title}</div>{body}'


def _resolve(dotted: str):
    """'dit_core.models.DiT.forward' -> the object (longest importable module prefix, then attributes)."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        module_name = ".".join(parts[:i])
        try:
            obj = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name is not None and not module_name.startswith(err.name):
                raise  # the module exists but one of its own imports is missing: show that error
            continue
        for attr in parts[i:]:
            try:
                obj = getattr(obj, attr)
            except AttributeError:
                raise ValueError(f"cannot find {dotted!r}: {obj!r} has no attribute {attr!r}") from None
        return obj
    raise ValueError(f"cannot find {dotted!r}: no importable module in it (expected e.g. 'dit_core.models.DiT')")


def source_of(obj) -> Source:
    """The :class:`Source` of a class, function, method, property, module, or a dotted name of one.

    An instance gives its class's source.
    """
    name_hint = obj if isinstance(obj, str) else None
    if isinstance(obj, str):
        obj = _resolve(obj)
    if isinstance(obj, property):
        obj = obj.fget
    elif isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    if not (inspect.ismodule(obj) or inspect.isclass(obj) or inspect.isroutine(obj) or inspect.iscode(obj)):
        obj = type(obj)  # an instance: show its class
    obj = inspect.unwrap(obj) if callable(obj) else obj
    try:
        lines, first = inspect.getsourcelines(obj)
        file = inspect.getsourcefile(obj)
    except (OSError, TypeError) as err:
        raise TypeError(
            f"show_source needs a Python class, function, method or module with source on disk; "
            f"{obj!r} has none ({err})"
        ) from None
    text = textwrap.dedent("".join(lines))
    first = max(first, 1)  # modules report line 0
    path = Path(file).resolve()
    module = inspect.getmodule(obj)
    root_pkg = sys.modules.get((module.__name__ if module else "").split(".")[0])
    shown = str(path)
    if root_pkg is not None and getattr(root_pkg, "__file__", None):
        base = Path(root_pkg.__file__).resolve().parent.parent
        try:
            shown = path.relative_to(base).as_posix()
        except ValueError:
            pass
    if name_hint is not None:
        name = name_hint
    elif inspect.ismodule(obj):
        name = obj.__name__
    else:
        name = f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', getattr(obj, '__name__', '?'))}"
    return Source(name=name, path=shown, first_line=first, text=text)


def _in_ipython() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    return get_ipython() is not None


def show_source(obj, *, collapsed: bool = False):
    """Render the source of a ``dit_core`` object (or its dotted name) in a notebook.

    In IPython/Jupyter it displays syntax-highlighted code with the file name and line numbers and returns
    None; elsewhere it returns the plain text (header line + code). ``collapsed=True`` folds long code under a
    clickable title.

    >>> show_source("dit_core.models.DiT.forward")      # doctest: +SKIP
    """
    view = SourceView(source_of(obj), collapsed=collapsed)
    if _in_ipython():
        from IPython.display import display

        display(view)
        return None
    return str(view.source)

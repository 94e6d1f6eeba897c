"""dit_book: the notebook helpers (source display, smoke mode, output stripping)."""

import inspect

import pytest

import dit_book as book
from dit_book import notebooks


def test_source_of_dotted_name_matches_the_file():
    src = book.source_of("dit_book.smoke_mode")
    assert src.name == "dit_book.smoke_mode"
    assert src.path == "dit_book/notebooks.py"
    assert src.text.startswith("def smoke_mode(")
    file_lines = inspect.getsource(notebooks).splitlines()
    # first_line/last_line point at the real lines of the file
    assert file_lines[src.first_line - 1].startswith("def smoke_mode(")
    assert file_lines[src.last_line - 1].strip() == src.text.rstrip().splitlines()[-1].strip()


def test_source_of_method_instance_and_property():
    method = book.source_of(book.SourceView._repr_html_)
    assert method.text.startswith("def _repr_html_(self)")  # dedented
    assert method.name == "dit_book.source.SourceView._repr_html_"
    inst = book.source_of(book.SourceView(method))
    assert inst.text.startswith("class SourceView")
    prop = book.source_of(book.Source.last_line)
    assert "def last_line" in prop.text


def test_show_source_outside_ipython_returns_plain_text():
    text = book.show_source(book.smoke_mode)
    assert text.splitlines()[0].startswith("# dit_book.notebooks.smoke_mode  (dit_book/notebooks.py, lines ")
    assert "def smoke_mode(default: bool = False) -> bool:" in text
    # a name the book re-exports is shown where it lives
    assert book.show_source(book.set_threads).startswith("# dit_core.runtime.set_threads  (dit_core/runtime.py")


def test_html_view_is_highlighted_and_escaped():
    view = book.SourceView(book.source_of(book.SourceView))
    html = view._repr_html_()
    assert "<span" in html and "style=" in html  # pygments, inline styles (no CSS needed in the book)
    assert "&lt;code&gt;" in html  # the f-strings with <code> in the source are escaped, not rendered
    folded = book.SourceView(view.source, collapsed=True)._repr_html_()
    assert folded.startswith("<details><summary>")


def test_show_source_errors_name_the_problem():
    with pytest.raises(TypeError, match="has none"):
        book.show_source(len)
    with pytest.raises(ValueError, match="has no attribute 'nope'"):
        book.show_source("dit_book.nope")
    with pytest.raises(ValueError, match="no importable module"):
        book.show_source("no_such_package_xyz.thing")


def test_smoke_mode_reads_environment(monkeypatch):
    monkeypatch.delenv(book.SMOKE_ENV, raising=False)
    assert book.smoke_mode() is False and book.smoke_mode(default=True) is True
    monkeypatch.setenv(book.SMOKE_ENV, "1")
    assert book.smoke_mode() is True
    monkeypatch.setenv(book.SMOKE_ENV, "off")
    assert book.smoke_mode(default=True) is False
    monkeypatch.setenv(book.SMOKE_ENV, "maybe")
    with pytest.raises(ValueError, match="DIT_SMOKE='maybe'"):
        book.smoke_mode()


def test_strip_outputs_clears_outputs_and_widget_state(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("1 + 1")
    cell.execution_count = 3
    cell.outputs = [nbformat.v4.new_output("execute_result", {"text/plain": "2"}, execution_count=3)]
    nb.cells.append(cell)
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}}}
    path = tmp_path / "x.ipynb"
    nbformat.write(nb, path)
    assert book.strip_outputs(path) is True
    clean = nbformat.read(path, as_version=4)
    assert clean.cells[0].outputs == [] and clean.cells[0].execution_count is None
    assert "widgets" not in clean.metadata
    assert book.strip_outputs(path) is False  # idempotent
    assert notebooks.main(["strip-outputs", str(path)]) == 0


def test_show_table_turns_a_pipe_table_into_html():
    from dit_book.tables import Table, markdown_to_html

    md = "The runs:\n\n| design | Mflops | note |\n|---|---:|---|\n| **in-context** | 1.25 | `a` < b \\| c |\n"
    html = markdown_to_html(md)
    assert html.startswith("<p>The runs:</p>\n<table")
    assert "<th style=\"text-align: right\">Mflops</th>" in html and "<td style=\"text-align: right\">1.25</td>" in html
    assert "<strong>in-context</strong>" in html and "<code>a</code> &lt; b | c" in html
    assert html.count("<tr>") == 2 and "|" not in html.replace("b | c", "")
    assert Table(md)._repr_html_() == html and repr(Table(md)) == md


def test_a_pipe_table_left_as_text_is_found_in_a_page():
    from dit_book.tables import markdown_to_html, pipe_tables_in_html

    md = "| a | b |\n|---|---|\n| 1 | 2 |"
    assert pipe_tables_in_html(f"<div><p>{md}</p></div>") == ["| a | b | |---|---| | 1 | 2 |"]
    assert len(pipe_tables_in_html(f"<pre>{md}</pre>")) == 1
    assert pipe_tables_in_html(markdown_to_html(md)) == []
    # prose with a pipe, a printed text table without a rule, and a one-line code sample are not tables
    assert pipe_tables_in_html("<p>a | b</p><pre>model   params\nS/2     33 M</pre><pre>x = a | b</pre>") == []

"""dit_book.reader: the reader's cells are run, checked and saved; a later chapter assembles their parts, the book's
solution standing in for each part they have not written (or that fails its check), and says which is which."""

from __future__ import annotations

import json

import pytest

from dit_book import reader

STUB = '''
def q_sample(x0, t, noise, alpha_bar):
    """x_t = sqrt(alpha_bar_t) x0 + sqrt(1 - alpha_bar_t) noise, each image at its own t."""
    raise NotImplementedError("write q_sample")
'''
#: A right q_sample written otherwise than the book's: the factor as a float32 table, indexed then shaped.
MINE = '''
def q_sample(x0, t, noise, alpha_bar):
    root = alpha_bar.sqrt().float()
    rest = (1 - alpha_bar).sqrt().float()
    return root[t].view(-1, 1, 1, 1) * x0 + rest[t].view(-1, 1, 1, 1) * noise
'''


def run(part, cell, folder):
    said, ns = [], {"READER_DIR": str(folder)}
    verdict = reader.answer(part, cell, ns, out=said.append)
    return verdict, ns, "\n".join(said)


def test_an_unfilled_stub_leaves_the_books_solution_in_place(tmp_path):
    verdict, ns, said = run("q_sample", STUB, tmp_path)
    assert verdict.verdict == "stub" and "not written yet (write q_sample)" in said
    assert "the book's solution stands in" in said
    assert not reader.path_of(tmp_path, "q_sample").exists()
    with pytest.raises(NotImplementedError):  # the cell's own names are bound, as any cell's
        ns["q_sample"](None, None, None, None)
    yours = reader.load(tmp_path, ["q_sample"], quiet=True)
    assert yours.parts["q_sample"].whose == "book's" and "not written" in yours.line
    assert yours.q_sample.__code__.co_filename.endswith("my_diffusion.py")


def test_a_right_answer_is_saved_and_then_runs_downstream(tmp_path):
    verdict, ns, said = run("q_sample", MINE, tmp_path)
    assert verdict.verdict == "passed" and "matches GaussianDiffusion.q_sample" in said
    path = reader.path_of(tmp_path, "q_sample")
    assert path.read_text() == reader.header("q_sample") + MINE and f"saved as yours in {path}" in said
    assert json.loads((tmp_path / reader.CHECKS).read_text())["q_sample"]["verdict"] == "passed"
    yours = reader.load(tmp_path, ["q_sample", "training_step"], quiet=True)
    assert yours.parts["q_sample"].yours and yours.q_sample.__code__.co_filename == str(path)
    # the book's training step, standing in, calls the reader's q_sample: one namespace
    assert yours.training_step.__globals__["q_sample"] is yours.q_sample
    assert yours.line.startswith(f"your code ({tmp_path}): yours: q_sample; the book's solution (not written): "
                                 "training step")
    # a stub run again later leaves the saved answer standing in, and says so
    _, _, said = run("q_sample", STUB, tmp_path)
    assert f"not written in this cell; your saved {path}, which passes its check, stands in" in said


def test_a_wrong_answer_is_saved_but_the_books_solution_runs(tmp_path):
    wrong = MINE.replace("[t]", "[t - 1]")
    verdict, _, said = run("q_sample", wrong, tmp_path)
    assert verdict.verdict == "failed" and "used alpha_bar[t - 1]" in said
    assert "does not pass its check yet: the book's solution stands in" in said
    assert reader.path_of(tmp_path, "q_sample").is_file()
    yours = reader.load(tmp_path, ["q_sample"], quiet=True)
    assert yours.parts["q_sample"].reason == "fails its check" and "fails its check" in yours.line


def test_an_error_in_the_readers_code_is_raised_with_its_own_lines(tmp_path):
    broken = MINE.replace("root = alpha_bar.sqrt()", "root = alpha_bars.sqrt()")  # a typo
    with pytest.raises(NameError, match="alpha_bars") as info:
        run("q_sample", broken, tmp_path)
    frames = [f for f in info.traceback if str(f.path) == str(reader.path_of(tmp_path, "q_sample"))]
    assert frames and frames[-1].lineno + 1 == 4  # the cell's line 4 (its line 1 is %%answer); pytest counts from 0
    assert "alpha_bars" in str(frames[-1].statement)
    assert json.loads((tmp_path / reader.CHECKS).read_text())["q_sample"]["verdict"] == "failed"


class FakeShell:
    """What the magics use of IPython: its namespace, its magic registry and showtraceback, which records its call."""

    def __init__(self, user_ns=None):
        self.user_ns = user_ns or {}
        self.magics, self.shown = {}, []

    def register_magic_function(self, fn, kind, name):
        self.magics[kind, name] = fn

    def showtraceback(self, exc_tuple=None, **kwargs):
        self.shown.append((exc_tuple, kwargs))


def _frames(tb) -> list[tuple[str, int, str]]:
    import traceback

    return [(f.filename, f.lineno, f.line) for f in traceback.extract_tb(tb)]


def test_inside_ipython_an_error_is_shown_and_the_chapter_goes_on(tmp_path):
    """In IPython (a shell given) an error in the reader's code is shown with its traceback, their lines included,
    and the cell ends normally: "Run All" goes on with the book's solution, as the message says."""
    shell, said = FakeShell(), []
    file = str(reader.path_of(tmp_path, "q_sample"))
    broken = MINE.replace("root = alpha_bar.sqrt()", "root = alpha_bars.sqrt()")  # raised when the checker calls it
    verdict = reader.answer("q_sample", broken, {"READER_DIR": str(tmp_path)}, out=said.append, shell=shell)
    assert verdict.verdict == "error" and isinstance(verdict.error, NameError)
    assert len(shell.shown) == 1
    (kind, err, tb), options = shell.shown[0]
    assert kind is NameError and err is verdict.error and options == {"tb_offset": 0}
    frames = _frames(tb)
    assert (file, 4, "root = alpha_bars.sqrt().float()") in frames  # the cell's line 4 (line 1: %%answer)
    assert not frames[0][0].endswith("reader.py"), "the traceback starts at the checker, not the magic's plumbing"
    assert "the book's solution stands in for it until it does" in "\n".join(said)
    assert reader.load(tmp_path, ["q_sample"], quiet=True).parts["q_sample"].reason == "fails its check"

    # an error when the cell itself runs: nothing saved, the same report
    shell.shown.clear()
    verdict = reader.answer("q_sample", "SCALE = HELPER_SCALE\n" + MINE, {"READER_DIR": str(tmp_path / "other")},
                            out=said.append, shell=shell)
    assert verdict.verdict == "error" and "HELPER_SCALE" in verdict.message
    (kind, _, tb), _ = shell.shown[0]
    assert kind is NameError and _frames(tb)[0][:2] == (str(reader.path_of(tmp_path / "other", "q_sample")), 2)
    assert "nothing saved: the book's solution stands in" in said[-2] and "runs on its own" in said[-1]
    assert not (tmp_path / "other" / "q_sample.py").exists()


def test_a_name_from_another_cell_is_explained(tmp_path):
    """A name the notebook defines elsewhere is not seen in an %%answer cell (its file must run on its own later):
    the NameError says so, whether it comes up when the cell runs or when the checker calls the code."""
    said = []
    at_run = "SCALE = HELPER_SCALE\n" + MINE
    with pytest.raises(NameError, match="HELPER_SCALE"):
        reader.answer("q_sample", at_run, {"READER_DIR": str(tmp_path), "HELPER_SCALE": 1.0}, out=said.append)
    assert "an %%answer cell runs on its own" in said[-1] and "not the names of other cells" in said[-1]
    said.clear()
    at_call = MINE.replace("root = alpha_bar.sqrt()", "root = my_sqrt(alpha_bar)")
    with pytest.raises(NameError, match="my_sqrt"):
        reader.answer("q_sample", at_call, {"READER_DIR": str(tmp_path), "my_sqrt": None}, out=said.append)
    assert "define or import the name in this cell" in said[-1]


def test_a_file_put_in_place_by_hand_is_checked_when_loaded(tmp_path):
    reader.path_of(tmp_path, "q_sample").write_text(MINE)
    reader.path_of(tmp_path, "dit_block").write_text(  # the MLP branch without its gate: caught, not used
        reader.book_source("dit_block").replace("gate2[:, None] * self.mlp", "self.mlp"))
    yours = reader.load(tmp_path, [*reader.MODEL_PARTS, "q_sample"], quiet=True)
    assert yours.parts["q_sample"].yours
    assert yours.parts["dit_block"].reason == "fails its check"
    assert "the MLP branch is added without its gate" in yours.parts["dit_block"].message
    assert yours.DiTBlock.__init__.__code__.co_filename.endswith("my_dit.py")
    records = json.loads((tmp_path / reader.CHECKS).read_text())
    assert set(records) == {"q_sample", "dit_block"}
    # the verdicts are kept: a second load does not check again, an edited file is checked again
    reader.path_of(tmp_path, "q_sample").write_text(MINE.replace("[t]", "[t - 1]"))
    again = reader.load(tmp_path, ["q_sample"], quiet=True)
    assert again.parts["q_sample"].reason == "fails its check"


def test_a_cell_that_leaves_out_a_name_is_told_which(tmp_path):
    verdict, _, said = run("patchify", "def patchify(x, p):\n    return x\n", tmp_path)
    assert verdict.verdict == "failed" and "the cell defines no unpatchify" in said


def test_a_later_part_uses_the_readers_earlier_ones(tmp_path):
    run("q_sample", MINE, tmp_path)
    verdict, ns, said = run("simple_loss", reader.book_source("simple_loss"), tmp_path)
    assert verdict.verdict == "passed"
    assert ns["simple_loss"].__globals__["q_sample"].__code__.co_filename == str(reader.path_of(tmp_path, "q_sample"))


def test_the_solution_magic_binds_nothing_and_checks_the_books_code(tmp_path):
    said, ns = [], {"READER_DIR": str(tmp_path), "q_sample": "the reader's", "unrelated": 1}
    reader.solution("simple_loss", reader.book_source("simple_loss"), ns, out=said.append)
    assert ns == {"READER_DIR": str(tmp_path), "q_sample": "the reader's", "unrelated": 1}
    assert said[0].startswith("the book's L_simple matches")
    with pytest.raises(AssertionError, match="the book's solution of q_sample does not pass"):
        reader.solution("q_sample", MINE.replace("[t]", "[t - 1]"), ns, out=said.append)


def test_every_part_has_the_books_solution_and_a_checker_that_passes_it(tmp_path):
    ns = reader._namespace("the_books_code")
    for part in reader.PARTS:
        reader._run_book(part, ns)
        assert set(reader.PARTS[part].names) <= set(ns), part
    for part in ("patchify", "label_embedder", "dit", "guidance", "ddim_step"):  # the quick ones
        assert reader.judge(part, ns).verdict == "passed", part


def test_the_magics_register_in_ipython(tmp_path):
    from IPython.testing.globalipapp import start_ipython

    ip = start_ipython()
    assert reader.register(ip)
    ip.user_ns["READER_DIR"] = str(tmp_path)
    ip.run_cell_magic("answer", "q_sample", MINE)
    assert ip.user_ns["q_sample"].__code__.co_filename == str(reader.path_of(tmp_path, "q_sample"))
    ip.user_ns.pop("q_sample")
    ip.run_cell_magic("solution", "q_sample", reader.book_source("q_sample"))
    assert "q_sample" not in ip.user_ns
    # an error in the reader's cell ends the cell normally in IPython: the next cells run
    ip.run_cell_magic("answer", "q_sample", MINE.replace("[t]", "[t_index]"))
    assert ip.user_ns["q_sample"].__code__.co_filename == str(reader.path_of(tmp_path, "q_sample"))


def test_register_adds_both_magics_to_a_shell_and_nothing_outside_ipython(tmp_path, monkeypatch):
    import IPython

    monkeypatch.setattr(IPython, "get_ipython", lambda: None)  # a plain Python process
    assert reader.register() is False
    shell = FakeShell({"READER_DIR": str(tmp_path)})
    assert reader.register(shell) is True
    assert set(shell.magics) == {("cell", "answer"), ("cell", "solution")}
    shell.magics["cell", "answer"]("q_sample ", MINE.replace("[t]", "[t_index]"))  # the shell's errors are shown
    assert len(shell.shown) == 1 and shell.shown[0][0][0] is NameError
    shell.magics["cell", "solution"]("q_sample", reader.book_source("q_sample"))
    assert shell.user_ns["q_sample"].__code__.co_filename == str(reader.path_of(tmp_path, "q_sample"))
    monkeypatch.setattr(IPython, "get_ipython", lambda: shell)  # the running one, by default
    shell.magics.clear()
    assert reader.register() is True and len(shell.magics) == 2


def test_unknown_parts_are_named():
    with pytest.raises(KeyError, match="no part 'qsample': the parts are patchify, "):
        reader.path_of(".", "qsample")


# ------------------------------------------------------------------------------------------------ edge cases
PATCHIFY_HALF = '''
def patchify(x, p):
    n, c, h, w = x.shape
    x = x.reshape(n, c, h // p, p, w // p, p)
    return x.permute(0, 2, 4, 3, 5, 1).reshape(n, (h // p) * (w // p), p * p * c)


def unpatchify(tokens, p, channels):
    """the inverse of patchify"""
    raise NotImplementedError("unpatchify: patchify's steps, undone in reverse order")
'''


def test_a_cell_half_written_is_saved_and_names_what_still_raises(tmp_path):
    verdict, _, said = run("patchify", PATCHIFY_HALF, tmp_path)
    assert verdict.verdict == "failed" and "not finished: unpatchify still raises NotImplementedError" in said
    assert reader.path_of(tmp_path, "patchify").read_text() == reader.header("patchify") + PATCHIFY_HALF
    assert "does not pass its check yet" in said
    assert reader.load(tmp_path, ["patchify"], quiet=True).parts["patchify"].reason == "fails its check"


def test_what_counts_as_the_stub():
    stub = STUB.replace('"""x_t = sqrt(alpha_bar_t) x0 + sqrt(1 - alpha_bar_t) noise, each image at its own t."""',
                        "# my notes: alpha_bar[t], shaped per image")
    assert reader.is_stub("q_sample", STUB) and reader.is_stub("q_sample", stub)  # comments are not code
    assert not reader.is_stub("q_sample", MINE) and not reader.is_stub("patchify", PATCHIFY_HALF)
    assert reader.unwritten("patchify", PATCHIFY_HALF) == (["unpatchify"], ["patchify"])
    block = reader.book_source("dit_block").replace(
        "    def forward(self, x, c):\n", "    def forward(self, x, c):\n        raise NotImplementedError('later')\n")
    assert reader.unwritten("dit_block", block) == (["DiTBlock.forward"], ["modulate", "DiTBlock.__init__"])
    assert reader.unwritten("patchify", "def patchify(x, p):\n    return x\n") is None  # unpatchify left out


def test_a_file_on_record_that_no_longer_runs_gives_way_to_the_books(tmp_path, monkeypatch):
    import importlib
    import sys

    helpers = tmp_path / "helpers"
    helpers.mkdir()
    (helpers / "reader_test_helper.py").write_text("SHAPE = (-1, 1, 1, 1)\n")
    monkeypatch.syspath_prepend(str(helpers))
    cell = "from reader_test_helper import SHAPE\n" + MINE.replace(".view(-1, 1, 1, 1)", ".view(SHAPE)")
    folder = tmp_path / "reader"
    assert run("q_sample", cell, folder)[0].verdict == "passed"
    (helpers / "reader_test_helper.py").unlink()  # the module it imports is gone
    monkeypatch.delitem(sys.modules, "reader_test_helper")
    importlib.invalidate_caches()
    yours = reader.load(folder, ["q_sample", "training_step"], quiet=True)
    resolved = yours.parts["q_sample"]
    assert (resolved.whose, resolved.reason) == ("book's", "raises an error")
    assert "passed its check but does not run now: ModuleNotFoundError" in resolved.message
    assert yours.q_sample.__code__.co_filename.endswith("my_diffusion.py")
    assert yours.training_step.__globals__["q_sample"] is yours.q_sample
    assert "the book's solution (raises an error): q_sample" in yours.line


@pytest.mark.parametrize("content", ["[1, 2]", "{not json", '{"q_sample": "passed"}', '"passed"'])
def test_a_broken_record_is_read_as_none_and_rewritten(tmp_path, content):
    reader.path_of(tmp_path, "q_sample").parent.mkdir(parents=True, exist_ok=True)
    reader.path_of(tmp_path, "q_sample").write_text(MINE)
    (tmp_path / reader.CHECKS).write_text(content)
    with pytest.warns(UserWarning, match="checked again"):
        yours = reader.load(tmp_path, ["q_sample"], quiet=True)
    assert yours.parts["q_sample"].yours  # checked again, and it passes
    records = json.loads((tmp_path / reader.CHECKS).read_text())
    assert records["q_sample"]["verdict"] == "passed"  # the file holds verdicts again

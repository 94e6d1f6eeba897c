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
    assert not reader.register(None) or True  # outside a running IPython it changes nothing


def test_unknown_parts_are_named():
    with pytest.raises(KeyError, match="no part 'qsample': the parts are patchify, "):
        reader.path_of(".", "qsample")

"""dit_book.your_dit: the reader's DiT is trained by the reader's step, saved as a dit_core checkpoint that the
library opens as it is, sampled with the reader's DDIM step and guidance (the library's sampler, number for number),
and published as one HTML file that samples it in a browser opened from disk."""

from __future__ import annotations

import os
import re

import pytest
import torch

from dit_book import reader, your_dit
from dit_book.setup import digits

#: A guidance of the reader's, right and written otherwise than the book's: one batch of 2N, as forward_with_cfg.
GUIDANCE = '''
def guided_fn(model, cfg_scale):
    def model_fn(x, t, y):
        both = model(torch.cat([x, x]), torch.cat([t, t]), torch.cat([y, torch.full_like(y, model.num_classes)]))
        cond, uncond = both.chunk(2)
        c = model.in_channels
        return torch.cat([uncond[:, :c] + cfg_scale * (cond[:, :c] - uncond[:, :c]), cond[:, c:]], dim=1)
    return model_fn
'''


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A reader's folder with their guidance written, the code assembled, 12 steps of training, the checkpoint."""
    folder = tmp_path_factory.mktemp("reader")
    verdict = reader.answer("guidance", GUIDANCE, {"READER_DIR": str(folder)}, out=lambda *_: None)
    assert verdict.verdict == "passed", verdict.message
    yours = reader.load(folder, quiet=True)
    x, y = digits(256)
    result = your_dit.train(yours, x, y, steps=12, progress=False)
    path = your_dit.save(folder / your_dit.CHECKPOINT, result)
    return folder, yours, result, path


def test_the_checkpoint_opens_in_dit_core_as_the_same_network(trained):
    from dit_core import load_dit
    from dit_core.sample import load_model

    _, yours, result, path = trained
    library = load_dit(path)  # the EMA weights, as samplers prefer
    mine, config = your_dit.load(path, yours)
    assert type(mine) is yours.DiT
    # the parts that made the model, no others: the guidance written here samples it, it did not train it
    assert set(config["yours"]["parts"]) == set(your_dit.MADE_BY) and yours.parts["guidance"].yours
    assert config["yours"]["parts"]["training_step"] == "the book's (not written)"
    x, t, y = torch.randn(4, 1, 8, 8), torch.tensor([0, 10, 500, 999]), torch.tensor([1, 10, 3, 7])
    with torch.no_grad():
        assert torch.equal(mine(x, t, y), library(x, t, y))
        assert torch.equal(mine(x, t, y), result.ema(x, t, y))
    _, info = load_model(path)
    assert (info["kind"], info["space"], info["noise_schedule"]) == ("dit_core", "pixel", your_dit.SCHEDULE)
    assert info["label_names"] == [str(d) for d in range(10)] and info["null_class"]
    assert len(result.losses) == 12 and all(v == v for v in result.losses)  # finite: the loop ran the steps


def test_the_page_and_the_chapter_name_the_parts_that_made_the_model():
    parts = {p: "the book's (not written)" for p in your_dit.MADE_BY}
    assert your_dit.made_by({"yours": {"parts": parts}}) == "made by the book's solutions alone (none of your parts yet)"
    parts.update(patchify="yours", training_step="yours", guidance="yours", newton_schulz="yours")
    said = your_dit.made_by({"yours": {"parts": parts}})
    assert said.startswith("made by your patchify, training step; the book's solutions stood in for timestep "
                           "embedding, label embedding, adaLN-Zero block, final layer, DiT, q_sample")
    assert "guidance" not in said and "Newton" not in said  # recorded by an older checkpoint: not what made it


def test_the_start_does_not_depend_on_what_the_readers_init_draws():
    """The library's initial weights are drawn before the reader's class is built: two classes whose __init__ draw
    different amounts of random numbers start from the same weights, dit_core's for the same seed."""
    from types import SimpleNamespace

    from dit_book import my_dit
    from dit_core.models import DiT

    class Thrifty(my_dit.DiT):
        pass

    class Lavish(my_dit.DiT):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            torch.randn(10_000)  # an __init__ that draws more, e.g. an initialisation of its own

    x, y = digits(64)
    starts = [your_dit.train(SimpleNamespace(DiT=cls), x, y, steps=0, progress=False, seed=3).model.state_dict()
              for cls in (Thrifty, Lavish)]
    torch.manual_seed(3)
    library = DiT(**your_dit.SIZE).state_dict()
    for start in starts:
        assert start.keys() == library.keys() and all(torch.equal(start[k], library[k]) for k in library)


def test_the_readers_sampler_is_the_librarys_from_the_same_seed(trained):
    from dit_core.sample import generate

    from dit_core import load_dit

    _, yours, _, path = trained
    mine, _ = your_dit.load(path, yours)
    labels = torch.tensor([0, 3, 7, 9])
    ours = your_dit.sample(mine, labels, yours, steps=10, cfg_scale=2.0, seed=5)
    library = generate(load_dit(path), your_dit.diffusion(), labels, sampler="ddim", steps=10, cfg_scale=2.0, seed=5,
                       clip_denoised=False)
    assert (ours - library).abs().max() < 1e-3
    other_seed = your_dit.sample(mine, labels, yours, steps=10, cfg_scale=2.0, seed=6)
    assert (other_seed - library).abs().max() > 1e-2  # the comparison can fail


def test_ensure_reuses_chapter_5s_checkpoint_and_trains_one_when_missing(trained, tmp_path):
    folder, yours, _, path = trained
    assert your_dit.ensure(folder, yours, None, None, steps=5) == (path, f"your DiT from {path} (chapter 5 trained it)")
    x, y = digits(128)
    made, said = your_dit.ensure(tmp_path, yours, x, y, steps=3, progress=False)
    assert made == tmp_path / your_dit.CHECKPOINT and made.is_file()
    assert said.startswith(f"no {made} (chapter 5 writes it): your DiT trained here, 3 steps in ")


def test_the_readers_classes_export_to_onnx_and_rebuild_as_dit_core(trained):
    pytest.importorskip("onnx")
    from dit_core.export import dit_from_onnx, export_onnx

    _, yours, _, path = trained
    mine, _ = your_dit.load(path, yours)
    with pytest.raises(ValueError, match="with its config"):
        export_onnx(mine)  # the reader's class has no config(): say what is missing
    rebuilt = dit_from_onnx(export_onnx(mine, config=your_dit.config()))
    x, t, y = torch.randn(3, 1, 8, 8), torch.tensor([5, 400, 999]), torch.tensor([2, 10, 4])
    with torch.no_grad():
        assert torch.equal(rebuilt(x, t, y), mine(x, t, y))


# ------------------------------------------------------------------------------------------------ the live page
REQUIRE = os.environ.get("DIT_REQUIRE_BROWSER", "").strip().lower() in {"1", "true", "yes", "on"}


def _missing(reason):
    if REQUIRE:
        pytest.fail(f"{reason} (DIT_REQUIRE_BROWSER=1 makes this a failure)", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def page(trained):
    pytest.importorskip("onnx")
    from dit_book.browser import runtime_folder

    try:
        runtime_folder()
    except FileNotFoundError as err:
        _missing(str(err))
    folder, yours, _, path = trained
    mine, _ = your_dit.load(path, yours)
    widget, file, missing = your_dit.publish(mine, folder / "your-dit.html", intro="<p>trained by the tests</p>")
    assert file and not missing
    return widget, file, mine


def test_without_the_runtime_the_page_is_not_written_and_says_why(trained, tmp_path):
    pytest.importorskip("onnx")
    folder, yours, _, path = trained
    mine, _ = your_dit.load(path, yours)
    widget, file, missing = your_dit.publish(mine, tmp_path / "page.html", runtime=tmp_path / "nowhere")
    assert file is None and "make vendor" in missing and not (tmp_path / "page.html").exists()
    assert widget.page is None and 'data-dit-live="your-dit"' in widget._repr_html_()  # the book still embeds it


def test_the_page_is_one_file_that_asks_for_nothing(page):
    widget, file, _ = page
    text = file.read_text()
    assert text.startswith("<!doctype html>") and "<p>trained by the tests</p>" in text
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=", text), "the page loads nothing from elsewhere"
    assert text.count("</script>") == 4 and 'data-dit-live="your-dit"' in text  # runtime, wasm, model, dit_live.js
    assert widget.bundle["config"] == your_dit.config()
    assert "Your DiT's weights, sampled with the library's DDIM and DDPM loops." in text  # not the reader's step


@pytest.mark.browser
def test_the_page_opened_from_disk_samples_the_readers_model(page):
    """Headless Chromium opens the file (file://, no server), presses Sample as a reader would, and the page's
    samples are generate(...)'s with the same settings and seed."""
    from dit_core.sample import generate

    sync_api = pytest.importorskip("playwright.sync_api") if not REQUIRE else __import__(
        "playwright.sync_api", fromlist=["sync_playwright"])
    from tests.test_browser import CHROMIUM_ARGS, find_chromium

    chromium = find_chromium()
    if chromium is None:
        _missing("no Chromium found: apt-get install chromium (or set DIT_CHROMIUM to its executable)")
    from dit_core import load_dit

    widget, file, mine = page
    library = load_dit(file.parent / your_dit.CHECKPOINT)  # the same weights, dit_core's class (generate needs it)
    errors, requests = [], []
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
        try:
            tab = browser.new_page()
            tab.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            tab.on("pageerror", lambda e: errors.append(str(e)))
            tab.on("request", lambda r: requests.append(r.url))
            tab.goto(file.as_uri(), wait_until="load", timeout=60_000)
            tab.wait_for_function("() => document.querySelector('div.dit-live[data-state]')", timeout=60_000)
            root = tab.locator("div.dit-live")
            root.locator("select[aria-label=class]").select_option("4")
            root.locator("select[aria-label=steps]").select_option("10")
            root.locator("button").click()
            tab.wait_for_function(
                "() => ['done', 'error'].includes(document.querySelector('div.dit-live').dataset.state)", timeout=180_000)
            result = tab.evaluate("""() => ({state: document.querySelector('div.dit-live').dataset.state,
                status: document.querySelector('div.dit-live .dit-live-status').textContent,
                x: Array.from(window.ditLive.last['your-dit'].x), labels: window.ditLive.last['your-dit'].labels})""")
        finally:
            browser.close()
    assert result["state"] == "done", result["status"]
    assert not errors, errors
    assert all(u.startswith(("file:", "data:", "blob:", "about:")) for u in requests), requests
    expected = generate(library, your_dit.diffusion(), result["labels"], sampler="ddim", steps=10,
                        cfg_scale=your_dit.CFG_SCALE, seed=0)
    assert result["labels"] == [4] * len(result["labels"])
    assert (torch.tensor(result["x"]).reshape(expected.shape) - expected).abs().max() < 1e-3


def test_the_books_build_writes_the_linked_page_and_points_the_link_there(page, tmp_path):
    """book/_ext/book_html.py moves the model out of the chapter's page, as for any live sampler, and writes the page
    of its own that the cell output links to into _static/dit-live/, with the runtime of html_static_path."""
    import importlib.util
    import shutil
    import types
    from pathlib import Path

    from dit_book.browser import runtime_folder

    widget, file, _ = page
    markup = widget._repr_html_()
    assert f'href="{file.as_posix()}" data-dit-live-page="your-dit"' in markup
    static = tmp_path / "src" / "static"
    shutil.copytree(runtime_folder(), static / "vendor" / "onnxruntime-web")
    app = types.SimpleNamespace(outdir=str(tmp_path / "html"), add_js_file=lambda *_: None,
                                confdir=str(tmp_path / "src"), config=types.SimpleNamespace(html_static_path=["static"]))
    context = {"body": f"<p>before</p>{markup}<p>after</p>", "pathto": lambda target, _: f"../{target}"}
    spec = importlib.util.spec_from_file_location("book_html", Path(__file__).resolve().parents[1] / "book" / "_ext" /
                                                  "book_html.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.move_live_models(app, "book/07_sampling", None, context, None)
    assert 'href="../_static/dit-live/your-dit.html" data-dit-live-page="your-dit"' in context["body"]
    built = tmp_path / "html" / "_static" / "dit-live" / "your-dit.html"
    assert built.read_text() == file.read_text()  # the same page as the chapter wrote for the reader

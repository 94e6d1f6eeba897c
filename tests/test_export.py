"""dit_core.export: a DiT's forward as an ONNX file, and the sampler's per-step numbers as plain data.

* the exported file rebuilds the same PyTorch model (config and every parameter by name), and ONNX Runtime
  (Python; the browser's runtime is checked by tests/test_browser.py) computes the model's output from it at any
  batch size;
* the tables, entered in the update the module documents (what the book's browser sampler runs), give the images
  of ``dit_core.sample.generate`` for DDIM and DDPM, with and without guidance;
* dit_book.browser.live_sampler carries the model and its tables in its cell output, and the book's Sphinx
  extension moves them into ``_static/dit-live/NAME.js``.
"""

from __future__ import annotations

import base64
import gzip
import importlib.util
import json
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from dit_core.diffusion import create_diffusion
from dit_core.export import dit_from_onnx, export_onnx, onnx_metadata, sampling_tables
from dit_core.models import DiT
from dit_core.sample import generate

REPO_ROOT = Path(__file__).resolve().parents[1]
needs_exporter = pytest.mark.skipif(
    importlib.util.find_spec("onnx") is None or importlib.util.find_spec("onnxscript") is None,
    reason='the ONNX export needs onnx and onnxscript: pip install -e ".[book]"')


def tiny_dit(seed=0, **kwargs) -> DiT:
    """A digits-shaped DiT with random weights everywhere (adaLN-Zero's zero layers too, so the output is not 0)."""
    torch.manual_seed(seed)
    model = DiT(**{**dict(input_size=8, patch_size=2, in_channels=1, hidden_size=32, depth=2, num_heads=2,
                          num_classes=10), **kwargs}).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.1)
    return model


@pytest.fixture(scope="module")
def widget():
    """One export for the module (about 8 s of CPU): the live sampler of a tiny model, whose bundle holds the file."""
    from dit_book.browser import live_sampler

    model = tiny_dit(seed=3)
    diffusion = create_diffusion("", noise_schedule="squaredcos_cap_v2")
    return model, diffusion, live_sampler(model, diffusion, steps=20, cfg_scale=2.0,
                                          label_names=[f"d{i}" for i in range(10)])


@pytest.fixture(scope="module")
def exported(widget):
    model, _, sampler = widget
    return model, gzip.decompress(base64.b64decode(sampler.bundle["onnx"]))


# ------------------------------------------------------------------------------------------------ the ONNX file
@pytest.mark.slow
@needs_exporter
def test_the_file_rebuilds_the_same_model(exported, tmp_path):
    model, data = exported
    assert onnx_metadata(data)["dit_config"] == model.config()
    rebuilt = dit_from_onnx(data)
    for (name, a), (_, b) in zip(model.state_dict().items(), rebuilt.state_dict().items()):
        assert torch.equal(a, b), f"{name} differs after the round trip"
    path = tmp_path / "m.onnx"
    path.write_bytes(data)
    assert torch.equal(dit_from_onnx(path).pos_embed, model.pos_embed)


@pytest.mark.slow
@needs_exporter
def test_onnx_runtime_computes_the_model(exported):
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime (the test extra) runs the exported file")
    model, data = exported
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["x", "t", "y"]
    gen = torch.Generator().manual_seed(1)
    for n in (1, 3, 16):  # the batch size is free (traced with 2)
        x = torch.randn(n, 1, 8, 8, generator=gen)
        t = torch.randint(0, 1000, (n,), generator=gen)
        y = torch.randint(0, 11, (n,), generator=gen)  # 10 is the null class
        (out,) = session.run(None, {"x": x.numpy(), "t": t.numpy(), "y": y.numpy()})
        with torch.no_grad():
            expected = model(x, t, y).numpy()
        assert out.shape == expected.shape == (n, 2, 8, 8)
        np.testing.assert_allclose(out, expected, atol=2e-5, rtol=0)


@needs_exporter
def test_export_refuses_what_it_cannot_export():
    with pytest.raises(ValueError, match="class-conditional"):
        export_onnx(tiny_dit(num_classes=0))
    with pytest.raises(ValueError, match="batch_size must be at least 2"):
        export_onnx(tiny_dit(), batch_size=1)


def test_a_foreign_file_is_refused():
    pytest.importorskip("onnx")
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Identity", ["a"], ["b"])], "g",
                              [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("b", TensorProto.FLOAT, [1])])
    data = helper.make_model(graph).SerializeToString()
    with pytest.raises(ValueError, match="no 'dit_config' metadata"):
        dit_from_onnx(data)
    model = helper.make_model(graph)
    onnx.helper.set_model_props(model, {"dit_config": json.dumps(tiny_dit().config())})
    with pytest.raises(ValueError, match="no initializer 'pos_embed'"):
        dit_from_onnx(model.SerializeToString())


# ------------------------------------------------------------------------------------------------ the tables
def sample_with_tables(model, tables, labels, cfg_scale, seed):
    """The update of dit_core.export's docstring (the browser sampler's loop), from the tables alone, with each
    sample's noise from its own generator seeded with seed + i, as generate draws it."""
    n, c = len(labels), model.in_channels
    shape = (c, model.input_size, model.input_size)
    gens = [torch.Generator().manual_seed(seed + i) for i in range(n)]
    x = torch.stack([torch.randn(shape, generator=g) for g in gens])
    y = torch.tensor(labels)
    col = {k: torch.tensor(v, dtype=torch.float32) for k, v in tables.items() if isinstance(v, list) and k != "t"}
    for k, step in enumerate(tables["t"]):
        t = torch.full((n,), step)
        with torch.no_grad():
            if cfg_scale == 1:
                out = model(x, t, y)
            else:
                null = torch.full_like(y, model.num_classes)
                both = model(torch.cat([x, x]), torch.cat([t, t]), torch.cat([y, null]))
                cond, uncond = both[:n], both[n:]
                out = torch.cat([uncond[:, :c] + cfg_scale * (cond[:, :c] - uncond[:, :c]), cond[:, c:]], dim=1)
        eps, v = out[:, :c], out[:, c:]
        x0 = (col["sqrt_recip_alpha_bar"][k] * x - col["sqrt_recipm1_alpha_bar"][k] * eps).clamp(-1, 1)
        last = k == len(tables["t"]) - 1
        if tables["sampler"] == "ddim":
            eps = (col["sqrt_recip_alpha_bar"][k] * x - x0) / col["sqrt_recipm1_alpha_bar"][k]
            prev = col["alpha_bar_prev"][k]
            x = x0 * prev.sqrt() + (1 - prev).sqrt() * eps
        else:
            mean = col["posterior_coef_x0"][k] * x0 + col["posterior_coef_xt"][k] * x
            f = (v + 1) / 2
            log_var = f * col["log_var_max"][k] + (1 - f) * col["log_var_min"][k]
            if not last:
                z = torch.stack([torch.randn(shape, generator=g) for g in gens])
                x = mean + torch.exp(0.5 * log_var) * z
            else:
                x = mean
    return x.clamp(-1, 1)


@pytest.mark.parametrize("sampler,steps,cfg_scale", [("ddim", 10, 2.0), ("ddim", 7, 1.0), ("ddpm", 12, 3.0)])
def test_tables_give_the_samples_of_generate(sampler, steps, cfg_scale):
    model = tiny_dit(seed=2)
    diffusion = create_diffusion("", noise_schedule="squaredcos_cap_v2")
    tables = sampling_tables(diffusion, sampler, steps)
    assert tables["steps"] == len(tables["t"]) == steps
    assert tables["t"] == sorted(tables["t"], reverse=True)  # the noisiest step first
    if sampler == "ddim":
        assert tables["t"] == [i * (1000 // steps) for i in range(steps)][::-1]
    labels = [3, 1, 4, 1, 5]
    ours = sample_with_tables(model, tables, labels, cfg_scale, seed=9)
    expected = generate(model, diffusion, labels, sampler=sampler, steps=steps, cfg_scale=cfg_scale, seed=9)
    assert (ours - expected).abs().max() < 1e-5


def test_tables_are_refused_for_what_they_cannot_describe():
    diffusion = create_diffusion("")
    with pytest.raises(ValueError, match="describes ddim and ddpm"):
        sampling_tables(diffusion, "dpm-solver++", 10)
    with pytest.raises(ValueError, match="already respaced"):
        sampling_tables(create_diffusion("250"), "ddim", 10)
    with pytest.raises(ValueError, match="predicts the noise"):
        sampling_tables(create_diffusion("", predict_xstart=True), "ddim", 10)
    fixed = sampling_tables(create_diffusion("", learn_sigma=False), "ddpm", 5)
    assert fixed["variance"] == "fixed" and len(fixed["log_var"]) == 5


# ------------------------------------------------------------------------------------------------ the page's glue
def load_extension():
    spec = importlib.util.spec_from_file_location("book_html", REPO_ROOT / "book" / "_ext" / "book_html.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@needs_exporter
def test_live_sampler_carries_the_model_into_the_built_book(widget, tmp_path):
    model, diffusion, widget = widget
    markup = widget._repr_html_()
    assert 'class="dit-live" data-dit-live="digits"' in markup and widget.sizes["shipped"] < 2 * widget.sizes["onnx"]
    assert "20" in [str(s) for s in widget.meta["steps"]["ddim"]]  # the chosen step count is offered

    added = []
    app = types.SimpleNamespace(outdir=str(tmp_path), add_js_file=added.append)
    context = {"body": f"<p>before</p>{markup}<p>after</p>"}
    load_extension().move_live_models(app, "book/07_sampling", None, context, None)
    assert "vnd.dit-live+json" not in context["body"] and "<p>after</p>" in context["body"]
    assert added == ["dit_live.js"]
    text = (tmp_path / "_static" / "dit-live" / "digits.js").read_text()
    prefix = "(window.ditLiveModels = window.ditLiveModels || {})['digits'] = "
    assert text.startswith(prefix) and text.rstrip().endswith(";")
    bundle = json.loads(text[len(prefix):].rstrip().rstrip(";"))
    rebuilt = dit_from_onnx(gzip.decompress(base64.b64decode(bundle["onnx"])))
    assert torch.equal(rebuilt.blocks[0].attn.qkv.weight, model.blocks[0].attn.qkv.weight)
    assert np.array_equal(bundle["diffusion"]["betas"], diffusion.betas)
    page_table = bundle["tables"]["ddim"]["20"]
    exact = sampling_tables(diffusion, "ddim", 20)
    assert page_table["t"] == exact["t"]
    assert np.array_equal(np.float32(page_table["sqrt_recip_alpha_bar"]), np.float32(exact["sqrt_recip_alpha_bar"]))

    pages = {"body": "<p>no sampler here</p>"}
    load_extension().move_live_models(app, "book/intro", None, pages, None)
    assert added == ["dit_live.js"]  # only pages with a sampler load its script


def test_live_sampler_refuses_what_the_page_cannot_show():
    from dit_book.browser import live_sampler

    with pytest.raises(ValueError, match="pixel-space"):
        live_sampler(tiny_dit(in_channels=4, hidden_size=32))
    with pytest.raises(ValueError, match="no null class"):
        live_sampler(tiny_dit(class_dropout_prob=0.0), cfg_scale=2.0)
    with pytest.raises(ValueError, match="file name"):
        live_sampler(tiny_dit(), name="../x")
    with pytest.raises(ValueError, match="label_names has 3 names"):
        live_sampler(tiny_dit(), label_names=["a", "b", "c"])



@pytest.mark.slow
@needs_exporter
def test_a_page_of_its_own(widget, tmp_path):
    """write_page lays out what the book's build would: the page, the sampler's script, the runtime and the model."""
    from dit_book.browser import read_built_model, write_page

    runtime = REPO_ROOT / ".vendor" / "static" / "vendor" / "onnxruntime-web"
    if not (runtime / "ort-wasm-inline.js").is_file():
        pytest.skip("no vendored ONNX Runtime Web: make vendor")
    model, _, sampler = widget
    page = write_page(sampler, tmp_path / "site")
    text = page.read_text()
    assert 'data-dit-live="digits"' in text and "vnd.dit-live+json" not in text and "_static/dit_live.js" in text
    for name in ("dit_live.js", "vendor/onnxruntime-web/ort.wasm.min.js", "vendor/onnxruntime-web/ort-wasm-inline.js"):
        assert (page.parent / "_static" / name).is_file(), name
    rebuilt, diffusion, bundle = read_built_model(page.parent / "_static" / "dit-live" / "digits.js")
    assert torch.equal(rebuilt.final_layer.linear.weight, model.final_layer.linear.weight)
    assert diffusion.num_timesteps == 1000 and bundle["defaults"]["steps"] == 20

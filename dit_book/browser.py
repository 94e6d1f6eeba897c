"""The live sampler of the HTML book: chapter 7's digits model, sampled in the reader's browser, without a kernel.

:func:`live_sampler` exports a trained DiT with :func:`dit_core.export.export_onnx` (its own forward, so DiT is
written once) and the per-step numbers of DDIM and DDPM with :func:`dit_core.export.sampling_tables`, and returns
a cell output that holds both. In the built HTML, the book's Sphinx extension (``book/_ext/book_html.py``) moves
the model out of the page into ``_static/dit-live/<name>.js`` and adds ``dit_live.js``
(``book/_ext/static``), which draws the controls (class, guidance scale, sampler, steps, seed, *Sample*) and runs
the sampling loop with ONNX Runtime Web, vendored from npm by ``make vendor``: from a static server and from a
page opened from disk alike, with no request to another host. In Jupyter the output is a short note (the
ipywidgets sampler is the live one there).

A seed in the page gives the images of ``generate(model, diffusion, [digit] * count, sampler=..., steps=...,
cfg_scale=..., seed=seed)`` (fp32): the page draws each sample's noise as ``torch.randn`` does from its seed.
``tests/test_browser.py`` checks it on the built book, and ``benchmarks/browser_sampler.py`` times it.

Example (a notebook cell)::

    from dit_book.browser import live_sampler

    live_sampler(model, diffusion, label_names=info["label_names"], cfg_scale=2.0, steps=50)
"""

from __future__ import annotations

import base64
import gzip
import html
import json
import re
import time

import numpy as np

#: The step counts the page offers for each sampler (the tables of every one travel with the model).
STEPS = {"ddim": (5, 10, 25, 50, 100), "ddpm": (25, 50, 100, 250)}
#: The MIME type of the script element that carries the model in the cell output (book_html.py moves it out).
BUNDLE_TYPE = "application/vnd.dit-live+json"
NAME_PATTERN = re.compile(r"[A-Za-z0-9_-]+")


class LiveSampler:
    """A cell output: the widget's markup and the model's bundle (``_repr_html_``), and its sizes (``repr``)."""

    def __init__(self, name: str, bundle: dict, defaults: dict, meta: dict, export_seconds: float):
        self.name, self.bundle, self.defaults, self.meta = name, bundle, defaults, meta
        self.export_seconds = export_seconds
        self.page: str | None = None  # a page of its own (write_standalone), linked below the sampler

    @property
    def sizes(self) -> dict:
        """Bytes of the ONNX file, gzipped, and as shipped in the page (base64 of the gzip)."""
        return {"onnx": self.bundle["onnx_bytes"], "gzip": self.bundle["gzip_bytes"],
                "shipped": len(self.bundle["onnx"])}

    def _repr_html_(self) -> str:
        bundle = json.dumps(self.bundle, separators=(",", ":")).replace("<", "\\u003c")
        attr = lambda value: html.escape(json.dumps(value, separators=(",", ":")), quote=True)  # noqa: E731
        return (f'<div class="dit-live" data-dit-live="{self.name}" data-defaults="{attr(self.defaults)}" '
                f'data-meta="{attr(self.meta)}"><p><em>In the HTML book a live sampler runs this model here, in the '
                'browser, without a kernel; in Jupyter the sampler above is the live one.</em></p></div>\n'
                + self._page_link() +
                f'<script type="{BUNDLE_TYPE}" data-dit-live="{self.name}">{bundle}</script>')

    def _page_link(self) -> str:
        """A link to the model's page of its own; the book's build writes that page into ``_static/dit-live/`` and
        points the link there (book/_ext/book_html.py)."""
        if not self.page:
            return ""
        return (f'<p><a class="dit-live-page" href="{html.escape(self.page, quote=True)}" '
                f'data-dit-live-page="{self.name}">This sampler as one HTML file</a>: it opens from disk, in any '
                'browser, with no Python and no server; keep it, or send it.</p>\n')

    def __repr__(self) -> str:
        s = self.sizes
        return (f"live sampler {self.name!r}: ONNX {s['onnx'] / 1e6:.2f} MB ({s['shipped'] / 1e6:.2f} MB in the page, "
                f"gzip + base64), exported in {self.export_seconds:.1f} s; it runs in the HTML book")


def _compact(values):
    """float32 values as the shortest decimals that read back as the same float32 (smaller pages)."""
    return [float(str(np.float32(v))) for v in values]


def live_sampler(model, diffusion=None, *, name: str = "digits", label_names=None, digit: int = 3,
                 cfg_scale: float = 2.0, sampler: str = "ddim", steps: int = 50, seed: int = 0, count: int = 8,
                 steps_offered: dict | None = None, config: dict | None = None, note: str = "") -> LiveSampler:
    """The live sampler of ``model`` for the HTML book, as a cell output (display it, or end a cell with it).

    ``diffusion``: the training diffusion (``create_diffusion("")`` with the model's noise schedule; default: the
    linear one). ``label_names``: the class names in the page's menu (default: the class numbers). ``digit``,
    ``cfg_scale``, ``sampler``, ``steps``, ``seed``: the page's initial settings; ``count``: the samples per press.
    ``steps_offered``: the step counts per sampler (default :data:`STEPS`; ``steps`` is added to its sampler's).
    ``name`` names the model's file in the built book (``_static/dit-live/<name>.js``). ``config``: for a model
    that is not a ``dit_core`` DiT but has its parameters (the reader's, :mod:`dit_book.your_dit`), the DiT
    arguments that rebuild it (:func:`dit_core.export.export_onnx`). ``note``: a sentence put before the page's own.
    """
    from dit_core.diffusion import create_diffusion
    from dit_core.export import INPUT_NAMES, OUTPUT_NAME, export_onnx, sampling_tables
    from dit_core.sample.samplers import has_null_class

    if not NAME_PATTERN.fullmatch(name):
        raise ValueError(f"name {name!r} becomes a file name in the book: use letters, digits, '-' and '_'")
    num_classes = getattr(model, "num_classes", 0)
    if not num_classes:
        raise ValueError("the live sampler shows a class-conditional model (num_classes > 0)")
    if model.in_channels not in (1, 3):
        raise ValueError(f"the live sampler draws pixel-space images (1 or 3 channels); this model has "
                         f"{model.in_channels} channels (a latent model needs its VAE decoder, which the page lacks)")
    shape = [model.in_channels, model.input_size, model.input_size]
    if int(np.prod(shape)) < 16:
        raise ValueError(f"the page draws torch's noise for samples of 16 values or more; this one has {shape}")
    if diffusion is None:
        diffusion = create_diffusion("", learn_sigma=model.learn_sigma)
    offered = {k: sorted(set(v)) for k, v in (steps_offered or STEPS).items()}
    if sampler not in offered:
        raise ValueError(f"sampler {sampler!r}: the page offers {sorted(offered)}")
    offered[sampler] = sorted(set(offered[sampler]) | {int(steps)})
    if not 0 <= digit < num_classes:
        raise ValueError(f"digit must lie in 0..{num_classes - 1}, got {digit}")
    guidance = has_null_class(model)
    if cfg_scale != 1 and not guidance:
        raise ValueError("this model has no null class (class_dropout_prob 0): set cfg_scale=1")
    names = [str(n) for n in (label_names or range(num_classes))]
    if len(names) != num_classes:
        raise ValueError(f"label_names has {len(names)} names for {num_classes} classes")

    if config is None:
        config = model.config()
    start = time.perf_counter()
    onnx = export_onnx(model, config=config)
    export_seconds = time.perf_counter() - start
    packed = gzip.compress(onnx, compresslevel=9, mtime=0)
    tables = {}
    for s, counts in offered.items():
        tables[s] = {}
        for n in counts:
            table = sampling_tables(diffusion, s, n)
            tables[s][str(n)] = {k: _compact(v) if isinstance(v, list) and k != "t" else v for k, v in table.items()}
    bundle = {
        "name": name, "shape": shape, "out_channels": model.out_channels, "num_classes": num_classes,
        "null_class": guidance, "label_names": names, "config": config,
        "input_names": list(INPUT_NAMES), "output_name": OUTPUT_NAME,
        # the training diffusion, for rebuilding it in Python (tests/test_browser.py): float64 betas, variance type
        "diffusion": {"betas": [float(b) for b in diffusion.betas], "model_var_type": diffusion.model_var_type.name},
        "defaults": {"digit": digit, "cfg_scale": cfg_scale, "sampler": sampler, "steps": int(steps), "seed": seed},
        "tables": tables, "onnx_bytes": len(onnx), "gzip_bytes": len(packed),
        "export_seconds": round(export_seconds, 2),
        "onnx": base64.b64encode(packed).decode("ascii"),
    }
    params = sum(p.numel() for p in model.parameters())
    megabytes = round(len(bundle["onnx"]) / 1e6, 1)
    meta = {"shape": shape, "label_names": names, "null_class": guidance, "steps": offered, "megabytes": megabytes,
            "note": (f"{note} " if note else "") + f"This DiT ({params / 1e6:.2f} M parameters), exported to ONNX "
                    "by dit_core.export "
                    f"({len(onnx) / 1e6:.1f} MB, {megabytes} MB in this page), runs here in ONNX Runtime Web "
                    "(WebAssembly, one thread) with dit_core's noise schedule. A seed gives the images of "
                    "generate(..., seed=seed) in Python."}
    defaults = dict(bundle["defaults"], count=count)
    bundle.update(defaults=defaults, meta=meta)  # for a bare <div class="dit-live" data-dit-live="NAME"> elsewhere
    return LiveSampler(name, bundle, defaults, meta, export_seconds)


def runtime_folder(runtime=None):
    """The folder of ONNX Runtime Web that ``make vendor`` fills (default: ``.vendor/static/vendor/onnxruntime-web``
    of this repository, or ``$DIT_ORT_DIR``), checked to hold what a page loads."""
    import os
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    runtime = Path(runtime or os.environ.get("DIT_ORT_DIR") or root / ".vendor" / "static" / "vendor" / "onnxruntime-web")
    missing = [f for f in ("ort.wasm.min.js", "ort-wasm-inline.js") if not (runtime / f).is_file()]
    if missing:
        raise FileNotFoundError(f"no ONNX Runtime Web in {runtime} ({', '.join(missing)} missing): run `make vendor` "
                                "(npm) first, or point DIT_ORT_DIR at such a folder")
    return runtime


def _inline_script(text: str) -> str:
    """``text`` as the body of an inline ``<script>``: a ``</script`` inside it (in a string or a comment) would end
    the element, ``<\\/script`` reads the same to JavaScript."""
    return "<script>" + re.sub(r"</(script)", r"<\\/\1", text, flags=re.IGNORECASE) + "</script>\n"


def standalone_page(widget: LiveSampler, *, runtime=None, title: str = "DiT live sampler", intro: str = "") -> str:
    """One HTML document that samples ``widget``'s model with nothing beside it: ONNX Runtime Web (its wasm build,
    gzipped in ``ort-wasm-inline.js``), the model and ``dit_live.js`` inlined as classic scripts, which a page opened
    from disk may run (it may neither fetch files nor import modules). ``intro``: HTML put above the sampler.
    About 5 MB of runtime, plus the model."""
    from pathlib import Path

    runtime = runtime_folder(runtime)
    root = Path(__file__).resolve().parents[1]
    bundle = json.dumps(widget.bundle, separators=(",", ":"))
    model = f"(window.ditLiveModels = window.ditLiveModels || {{}})[{json.dumps(widget.name)}] = {bundle};"
    markup = LiveSampler(widget.name, widget.bundle, widget.defaults, widget.meta, widget.export_seconds)._repr_html_()
    markup = markup[: markup.index(f'<script type="{BUNDLE_TYPE}"')]  # without a link to the page itself
    scripts = "".join(_inline_script(text) for text in (
        (runtime / "ort.wasm.min.js").read_text(encoding="utf-8"),
        (runtime / "ort-wasm-inline.js").read_text(encoding="utf-8"), model,
        (root / "book" / "_ext" / "static" / "dit_live.js").read_text(encoding="utf-8")))
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">\n<title>{html.escape(title)}</title>\n'
            '<style>body{font-family:system-ui,sans-serif;max-width:60em;margin:2em auto;padding:0 1em;color:#1f2328}'
            '</style>\n' + scripts + f'</head>\n<body>\n<h1>{html.escape(title)}</h1>\n{intro}\n{markup}\n</body></html>\n')


def write_standalone(widget: LiveSampler, path, *, runtime=None, title: str = "DiT live sampler", intro: str = ""):
    """:func:`standalone_page` written to ``path`` (atomically); returns the path."""
    from pathlib import Path

    from dit_core.atomic import atomic_write_text

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    widget.bundle["page"] = {"title": title, "intro": intro}  # for the book's build, which writes it again
    written = atomic_write_text(path, standalone_page(widget, runtime=runtime, title=title, intro=intro))
    widget.page = path.as_posix()
    return written


def read_built_model(path):
    """``(model, diffusion, bundle)`` from a built book's ``_static/dit-live/<name>.js``: the PyTorch DiT rebuilt
    from the page's own ONNX file (:func:`dit_core.export.dit_from_onnx`) and the training diffusion from its betas,
    to sample in Python exactly what the page samples (tests/test_browser.py, benchmarks/browser_sampler.py)."""
    from pathlib import Path

    from dit_core.diffusion.gaussian import LossType, ModelMeanType, ModelVarType
    from dit_core.diffusion.respace import SpacedDiffusion
    from dit_core.export import dit_from_onnx

    text = Path(path).read_text(encoding="utf-8")
    start, end = text.index("] = ") + 4, text.rstrip().rindex(";")
    bundle = json.loads(text[start:end])
    model = dit_from_onnx(gzip.decompress(base64.b64decode(bundle["onnx"])))
    betas = np.asarray(bundle["diffusion"]["betas"], dtype=np.float64)
    diffusion = SpacedDiffusion(use_timesteps=range(len(betas)), betas=betas, model_mean_type=ModelMeanType.EPSILON,
                                model_var_type=ModelVarType[bundle["diffusion"]["model_var_type"]],
                                loss_type=LossType.MSE)
    return model, diffusion, bundle


def write_page(widget: LiveSampler, folder, *, runtime=None, title: str = "DiT live sampler"):
    """A page of its own for ``widget``: ``folder/index.html`` with the files it loads in ``folder/_static`` (as
    the book lays them out), to open from disk or serve. ``runtime``: the folder of ONNX Runtime Web that ``make
    vendor`` fills (default: ``.vendor/static/vendor/onnxruntime-web`` of this repository). Returns the page's path.
    benchmarks/browser_sampler.py times the sampler in it."""
    import shutil
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    runtime = runtime_folder(runtime)
    folder = Path(folder)
    static = folder / "_static"
    shutil.copytree(runtime, static / "vendor" / "onnxruntime-web", dirs_exist_ok=True)
    shutil.copy(root / "book" / "_ext" / "static" / "dit_live.js", static / "dit_live.js")
    (static / "dit-live").mkdir(parents=True, exist_ok=True)
    bundle = json.dumps(widget.bundle, separators=(",", ":"))
    (static / "dit-live" / f"{widget.name}.js").write_text(
        f"(window.ditLiveModels = window.ditLiveModels || {{}})[{widget.name!r}] = {bundle};\n", encoding="utf-8")
    markup = widget._repr_html_()
    markup = markup[: markup.index(f'<script type="{BUNDLE_TYPE}"')]
    page = folder / "index.html"
    page.write_text(f'<!doctype html>\n<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>\n'
                    f'<script src="_static/dit_live.js"></script></head>\n<body>\n{markup}\n</body></html>\n',
                    encoding="utf-8")
    return page

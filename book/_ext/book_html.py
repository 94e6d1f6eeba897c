"""Fixes to the HTML that Jupyter Book 1.x writes, so that the pages load offline and without console errors.

* sphinx-thebe registers its inline configuration script (``const THEBE_JS_URL = ...``) in a way that Sphinx 7
  emits twice on every page; the second copy throws "Identifier 'THEBE_JS_URL' has already been declared".
  :func:`drop_duplicate_scripts` keeps the first copy of every script.
* pydata-sphinx-theme logs "Got invalid theme mode" on every first visit unless a default mode is set;
  :func:`set_default_mode` sets ``auto`` (follow the reader's system setting) unless _config.yml sets one.
* The ipywidgets HTML manager loads its fonts relative to the URL of its AMD modules, which RequireJS puts in
  the page's own folder (404s). ``static/book_widgets.js``, loaded between require.js and the manager
  (``nb_ipywidgets_js`` in _config.yml), maps the module names to ``_static/vendor/html-manager/``. It also
  gives MathJax 3 the one MathJax 2 call the manager makes (``MathJax.Hub.Queue``), which otherwise throws.
* Some notebook outputs link stylesheets from a CDN: matplotlib's ``FuncAnimation.to_jshtml()`` (chapter 7)
  adds Font Awesome 4 from maxcdn for its player buttons. :func:`use_vendored_css` points such links at the
  copy that ``make vendor`` installs from npm (``_static/vendor/font-awesome``), so no page asks another host.
* A live sampler (:func:`dit_book.browser.live_sampler`, chapter 7) leaves its model in the cell output, inside a
  ``<script type="application/vnd.dit-live+json" data-dit-live="NAME">``. :func:`move_live_models` writes it to
  ``_static/dit-live/NAME.js`` (a classic script, which a page opened from disk may load, unlike a fetched file),
  removes it from the page, so that the page stays light until the reader presses *Sample*, and adds
  ``static/dit_live.js`` (the widget and the sampling loop) to every page that shows a live sampler. A sampler with
  a page of its own (chapter 7's model of the reader, :func:`dit_book.browser.write_standalone`) links to it: the
  build writes that page, one HTML file with the runtime and the model inlined, to ``_static/dit-live/NAME.html``
  and points the link there.

The browser test (tests/test_browser.py) fails on any console error and any request to another host, so
removing this extension shows there.
"""

from __future__ import annotations

import re
from pathlib import Path

#: The model of a live sampler in a cell output (dit_book.browser.BUNDLE_TYPE), and its widget.
LIVE_MODEL = re.compile(
    r'<script type="application/vnd\.dit-live\+json" data-dit-live="([A-Za-z0-9_-]+)">(.*?)</script>', re.DOTALL)
LIVE_WIDGET = re.compile(r'<div class="dit-live" data-dit-live="')
#: The link to a live sampler's page of its own (dit_book.browser.LiveSampler._page_link).
LIVE_PAGE = re.compile(r'<a class="dit-live-page" href="[^"]*" data-dit-live-page="([A-Za-z0-9_-]+)">')
#: Where ONNX Runtime Web lies under a folder of html_static_path (``make vendor``).
RUNTIME = Path("vendor") / "onnxruntime-web"

#: Stylesheets that notebook outputs link from a CDN -> the vendored copy under _static/ (see the Makefile).
VENDORED_CSS = {
    r"https?://(?:maxcdn|stackpath)\.bootstrapcdn\.com/font-awesome/4\.[0-9.]+/css/font-awesome(?:\.min)?\.css":
        "_static/vendor/font-awesome/css/font-awesome.min.css",
    r"https?://cdnjs\.cloudflare\.com/ajax/libs/font-awesome/4\.[0-9.]+/css/font-awesome(?:\.min)?\.css":
        "_static/vendor/font-awesome/css/font-awesome.min.css",
}


def set_default_mode(app, config) -> None:
    context = dict(config.html_context or {})  # pydata-sphinx-theme reads it from html_context
    context.setdefault("default_mode", "auto")
    config.html_context = context


def add_static_folder(app, config) -> None:
    """Serve book/_ext/static/ (book_widgets.js) from _static/ beside the vendored files."""
    folder = str(Path(__file__).resolve().parent / "static")
    if folder not in config.html_static_path:
        config.html_static_path = [*config.html_static_path, folder]


def use_vendored_css(app, pagename, templatename, context, doctree) -> None:
    body = context.get("body")
    if not body:
        return
    for pattern, local in VENDORED_CSS.items():
        body = re.sub(pattern, context["pathto"](local, 1), body)
    context["body"] = body


def move_live_models(app, pagename, templatename, context, doctree) -> None:
    body = context.get("body")
    if not body or not LIVE_WIDGET.search(body):
        return
    folder = Path(app.outdir) / "_static" / "dit-live"
    bundles = {}

    def write(match):
        folder.mkdir(parents=True, exist_ok=True)
        name, bundle = match.group(1), match.group(2)
        (folder / f"{name}.js").write_text(
            f"(window.ditLiveModels = window.ditLiveModels || {{}})[{name!r}] = {bundle};\n", encoding="utf-8")
        bundles[name] = bundle
        return ""

    body = LIVE_MODEL.sub(write, body)

    def page(match):
        name = match.group(1)
        runtime = next((Path(app.confdir) / p / RUNTIME for p in app.config.html_static_path
                        if (Path(app.confdir) / p / RUNTIME / "ort-wasm-inline.js").is_file()), None)
        if name not in bundles or runtime is None:
            from sphinx.util import logging

            why = "no ONNX Runtime Web: make vendor" if runtime is None else "no model"
            logging.getLogger(__name__).warning(f"{pagename}: no page of its own for the live sampler {name!r} ({why})")
            return match.group(0)
        import json

        from dit_book.browser import LiveSampler, standalone_page

        bundle = json.loads(bundles[name])
        widget = LiveSampler(name, bundle, bundle["defaults"], bundle["meta"], bundle.get("export_seconds", 0.0))
        text = standalone_page(widget, runtime=runtime, **bundle.get("page", {}))
        (folder / f"{name}.html").write_text(text, encoding="utf-8")
        href = context["pathto"](f"_static/dit-live/{name}.html", 1)
        return f'<a class="dit-live-page" href="{href}" data-dit-live-page="{name}">'

    context["body"] = LIVE_PAGE.sub(page, body)
    app.add_js_file("dit_live.js")  # for this page only (called in html-page-context)


def drop_duplicate_scripts(app, pagename, templatename, context, doctree) -> None:
    scripts = context.get("script_files")
    if not scripts:
        return
    seen, unique = set(), []
    for script in scripts:
        # Inline scripts are registered with filename None by some extensions and "" by Sphinx's copy.
        filename = getattr(script, "filename", script) or ""
        key = (str(filename), repr(sorted(getattr(script, "attributes", {}).items())))
        if key not in seen:
            seen.add(key)
            unique.append(script)
    scripts[:] = unique


def setup(app):
    app.connect("config-inited", set_default_mode)
    app.connect("config-inited", add_static_folder)
    app.connect("html-page-context", use_vendored_css)
    app.connect("html-page-context", move_live_models)
    app.connect("html-page-context", drop_duplicate_scripts, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}

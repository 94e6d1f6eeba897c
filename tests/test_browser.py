"""The built book in a real browser: every page loads offline, math is typeset, figures and widgets render.

Debian's Chromium, driven headless by Playwright (the Python package; its own browser downloads are never
used), opens every page listed in ``_toc.yml`` from ``_build/html``, served by a local ``http.server`` on
127.0.0.1. For each page the test checks that

* the page loads (HTTP 200) and every resource it asks for is served by 127.0.0.1: **any request to another
  host fails the test** (requests are recorded with ``page.on("request")`` and aborted, so the test itself
  never reaches the network);
* no local resource is missing (no failed request, no HTTP error status);
* math is typeset: every ``span.math`` / ``div.math`` that Sphinx writes for ``$...$`` holds an MathJax
  ``mjx-container``, and MathJax reports no TeX error (``mjx-merror``);
* every ``img`` decoded (``naturalWidth > 0``): the matplotlib figures, the sample grids, the logos;
* every saved widget view (``application/vnd.jupyter.widget-view+json``) was rendered by the vendored
  ipywidgets HTML manager, without error;
* the console shows no error and the page throws no exception, except the entries of
  :data:`CONSOLE_ALLOW` (each with the reason it is harmless);
* on a chapter page, the "Running this chapter" box is there, and every exercise's solution (a dropdown admonition,
  sphinx-togglebutton) starts hidden and opens when its title is clicked.

A full-page screenshot of each page goes to ``_build/screenshots/<page>.png`` (a CI artifact).

Prerequisites: a built book (``make book``, or ``make book-smoke`` for the quick CI build), the
``playwright`` package (``pip install -e ".[browser]"``) and a Chromium (``apt-get install chromium``;
``DIT_CHROMIUM`` points at another executable). When one is missing, or the build is older than a file in
book/ or the book's configuration, the tests skip and say why; with ``DIT_REQUIRE_BROWSER=1`` (set by
``make browser-test`` and CI) they fail instead. ``DIT_BOOK_HTML`` points at another build folder (of any
tree: its age is then not checked).
"""

from __future__ import annotations

import functools
import http.server
import os
import re
import shutil
import threading
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
HTML_DIR = Path(os.environ.get("DIT_BOOK_HTML", REPO_ROOT / "_build" / "html")).resolve()
SCREENSHOT_DIR = REPO_ROOT / "_build" / "screenshots"
REQUIRE = os.environ.get("DIT_REQUIRE_BROWSER", "").strip().lower() in {"1", "true", "yes", "on"}
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run",
                 "--disable-dev-shm-usage"]
PAGE_TIMEOUT_MS = 60_000
VIEWPORT = {"width": 1280, "height": 900}

#: Console messages (type "error") and page exceptions that are allowed, as (regex, reason) pairs.
#: Keep it short: every entry is a documented, harmless message; anything else fails the test.
CONSOLE_ALLOW: list[tuple[str, str]] = [
    # Chromium asks for /favicon.ico on every origin; Sphinx books have no favicon unless one is configured.
    (r"favicon\.ico", "no favicon configured: the browser's own request, not the page's"),
]

pytestmark = pytest.mark.browser


def _missing(reason: str):
    """Skip (or fail, under DIT_REQUIRE_BROWSER=1) with a reason that names the fix."""
    if REQUIRE:
        pytest.fail(f"{reason} (DIT_REQUIRE_BROWSER=1 makes this a failure)", pytrace=False)
    pytest.skip(reason)


def find_chromium() -> str | None:
    """The Chromium to drive: $DIT_CHROMIUM, else Debian's chromium on PATH."""
    explicit = os.environ.get("DIT_CHROMIUM")
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return "/usr/bin/chromium" if os.access("/usr/bin/chromium", os.X_OK) else None


def toc_pages() -> list[str]:
    """Every page of _toc.yml (root first), as paths relative to the HTML folder, e.g. 'book/intro.html'."""
    toc = yaml.safe_load((REPO_ROOT / "_toc.yml").read_text())
    found: list[str] = []

    def walk(node):
        if isinstance(node, dict):
            for key in ("root", "file"):
                if isinstance(node.get(key), str):
                    found.append(re.sub(r"\.(ipynb|md)$", "", node[key]) + ".html")
            for value in node.values():
                if isinstance(value, (dict, list)):
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(toc)
    return found


PAGES = toc_pages()


def stale_sources() -> list[str]:
    """Book sources changed after the HTML was built (so the pages may not show them).

    A chapter is compared with its own page (Sphinx rewrites only the pages whose sources changed); the
    configuration, the bibliography and book/_ext with the newest page.
    """
    stale = []
    newest = 0.0
    for page in PAGES:
        html = HTML_DIR / page
        if not html.is_file():
            continue
        newest = max(newest, html.stat().st_mtime)
        for suffix in (".ipynb", ".md"):
            source = REPO_ROOT / Path(page).with_suffix(suffix)
            if source.is_file() and source.stat().st_mtime > html.stat().st_mtime:
                stale.append(str(source.relative_to(REPO_ROOT)))
    shared = [REPO_ROOT / "_config.yml", REPO_ROOT / "_toc.yml", REPO_ROOT / "book" / "references.bib",
              *(REPO_ROOT / "book" / "_ext").rglob("*")]
    stale += [str(p.relative_to(REPO_ROOT)) for p in shared
              if p.is_file() and "__pycache__" not in p.parts and p.stat().st_mtime > newest]
    return sorted(stale)


def is_allowed(text: str) -> bool:
    return any(re.search(pattern, text) for pattern, _ in CONSOLE_ALLOW)


# ------------------------------------------------------------------------------------------------ fixtures
class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass


@pytest.fixture(scope="module")
def server():
    """The built HTML, served on 127.0.0.1 at a free port; yields the base URL."""
    if not (HTML_DIR / "index.html").is_file():
        _missing(f"no built book at {HTML_DIR} (index.html missing): run `make book` or `make book-smoke` first")
    stale = [] if "DIT_BOOK_HTML" in os.environ else stale_sources()
    if stale:
        _missing(f"the book in {HTML_DIR} is older than {stale[:3]}{' ...' if len(stale) > 3 else ''}: rebuild it "
                 "(`make book-smoke`, or `make book`)")
    handler = functools.partial(_QuietHandler, directory=str(HTML_DIR))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, name="book-http", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


@pytest.fixture(scope="module")
def browser():
    """Headless Debian Chromium through Playwright (never Playwright's downloaded browsers)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing('the playwright package is not installed: pip install -e ".[browser]"')
    chromium = find_chromium()
    if chromium is None:
        _missing("no Chromium found: apt-get install chromium (or set DIT_CHROMIUM to its executable)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


class PageLog:
    """Everything a page did while it loaded: requests, failures, console errors, exceptions."""

    def __init__(self, base: str):
        self.host = urlsplit(base).netloc
        self.requests: list[str] = []
        self.external: list[str] = []
        self.failed: list[str] = []
        self.errors: list[str] = []

    def attach(self, page):
        page.on("request", self._on_request)
        page.on("requestfailed", lambda r: self.failed.append(f"{r.url} ({r.failure})")
                if urlsplit(r.url).netloc == self.host else None)
        page.on("response", lambda r: self.failed.append(f"{r.url} (HTTP {r.status})")
                if r.status >= 400 and not is_allowed(r.url) else None)
        page.on("console", lambda m: self.errors.append(f"console {m.type}: {m.text} [{m.location.get('url', '')}]")
                if m.type == "error" and not is_allowed(f"{m.text} {m.location.get('url', '')}") else None)
        page.on("pageerror", lambda e: self.errors.append(f"exception: {e}") if not is_allowed(str(e)) else None)
        # Abort everything not served by our server, so that a leak is recorded but never reaches the network.
        page.route("**/*", self._route)

    def _on_request(self, request):
        self.requests.append(request.url)
        if not self._local(request.url):
            self.external.append(request.url)

    def _local(self, url: str) -> bool:
        parts = urlsplit(url)
        return parts.scheme in ("data", "blob", "about") or parts.netloc == self.host

    def _route(self, route):
        if self._local(route.request.url):
            route.continue_()
        else:
            route.abort()


# ------------------------------------------------------------------------------------------------ the test
MATH_JS = """async () => {
  const maths = Array.from(document.querySelectorAll('span.math, div.math'));
  if (maths.length && window.MathJax && MathJax.startup && MathJax.startup.promise) {
    await Promise.race([MathJax.startup.promise, new Promise(done => setTimeout(done, 30000))]);
  }
  return {
    total: maths.length,
    typeset: maths.filter(m => m.querySelector('mjx-container')).length,
    untypeset: maths.filter(m => !m.querySelector('mjx-container')).slice(0, 3).map(m => m.textContent.slice(0, 80)),
    errors: Array.from(document.querySelectorAll('mjx-merror')).slice(0, 3).map(e => e.textContent.slice(0, 80)),
    mathjax: !!(window.MathJax && MathJax.version),
  };
}"""

IMAGES_JS = """async () => {
  const imgs = Array.from(document.images);
  await Promise.all(imgs.map(img => img.decode().catch(() => null)));
  return imgs.map(img => ({src: img.getAttribute('src') || '', width: img.naturalWidth}));
}"""

WIDGETS_JS = """() => {
  const views = document.querySelectorAll('script[type="application/vnd.jupyter.widget-view+json"]');
  const rendered = document.querySelectorAll('.widget-subarea .jupyter-widgets, .widget-subarea .lm-Widget');
  const errors = Array.from(document.querySelectorAll('.widget-subarea .jupyter-widgets-error-widget,'
                                                       + ' .widget-subarea .widget-error'));
  return {views: views.length, rendered: rendered.length,
          subareas: document.querySelectorAll('.widget-subarea').length, errors: errors.length,
          manager: typeof window.require === 'function'};
}"""


def is_chapter(page_path: str) -> bool:
    """A page built from a notebook (a chapter or the appendix): those have a box and exercises."""
    return (REPO_ROOT / Path(page_path).with_suffix(".ipynb")).is_file()


def check_solution_toggles(page) -> dict:
    """Every dropdown admonition (an exercise's solution) starts with its content hidden and shows it when its title
    is clicked (sphinx-togglebutton). Returns the count and what went wrong."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    dropdowns = page.locator("div.admonition.dropdown")
    problems = []
    for i in range(dropdowns.count()):
        item = dropdowns.nth(i)
        title = item.locator(":scope > .admonition-title")
        body = item.locator(":scope > :not(.admonition-title)").first
        name = f"dropdown {i + 1} ({title.inner_text().strip()[:30]!r})"
        if item.locator(".toggle-button").count() != 1:
            problems.append(f"{name}: no toggle button (sphinx-togglebutton did not run)")
            continue
        if body.is_visible():
            problems.append(f"{name}: its content is visible before it is opened")
            continue
        item.scroll_into_view_if_needed()
        title.click()
        try:
            body.wait_for(state="visible", timeout=5_000)
        except PlaywrightTimeout:
            problems.append(f"{name}: clicking its title did not show its content")
    return {"count": dropdowns.count(), "problems": problems}


def test_every_toc_page_was_built():
    if not HTML_DIR.is_dir():
        _missing(f"no built book at {HTML_DIR}: run `make book` or `make book-smoke` first")
    missing = [p for p in PAGES if not (HTML_DIR / p).is_file()]
    if missing:
        _missing(f"the build in {HTML_DIR} is older than _toc.yml: {missing} not built; rebuild the book")


@pytest.mark.parametrize("page_path", PAGES, ids=[Path(p).stem for p in PAGES])
def test_no_table_is_shown_as_text(page_path):
    """Every table a page shows is an HTML table: no paragraph or printed output is a Markdown pipe table (a cell
    shows one with ``dit_book.show_table``)."""
    if not (HTML_DIR / page_path).is_file():
        _missing(f"{page_path} is listed in _toc.yml but not in {HTML_DIR}: rebuild the book")
    from dit_book.tables import pipe_tables_in_html

    raw = pipe_tables_in_html((HTML_DIR / page_path).read_text(encoding="utf-8"))
    assert not raw, f"{page_path} shows {len(raw)} pipe table(s) as text (use dit_book.show_table): {raw}"


@pytest.mark.parametrize("page_path", PAGES, ids=[Path(p).stem for p in PAGES])
def test_page_renders_offline(page_path, server, browser):
    if not (HTML_DIR / page_path).is_file():
        _missing(f"{page_path} is listed in _toc.yml but not in {HTML_DIR}: rebuild the book")
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    context = browser.new_context(viewport=VIEWPORT, service_workers="block")
    page = context.new_page()
    log = PageLog(server)
    log.attach(page)
    try:
        response = page.goto(f"{server}/{page_path}", wait_until="load", timeout=PAGE_TIMEOUT_MS)
        assert response is not None and response.status == 200, f"{page_path}: HTTP {response and response.status}"
        math = page.evaluate(MATH_JS)
        images = page.evaluate(IMAGES_JS)
        widget_views = page.evaluate(WIDGETS_JS)["views"]
        if widget_views:  # the html manager renders asynchronously after loading its AMD modules
            try:
                page.wait_for_function(
                    "n => document.querySelectorAll('.widget-subarea .jupyter-widgets, .widget-subarea .lm-Widget')"
                    ".length >= n", arg=widget_views, timeout=PAGE_TIMEOUT_MS)
            except PlaywrightTimeout:
                pass  # reported below with the counts
        widgets = page.evaluate(WIDGETS_JS)
        page.wait_for_load_state("networkidle", timeout=PAGE_TIMEOUT_MS)
        SCREENSHOT_DIR.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOT_DIR / (Path(page_path).stem + ".png")), full_page=True)
        boxes = page.locator(".dit-running-box").count()
        toggles = check_solution_toggles(page)
    finally:
        context.close()

    problems = []
    if log.external:
        problems.append(f"requests to hosts other than 127.0.0.1 (the page is not offline): {log.external[:5]}")
    if log.failed:
        problems.append(f"local resources failed to load: {log.failed[:5]}")
    if math["total"]:
        if not math["mathjax"]:
            problems.append(f"{math['total']} math elements but MathJax did not load")
        elif math["typeset"] != math["total"]:
            problems.append(f"math not typeset: {math['typeset']}/{math['total']}, e.g. {math['untypeset']}")
        if math["errors"]:
            problems.append(f"TeX errors in MathJax output: {math['errors']}")
    broken = [i["src"] for i in images if i["width"] == 0]
    if broken:
        problems.append(f"{len(broken)} image(s) did not render (naturalWidth 0): {broken[:5]}")
    if widgets["views"] and (widgets["rendered"] < widgets["views"] or widgets["errors"]):
        problems.append(f"widgets: {widgets['views']} saved views, {widgets['rendered']} rendered, "
                        f"{widgets['errors']} errors")
    if log.errors:
        problems.append(f"console errors / exceptions: {log.errors[:5]}")
    if is_chapter(page_path):
        if boxes != 1:
            problems.append(f"{boxes} 'Running this chapter' boxes (expected one, after the title)")
        if toggles["count"] < 3:
            problems.append(f"{toggles['count']} solution toggles (every chapter has at least three exercises)")
    if toggles["problems"]:
        problems.append(f"solution toggles: {toggles['problems'][:3]}")
    assert not problems, f"{page_path}:\n  " + "\n  ".join(problems)


# ------------------------------------------------------------------------------------------------ the live sampler
#: The page with chapter 7's live sampler (dit_book.browser.live_sampler) and the model file the build writes for it.
LIVE_PAGE = "book/07_sampling.html"
LIVE_MODEL = HTML_DIR / "_static" / "dit-live" / "digits.js"
#: Agreement asked of the page's samples with dit_core's (pixel values in [-1, 1]); measured: about 2e-5.
LIVE_TOLERANCE = 1e-3
LIVE_TIMEOUT_MS = 180_000


@pytest.fixture(scope="module")
def live_model():
    """The page's own model (rebuilt in PyTorch from its ONNX file), its training diffusion and its bundle."""
    if not LIVE_MODEL.is_file():
        _missing(f"no live sampler model at {LIVE_MODEL}: chapter 7 writes it when the book is built (make book-smoke)")
    from dit_book.browser import read_built_model

    return read_built_model(LIVE_MODEL)


def _open_live_page(browser, url: str, log: PageLog):
    context = browser.new_context(viewport=VIEWPORT, service_workers="block")
    page = context.new_page()
    log.attach(page)
    page.goto(url, wait_until="load", timeout=PAGE_TIMEOUT_MS)
    page.wait_for_function("() => window.ditLive && document.querySelector('div.dit-live[data-state]')",
                           timeout=PAGE_TIMEOUT_MS)
    return context, page


def _press_sample(page, digit: int, sampler: str, steps: int, scale: float, seed: int) -> dict:
    """Set the widget's controls as a reader would, press Sample, wait; the page's result and status line."""
    widget = page.locator("div.dit-live").first
    widget.scroll_into_view_if_needed()
    widget.locator("select[aria-label=class]").select_option(str(digit))
    widget.locator("select[aria-label=sampler]").select_option(sampler)
    widget.locator("select[aria-label=steps]").select_option(str(steps))
    widget.locator("input[aria-label='guidance scale']").evaluate(  # a range input: set it as a drag would
        "(el, v) => { el.value = v; el.dispatchEvent(new Event('input', {bubbles: true})); }", str(scale))
    widget.locator("input[aria-label=seed]").fill(str(seed))
    widget.locator("button").click()
    page.wait_for_function("() => ['done', 'error'].includes(document.querySelector('div.dit-live').dataset.state)",
                           timeout=LIVE_TIMEOUT_MS)
    return page.evaluate("""() => {
      const r = window.ditLive.last.digits;
      const root = document.querySelector('div.dit-live');  // the first sampler of the page, the one pressed
      const painted = Array.from(root.querySelectorAll('canvas')).filter(c => {
        const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        return d.some((v, i) => i % 4 === 3 && v > 0);
      }).length;
      return {state: root.dataset.state, painted, canvases: root.querySelectorAll('canvas').length,
              status: root.querySelector('.dit-live-status').textContent,
              x: r ? Array.from(r.x) : null, labels: r ? r.labels : null, steps: r ? r.steps : null};
    }""")


def _problems(log: PageLog) -> list[str]:
    problems = []
    if log.external:
        problems.append(f"requests to other hosts: {log.external[:5]}")
    if log.failed:
        problems.append(f"local resources failed to load: {log.failed[:5]}")
    if log.errors:
        problems.append(f"console errors / exceptions: {log.errors[:5]}")
    return problems


@pytest.mark.parametrize("origin", ["server", "disk"])
def test_live_sampler_samples_a_chosen_digit(origin, server, browser, live_model):
    """The reader's path, from a static server and from the file opened from disk: choose a digit, a sampler, a
    step count, a guidance scale and a seed, press Sample; the page shows the denoising and its time, and its
    images are dit_core's generate(...) with the same settings and seed."""
    import torch

    from dit_core.sample import generate

    model, diffusion, bundle = live_model
    if origin == "server":
        url, log = f"{server}/{LIVE_PAGE}", PageLog(server)
    else:
        url, log = (HTML_DIR / LIVE_PAGE).as_uri(), PageLog("file://")
    sampler, steps = "ddim", min(bundle["tables"]["ddim"], key=int)
    digit, scale, seed = 7, 2.0, 3 if origin == "server" else 0
    context, page = _open_live_page(browser, url, log)
    try:
        result = _press_sample(page, digit, sampler, int(steps), scale, seed)
    finally:
        context.close()
    assert result["state"] == "done", f"{origin}: the sampler did not finish: {result['status']}"
    assert not _problems(log), f"{origin}: " + "; ".join(_problems(log))
    assert result["painted"] == result["canvases"] > 0, f"{origin}: {result['painted']}/{result['canvases']} drawn"
    assert re.search(r"\d+\.\d\d s in this browser", result["status"]), result["status"]
    assert result["labels"] == [digit] * len(result["labels"])
    expected = generate(model, diffusion, result["labels"], sampler=sampler, steps=int(steps), cfg_scale=scale,
                        seed=seed)
    diff = (torch.tensor(result["x"]).reshape(expected.shape) - expected).abs().max().item()
    assert diff < LIVE_TOLERANCE, f"{origin}: the page's digits differ from generate's by {diff:.2e}"


def test_live_sampler_is_dit_core_from_the_same_noise(server, browser, live_model):
    """ditLive.sample from a fixed noise tensor and labels gives dit_core's DDIM sample from that noise
    (SpacedDiffusion.ddim_sample_loop with guided()), and from a seed DDPM's samples of generate."""
    import torch

    from dit_core.sample import generate
    from dit_core.sample.samplers import _rebuild, ddim_timesteps, guided

    model, diffusion, bundle = live_model
    steps = int(min(bundle["tables"]["ddim"], key=int))
    labels = list(range(bundle["num_classes"]))
    noise = torch.randn(len(labels), *bundle["shape"], generator=torch.Generator().manual_seed(2024))
    log = PageLog(server)
    context, page = _open_live_page(browser, f"{server}/{LIVE_PAGE}", log)
    run = "o => window.ditLive.sample('digits', o).then(r => Array.from(r.x))"
    try:
        from_noise = page.evaluate(run, dict(labels=labels, cfgScale=2.0, sampler="ddim", steps=steps,
                                             noise=noise.flatten().tolist()))
        ddpm_steps = int(min(bundle["tables"]["ddpm"], key=int))
        ddpm = page.evaluate(run, dict(labels=labels[:4], cfgScale=1.5, sampler="ddpm", steps=ddpm_steps, seed=11))
    finally:
        context.close()
    assert not _problems(log), "; ".join(_problems(log))
    spaced = _rebuild(diffusion, ddim_timesteps(1000, steps))
    with torch.no_grad():
        expected = spaced.ddim_sample_loop(guided(model, 2.0), noise.shape, noise=noise, clip_denoised=True,
                                           model_kwargs=dict(y=torch.tensor(labels))).clamp(-1, 1)
    diff = (torch.tensor(from_noise).reshape(expected.shape) - expected).abs().max().item()
    assert diff < LIVE_TOLERANCE, f"DDIM from a fixed noise: the page differs from dit_core by {diff:.2e}"
    expected = generate(model, diffusion, labels[:4], sampler="ddpm", steps=ddpm_steps, cfg_scale=1.5, seed=11)
    diff = (torch.tensor(ddpm).reshape(expected.shape) - expected).abs().max().item()
    assert diff < LIVE_TOLERANCE, f"DDPM from seed 11: the page differs from generate by {diff:.2e}"


#: The reader's DiT of chapter 7's section 7.7: embedded like the digits model, and a page of its own (one HTML file,
#: runtime and model inlined) that the build writes beside the model and the chapter links to (book/_ext/book_html.py).
YOUR_MODEL = HTML_DIR / "_static" / "dit-live" / "your-dit.js"
YOUR_PAGE = HTML_DIR / "_static" / "dit-live" / "your-dit.html"


def test_your_dits_own_page_opens_from_disk_and_samples(browser):
    """The chapter links to the reader's page; opened from disk (file://, the page alone), it samples the reader's
    model as generate(...) does with the same seed."""
    import torch

    from dit_book.browser import read_built_model
    from dit_core.sample import generate

    if not YOUR_PAGE.is_file():
        _missing(f"no page of the reader's DiT at {YOUR_PAGE}: chapter 7 writes it when the book is built")
    assert 'href="../_static/dit-live/your-dit.html"' in (HTML_DIR / LIVE_PAGE).read_text(), "the chapter's link"
    model, diffusion, bundle = read_built_model(YOUR_MODEL)
    log = PageLog("file://")
    context, page = _open_live_page(browser, YOUR_PAGE.as_uri(), log)
    steps = int(min(bundle["tables"]["ddim"], key=int))
    try:
        result = page.evaluate("o => window.ditLive.sample('your-dit', o).then(r => Array.from(r.x))",
                               dict(labels=[2, 5, 8], cfgScale=2.0, sampler="ddim", steps=steps, seed=4))
    finally:
        context.close()
    assert not _problems(log), "; ".join(_problems(log))
    expected = generate(model, diffusion, [2, 5, 8], sampler="ddim", steps=steps, cfg_scale=2.0, seed=4)
    diff = (torch.tensor(result).reshape(expected.shape) - expected).abs().max().item()
    assert diff < LIVE_TOLERANCE, f"the reader's page differs from generate by {diff:.2e}"

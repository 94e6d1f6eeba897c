"""Time the book's live sampler (chapter 7.7) in headless Chromium, beside dit_core in PyTorch, and size its files.

    python benchmarks/browser_sampler.py                      # the built book's model (_build/html), else runs/digits
    python benchmarks/browser_sampler.py --ckpt runs/digits   # a page of its own for this run (dit_book.browser)
    python benchmarks/browser_sampler.py --html _build/html --steps 10 25 50 --repeats 3 --json

The page is opened from disk (file://), as a reader opens a copy of the book. For each setting it presses the
sampler's loop (``window.ditLive.sample``: 8 samples of one digit, guidance 2, as the page's Sample button does)
``--repeats`` times and prints the median seconds, the time per step, and dit_core's ``generate`` for the same
samples on this machine (fp32, ``torch.get_num_threads()`` threads; the page runs ONNX Runtime Web's WebAssembly
build on one thread). The first row is the one-time cost of loading the runtime and the model. It also prints the
largest difference between the page's samples and generate's (same seed), and the bytes the runtime and the model
add to the built HTML: as shipped (gzip + base64 in classic scripts) and raw.

Needs: Debian's chromium (apt-get install chromium), the playwright package (pip install -e ".[browser]"), the
vendored ONNX Runtime Web (make vendor), and with ``--ckpt`` the onnx and onnxscript packages (the book extra).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def tree_cpu_seconds() -> float:
    """CPU seconds (user + system) of this process's descendants: Playwright's driver and the Chromium it started.
    On a machine that other work also loads, the CPU time of a sample is steadier than its wall time."""
    children, cpu = {}, {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(stat.parent.name)
        children.setdefault(int(fields[1]), []).append(pid)
        cpu[pid] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    total, todo = 0.0, list(children.get(os.getpid(), []))
    while todo:
        pid = todo.pop()
        total += cpu.get(pid, 0.0)
        todo += children.get(pid, [])
    return total


def sizes(static: Path, bundle: dict) -> dict:
    """Bytes the live sampler adds to the built HTML, as shipped and raw."""
    node = REPO / ".vendor" / "node_modules" / "onnxruntime-web" / "dist"
    runtime = static / "vendor" / "onnxruntime-web"
    shipped = {"ort.wasm.min.js": (runtime / "ort.wasm.min.js").stat().st_size,
               "ort-wasm-inline.js": (runtime / "ort-wasm-inline.js").stat().st_size,
               "dit_live.js": (static / "dit_live.js").stat().st_size,
               f"dit-live/{bundle['name']}.js": (static / "dit-live" / f"{bundle['name']}.js").stat().st_size}
    raw = {"ONNX model": bundle["onnx_bytes"], "ONNX model, gzip": bundle["gzip_bytes"]}
    for name in ("ort-wasm-simd-threaded.wasm", "ort-wasm-simd-threaded.mjs", "ort.wasm.min.js"):
        if (node / name).is_file():
            raw[name] = (node / name).stat().st_size
    return {"shipped": shipped, "shipped_total": sum(shipped.values()), "raw": raw}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--html", type=Path, default=None, help="a built book (default: _build/html if it has a model)")
    parser.add_argument("--ckpt", default=None, help="a run or checkpoint: time a page of its own (exported here)")
    parser.add_argument("--name", default="digits", help="the model's name in the built book")
    parser.add_argument("--digit", type=int, default=3)
    parser.add_argument("--cfg-scale", type=float, default=2.0)
    parser.add_argument("--steps", type=int, nargs="+", default=[10, 25, 50], help="DDIM step counts to time")
    parser.add_argument("--ddpm-steps", type=int, nargs="*", default=[50], help="DDPM step counts to time")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)

    import torch
    from playwright.sync_api import sync_playwright

    from dit_book.browser import read_built_model
    from dit_core.sample import generate

    html_dir = args.html or REPO / "_build" / "html"
    tmp = None
    export_seconds = None
    if args.ckpt or not (html_dir / "_static" / "dit-live" / f"{args.name}.js").is_file():
        from dit_book.browser import STEPS, live_sampler, write_page
        from dit_core.diffusion import create_diffusion
        from dit_core.sample import load_model

        ckpt = args.ckpt or str(REPO / "runs" / "digits")
        model, info = load_model(ckpt)
        diffusion = create_diffusion("", noise_schedule=info["noise_schedule"], learn_sigma=model.learn_sigma)
        offered = {"ddim": sorted(set(STEPS["ddim"]) | set(args.steps)),
                   "ddpm": sorted(set(STEPS["ddpm"]) | set(args.ddpm_steps))}
        widget = live_sampler(model, diffusion, name=args.name, label_names=info.get("label_names"),
                              steps_offered=offered)
        export_seconds = widget.export_seconds
        tmp = tempfile.TemporaryDirectory()
        page = write_page(widget, tmp.name)
        static = page.parent / "_static"
    else:
        page = html_dir / "book" / "07_sampling.html"
        static = html_dir / "_static"
    model, diffusion, bundle = read_built_model(static / "dit-live" / f"{args.name}.js")
    chromium = os.environ.get("DIT_CHROMIUM", "/usr/bin/chromium")
    settings = [("ddim", s) for s in args.steps] + [("ddpm", s) for s in args.ddpm_steps]
    missing = [f"{s} {n}" for s, n in settings if str(n) not in bundle["tables"].get(s, {})]
    if missing:
        raise SystemExit(f"the page has no tables for {missing}; it offers "
                         f"{ {s: sorted(map(int, t)) for s, t in bundle['tables'].items()} } (use --ckpt for others)")
    labels = [args.digit] * 8
    rows = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True, args=["--no-sandbox", "--disable-gpu"])
        page_ = browser.new_page()
        errors = []
        page_.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page_.goto(page.as_uri())
        page_.wait_for_function("() => window.ditLive")
        start = time.perf_counter()
        load_seconds = page_.evaluate("name => window.ditLive.load(name).then(m => m.seconds)", args.name)
        load_wall = time.perf_counter() - start
        version = page_.evaluate("() => window.ort.env.versions ? window.ort.env.versions.web : null")
        first = dict(labels=labels, cfgScale=args.cfg_scale, sampler=settings[0][0], steps=settings[0][1], seed=0)
        first_press = page_.evaluate("([name, o]) => window.ditLive.sample(name, o).then(r => r.seconds)",
                                     [args.name, first])  # the wasm code is still warming up: not in the rows
        for sampler, steps in settings:
            options = dict(labels=labels, cfgScale=args.cfg_scale, sampler=sampler, steps=steps, seed=0)
            runs, browser_cpu = [], []
            for _ in range(args.repeats):
                cpu0 = tree_cpu_seconds()
                runs.append(page_.evaluate("([name, o]) => window.ditLive.sample(name, o).then(r => ({s: r.seconds, "
                                           "x: Array.from(r.x)}))", [args.name, options]))
                browser_cpu.append(tree_cpu_seconds() - cpu0)
            seconds = statistics.median(r["s"] for r in runs)
            torch_times, torch_cpu = [], []
            for _ in range(args.repeats):
                t0, c0 = time.perf_counter(), time.process_time()
                expected = generate(model, diffusion, labels, sampler=sampler, steps=steps, cfg_scale=args.cfg_scale,
                                    seed=0)
                torch_times.append(time.perf_counter() - t0)
                torch_cpu.append(time.process_time() - c0)
            diff = (torch.tensor(runs[0]["x"]).reshape(expected.shape) - expected).abs().max().item()
            rows.append(dict(sampler=sampler, steps=steps, browser_s=seconds, ms_per_step=1000 * seconds / steps,
                             browser_cpu_s=statistics.median(browser_cpu), torch_s=statistics.median(torch_times),
                             torch_cpu_s=statistics.median(torch_cpu), max_abs_diff=diff))
        browser.close()
    figures = dict(page=str(page), onnx_runtime_web=version,
                   model_parameters=sum(p.numel() for p in model.parameters()), load_s=load_seconds,
                   load_wall_s=load_wall, first_press_s=first_press, export_s=export_seconds, torch_threads=torch.get_num_threads(),
                   samples_per_press=len(labels), cfg_scale=args.cfg_scale, rows=rows, sizes=sizes(static, bundle),
                   console_errors=errors)
    if args.json:
        print(json.dumps(figures, indent=2))
        return 0
    print(f"page {page} (ONNX Runtime Web {version}); model {figures['model_parameters'] / 1e6:.2f} M parameters")
    if export_seconds is not None:
        print(f"export (dit_core.export.export_onnx) {export_seconds:.1f} s")
    print(f"loading the runtime and the model (once per page): {load_seconds:.2f} s; the first press after it "
          f"({settings[0][0]} {settings[0][1]} steps): {first_press:.2f} s")
    print(f"{len(labels)} samples of digit {args.digit}, guidance {args.cfg_scale} ({2 * len(labels)} images per model "
          f"call); median of {args.repeats}; torch: generate, fp32, {torch.get_num_threads()} thread(s)")
    print("wall: seconds the page reports; CPU: seconds of CPU the browser's processes (torch: this process) used")
    print(f"{'sampler':>8} {'steps':>5} {'browser s':>10} {'ms/step':>8} {'CPU s':>6} {'torch s':>8} {'CPU s':>6} "
          f"{'max |diff|':>11}")
    for r in rows:
        print(f"{r['sampler']:>8} {r['steps']:5d} {r['browser_s']:10.2f} {r['ms_per_step']:8.1f} "
              f"{r['browser_cpu_s']:6.2f} {r['torch_s']:8.2f} {r['torch_cpu_s']:6.2f} {r['max_abs_diff']:11.1e}")
    s = figures["sizes"]
    print("added to the built HTML, as shipped: " + ", ".join(f"{k} {v / 1e6:.2f} MB" for k, v in s["shipped"].items())
          + f"; total {s['shipped_total'] / 1e6:.2f} MB")
    print("raw: " + ", ".join(f"{k} {v / 1e6:.2f} MB" for k, v in s["raw"].items()))
    if errors:
        print(f"console errors: {errors[:5]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

// The book's live sampler: a dit_core DiT, exported to ONNX by dit_core.export, sampled in the reader's browser by
// ONNX Runtime Web (its wasm build), with the library's own noise schedule (dit_core.export.sampling_tables).
//
// A page built from chapter 7 holds <div class="dit-live" data-dit-live="NAME" data-defaults="{...}">; the book's
// Sphinx extension (book/_ext/book_html.py) has moved the model, its tables and its config into
// _static/dit-live/NAME.js, which sets window.ditLiveModels[NAME]. Nothing is fetched: a page opened from disk may
// not fetch files or import modules, so every part comes as a classic <script> (the runtime's .wasm and .mjs as
// gzipped base64 in _static/vendor/onnxruntime-web/ort-wasm-inline.js, made by `make vendor`), and is unpacked here
// with DecompressionStream.
//
// The sampling loop is dit_core.sample.generate's for DDIM (eta 0) and DDPM in pixel space, step for step:
// classifier-free guidance as DiT.forward_with_cfg computes it (labels, then the null class, in one batch), the
// update of GaussianDiffusion.ddim_sample / p_sample with the exported float32 coefficients, and each sample's
// noise drawn like torch.randn from a CPU generator seeded with seed + i (Mersenne Twister and torch's Box-Muller
// in blocks of 16), so that a seed gives the image that generate(..., seed=seed) gives.
//
// window.ditLive.sample(name, {labels, cfgScale, sampler, steps, seed | noise}) is the same loop without the page's
// controls (tests/test_browser.py compares it with dit_core).
//
// A page of its own (dit_book.browser.standalone_page: one file, a reader's model) inlines the runtime, the model and
// this script before its body: what is already defined (window.ort, window.ditOrtWasm, window.ditLiveModels[NAME]) is
// not loaded again.
(function () {
  "use strict";
  if (window.ditLive) return;
  var script = document.currentScript;
  var source = (script && script.src) || ""; // "" when inlined in a page of its own
  var staticRoot = source.slice(0, source.lastIndexOf("/") + 1); // .../_static/
  var ORT_DIR = staticRoot + "vendor/onnxruntime-web/";
  var MODEL_DIR = staticRoot + "dit-live/";
  var fr = Math.fround;

  // ------------------------------------------------------------------------------------------ loading
  var scripts = {};
  function loadScript(url) {
    if (!scripts[url]) {
      scripts[url] = new Promise(function (resolve, reject) {
        var el = document.createElement("script");
        el.src = url;
        el.onload = resolve;
        el.onerror = function () { reject(new Error("could not load " + url + " (rebuild the book: make book)")); };
        document.head.appendChild(el);
      });
    }
    return scripts[url];
  }

  function base64Bytes(text) {
    var binary = atob(text);
    var bytes = new Uint8Array(binary.length);
    for (var i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
    return bytes;
  }

  function gunzip(bytes) {
    var stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
    return new Response(stream).arrayBuffer().then(function (buffer) { return new Uint8Array(buffer); });
  }

  var runtime = null;
  function loadRuntime() {
    if (!runtime) {
      var inlined = window.ort && window.ditOrtWasm;
      runtime = (inlined ? Promise.resolve() : loadScript(ORT_DIR + "ort.wasm.min.js")
        .then(function () { return loadScript(ORT_DIR + "ort-wasm-inline.js"); }))
        .then(function () {
          var packed = window.ditOrtWasm;
          return Promise.all([gunzip(base64Bytes(packed.wasm)), gunzip(base64Bytes(packed.mjs))]);
        })
        .then(function (parts) {
          var ort = window.ort;
          ort.env.wasm.numThreads = 1; // threads need a cross-origin isolated page; the book is plain files
          ort.env.wasm.proxy = false;
          ort.env.wasm.wasmBinary = parts[0];
          ort.env.wasm.wasmPaths = { mjs: URL.createObjectURL(new Blob([parts[1]], { type: "text/javascript" })) };
          return ort;
        });
    }
    return runtime;
  }

  var models = {};
  function load(name) {
    if (!models[name]) {
      var started = performance.now();
      var inlined = (window.ditLiveModels || {})[name];
      models[name] = Promise.all([loadRuntime(), inlined ? null : loadScript(MODEL_DIR + encodeURIComponent(name) + ".js")])
        .then(function (parts) {
          var bundle = (window.ditLiveModels || {})[name];
          if (!bundle) throw new Error("no model " + name + " in " + MODEL_DIR + encodeURIComponent(name) + ".js");
          return gunzip(base64Bytes(bundle.onnx)).then(function (onnx) {
            // logSeverityLevel 3: errors only; the graph optimiser's warnings (a CastLike it cannot fold) are no
            // reader's business, and reach the console as errors
            return parts[0].InferenceSession.create(onnx, { executionProviders: ["wasm"], logSeverityLevel: 3 });
          }).then(function (session) {
            var tables = {};
            Object.keys(bundle.tables).forEach(function (sampler) {
              tables[sampler] = {};
              Object.keys(bundle.tables[sampler]).forEach(function (steps) {
                var raw = bundle.tables[sampler][steps], table = {};
                Object.keys(raw).forEach(function (key) {
                  table[key] = Array.isArray(raw[key]) && key !== "t" ? Float32Array.from(raw[key]) : raw[key];
                });
                tables[sampler][steps] = table;
              });
            });
            return { name: name, bundle: bundle, session: session, tables: tables,
                     seconds: (performance.now() - started) / 1000 };
          });
        });
      models[name].catch(function () { delete models[name]; });
    }
    return models[name];
  }

  // ------------------------------------------------------------------------------------------ torch.randn
  // torch.Generator().manual_seed(s) is a 32-bit Mersenne Twister (MT19937) seeded with s mod 2^32; torch.randn
  // of n >= 16 floats draws n uniforms of 24 bits, turns each block of 16 into normals by Box-Muller (u1 from the
  // first 8, u2 from the last 8), and, when 16 does not divide n, redraws the last 16 values the same way.
  function MT19937(seed) {
    var mt = new Uint32Array(624);
    mt[0] = seed >>> 0;
    for (var i = 1; i < 624; i++) {
      var prev = mt[i - 1] ^ (mt[i - 1] >>> 30);
      mt[i] = (Math.imul(1812433253, prev) + i) >>> 0;
    }
    this.mt = mt;
    this.index = 624;
  }
  MT19937.prototype.next = function () {
    var mt = this.mt, y, k;
    if (this.index >= 624) {
      for (k = 0; k < 624; k++) {
        y = (mt[k] & 0x80000000) | (mt[(k + 1) % 624] & 0x7fffffff);
        mt[k] = mt[(k + 397) % 624] ^ (y >>> 1) ^ (y & 1 ? 0x9908b0df : 0);
      }
      this.index = 0;
    }
    y = mt[this.index++];
    y ^= y >>> 11;
    y ^= (y << 7) & 0x9d2c5680;
    y ^= (y << 15) & 0xefc60000;
    y ^= y >>> 18;
    return y >>> 0;
  };
  MT19937.prototype.uniform = function () { return fr((this.next() & 0xffffff) / 16777216); };

  function boxMuller16(data, at) {
    for (var j = 0; j < 8; j++) {
      var u1 = fr(1 - data[at + j]), u2 = data[at + j + 8];
      var radius = Math.sqrt(-2 * Math.log(u1)), theta = 2 * Math.PI * u2;
      data[at + j] = radius * Math.cos(theta);
      data[at + j + 8] = radius * Math.sin(theta);
    }
  }

  function randn(gen, n) {
    if (n < 16) throw new Error("the page draws torch's noise for samples of 16 values or more, not " + n);
    var data = new Float32Array(n), i;
    for (i = 0; i < n; i++) data[i] = gen.uniform();
    for (i = 0; i + 16 <= n; i += 16) boxMuller16(data, i);
    if (n % 16) {
      for (i = n - 16; i < n; i++) data[i] = gen.uniform();
      boxMuller16(data, n - 16);
    }
    return data;
  }

  // ------------------------------------------------------------------------------------------ sampling
  function nextTask() { // let the page paint between steps, without the 4 ms clamp of nested setTimeout
    return new Promise(function (resolve) {
      var channel = new MessageChannel();
      channel.port1.onmessage = function () { resolve(); };
      channel.port2.postMessage(null);
    });
  }

  function sample(name, options) {
    return load(name).then(function (model) { return run(model, options || {}); });
  }

  function run(model, o) {
    var b = model.bundle, ort = window.ort;
    var C = b.shape[0], H = b.shape[1], W = b.shape[2], D = C * H * W, HW = H * W, Cout = b.out_channels;
    var sampler = String(o.sampler || "ddim").toLowerCase(), steps = String(o.steps || b.defaults.steps);
    var table = (model.tables[sampler] || {})[steps];
    if (!table) {
      var have = Object.keys(model.tables).map(function (s) { return s + " " + Object.keys(model.tables[s]).join("/"); });
      return Promise.reject(new Error("no " + sampler + " table for " + steps + " steps in this page (it has: " +
                                      have.join("; ") + ")"));
    }
    var labels = Array.from(o.labels || [b.defaults.digit]).map(Number), N = labels.length;
    labels.forEach(function (l) {
      if (!(Number.isInteger(l) && l >= 0 && l < b.num_classes)) throw new Error("labels must lie in 0.." + (b.num_classes - 1));
    });
    var scale = o.cfgScale === undefined ? 1 : Number(o.cfgScale), guided = scale !== 1;
    if (guided && !b.null_class) throw new Error("this model has no null class: it samples with guidance 1 only");
    var seed = Number(o.seed || 0), gens = labels.map(function (_, i) { return new MT19937(seed + i); });
    var x = new Float32Array(N * D), i, n;
    if (o.noise) {
      if (o.noise.length !== N * D) throw new Error("noise must hold " + N * D + " numbers (" + N + " x " + D + ")");
      x.set(o.noise);
    } else {
      for (n = 0; n < N; n++) x.set(randn(gens[n], D), n * D);
    }
    var B = guided ? 2 * N : N;
    var xin = new Float32Array(B * D), tin = new BigInt64Array(B), yin = new BigInt64Array(B);
    for (n = 0; n < B; n++) yin[n] = BigInt(n < N ? labels[n] : b.num_classes); // the null class: num_classes
    var S = table.steps, ddim = sampler === "ddim", learned = table.variance === "learned-range";
    var s32 = fr(scale), started = performance.now(), k = 0, x0 = new Float32Array(N * D);
    var inputName = b.input_names, outputName = b.output_name;

    function step() {
      if (k >= S) {
        for (i = 0; i < x.length; i++) x[i] = Math.min(1, Math.max(-1, x[i])); // generate clamps pixel samples
        return Promise.resolve({ x: x, x0: x0, labels: labels, shape: [N, C, H, W], sampler: sampler, steps: S,
                                 cfgScale: scale, seed: seed, seconds: (performance.now() - started) / 1000 });
      }
      var last = k === S - 1; // the spaced step 0: no noise is added
      xin.set(x, 0);
      if (guided) xin.set(x, N * D);
      tin.fill(BigInt(table.t[k]));
      var feeds = {};
      feeds[inputName[0]] = new ort.Tensor("float32", xin, [B, C, H, W]);
      feeds[inputName[1]] = new ort.Tensor("int64", tin, [B]);
      feeds[inputName[2]] = new ort.Tensor("int64", yin, [B]);
      return model.session.run(feeds).then(function (result) {
        var out = result[outputName].data, next = new Float32Array(N * D), z = null;
        if (!ddim && !last) {
          z = new Float32Array(N * D);
          for (n = 0; n < N; n++) z.set(randn(gens[n], D), n * D);
        }
        var a = table.sqrt_recip_alpha_bar[k], m1 = table.sqrt_recipm1_alpha_bar[k];
        for (n = 0; n < N; n++) {
          for (var c = 0; c < C; c++) {
            for (var p = 0; p < HW; p++) {
              var at = n * D + c * HW + p, o1 = (n * Cout + c) * HW + p;
              var eps = out[o1];
              if (guided) { var u = out[((N + n) * Cout + c) * HW + p]; eps = fr(fr(fr(eps - u) * s32) + u); }
              var xv = x[at];
              var pred = fr(fr(a * xv) - fr(m1 * eps));
              pred = Math.min(1, Math.max(-1, pred)); // clip_denoised: pixel samples
              x0[at] = pred;
              if (ddim) { // GaussianDiffusion.ddim_sample, eta 0
                var e2 = fr(fr(fr(a * xv) - pred) / m1), abp = table.alpha_bar_prev[k];
                next[at] = fr(fr(pred * fr(Math.sqrt(abp))) + fr(fr(Math.sqrt(fr(1 - abp))) * e2));
              } else { // GaussianDiffusion.p_sample with the learned (or fixed) variance
                var mean = fr(fr(table.posterior_coef_x0[k] * pred) + fr(table.posterior_coef_xt[k] * xv));
                var logVar;
                if (learned) {
                  var f = fr(fr(out[(n * Cout + C + c) * HW + p] + 1) / 2);
                  logVar = fr(fr(f * table.log_var_max[k]) + fr(fr(1 - f) * table.log_var_min[k]));
                } else {
                  logVar = table.log_var[k];
                }
                next[at] = last ? mean : fr(mean + fr(fr(Math.exp(fr(0.5 * logVar))) * z[at]));
              }
            }
          }
        }
        x = next;
        var info = { step: k, steps: S, t: table.t[k], x: x, x0: x0 };
        k += 1;
        return Promise.resolve(o.onStep ? o.onStep(info) : null).then(o.onStep ? nextTask : null).then(step);
      });
    }
    return step();
  }

  // ------------------------------------------------------------------------------------------ the widget
  var STYLE = [
    ".dit-live{border:1px solid var(--pst-color-border,#ccc);border-radius:6px;padding:.75em;margin:1em 0}",
    ".dit-live-controls{display:flex;flex-wrap:wrap;gap:.5em 1.2em;align-items:center;margin-bottom:.6em}",
    ".dit-live-controls label{display:flex;gap:.4em;align-items:center;margin:0}",
    ".dit-live-controls select,.dit-live-controls input[type=number]{max-width:6em}",
    ".dit-live-controls button{padding:.25em 1.2em;font-weight:600;cursor:pointer}",
    ".dit-live-row{display:flex;gap:4px;align-items:center;margin:3px 0}",
    ".dit-live-row>span{width:9em;font-size:.85em;text-align:right;padding-right:.4em}",
    ".dit-live canvas{width:48px;height:48px;image-rendering:pixelated;background:#000;border-radius:2px}",
    ".dit-live-status{font-size:.9em;min-height:1.4em;margin:.3em 0}",
    ".dit-live-status.error{color:#c00}",
    ".dit-live-note{font-size:.8em;opacity:.8;margin-top:.4em}",
  ].join("\n");

  function el(tag, attrs, children) {
    var node = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (key) {
      if (key === "text") node.textContent = attrs[key];
      else node.setAttribute(key, attrs[key]);
    });
    (children || []).forEach(function (child) { node.appendChild(child); });
    return node;
  }

  function draw(canvas, data, offset, C, H, W) {
    var ctx = canvas.getContext("2d"), image = ctx.createImageData(W, H), HW = H * W;
    for (var p = 0; p < HW; p++) {
      for (var c = 0; c < 3; c++) {
        var v = data[offset + (C === 1 ? 0 : c) * HW + p];
        image.data[4 * p + c] = Math.round((Math.min(1, Math.max(-1, v)) + 1) * 127.5);
      }
      image.data[4 * p + 3] = 255;
    }
    ctx.putImageData(image, 0, 0);
  }

  function canvases(count, H, W, label) {
    var list = [];
    for (var i = 0; i < count; i++) list.push(el("canvas", { width: W, height: H, "aria-label": label + " " + (i + 1) }));
    return list;
  }

  // A widget carries its settings (data-defaults) and what the controls offer (data-meta), so that it draws before
  // the model loads. A bare <div class="dit-live" data-dit-live="NAME"></div> (in a Markdown page, say) takes both
  // from the model's file, loaded at once.
  function mount(root) {
    if (root.dataset.ditLiveMounted) return;
    root.dataset.ditLiveMounted = "1";
    var name = root.getAttribute("data-dit-live");
    var defaults = JSON.parse(root.getAttribute("data-defaults") || "{}");
    if (root.getAttribute("data-meta")) {
      build(root, name, defaults, JSON.parse(root.getAttribute("data-meta")));
      return;
    }
    root.textContent = "Loading the live sampler...";
    loadScript(MODEL_DIR + encodeURIComponent(name) + ".js").then(function () {
      var bundle = (window.ditLiveModels || {})[name];
      if (!bundle) throw new Error("no model " + name + " in " + MODEL_DIR);
      build(root, name, Object.assign({}, bundle.defaults, defaults), bundle.meta);
    }).catch(function (err) {
      root.textContent = "The live sampler could not load: " + err.message;
      console.error("dit-live:", err);
    });
  }

  function build(root, name, defaults, meta) {
    var count = defaults.count || 8, filmFrames = 10;
    var C = meta.shape[0], H = meta.shape[1], W = meta.shape[2], D = C * H * W;
    if (!document.getElementById("dit-live-style")) document.head.appendChild(el("style", { id: "dit-live-style", text: STYLE }));

    var digit = el("select", { "aria-label": "class" });
    meta.label_names.forEach(function (label, i) { digit.appendChild(el("option", { value: i, text: label })); });
    digit.value = defaults.digit;
    var scale = el("input", { type: "range", min: 1, max: 8, step: 0.5, value: defaults.cfg_scale, "aria-label": "guidance scale" });
    var scaleText = el("output", { text: Number(defaults.cfg_scale).toFixed(1) });
    if (!meta.null_class) { scale.value = 1; scale.disabled = true; scaleText.textContent = "1.0"; }
    var sampler = el("select", { "aria-label": "sampler" });
    Object.keys(meta.steps).forEach(function (s) { sampler.appendChild(el("option", { value: s, text: s.toUpperCase() })); });
    sampler.value = defaults.sampler;
    var steps = el("select", { "aria-label": "steps" });
    var seed = el("input", { type: "number", min: 0, step: 1, value: defaults.seed, "aria-label": "seed" });
    var button = el("button", { type: "button", text: "Sample" });
    function fillSteps(wanted) {
      steps.textContent = "";
      meta.steps[sampler.value].forEach(function (s) { steps.appendChild(el("option", { value: s, text: s })); });
      var options = meta.steps[sampler.value].map(String);
      steps.value = options.indexOf(String(wanted)) >= 0 ? String(wanted) : options[Math.floor(options.length / 2)];
    }
    fillSteps(defaults.steps);
    sampler.addEventListener("change", function () { fillSteps(steps.value); });
    scale.addEventListener("input", function () { scaleText.textContent = Number(scale.value).toFixed(1); });

    var xt = canvases(count, H, W, "x_t of sample"), pred = canvases(count, H, W, "predicted x_0 of sample");
    var film = canvases(filmFrames, H, W, "predicted x_0 of sample 1 at frame");
    var status = el("div", { class: "dit-live-status", role: "status",
                             text: "Choose a digit and press Sample: the model runs here, in your browser." });
    var note = el("div", { class: "dit-live-note", text: meta.note || "" });
    root.textContent = "";
    root.appendChild(el("div", { class: "dit-live-controls" }, [
      el("label", {}, [document.createTextNode("digit"), digit]),
      el("label", {}, [document.createTextNode("guidance"), scale, scaleText]),
      el("label", {}, [document.createTextNode("sampler"), sampler]),
      el("label", {}, [document.createTextNode("steps"), steps]),
      el("label", {}, [document.createTextNode("seed"), seed]),
      button,
    ]));
    root.appendChild(status);
    root.appendChild(el("div", { class: "dit-live-row" }, [el("span", { text: "x\u209c now" })].concat(xt)));
    root.appendChild(el("div", { class: "dit-live-row" }, [el("span", { text: "predicted x\u0302\u2080" })].concat(pred)));
    root.appendChild(el("div", { class: "dit-live-row" }, [el("span", { text: "sample 1, step by step" })].concat(film)));
    root.appendChild(note);
    root.setAttribute("data-state", "idle");

    function setStatus(text, error) {
      status.textContent = text;
      status.className = "dit-live-status" + (error ? " error" : "");
    }

    button.addEventListener("click", function () {
      if (root.getAttribute("data-state") === "loading" || root.getAttribute("data-state") === "sampling") return;
      var wasLoaded = !!models[name];
      var chosen = { labels: new Array(count).fill(Number(digit.value)), cfgScale: Number(scale.value),
                     sampler: sampler.value, steps: Number(steps.value), seed: Math.max(0, Math.floor(Number(seed.value) || 0)) };
      var frames = [], S = chosen.steps;
      for (var j = 0; j < filmFrames; j++) frames.push(Math.round(j * (S - 1) / (filmFrames - 1)));
      film.forEach(function (canvas) { canvas.getContext("2d").clearRect(0, 0, W, H); });
      root.setAttribute("data-state", "loading");
      button.disabled = true;
      if (!wasLoaded) setStatus("Loading ONNX Runtime Web and the model (" + meta.megabytes + " MB, once)...");
      load(name).then(function (model) {
        root.setAttribute("data-state", "sampling");
        chosen.onStep = function (info) {
          for (var i = 0; i < count; i++) {
            draw(xt[i], info.x, i * D, C, H, W);
            draw(pred[i], info.x0, i * D, C, H, W);
          }
          frames.forEach(function (frame, j) { if (frame === info.step) draw(film[j], info.x0, 0, C, H, W); });
          setStatus("step " + (info.step + 1) + " of " + info.steps + " (t = " + info.t + ")");
        };
        return run(model, chosen).then(function (result) {
          for (var i = 0; i < count; i++) draw(xt[i], result.x, i * D, C, H, W);
          var text = count + " samples of \u201c" + meta.label_names[chosen.labels[0]] + "\u201d, " +
            chosen.sampler.toUpperCase() + " " + result.steps + " steps, guidance " + chosen.cfgScale.toFixed(1) +
            ", seed " + chosen.seed + ": " + result.seconds.toFixed(2) + " s in this browser (" +
            (1000 * result.seconds / result.steps).toFixed(1) + " ms per step, " + (chosen.cfgScale === 1 ? count : 2 * count) +
            " images per model call)";
          if (!wasLoaded) text += "; loading the runtime and the model took " + model.seconds.toFixed(2) + " s";
          setStatus(text);
          api.last[name] = result;
          root.setAttribute("data-state", "done");
        });
      }).catch(function (err) {
        setStatus("The sampler failed: " + err.message, true);
        root.setAttribute("data-state", "error");
        console.error("dit-live:", err);
      }).then(function () { button.disabled = false; });
    });
  }

  var api = window.ditLive = { sample: sample, load: load, randn: function (seed, n) { return randn(new MT19937(seed), n); },
                               mount: mount, last: {} };
  function mountAll() { document.querySelectorAll("div.dit-live[data-dit-live]").forEach(mount); }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", mountAll);
  else mountAll();
})();

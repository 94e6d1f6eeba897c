# DiT on one GPU: set up, test, and build the book.
#
#   make book    set up (if needed), execute every chapter at its embedded default, build HTML in _build/html,
#                record each chapter's time in book/_timings.json
#   make test    set up (if needed), run the whole pytest suite (unit tests + notebook smoke runs)
#   make smoke   only the papermill smoke runs of the notebooks in book/
#   make nbval   the cheap chapters at their full defaults, checked by nbval (lax: they must run without error)
#   make book-smoke    quick HTML: the chapters at their SMOKE settings (reuses executed smoke runs; CI's build)
#   make browser-test  headless Chromium over _build/html (built with book-smoke if missing): offline, math, figures
#   make setup   create/refresh the Python environment (idempotent; quick when nothing changed)
#   make clean   remove build outputs (keeps .venv; `make distclean` removes it too)
#   make gpu-wheels    the wheels a GPU machine without internet needs (benchmarks/gpu_first_run.sh), in .gpu-wheels/
#
# Environment: an active virtualenv ($VIRTUAL_ENV) or conda env ($CONDA_PREFIX) is used as it is;
# otherwise a .venv is created in the repository root. On a machine without an NVIDIA GPU the CPU
# build of torch is installed first, so that `pip install -e .` does not pull a multi-GB CUDA build.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

ifneq ($(strip $(VIRTUAL_ENV)),)
  ENV_PREFIX := $(VIRTUAL_ENV)
else ifneq ($(strip $(CONDA_PREFIX)),)
  ENV_PREFIX := $(CONDA_PREFIX)
else
  ENV_PREFIX := $(CURDIR)/.venv
  CREATE_VENV := 1
endif

PYTHON := $(ENV_PREFIX)/bin/python
# The interpreter used to create .venv (Python >= 3.10).
BASE_PYTHON ?= python3
# The CPU build of torch that a GPU-less machine gets, and where it may lie on local disk.
TORCH_VERSION ?= 2.13.0
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
TORCH_WHEELS ?= /opt/wheels
EXTRAS ?= test,book
# Threads for the test suite (2-core machines slow down badly when torch oversubscribes them).
TEST_THREADS ?= 2
# Idle OpenMP threads sleep instead of spinning: on a 2-core machine that something else also uses, spinning
# threads made a chapter 6x slower (925 s vs 146 s for chapter 05); on an idle one sleeping costs ~5%.
OMP_WAIT_POLICY ?= PASSIVE
export OMP_WAIT_POLICY
PYTEST_ARGS ?=
# Extra arguments for `jupyter-book build`, e.g. BOOK_ARGS="--toc /tmp/partial_toc.yml".
BOOK_ARGS ?=

# The setup is redone when pyproject.toml changes (its checksum names the stamp file).
SETUP_KEY := $(shell cksum pyproject.toml 2>/dev/null | cut -d' ' -f1)
SETUP_STAMP := $(ENV_PREFIX)/.dit-core-setup-$(SETUP_KEY)

# Offline HTML: MathJax, RequireJS, the ipywidgets HTML manager and ONNX Runtime Web (chapter 7's live sampler)
# come from npm into .vendor/ (not committed); _config.yml copies .vendor/static into the built HTML's _static/.
VENDOR := .vendor
NPM_PACKAGES := mathjax@3.2.2 @jupyter-widgets/html-manager@1.0.15 requirejs@2.3.8 font-awesome@4.7.0 \
  onnxruntime-web@1.31.1
VENDOR_STAMP := $(VENDOR)/.complete-$(shell echo '$(NPM_PACKAGES)' | cksum | cut -d' ' -f1)

.PHONY: help setup test smoke book vendor clean distclean book-smoke browser-test nbval gpu-wheels

# Chapters cheap enough to run at their full defaults in CI (about a minute together on 2 cores).
NBVAL_NOTEBOOKS ?= book/04_diffusion.ipynb book/08_troubleshooting.ipynb

# A recipe that fails leaves no half-written target behind (executed smoke notebooks, stamps).
.DELETE_ON_ERROR:

# Quick HTML: the notebooks executed by the smoke runs (SMOKE = True), kept in SMOKE_DIR, are built without
# executing them again. `make test` keeps them too when SMOKE_OUTPUT_DIR=$(SMOKE_DIR) is set (as .ci/run does);
# a notebook is re-run only when it, or the library, changed since.
SMOKE_DIR := _build/smoke
SMOKE_STAGE := _build/smoke-src
NOTEBOOKS := $(sort $(wildcard book/*.ipynb))
SMOKE_NOTEBOOKS := $(patsubst book/%.ipynb,$(SMOKE_DIR)/%.smoke.ipynb,$(NOTEBOOKS))
LIBRARY_SOURCES := $(shell find dit_core dit_book -name '*.py' -o -name '*.yaml' 2>/dev/null)

help:
	@sed -n '2,12p' Makefile | sed 's/^# \{0,1\}//'

setup: $(SETUP_STAMP)

$(SETUP_STAMP): pyproject.toml
ifdef CREATE_VENV
	@if [ ! -x "$(PYTHON)" ]; then \
	  echo ">> creating .venv with $(BASE_PYTHON)"; \
	  $(BASE_PYTHON) -c 'import sys; assert sys.version_info >= (3, 10), "Python >= 3.10 is needed, found " + sys.version.split()[0]'; \
	  $(BASE_PYTHON) -m venv "$(ENV_PREFIX)" || { echo "error: could not create .venv; on Debian/Ubuntu: apt-get install python3-venv" >&2; exit 1; }; \
	fi
endif
	@echo ">> environment: $(ENV_PREFIX)"
	@if ! "$(PYTHON)" -c 'import torch' >/dev/null 2>&1; then \
	  if nvidia-smi >/dev/null 2>&1; then \
	    echo ">> NVIDIA GPU found: torch (CUDA build) comes with the package dependencies"; \
	  else \
	    echo ">> no NVIDIA GPU: installing the CPU build torch==$(TORCH_VERSION) first"; \
	    links=""; if [ -d "$(TORCH_WHEELS)" ]; then links="--find-links $(TORCH_WHEELS)"; fi; \
	    "$(PYTHON)" -m pip install $$links "torch==$(TORCH_VERSION)+cpu" \
	    || "$(PYTHON)" -m pip install --index-url "$(TORCH_CPU_INDEX)" "torch==$(TORCH_VERSION)" \
	    || "$(PYTHON)" -m pip install "torch==$(TORCH_VERSION)"; \
	  fi; \
	fi
	"$(PYTHON)" -m pip install -e ".[$(EXTRAS)]"
	"$(PYTHON)" -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (dit-core)" >/dev/null
	@rm -f "$(ENV_PREFIX)"/.dit-core-setup-*
	@touch "$@"
	@echo ">> setup done"

test: setup
	OMP_NUM_THREADS=$(TEST_THREADS) MKL_NUM_THREADS=$(TEST_THREADS) "$(PYTHON)" -m pytest -q $(PYTEST_ARGS)

smoke: setup
	OMP_NUM_THREADS=$(TEST_THREADS) MKL_NUM_THREADS=$(TEST_THREADS) "$(PYTHON)" -m pytest -q -m notebook tests/test_notebooks.py $(PYTEST_ARGS)

nbval: setup
	OMP_NUM_THREADS=$(TEST_THREADS) MKL_NUM_THREADS=$(TEST_THREADS) "$(PYTHON)" -m pytest -q -p no:cacheprovider \
	  --nbval-lax --nbval-current-env $(NBVAL_NOTEBOOKS)

vendor: $(VENDOR_STAMP)

$(VENDOR_STAMP):
	@command -v npm >/dev/null || { echo "error: npm is needed to vendor MathJax and the widget manager for offline HTML (Debian/Ubuntu: apt-get install npm)" >&2; exit 1; }
	npm install --prefix $(VENDOR) --no-audit --no-fund --loglevel=error $(NPM_PACKAGES)
	rm -rf $(VENDOR)/static
	mkdir -p $(VENDOR)/static/vendor
	cp -R $(VENDOR)/node_modules/mathjax/es5 $(VENDOR)/static/vendor/mathjax
	cp -R $(VENDOR)/node_modules/@jupyter-widgets/html-manager/dist $(VENDOR)/static/vendor/html-manager
	cp $(VENDOR)/node_modules/requirejs/require.js $(VENDOR)/static/vendor/require.js
	mkdir -p $(VENDOR)/static/vendor/font-awesome  # Font Awesome 4, for matplotlib's animation player (book/_ext)
	cp -R $(VENDOR)/node_modules/font-awesome/css $(VENDOR)/node_modules/font-awesome/fonts $(VENDOR)/static/vendor/font-awesome/
	# ONNX Runtime Web (MIT), its CPU (wasm) build only: a page opened from disk may neither fetch the .wasm nor import
	# the .mjs, so both travel gzipped and base64-encoded inside a classic script (book/_ext/static/dit_live.js).
	mkdir -p $(VENDOR)/static/vendor/onnxruntime-web
	cp $(VENDOR)/node_modules/onnxruntime-web/dist/ort.wasm.min.js $(VENDOR)/static/vendor/onnxruntime-web/
	ort=$(VENDOR)/node_modules/onnxruntime-web/dist/ort-wasm-simd-threaded; { \
	  printf 'window.ditOrtWasm = {mjs: "'; gzip -9 -n -c $$ort.mjs | base64 | tr -d '\n'; \
	  printf '", wasm: "'; gzip -9 -n -c $$ort.wasm | base64 | tr -d '\n'; printf '"};\n'; \
	} > $(VENDOR)/static/vendor/onnxruntime-web/ort-wasm-inline.js
	touch $@

$(SMOKE_DIR)/%.smoke.ipynb: book/%.ipynb $(LIBRARY_SOURCES) | setup
	SMOKE_OUTPUT_DIR=$(SMOKE_DIR) OMP_NUM_THREADS=$(TEST_THREADS) MKL_NUM_THREADS=$(TEST_THREADS) \
	  "$(PYTHON)" -m pytest -q -p no:cacheprovider -m notebook tests/test_notebooks.py -k "$*"

# Chapter 7 writes the page of the reader's own DiT with the vendored ONNX Runtime Web: a smoke run made before
# `make vendor` (a `make test` first) has no page, so it runs again once the vendored files are there.
$(SMOKE_DIR)/07_sampling.smoke.ipynb: $(VENDOR_STAMP)

book-smoke: setup vendor $(SMOKE_NOTEBOOKS)
	"$(PYTHON)" .ci/smoke_book.py $(SMOKE_DIR) $(SMOKE_STAGE)
	JUPYTER_PATH="$(ENV_PREFIX)/share/jupyter" "$(ENV_PREFIX)/bin/jupyter-book" build $(SMOKE_STAGE) --path-output . -W --keep-going --builder html
	@echo ">> smoke book: file://$(CURDIR)/_build/html/index.html"

# The browser test needs Chromium (Debian: apt-get install chromium; .ci/run installs it) and the playwright
# package (installed here; its own browser downloads are never used). DIT_REQUIRE_BROWSER=1 turns a missing
# prerequisite into a failure instead of a skip.
browser-test: setup
	@"$(PYTHON)" -c 'import playwright' 2>/dev/null || "$(PYTHON)" -m pip install -e ".[browser]"
	@command -v chromium >/dev/null || test -x "$${DIT_CHROMIUM:-/usr/bin/chromium}" || { \
	  echo "error: Chromium is needed for the browser test: apt-get install chromium (or set DIT_CHROMIUM)" >&2; exit 1; }
	@test -f _build/html/index.html || $(MAKE) book-smoke
	DIT_REQUIRE_BROWSER=1 OMP_NUM_THREADS=$(TEST_THREADS) MKL_NUM_THREADS=$(TEST_THREADS) \
	  "$(PYTHON)" -m pytest -q -p no:cacheprovider -m browser tests/test_browser.py $(PYTEST_ARGS)
	@echo ">> screenshots: $(CURDIR)/_build/screenshots/"

# After the build, the execution time of every chapter it ran goes into book/_timings.json (with the date, the
# commit and the machine), and the intro's chapter table is regenerated from it (dit_book/timings.py): commit
# both. The chapters' "Running this chapter" boxes read that file, so the next build shows these times; the intro's
# page is rendered again at once (an incremental Sphinx build re-reads only the changed intro.md), so the HTML
# is never older than its sources (the browser test checks that).
BOOK_BUILD = JUPYTER_PATH="$(ENV_PREFIX)/share/jupyter" "$(ENV_PREFIX)/bin/jupyter-book" build . -W --keep-going --builder html $(BOOK_ARGS)
book: setup vendor
	start=$$(date +%s); \
	$(BOOK_BUILD); \
	"$(PYTHON)" -m dit_book timings record --build-dir _build --since $$start; \
	if [ book/intro.md -nt _build/html/book/intro.html ]; then \
	  echo ">> the intro's chapter table has the new times: rendering its page again (the chapters are not re-run)"; \
	  $(BOOK_BUILD); \
	fi
	@echo ">> book: file://$(CURDIR)/_build/html/index.html"
	@echo ">> chapter times: book/_timings.json and book/intro.md (commit them)"

# The wheels that benchmarks/gpu_first_run.sh and gpu_chapters_smoke.sh install on a GPU machine without internet
# (it is expected to have PyTorch with CUDA, numpy, PyYAML, pytest, Pillow, tqdm, safetensors, huggingface_hub,
# requests, scikit-learn, scipy, matplotlib): bitsandbytes, diffusers, and papermill with the kernel and widgets
# that run the notebooks, each without dependencies, for that machine's platform and Python (GPU_PYTHON_VERSION).
# The list is what pip resolves for these versions, less what such a machine has; ipykernel's debugger (debugpy)
# and IPython's completion (jedi, parso) are left out: nothing here uses them and they import only on use.
# About 57 MB in all (measured with these versions).
GPU_WHEELS_DIR ?= .gpu-wheels
GPU_PYTHON_VERSION ?= 3.12
GPU_PLATFORMS ?= manylinux_2_28_x86_64 manylinux_2_26_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
  manylinux2014_x86_64 manylinux1_x86_64
GPU_WHEELS ?= bitsandbytes==0.50.2 diffusers==0.42.1 importlib-metadata==10.2.0 lazy-importer==0.1.0 \
  papermill==2.7.0 entrypoints==0.4.2 tenacity==9.2.1 nbclient==0.11.0 nbformat==5.11.1 fastjsonschema==2.22.3 \
  jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1 \
  jupyter-client==8.10.0 jupyter-core==5.9.1 platformdirs==4.14.9 pyzmq==27.3.0 tornado==6.6.1 traitlets==5.16.1 \
  ipykernel==7.4.0 comm==0.2.3 nest-asyncio2==1.7.4 matplotlib-inline==0.2.2 ipython==9.19.1 \
  ipython-pygments-lexers==1.1.1 prompt-toolkit==3.0.53 wcwidth==0.9.5 pexpect==4.9.0 ptyprocess==0.7.0 \
  stack-data==0.6.3 executing==2.3.0 asttokens==3.0.2 pure-eval==0.2.4 \
  ipywidgets==8.1.9 widgetsnbextension==4.0.16 jupyterlab-widgets==3.0.17
PIP_PYTHON := $(if $(wildcard $(PYTHON)),$(PYTHON),$(BASE_PYTHON))

gpu-wheels:
	mkdir -p $(GPU_WHEELS_DIR)
	"$(PIP_PYTHON)" -m pip download --quiet --no-deps --only-binary=:all: --dest $(GPU_WHEELS_DIR) \
	  --python-version $(GPU_PYTHON_VERSION) --implementation cp $(addprefix --platform ,$(GPU_PLATFORMS)) $(GPU_WHEELS)
	@echo ">> $$(ls $(GPU_WHEELS_DIR)/*.whl | wc -l) wheels, $$(du -sh $(GPU_WHEELS_DIR) | cut -f1) in $(GPU_WHEELS_DIR)/:" \
	  "carry it to the GPU machine beside the repository (bash benchmarks/gpu_first_run.sh installs them)"

clean:
	rm -rf _build .pytest_cache $(VENDOR)
	find . -path ./.venv -prune -o -name __pycache__ -type d -exec rm -rf {} +

distclean: clean
	rm -rf .venv *.egg-info

# DiT on one GPU: set up, test, and build the book.
#
#   make book    set up (if needed), execute every chapter at its embedded default, build HTML in _build/html
#   make test    set up (if needed), run the whole pytest suite (unit tests + notebook smoke runs)
#   make smoke   only the papermill smoke runs of the notebooks in book/
#   make setup   create/refresh the Python environment (idempotent; quick when nothing changed)
#   make clean   remove build outputs (keeps .venv; `make distclean` removes it too)
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
PYTEST_ARGS ?=
# Extra arguments for `jupyter-book build`, e.g. BOOK_ARGS="--toc /tmp/partial_toc.yml".
BOOK_ARGS ?=

# The setup is redone when pyproject.toml changes (its checksum names the stamp file).
SETUP_KEY := $(shell cksum pyproject.toml 2>/dev/null | cut -d' ' -f1)
SETUP_STAMP := $(ENV_PREFIX)/.dit-core-setup-$(SETUP_KEY)

# Offline HTML: MathJax, RequireJS and the ipywidgets HTML manager come from npm into .vendor/
# (not committed); _config.yml copies .vendor/static into the built HTML's _static/.
VENDOR := .vendor
NPM_PACKAGES := mathjax@3.2.2 @jupyter-widgets/html-manager@1.0.15 requirejs@2.3.8
VENDOR_STAMP := $(VENDOR)/.complete-$(shell echo '$(NPM_PACKAGES)' | cksum | cut -d' ' -f1)

.PHONY: help setup test smoke book vendor clean distclean

help:
	@sed -n '2,7p' Makefile | sed 's/^# \{0,1\}//'

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

vendor: $(VENDOR_STAMP)

$(VENDOR_STAMP):
	@command -v npm >/dev/null || { echo "error: npm is needed to vendor MathJax and the widget manager for offline HTML (Debian/Ubuntu: apt-get install npm)" >&2; exit 1; }
	npm install --prefix $(VENDOR) --no-audit --no-fund --loglevel=error $(NPM_PACKAGES)
	rm -rf $(VENDOR)/static
	mkdir -p $(VENDOR)/static/vendor
	cp -R $(VENDOR)/node_modules/mathjax/es5 $(VENDOR)/static/vendor/mathjax
	cp -R $(VENDOR)/node_modules/@jupyter-widgets/html-manager/dist $(VENDOR)/static/vendor/html-manager
	cp $(VENDOR)/node_modules/requirejs/require.js $(VENDOR)/static/vendor/require.js
	touch $@

book: setup vendor
	JUPYTER_PATH="$(ENV_PREFIX)/share/jupyter" "$(ENV_PREFIX)/bin/jupyter-book" build . -W --keep-going --builder html $(BOOK_ARGS)
	@echo ">> book: file://$(CURDIR)/_build/html/index.html"

clean:
	rm -rf _build .pytest_cache $(VENDOR)
	find . -path ./.venv -prune -o -name __pycache__ -type d -exec rm -rf {} +

distclean: clean
	rm -rf .venv *.egg-info

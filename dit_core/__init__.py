"""dit_core: the library behind the book "DiT on one GPU".

Scalable Diffusion Models with Transformers (Peebles & Xie, 2023), written from the paper:
the model (:mod:`dit_core.models`), the Gaussian diffusion (:mod:`dit_core.diffusion`), checkpoint
loading that accepts the official checkpoints (:mod:`dit_core.checkpoint`), and the tools a
one-GPU trainer needs.

The layout follows the architecture: the teaching core (:mod:`.models`, :mod:`.attention`, :mod:`.diffusion`,
:mod:`.train`, :mod:`.sample`); what faster-converging objectives add for training only (:mod:`.alignment`,
:mod:`.teachers`; the options themselves are :mod:`.train.objectives`); the data pipeline (:mod:`.vae`,
:mod:`.data`, :mod:`.latents`, and :mod:`.downloads`, which fetches the GPU track's files only when asked); evaluation
(:mod:`.eval`); checkpoints and interop (:mod:`.checkpoint`, :mod:`.interop`, :mod:`.atomic`); where the
computation runs (:mod:`.runtime`); the measuring tools (:mod:`.measure`); the command lines on top (:mod:`.cli`).
The book's helpers (showing source, chapter timings, the GPU track's cells, the converging-faster study) live
apart from the library, in the package ``dit_book``.

Names are imported lazily so that ``import dit_core`` stays cheap and each piece can be used alone.
"""

__version__ = "0.1.0"

_EXPORTS = {
    "DiT": "dit_core.models",
    "DiT_models": "dit_core.models",
    "create_diffusion": "dit_core.diffusion",
    "load_dit": "dit_core.checkpoint",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name):
    if name in _EXPORTS:
        import importlib

        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'dit_core' has no attribute {name!r}")


def __dir__():
    return __all__

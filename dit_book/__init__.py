"""Helpers for the book's notebooks, apart from the library they explain.

- :mod:`.source`: :func:`show_source`, the code that runs, rendered in a cell instead of copied into it;
- :mod:`.tables`: :func:`show_table`, a Markdown pipe table shown as an HTML table (in Jupyter and the built book);
- :mod:`.notebooks`: :func:`smoke_mode` (tiny settings for tests and quick builds) and
  ``python -m dit_book strip-outputs book/*.ipynb``;
- :mod:`.bench_data`: offline JPEG folders and samples-per-second timings for the data chapters;
- :mod:`.toy`: the exact denoiser of a finite data set, chapter 04's toy model;
- :mod:`.figures`: figures drawn by code, such as chapter 03's DiT and its block (the paper's Figure 3);
- :mod:`.timings`: :func:`chapter_box`, the "Running this chapter" box at the top of every chapter, from the run
  times that ``make book`` records in ``book/_timings.json``;
- :mod:`.records`: the profile table of the README and the introduction, from ``benchmarks/results``;
- :mod:`.routes`: the introduction's route by hardware, from the same sources as its chapter table;
  :mod:`.intro_tables` rewrites both tables (``python -m dit_book timings intro``);
- :mod:`.setup`: each chapter's setup in one call (track, device, smoke sizes, stand-ins for downloads);
- :mod:`.recorded`: a recorded run's grid and figures, where a chapter at its defaults does not train it;
- :mod:`.track`, :mod:`.gpu_box`: the GPU track's cells, and what they show on a build without a GPU;
- :mod:`.exercises`: the checkers of the "implement it" exercises;
- :mod:`.reader`: the reader's own code: the ``%%answer`` cells of the implement-it exercises, checked and saved,
  and the assembly of what a later chapter runs (the book's solution where the reader wrote none);
- :mod:`.my_dit`, :mod:`.my_diffusion`: the book's solutions of those exercises (chapters 3, 4, 5 and 7);
- :mod:`.your_dit`: the reader's DiT, trained by their step, saved, sampled with their sampler and published;
- :mod:`.browser`: chapter 7's live sampler, the digits model sampled in the reader's browser (ONNX Runtime Web);
- :mod:`.study`: the studies' one train-and-score skeleton and the reading of their records;
- :mod:`.converging`, :mod:`.convergence`: the helpers and the study of chapter "Converging faster";
- :mod:`.findings`, :mod:`.findings_gpu`: chapter 7c's studies of the paper's block designs and scaling (``python -m
  dit_book.findings``), on the digits and on the GPU track's Imagenette latents; :mod:`.paper`: the paper's
  Table 4 as data, read by the same code.

Nothing in :mod:`dit_core` imports this package: the library trains, samples and measures without the book.

:func:`set_threads` (a sensible number of CPU threads for torch) lives in :mod:`dit_core.runtime`, where the
library's command lines use it too; the chapters import it from here.

Example::

    from dit_book import chapter_box, set_threads, show_source, smoke_mode
"""

from dit_core.runtime import set_threads
from .notebooks import SMOKE_ENV, smoke_mode, strip_outputs
from .source import Source, SourceView, show_source, source_of
from .tables import show_table
from .timings import chapter_box

__all__ = ["SMOKE_ENV", "Source", "SourceView", "chapter_box", "set_threads", "show_source", "show_table",
           "smoke_mode", "source_of", "strip_outputs"]

"""``python -m dit_core.measure.bench --child PAYLOAD``: the fresh process in which
:func:`dit_core.measure.bench.isolate.measure_rung_isolated` runs one rung. The command line is ``dit-bench``
(:mod:`dit_core.cli.bench`), which stands above this package: the tool never imports it."""

import sys

if len(sys.argv) != 3 or sys.argv[1] != "--child":
    sys.exit("python -m dit_core.measure.bench runs one rung for dit-bench (--child PAYLOAD); measure with dit-bench "
             "(or python -m dit_core.cli.bench)")

from .ladder import run_child  # noqa: E402

sys.exit(run_child(sys.argv[2]))

"""``python -m dit_core.measure.bench`` = ``dit-bench``; with ``--child PAYLOAD`` it is the fresh process in which
:func:`dit_core.measure.bench.isolate.measure_rung_isolated` runs one rung."""

import sys

if len(sys.argv) == 3 and sys.argv[1] == "--child":
    from .ladder import run_child

    sys.exit(run_child(sys.argv[2]))

from ...cli.bench import main  # noqa: E402

sys.exit(main())

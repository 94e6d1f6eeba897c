"""``python -m dit_core.train`` = ``dit-train`` (and what ``torchrun -m dit_core.train`` starts)."""

import sys

from ..cli.train import main

sys.exit(main())

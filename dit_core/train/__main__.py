"""``python -m dit_core.train`` = ``dit-train`` (and what ``torchrun -m dit_core.train`` starts)."""

import sys

from .cli import main

sys.exit(main())

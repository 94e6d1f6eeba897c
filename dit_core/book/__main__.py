"""``python -m dit_core.book strip-outputs book/*.ipynb``: clear notebook outputs before a commit."""

from .notebooks import main

raise SystemExit(main())

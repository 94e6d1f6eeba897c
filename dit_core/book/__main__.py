"""``python -m dit_core.book strip-outputs|add-box|timings ...``: keep the chapter notebooks clean, boxed and timed."""

from .notebooks import main

raise SystemExit(main())

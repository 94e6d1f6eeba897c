"""``python -m dit_book strip-outputs|add-box|timings ...``: keep the chapter notebooks clean, boxed and timed."""

from .notebooks import main

raise SystemExit(main())

"""``python -m framework`` is the ``pairlink`` command."""

from framework.cli import main

raise SystemExit(main())

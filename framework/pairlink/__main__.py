"""``python -m pairlink`` is the ``pairlink`` command."""

from pairlink._cli import main

raise SystemExit(main())

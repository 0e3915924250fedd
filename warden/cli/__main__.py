"""``python -m warden.cli``: the same as the ``warden`` command."""

from warden.cli.main import main

raise SystemExit(main())

"""The ``warden`` command line and the tools behind its subcommands (demo, scenario, models)."""

from warden.cli.main import main

__all__ = ["main"]

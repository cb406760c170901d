"""The `snapstore` command line. Parses arguments, formats output, and calls the public
Store API and the bench harness; holds no storage logic of its own."""
from snapstore.cli.main import main

__all__ = ["main"]

"""The `snapstore` command line. Parses arguments, formats output, and calls the public
Store API, snapstore.diff and the bench harness; holds no storage logic of its own.

Modules: app (parser, dispatch, exit codes, error printing; ``main``), args (argument types,
global options), common (exit codes, errors, opening the store), output (JSON, reports, safe
file names), progress (progress bars), and one module per command group: inspect_cmds (ls,
show, stats), diff_cmd, restore_cmd, write_cmds (init, rm, tag, retain), maintain_cmds
(compact, verify), bench_cmd.
"""
from snapstore.cli.app import main

__all__ = ["main"]

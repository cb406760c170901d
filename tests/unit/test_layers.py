"""The package's architecture, checked from its source: layers import only downwards, there
are no import cycles (imports inside functions count), no module uses another module's
private names, and only snapstore._native talks to the compiled C core.

Layers, bottom up (docs/design.md, "Layers"):

    errors  <  _native  <  engine  <  capture  <  store  <  object layers  <  integrations
            <  bench  <  cli  <  the package's __init__ / __main__

A module may import its own layer and any layer below it. The one sanctioned upward edge is
Store.save/load, the documented convenience entry points of the object layer.
"""
from __future__ import annotations

import ast
import os
from collections import defaultdict

import pytest

import snapstore

PACKAGE_DIR = os.path.dirname(os.path.abspath(snapstore.__file__))

# Rank of each layer (a prefix of dotted module names; the longest matching prefix wins).
LAYER_RANKS = {
    "snapstore.errors": 0,
    "snapstore.version": 0,
    "snapstore.formatting": 0,  # leaf: sizes, durations, tables, JSON for cli and bench
    "snapstore.halves": 0,      # leaf: two calls at once (the C core's loops, zstd)
    "snapstore.wakeups": 0,     # leaf: waits that Ctrl-C cannot leave half done
    "snapstore.interrupts": 0,  # leaf: sections Ctrl-C cannot cut (SIGINT deferred)
    "snapstore._native": 1,
    "snapstore._ffi": 1,
    "snapstore.engine": 2,
    "snapstore.remote": 2.5,    # S3 stores: the engine's pieces over a bucket
    "snapstore.capture": 3,
    "snapstore.store": 4,
    "snapstore.objectlayer": 5,  # what the object layers share
    "snapstore.objects": 5,
    "snapstore.arrays": 6,
    "snapstore.tensors": 6,     # what tensors a checkpoint holds (object, arrays, DCP)
    "snapstore.exporter": 7,    # checkpoints out as safetensors / pt / npz files
    "snapstore.torch": 7,
    "snapstore.langgraph": 7,
    "snapstore.langgraph_streams": 7,   # its stream names, importable without LangGraph
    "snapstore.workflow": 7,
    "snapstore.diff": 7,        # checkpoint diffs over the Store API
    "snapstore.copying": 7,     # checkpoints copied between stores over the Store API
    "snapstore.savepoints": 7,  # one checkpoint as a portable .snap file, over the Store API
    "snapstore.bench": 8,
    "snapstore.cli": 9,
    "snapstore": 10,            # the package __init__ (the public API) and __main__
    "snapstore.__main__": 10,
}
SANCTIONED_UPWARD = {("snapstore.store", "snapstore.objects")}


def _module_name(path: str) -> str:
    rel = os.path.relpath(path, os.path.dirname(PACKAGE_DIR))[:-3].replace(os.sep, ".")
    return rel[: -len(".__init__")] if rel.endswith(".__init__") else rel


def _sources() -> dict[str, str]:
    out = {}
    for root, _dirs, files in os.walk(PACKAGE_DIR):
        for f in files:
            if f.endswith(".py"):
                out[_module_name(os.path.join(root, f))] = os.path.join(root, f)
    return out


SOURCES = _sources()


def _is_package(name: str) -> bool:
    return SOURCES.get(name, "").endswith("__init__.py")


def _resolve(module: str, level: int, current: str) -> str:
    if not level:
        return module
    base = current if _is_package(current) else current.rpartition(".")[0]
    for _ in range(level - 1):
        base = base.rpartition(".")[0]
    return f"{base}.{module}" if module else base


def _imports(name: str) -> list[tuple[str, str | None, int]]:
    """(imported module, imported name or None, line) for every import in the module,
    including imports inside functions."""
    tree = ast.parse(open(SOURCES[name], encoding="utf-8").read())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((a.name, None, node.lineno) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            mod = _resolve(node.module or "", node.level, name)
            for a in node.names:
                sub = f"{mod}.{a.name}"
                if sub in SOURCES or sub == "snapstore._ffi":
                    found.append((sub, None, node.lineno))     # a submodule
                else:
                    found.append((mod, a.name, node.lineno))
    return [f for f in found if f[0] == "snapstore" or f[0].startswith("snapstore.")]


def _rank(name: str) -> int:
    best = max((p for p in LAYER_RANKS if name == p or name.startswith(p + ".")), key=len)
    return LAYER_RANKS[best]


def _graph() -> dict[str, set[str]]:
    graph = defaultdict(set)
    for name in SOURCES:
        for target, _, _ in _imports(name):
            if target != name and target in SOURCES:
                graph[name].add(target)
    return graph


def test_every_module_has_a_layer():
    for name in SOURCES:
        _rank(name)     # raises ValueError (max of nothing) for a module outside every layer


def test_no_import_cycles():
    graph = _graph()
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = 2

    for node in sorted(SOURCES):
        if node not in state:
            visit(node, [])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_layers_import_only_downwards():
    bad = []
    for name in SOURCES:
        for target, _, line in _imports(name):
            if target in SOURCES or target == "snapstore._ffi":
                if _rank(target) > _rank(name) and (name, target) not in SANCTIONED_UPWARD:
                    bad.append(f"{name}:{line} imports {target}")
    assert not bad, "upward imports: " + "; ".join(bad)


def test_engine_and_capture_never_import_upper_layers():
    # Spelled out on its own, because these are the seams later backends plug into.
    for name in SOURCES:
        if name.startswith(("snapstore.engine", "snapstore.capture")):
            for target, _, line in _imports(name):
                assert _rank(target) <= _rank(name), f"{name}:{line} imports {target}"


def test_no_private_names_across_modules():
    bad = []
    for name in SOURCES:
        tree = ast.parse(open(SOURCES[name], encoding="utf-8").read())
        aliases = {}        # local name -> snapstore module it stands for
        for target, imported, line in _imports(name):
            if imported is not None and imported.startswith("_") and \
                    not imported.startswith("__") and target != name:
                bad.append(f"{name}:{line} imports {target}.{imported}")
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                mod = _resolve(node.module or "", node.level, name)
                for a in node.names:
                    if f"{mod}.{a.name}" in SOURCES:
                        aliases[a.asname or a.name] = f"{mod}.{a.name}"
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name in SOURCES and a.asname:
                        aliases[a.asname] = a.name
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id in aliases and node.attr.startswith("_") \
                    and not node.attr.startswith("__") and aliases[node.value.id] != name:
                bad.append(f"{name}:{node.lineno} uses {aliases[node.value.id]}.{node.attr}")
    assert not bad, "private names used across modules: " + "; ".join(sorted(set(bad)))


def test_only_native_binds_the_c_core():
    users = sorted({name for name in SOURCES for target, _, _ in _imports(name)
                    if target == "snapstore._ffi"})
    assert users == ["snapstore._native"], users


@pytest.mark.parametrize("rule", ["cycle", "upward", "private"])
def test_the_checks_can_fail(rule, monkeypatch, tmp_path):
    """Each check above finds a planted violation (so a silently broken checker cannot pass)."""
    planted = {
        "cycle": {"snapstore.engine.zz_a": "from snapstore.engine import zz_b\n",
                  "snapstore.engine.zz_b": "from snapstore.engine import zz_a\n"},
        "upward": {"snapstore.engine.zz_a": "from snapstore import cli\n"},
        "private": {"snapstore.engine.zz_a": "from snapstore.engine.format import _x\n"},
    }[rule]
    for module, source in planted.items():
        path = tmp_path / (module.rpartition(".")[2] + ".py")
        path.write_text(source)
        monkeypatch.setitem(SOURCES, module, str(path))
    check = {"cycle": test_no_import_cycles, "upward": test_layers_import_only_downwards,
             "private": test_no_private_names_across_modules}[rule]
    with pytest.raises(AssertionError):
        check()

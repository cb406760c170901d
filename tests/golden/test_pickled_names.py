"""Names that old object checkpoints pickle must keep resolving.

An object checkpoint (store.save, snapstore.torch.save) is a pickle stream, and pickle names
the functions and classes that rebuild objects by module and qualified name, e.g.
snapstore.objects._storage. A DCP checkpoint's "dcp/metadata" buffer is a pickle too (DCP's
Metadata, whose storage_data holds snapstore.torch._Location tuples). Moving or renaming any
of these breaks every checkpoint already on disk, so:

  * every snapstore* global named by a pickle in the golden stores must resolve today
    (importlib.import_module + getattr along the qualname), and
  * PINNED lists the names the format-defining version pickled: each must still resolve, and
    the golden pickles must name nothing outside it. A moved module needs an alias left at the
    old path (e.g. `from snapstore.engine.objects import _storage` kept importable as
    snapstore.objects._storage), not an update of this list.
"""
from __future__ import annotations

import glob
import importlib
import io
import json
import os
import pickle
import pickletools
import shutil

import pytest

import snapstore

HERE = os.path.dirname(os.path.abspath(__file__))
STORE_DIRS = sorted(os.path.dirname(p) for p in
                    glob.glob(os.path.join(HERE, "stores", "v*", "*", "expected.json")))

# The snapstore globals the v1 golden pickles name (module, qualname).
PINNED = {
    ("snapstore.objects", "_storage"),
    ("snapstore.objects", "_tensor"),
    ("snapstore.objects", "_datetime_array"),
    ("snapstore.torch", "_Location"),
}
# Needs torch to import (snapstore.torch imports it).
NEEDS_TORCH = {"snapstore.torch"}

_STRING_OPS = {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "SHORT_BINSTRING",
               "BINSTRING", "STRING"}
_GET_OPS = {"GET", "BINGET", "LONG_BINGET"}
_PUT_OPS = {"PUT", "BINPUT", "LONG_BINPUT"}


def pickled_globals(data: bytes) -> set:
    """Every (module, qualname) a pickle stream looks up: GLOBAL/INST carry it in their
    argument; STACK_GLOBAL pops two strings, pushed just before or fetched from the memo."""
    found = set()
    memo: dict = {}
    pushed: list = []              # what each stack-pushing opcode pushed (None: not a str)
    for op, arg, _ in pickletools.genops(data):
        name = op.name
        if name in ("GLOBAL", "INST"):
            module, qualname = arg.split(" ", 1)
            found.add((module, qualname))
            pushed.append(None)
        elif name == "STACK_GLOBAL":
            module, qualname = pushed[-2], pushed[-1]
            assert isinstance(module, str) and isinstance(qualname, str), (module, qualname)
            found.add((module, qualname))
            pushed[-2:] = [None]
        elif name in _STRING_OPS:
            pushed.append(arg if isinstance(arg, str) else arg.decode("latin-1"))
        elif name in _GET_OPS:
            pushed.append(memo.get(arg))
        elif name == "MEMOIZE":
            memo[len(memo)] = pushed[-1] if pushed else None
        elif name in _PUT_OPS:
            memo[arg] = pushed[-1] if pushed else None
        elif name not in ("PROTO", "FRAME", "STOP"):
            pushed.append(None)
    return found


class _Recorder(pickle.Unpickler):
    """An unpickler that records every find_class (pickle's own view of the names)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.names: set = set()

    def find_class(self, module, name):
        self.names.add((module, name))
        return super().find_class(module, name)


def resolve(module: str, qualname: str):
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def golden_pickles() -> list:
    """(label, pickle bytes, out-of-band buffers) of every pickle in the golden stores."""
    out = []
    for store_dir in STORE_DIRS:
        with open(os.path.join(store_dir, "expected.json")) as f:
            exp = json.load(f)
        for c in exp["checkpoints"]:
            names = [b["name"] for b in c["buffers"]]
            if c["load"] and c["load"]["api"] in ("objects", "torch"):
                oob = [n for n in names if n.startswith("oob/")]
                out.append((store_dir, c["id"], "pickle", oob))
            if "dcp/metadata" in names:
                out.append((store_dir, c["id"], "dcp/metadata", []))
    return out


PICKLES = golden_pickles()


@pytest.fixture(scope="module")
def restored(tmp_path_factory):
    """{(store dir, checkpoint id, buffer): (bytes, [out-of-band buffers])}."""
    tmp = tmp_path_factory.mktemp("pickles")
    out = {}
    for store_dir in sorted({p[0] for p in PICKLES}):
        copy = os.path.join(str(tmp), os.path.relpath(store_dir, HERE).replace(os.sep, "_"))
        shutil.copytree(store_dir, copy, ignore=shutil.ignore_patterns("expected.json"))
        with snapstore.open(copy, readonly=True) as store:
            for sd, cid, buf, oob in PICKLES:
                if sd == store_dir:
                    data = store.restore(cid)
                    out[(sd, cid, buf)] = (data[buf], [bytearray(data[n]) for n in oob])
    return out


def _label(p) -> str:
    return f"{os.path.relpath(p[0], os.path.join(HERE, 'stores'))}#{p[1]}:{p[2]}"


def test_golden_pickles_found():
    kinds = {(os.path.basename(p[0]), p[2]) for p in PICKLES}
    assert {("objects", "pickle"), ("torch", "pickle"), ("torch", "dcp/metadata")} <= kinds


@pytest.mark.parametrize("pick", PICKLES, ids=_label)
def test_snapstore_names_in_golden_pickles_resolve(pick, restored):
    data, _ = restored[pick[0], pick[1], pick[2]]
    names = pickled_globals(data)
    ours = {n for n in names if n[0] == "snapstore" or n[0].startswith("snapstore.")}
    assert ours <= PINNED, f"a golden pickle names {sorted(ours - PINNED)}, not pinned"
    for module, qualname in sorted(ours):
        if module in NEEDS_TORCH:
            pytest.importorskip("torch")
        assert resolve(module, qualname) is not None, (module, qualname)


@pytest.mark.parametrize("pick", PICKLES, ids=_label)
def test_opcode_walk_finds_what_pickle_looks_up(pick, restored):
    """The opcode walk above against pickle itself: the names an unpickler asks for."""
    data, oob = restored[pick[0], pick[1], pick[2]]
    needs_torch = os.path.basename(pick[0]) == "torch"
    if needs_torch:
        pytest.importorskip("torch")
        import snapstore.torch  # noqa: F401  (DCP metadata unpickles torch classes)
    rec = _Recorder(io.BytesIO(data), buffers=oob)
    rec.load()
    assert pickled_globals(data) == rec.names


def test_pinned_names_all_occur(restored):
    """PINNED is exactly what the golden pickles name: nothing stale, nothing missing."""
    seen = set()
    for data, _ in restored.values():
        seen |= {n for n in pickled_globals(data) if n[0].split(".")[0] == "snapstore"}
    assert seen == PINNED


@pytest.mark.parametrize("name", sorted(PINNED), ids=lambda n: ".".join(n))
def test_pinned_names_resolve(name):
    module, qualname = name
    if module in NEEDS_TORCH:
        pytest.importorskip("torch")
    obj = resolve(module, qualname)
    assert callable(obj), name
    # what an unpickler does with the name
    assert pickle.Unpickler(io.BytesIO(b"")).find_class(module, qualname) is obj

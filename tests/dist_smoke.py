"""Smoke test of an INSTALLED snapstore (run by `make dist-check` with the Python of a fresh
virtualenv into which the sdist was pip-installed, from a directory outside the source tree).

Checks: the package imported is the installed one (not the source tree's), its compiled
extension loads, a checkpoint / restore round trip gives back the bytes, and the console
script works: `snapstore --version`, `snapstore init`, `snapstore ls`.
Exit status 0 and a last line "dist smoke: ok" when all hold."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import tempfile


def main() -> int:
    import snapstore
    import snapstore._ffi as ffi

    site = sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]
    assert snapstore.__file__.startswith(site), f"not the installed package: {snapstore.__file__}"
    assert ffi.__file__.startswith(site) and ffi.__file__.endswith(".so"), ffi.__file__
    script = os.path.join(os.path.dirname(sys.executable), "snapstore")
    assert os.path.exists(script), "the console script was not installed"

    with tempfile.TemporaryDirectory(prefix="snapstore-smoke-") as tmp:
        path = os.path.join(tmp, "store")
        data = {"a": bytearray(os.urandom(1 << 20)), "b": bytearray(b"x" * 5000)}
        with snapstore.open(path) as store:
            first = store.checkpoint(data, "s")
            data["a"][4096:4160] = b"\x01" * 64
            second = store.checkpoint(data, "s")
            assert store.restore(first.id)["b"] == data["b"]
            assert store.restore(second.id)["a"] == data["a"]

        def run(*args: str) -> str:
            p = subprocess.run([script, *args], capture_output=True, text=True, timeout=120,
                               cwd=tmp)
            assert p.returncode == 0, (args, p.returncode, p.stdout, p.stderr)
            return p.stdout

        assert run("--version").strip() == f"snapstore {snapstore.__version__}"
        run("init", os.path.join(tmp, "fresh"))
        listed = json.loads(run("-s", path, "ls", "--json"))["checkpoints"]
        assert [(c["id"], c["stream"]) for c in listed] == [(first.id, "s"), (second.id, "s")]
        fresh = json.loads(run("-s", os.path.join(tmp, "fresh"), "ls", "--json"))
        assert fresh["checkpoints"] == [], fresh
    print(f"dist smoke: ok (snapstore {snapstore.__version__} from {snapstore.__file__})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

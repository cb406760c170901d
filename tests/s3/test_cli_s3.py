"""The CLI takes s3://BUCKET/PREFIX wherever it takes a store path (against a real server)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import snapstore


def run(env, *argv):
    r = subprocess.run([sys.executable, "-m", "snapstore", *argv], env=env,
                       capture_output=True, text=True, timeout=120)
    return r.returncode, r.stdout, r.stderr


def test_cli_over_an_s3_store(s3, tmp_path):
    url = f"s3://{s3.bucket}/{s3.prefix.rstrip('/')}"
    env = dict(os.environ, SNAPSTORE_CACHE_DIR=str(tmp_path / "cache"))
    assert run(env, "init", url)[0] == 0
    code, out, _ = run(env, "init", url, "--json")
    assert code == 0 and json.loads(out)["created"] is False
    os.environ["SNAPSTORE_CACHE_DIR"] = str(tmp_path / "py-cache")
    try:
        with snapstore.open(url) as s:
            info = s.checkpoint({"a": b"hello", "b": os.urandom(70000)}, stream="s")
            s.tag(info.id, "v1")
    finally:
        del os.environ["SNAPSTORE_CACHE_DIR"]
    code, out, _ = run(env, "ls", url, "--json")
    assert code == 0 and [c["id"] for c in json.loads(out)["checkpoints"]] == [info.id]
    code, out, err = run(env, "restore", url, "v1", "--out", str(tmp_path / "out"))
    assert code == 0, err
    assert (tmp_path / "out" / "a").read_bytes() == b"hello"
    for argv in (("verify", url), ("verify", url, "--deep"), ("stats", url),
                 ("repair", url)):
        code, out, err = run(env, *argv)
        assert code == 0, (argv, out, err)
    code, out, err = run(env, "ls", f"s3://{s3.bucket}/no-store-here")
    assert code != 0 and "not a snapstore store" in err

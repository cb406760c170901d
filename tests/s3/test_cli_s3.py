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


def test_copy_export_and_import_take_s3_urls(s3, tmp_path):
    """copy (either side an S3 store), export from one and import into one, as `init`, `ls`
    and the API take them; --json gives the URL, not a path made of it."""
    url = f"s3://{s3.bucket}/{s3.prefix.rstrip('/')}"
    env = dict(os.environ, SNAPSTORE_CACHE_DIR=str(tmp_path / "cache"))
    local, back = str(tmp_path / "local"), str(tmp_path / "back")
    payload = {"a": b"x", "b": os.urandom(70000)}
    with snapstore.open(local) as s:
        s.checkpoint(payload, stream="s")
    assert run(env, "init", url)[0] == 0
    code, out, err = run(env, "copy", local, url, "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert (doc["src"], doc["dst"]) == (os.path.abspath(local), url)
    assert len(doc["copied"]) == 1
    assert run(env, "init", back)[0] == 0
    code, out, err = run(env, "copy", url, back)
    assert code == 0, err
    code, out, err = run(env, "export", url, "latest:s", "-o", str(tmp_path / "s.snap"))
    assert code == 0, err
    code, out, err = run(env, "import", str(tmp_path / "s.snap"), url, "--stream", "again",
                         "--json")
    assert code == 0, err
    assert json.loads(out)["store"] == url
    code, out, err = run(env, "import", str(tmp_path / "s.snap"), url, "-s", url)
    assert code == 0, err                   # the same store twice is one store
    os.environ["SNAPSTORE_CACHE_DIR"] = str(tmp_path / "py-cache")
    try:
        with snapstore.open(url) as s:
            assert sorted(c.stream for c in s.checkpoints()) == ["again", "s", "s"]
            assert s.restore("latest:again") == payload
    finally:
        del os.environ["SNAPSTORE_CACHE_DIR"]
    with snapstore.open(back) as s:
        assert s.restore("latest:s") == payload
    code, _, err = run(env, "copy", local, f"s3://{s3.bucket}/no-store-here")
    assert code != 0 and "not a snapstore store" in err

"""`snapstore export` through the installed console script: files numpy / safetensors / torch
read back byte-exact, --json, refusals with exit 2 and nothing written, and `restore` pointing
to export for tensor checkpoints."""
from __future__ import annotations

import os

import numpy as np
import pytest

import snapstore
from cli_runner import cli_error, cli_json, cli_ok

safetensors_numpy = pytest.importorskip("safetensors.numpy")


@pytest.fixture
def arrays_store(tmp_path):
    path = str(tmp_path / "s")
    state = {"w": np.arange(12, dtype=np.float32).reshape(3, 4),
             "f": np.asfortranarray(np.arange(6, dtype=np.int8).reshape(2, 3))}
    with snapstore.open(path) as s:
        snapstore.save_arrays(s, state, "a", meta={"step": 1})
        s.save({"model": {"w": np.ones(2000, np.float64)}, "step": 7}, "o")
        s.checkpoint({"raw": b"xyz"}, stream="plain")
    return path, state


def test_export_npz_and_safetensors(arrays_store, tmp_path):
    path, state = arrays_store
    out = str(tmp_path / "a.npz")
    p = cli_ok("export", "1", "-o", out, "-s", path)
    assert "exported checkpoint 1" in p.stdout and "2 tensor(s)" in p.stdout
    got = np.load(out)
    for k, a in state.items():
        assert got[k].tobytes() == np.ascontiguousarray(a).tobytes()
    doc = cli_json("-s", path, "export", "latest:o", "-o", str(tmp_path / "o.bin"),
                   "--format", "safetensors")
    assert doc["format"] == "safetensors" and doc["tensors"] == 1
    assert doc["values"] == {"step": 7} and doc["path"] == str(tmp_path / "o.bin")
    got = safetensors_numpy.load_file(str(tmp_path / "o.bin"))
    assert np.array_equal(got["model.w"], np.ones(2000))


def test_export_refusals_exit_2_and_write_nothing(arrays_store, tmp_path):
    path, _ = arrays_store
    out = tmp_path / "x.npz"
    cli_error(2, "-s", path, "export", "3", "-o", str(out), needles=["holds no tensors"])
    cli_error(2, "-s", path, "export", "99", "-o", str(out))
    cli_error(2, "-s", path, "export", "1", "-o", str(tmp_path / "x.txt"),
              needles=["no export format given", "x.txt"])
    cli_error(2, "-s", path, "export", "1", "-o", str(tmp_path / "x.npz"), "--format", "zip",
              needles=["invalid choice: 'zip'"])
    assert not out.exists()
    out.write_bytes(b"old")
    cli_error(2, "-s", path, "export", "1", "-o", str(out), needles=["exists", "--force"])
    assert out.read_bytes() == b"old"
    cli_ok("-s", path, "export", "1", "-o", str(out), "--force")
    assert np.load(str(out))["w"].shape == (3, 4)
    assert sorted(os.listdir(tmp_path)) == ["s", "x.npz"]    # no temporary file left


def test_export_never_replaces_a_fifo_or_directory_and_names_the_users_path(arrays_store,
                                                                           tmp_path):
    """--force replaces a file by rename: a device, FIFO or directory at the path is refused
    (`-o /dev/null --force` once turned /dev/null into a regular file); an I/O error names the
    path asked for, not the temporary file beside it."""
    path, _ = arrays_store
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for fmt in ("npz", "snap"):
        cli_error(2, "-s", path, "export", "1", "-o", str(fifo), "--format", fmt, "--force",
                  needles=[str(fifo), "not a regular file"])
        assert fifo.is_fifo()
    folder = tmp_path / "d.npz"
    folder.mkdir()
    cli_error(2, "-s", path, "export", "1", "-o", str(folder), "--force",
              needles=[str(folder), "is a directory"])
    for fmt in ("npz", "snap"):         # without --force: not "pass --force" (it would not do)
        line = cli_error(2, "-s", path, "export", "1", "-o", str(folder), "--format", fmt,
                         needles=[str(folder), "is a directory"])
        assert "--force" not in line
    assert folder.is_dir() and os.listdir(folder) == []
    missing = tmp_path / "missing" / "x.npz"
    line = cli_error(1, "-s", path, "export", "1", "-o", str(missing),
                     needles=[str(missing), "No such file or directory"])
    assert ".part" not in line
    line = cli_error(2, "-s", path, "export", "1", "-o", str(tmp_path / "noext"),
                     needles=["no export format given", "noext"])
    assert sorted(os.listdir(tmp_path)) == ["d.npz", "pipe", "s"]


def test_export_bfloat16_to_npz_is_refused(tmp_path):
    torch = pytest.importorskip("torch")
    path = str(tmp_path / "s")
    with snapstore.open(path) as s:
        s.save({"w": torch.ones(3000, dtype=torch.bfloat16)}, "t")
    cli_error(2, "-s", path, "export", "latest", "-o", str(tmp_path / "t.npz"),
              needles=["bfloat16", "NumPy"])
    p = cli_ok("-s", path, "export", "latest", "-o", str(tmp_path / "t.pt"))
    got = torch.load(str(tmp_path / "t.pt"), weights_only=True)
    assert torch.equal(got["w"], torch.ones(3000, dtype=torch.bfloat16)), p.stdout


def test_restore_points_to_export(arrays_store, tmp_path):
    path, _ = arrays_store
    p = cli_ok("-s", path, "restore", "2", "--out", str(tmp_path / "r"))
    assert "snapstore export 2" in p.stdout
    p = cli_ok("-s", path, "restore", "3", "--out", str(tmp_path / "r2"))
    assert "snapstore export" not in p.stdout
    assert "snapstore export" in cli_ok("restore", "--help").stdout.replace("\n", " ")
    assert "export" in cli_ok("--help").stdout


def _store_files(path: str) -> dict:
    out = {}
    for root, _, names in os.walk(path):
        for n in names:
            if n not in ("lock.mdb",):
                with open(os.path.join(root, n), "rb") as f:
                    out[os.path.relpath(os.path.join(root, n), path)] = f.read()
    return out


@pytest.mark.parametrize("target", ["FORMAT", "index", "new.npz", "via symlink"])
@pytest.mark.parametrize("command", ["export", "export --format snap", "restore"])
def test_output_into_the_store_itself_is_refused_even_with_force(arrays_store, tmp_path,
                                                                 target, command):
    """Regression: `export -o STORE/FORMAT --force` (or `restore --out STORE --force`)
    replaced the store's own files with the export and reported success: the store was gone.
    Any output path inside the store's directory is refused, and the store is untouched."""
    path, state = arrays_store
    before = _store_files(path)
    inside = {"FORMAT": os.path.join(path, "FORMAT"), "new.npz": os.path.join(path, "new.npz"),
              "index": os.path.join(path, sorted(os.listdir(path))[0]),
              "via symlink": str(tmp_path / "alias" / "FORMAT")}[target]
    os.symlink(path, tmp_path / "alias")
    if command == "restore":
        out = os.path.dirname(inside)
        cli_error(2, "-s", path, "restore", "1", "--out", out, "--force",
                  needles=["inside the store's own directory"])
    else:
        fmt = ["--format", "snap"] if "snap" in command else ["--format", "npz"]
        cli_error(2, "-s", path, "export", "1", "-o", inside, "--force", *fmt,
                  needles=["inside the store's own directory"])
    assert _store_files(path) == before
    with snapstore.open(path) as s:
        assert s.verify()["ok"]
        assert snapstore.load_arrays(s, 1)["w"].tobytes() == state["w"].tobytes()

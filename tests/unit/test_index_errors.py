"""How the index's LMDB errors reach the caller (engine/index.py, _wrap)."""
from __future__ import annotations

import errno

import lmdb

from snapstore.engine import index as index_module
from snapstore.errors import StoreIOError


def test_an_index_write_failing_with_eio_on_a_nearly_full_file_system_says_disk_full(
        tmp_path, monkeypatch):
    """LMDB turns a short write into EIO: `snapstore init` on a full disk said only
    'index write: mdb_txn_commit: Input/output error' (a reviewer's find)."""
    eio = lmdb.Error("mdb_txn_commit: Input/output error")
    monkeypatch.setattr(index_module, "_free_bytes", lambda path: 40 << 10)
    exc = index_module._wrap(eio, "write", str(tmp_path))
    assert isinstance(exc, StoreIOError) and exc.errno == errno.ENOSPC
    assert str(exc).startswith("index write: disk full") and "40960 bytes free" in str(exc)
    monkeypatch.setattr(index_module, "_free_bytes", lambda path: 10 << 30)
    plain = index_module._wrap(eio, "write", str(tmp_path))     # room enough: as it was
    assert str(plain) == "index write: mdb_txn_commit: Input/output error"
    assert str(index_module._wrap(eio, "write")) == str(plain)   # no path: as it was

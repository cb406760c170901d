"""IndexWriter.apply_commit's chunk entries (engine/index.py): each chunk the index lacks is
written once with its reference count, from the commit's new-chunk table or from a table of
reused chunks (what an S3 pull brings, remote/sync.py); an entry already there is kept as it
is and its count raised; a damaged one is refused, not overwritten."""
from __future__ import annotations

import os

import pytest

from snapstore.engine import format as fmt
from snapstore.engine.index import ChunkEntry, Index, seal
from snapstore.engine.records import BufferEntry, Commit
from snapstore.errors import CorruptionError
from snapstore.remote import sync

CHUNK = 4096


def _ids(n: int, tag: bytes) -> list[bytes]:
    return [tag + bytes([i % 256, i // 256]) + bytes(29) for i in range(n)]


def _table(ids, segment: int = 1) -> bytes:
    return b"".join(fmt.NEW_CHUNK.pack(c, segment, 100 * i, 50, CHUNK, 0)
                    for i, c in enumerate(ids))


def _commit(cid: int, uses: list[bytes], new: list[bytes], parent=None) -> Commit:
    extents = b"".join(fmt.EXTENT.pack(i * CHUNK, 0, CHUNK, c) for i, c in enumerate(uses))
    return Commit(id=cid, stream="s", parent=parent, created=0.0, meta=None,
                  buffers=[BufferEntry("b", len(uses) * CHUNK, "full", 0, "pages", CHUNK,
                                       extents)],
                  new_chunks=_table(new), seq=cid)


@pytest.fixture
def index(tmp_path):
    path = str(tmp_path / "index")
    os.makedirs(path)
    idx = Index(path, readonly=False, durable=False)
    yield idx
    idx.close()


def _entries(index, ids) -> list:
    with index.read() as r:
        return [r.chunk(c) for c in ids]


def test_new_chunks_are_written_once_with_their_counts(index):
    a = _ids(300, b"a")
    uses = a + a[:10] + a[:1]            # chunk 0 three times, 1..9 twice
    with index.write() as w:
        w.apply_commit(_commit(1, uses, a + a[:5]), None)   # a table listing some twice
    got = _entries(index, a)
    assert [e.refs for e in got] == [3] + [2] * 9 + [1] * 290
    assert [(e.segment, e.offset, e.stored_len, e.raw_len, e.codec) for e in got] == \
        [(1, 100 * i, 50, CHUNK, 0) for i in range(300)]


def test_nothing_new_and_nothing_used(index):
    with index.write() as w:
        w.apply_commit(_commit(1, [], []), None)
    with index.read() as r:
        assert r.checkpoint(1) is not None
        assert list(r.chunks()) == []


def test_a_chunk_listed_but_unused_gets_count_zero(index):
    a = _ids(3, b"a")
    with index.write() as w:
        w.apply_commit(_commit(1, a[:2], a), None)
    assert [e.refs for e in _entries(index, a)] == [1, 1, 0]


def test_reused_table_adds_the_missing_entries_and_keeps_present_ones(index):
    a, b = _ids(50, b"a"), _ids(50, b"b")
    with index.write() as w:
        w.apply_commit(_commit(1, a, a), None)
    # checkpoint 2 uses a (present) and b (absent), and lists both as reused elsewhere
    reused = _table(a + b, segment=7)
    with index.write() as w:
        w.apply_commit(_commit(2, a + b, [], parent=1), None, reused)
    got_a, got_b = _entries(index, a), _entries(index, b)
    assert all(e.segment == 1 and e.refs == 2 for e in got_a), "a present entry was rewritten"
    assert [(e.segment, e.offset, e.refs) for e in got_b] == \
        [(7, 100 * (50 + i), 1) for i in range(50)]


def test_a_pull_applies_a_checkpoint_once(index):
    a = _ids(20, b"a")
    commit = _commit(1, a, [])
    with index.write() as w:
        assert sync.apply_checkpoint(w, commit, _table(a))
    with index.write() as w:
        assert not sync.apply_checkpoint(w, _commit(1, a, []), _table(a))
    assert [e.refs for e in _entries(index, a)] == [1] * 20


def test_a_damaged_entry_of_a_used_chunk_is_refused_not_overwritten(index):
    a = _ids(4, b"a")
    with index.write() as w:
        w.apply_commit(_commit(1, a, a), None)
        good = ChunkEntry(1, 0, 50, CHUNK, 1, 0).pack()
        value = bytearray(seal(fmt.DB_CHUNKS, a[2], good))
        value[0] ^= 1                                    # a flipped bit
        w.txn.put(a[2], bytes(value), db=w.dbs[fmt.DB_CHUNKS])
    with pytest.raises(CorruptionError, match="checksum"):
        with index.write() as w:
            w.apply_commit(_commit(2, a, [], parent=1), None, _table(a, segment=9))
    with pytest.raises(CorruptionError, match="checksum"):
        _entries(index, a[2:3])                          # still the damaged one

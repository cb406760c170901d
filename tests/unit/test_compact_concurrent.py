"""Compaction while another writer writes (docs/design.md, "Compaction", "While other writers
write"): deterministic interleavings of one compaction and another Store's operations, made by
running the other Store's operation at one of compaction's crash points (the points are
between its transactions, so the other writer can take the index's write lock there).
"""
from __future__ import annotations

import random

import pytest

import snapstore
from snapstore.engine import compact as compaction


@pytest.fixture
def at_point(monkeypatch):
    """at_point(name, action): runs action() when compaction reaches crash point `name`."""
    actions: dict = {}
    real = compaction.crashpoint

    def hook(name: str) -> None:
        if name in actions:
            actions.pop(name)()
        real(name)
    monkeypatch.setattr(compaction, "crashpoint", hook)

    def add(name: str, action) -> None:
        actions[name] = action
    return add


def _trimmable(store, rng) -> tuple:
    """Two checkpoints of one 64 KiB buffer, the second a delta rewriting 6 of its 16 pages;
    the first deleted, so the second uses 10/16 of the first's chunk: a chunk compact()
    trims with threshold 0.9."""
    state = bytearray(rng.randbytes(64 << 10))
    original = bytes(state)
    first = store.checkpoint({"x": state}, stream="s")
    for page in range(6):
        state[page * 4096:(page + 1) * 4096] = rng.randbytes(4096)
    second = store.checkpoint({"x": state}, stream="s")
    assert second.kind == "incremental"
    store.delete(first.id)
    return second, original, bytes(state)


def test_trim_survives_a_delete_by_another_writer(store_path, at_point):
    # Regression (found by tests/crash/test_many_writers_kill.py): a checkpoint whose chunk
    # compaction planned to trim, deleted by another writer between the plan and the trim's
    # transaction, made compact() raise CorruptionError('index lacks manifest 0 of
    # checkpoint N') -- on a healthy store -- whenever writers delete while it runs.
    rng = random.Random(7)
    with snapstore.open(store_path) as a, snapstore.open(store_path) as b:
        second, _, _ = _trimmable(a, rng)
        kept = rng.randbytes(100_000)
        keep = a.checkpoint({"y": kept}, stream="other")
        at_point("compact_after_trim_copy", lambda: b.delete(second.id))
        report = a.compact(threshold=0.9)
        assert report["segments_removed"] >= 1
        assert [c.id for c in a.checkpoints()] == [keep.id]
        assert a.verify(deep=True)["ok"]
        a.compact(threshold=0.9)      # the trimmed copy nobody uses is garbage: collected
        assert a.stats()["garbage_chunk_bytes"] == 0
        assert a.restore(keep.id)["y"] == kept
        assert a.verify(deep=True)["ok"]


def test_trim_keeps_a_checkpoint_another_writer_commits_meanwhile(store_path, at_point):
    """A commit between the trim's plan and its transaction that reuses the trimmed chunk
    (the same bytes again) keeps the whole chunk, which stays referenced and restorable."""
    rng = random.Random(8)
    with snapstore.open(store_path) as a, snapstore.open(store_path) as b:
        second, original, state = _trimmable(a, rng)
        made = []
        # a full checkpoint of another stream holding the first checkpoint's bytes: it
        # reuses (and pins) the very chunk the trim replaces
        at_point("compact_after_trim_copy",
                 lambda: made.append(b.checkpoint({"x": original}, stream="t")))
        report = a.compact(threshold=0.9)
        assert report["chunks_trimmed"] == 1 and made
        assert made[0].bytes_new < 4096          # deduplicated: only its commit record
        assert a.restore(second.id)["x"] == state
        assert b.restore(made[0].id)["x"] == original
        assert a.verify(deep=True)["ok"]
        a.compact(threshold=0.9)
        assert a.restore(second.id)["x"] == state
        assert b.restore(made[0].id)["x"] == original
        assert a.verify(deep=True)["ok"]

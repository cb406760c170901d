"""Stateful property test of the Store against a pure-Python model.

Random sequences of: mutate 1-3 named buffers (random pages, random byte ranges, insertions,
resizes to 0..300 KB), checkpoint a random subset into one of two streams (page chunking, now
and then content-defined), delete a random checkpoint, reopen the store (sometimes with the
other page size), read random ranges and restore. The model is {checkpoint id: (stream,
{name: bytes})}. Small page sizes, chunk sizes, segment sizes and max_chain make chains, packed
delta chunks, segment rollover and delete-merges happen in short runs.

Checked all along: every live checkpoint restores byte-exact (restore, restore_into, read);
checkpoints() lists exactly the live ids oldest first, per stream too; latest() and streams()
are right; parents point at the previous live checkpoint of the stream.
SNAPSTORE_HYPOTHESIS_PROFILE=slow runs 10x more examples.
"""
import functools
import os
import shutil
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant, precondition,
                                 rule)

import snapstore
from snapstore.errors import CheckpointNotFound

NAMES = ("a", "b", "c")
STREAMS = ("s0", "s1")
MAX_SIZE = 300_000


def examples(n: int) -> int:
    """n scaled by the loaded profile (dev: 100 -> n, slow: 1000 -> 10 n)."""
    return max(1, n * settings.default.max_examples // 100)


def random_bytes(rng: np.random.Generator, n: int) -> bytes:
    return rng.integers(0, 256, n, dtype=np.uint8).tobytes()


def guarded(method):
    """Marks the machine failed while the method runs, so teardown skips its own checks
    (which would otherwise mask the real error) when the method raises."""
    @functools.wraps(method)
    def run(self, **kwargs):
        self.failed = True
        method(self, **kwargs)
        self.failed = False
    return run


class StoreMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="snapstore-prop-")
        self.path = os.path.join(self.dir, "store")
        self.store = None
        self.opts = {}
        self.bufs = {}            # name -> bytearray: the live application state
        self.model = {}           # checkpoint id -> (stream, {name: bytes})
        self.max_chain = 1
        self.failed = False       # a rule raised: teardown must not mask its error

    # ---- helpers ------------------------------------------------------------------------
    def live_ids(self, stream=None):
        return sorted(i for i, (s, _) in self.model.items() if stream is None or s == stream)

    def check_checkpoint(self, cid):
        stream, expected = self.model[cid]
        assert self.store.restore(cid) == expected
        info = self.store.get(cid)
        assert info.stream == stream
        assert info.sizes == {n: len(v) for n, v in expected.items()}

    # ---- set-up -----------------------------------------------------------------------------
    @initialize(page_size=st.sampled_from([512, 4096]), max_chain=st.integers(1, 4),
                chunk_size=st.sampled_from([8192, 65536]),
                full_threshold=st.sampled_from([0.5, 0.5, 0.9, 0.1]),
                sizes=st.lists(st.integers(0, MAX_SIZE) | st.integers(0, 3000), min_size=3,
                               max_size=3),
                seed=st.integers(0, 2 ** 32 - 1))
    @guarded
    def setup(self, page_size, max_chain, chunk_size, full_threshold, sizes, seed):
        self.max_chain = max_chain
        self.opts = dict(durability="none", page_size=page_size, max_chain=max_chain,
                         chunk_size=chunk_size, full_threshold=full_threshold,
                         segment_size=1 << 16, cdc_sizes=(1024, 4096, 16384))
        self.store = snapstore.open(self.path, **self.opts)
        rng = np.random.default_rng(seed)
        self.bufs = {n: bytearray(random_bytes(rng, size)) for n, size in zip(NAMES, sizes)}

    def teardown(self):
        try:
            if self.store is not None and not self.failed:
                for cid in self.live_ids():
                    self.check_checkpoint(cid)
                self.store.close()
                # and once more from a fresh open
                with snapstore.open(self.path, **self.opts) as s:
                    assert [c.id for c in s.checkpoints()] == self.live_ids()
                    for cid in self.live_ids():
                        assert s.restore(cid) == self.model[cid][1]
        finally:
            if self.store is not None:
                self.store.close()        # always: every open store maps its index
            shutil.rmtree(self.dir, ignore_errors=True)

    # ---- mutations of the application state ---------------------------------------------
    def apply_mutation(self, name, kind, amount, seed):
        rng = np.random.default_rng(seed)
        buf = self.bufs[name]
        if kind == "pages":                       # flip bytes in `amount` random pages
            if not buf:
                return
            ps = self.opts["page_size"]
            n_pages = -(-len(buf) // ps)
            for p in rng.integers(0, n_pages, amount):
                i = int(p) * ps + int(rng.integers(0, min(ps, len(buf) - int(p) * ps)))
                buf[i] = (buf[i] + 1 + int(rng.integers(0, 255))) % 256
        elif kind == "range":                     # overwrite a random byte range
            if not buf:
                return
            start = int(rng.integers(0, len(buf)))
            end = min(len(buf), start + amount * 1000)
            buf[start:end] = random_bytes(rng, end - start)
        elif kind == "insert":                    # shift the content after a random point
            at = int(rng.integers(0, len(buf) + 1))
            buf[at:at] = random_bytes(rng, min(amount * 100, max(0, MAX_SIZE - len(buf))))
        else:                                     # resize, keeping the prefix or not
            size = int(rng.integers(0, MAX_SIZE + 1)) if amount > 2 else amount - 1
            new = bytearray(random_bytes(rng, size))
            if kind == "resize_keep":
                n = min(size, len(buf))
                new[:n] = buf[:n]
            self.bufs[name] = new

    @rule(name=st.sampled_from(NAMES),
          kind=st.sampled_from(["pages", "pages", "range", "insert", "resize_keep", "resize"]),
          amount=st.integers(1, 20), seed=st.integers(0, 2 ** 32 - 1))
    @guarded
    def mutate(self, name, kind, amount, seed):
        self.apply_mutation(name, kind, amount, seed)

    # ---- store operations -------------------------------------------------------------------
    def do_checkpoint(self, stream, names, chunking, meta):
        prev = self.live_ids(stream)
        expected = {n: bytes(self.bufs[n]) for n in sorted(names)}
        kwargs = {"chunking": chunking} if chunking else {}
        info = self.store.checkpoint({n: self.bufs[n] for n in sorted(names)}, stream=stream,
                                     meta=meta, **kwargs)
        assert info.id not in self.model
        assert all(info.id > i for i in self.model)
        assert info.stream == stream
        assert info.parent == (prev[-1] if prev else None)
        if info.parent is None:
            assert info.kind == "full"
        assert info.kind in ("full", "incremental")
        assert (info.kind == "full") == (info.chain_length == 0)
        assert 0 <= info.chain_length <= self.max_chain
        assert info.meta == meta
        assert info.sizes == {n: len(v) for n, v in expected.items()}
        assert info.bytes_new >= 0
        if chunking is None and prev and info.kind == "incremental":
            parent = self.model[prev[-1]][1]
            if all(parent.get(n) == v for n, v in expected.items()):
                assert info.bytes_new < 8192     # nothing changed: only the commit record
        self.model[info.id] = (stream, expected)
        # the newest checkpoint is always checked right away
        assert self.store.restore(info.id) == expected

    @rule(stream=st.sampled_from(STREAMS),
          names=st.sets(st.sampled_from(NAMES), max_size=3) | st.just(set(NAMES)),
          chunking=st.sampled_from([None, None, None, None, "cdc"]),
          meta=st.none() | st.integers() | st.dictionaries(st.text(max_size=5), st.integers(),
                                                           max_size=3))
    @guarded
    def checkpoint(self, stream, names, chunking, meta):
        self.do_checkpoint(stream, names, chunking, meta)

    @rule(stream=st.sampled_from(STREAMS), pages=st.integers(1, 8),
          seed=st.integers(0, 2 ** 32 - 1))
    @guarded
    def change_pages_and_checkpoint(self, stream, pages, seed):
        """The training-loop pattern: a few pages of every buffer change, then a checkpoint
        (builds delta chains up to max_chain)."""
        for k, name in enumerate(NAMES):
            self.apply_mutation(name, "pages", pages, seed + k)
        self.do_checkpoint(stream, set(NAMES), None, {"seed": seed})

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    @guarded
    def delete(self, data):
        cid = data.draw(st.sampled_from(self.live_ids()), label="delete")
        self.store.delete(cid)
        del self.model[cid]
        with pytest.raises(CheckpointNotFound):
            self.store.get(cid)
        with pytest.raises(CheckpointNotFound):
            self.store.delete(cid)

    @rule(offset=st.integers(1, 1000))
    @guarded
    def delete_unknown(self, offset):
        unknown = max(self.model, default=0) + offset
        with pytest.raises(CheckpointNotFound):
            self.store.delete(unknown)

    @rule(other_page_size=st.booleans())
    @guarded
    def reopen(self, other_page_size):
        self.store.close()
        if other_page_size:
            self.opts["page_size"] = 4096 if self.opts["page_size"] == 512 else 512
        self.store = snapstore.open(self.path, **self.opts)

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    @guarded
    def read_range(self, data):
        cid = data.draw(st.sampled_from(self.live_ids()), label="checkpoint")
        bufs = self.model[cid][1]
        if not bufs:
            assert self.store.restore(cid) == {}
            return
        name = data.draw(st.sampled_from(sorted(bufs)), label="buffer")
        buf = bufs[name]
        offset = data.draw(st.integers(0, len(buf)), label="offset")
        length = data.draw(st.integers(0, len(buf) - offset) | st.none(), label="length")
        if length is None:
            assert self.store.read(cid, name, offset) == buf[offset:]
        else:
            assert self.store.read(cid, name, offset, length) == buf[offset:offset + length]

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    @guarded
    def restore_into(self, data):
        cid = data.draw(st.sampled_from(self.live_ids()), label="checkpoint")
        bufs = self.model[cid][1]
        names = data.draw(st.sets(st.sampled_from(sorted(bufs))) if bufs else st.just(set()),
                          label="names")
        targets = {n: bytearray(b"\xa5") * len(bufs[n]) for n in names}
        self.store.restore_into(cid, targets)
        for n in names:
            assert targets[n] == bufs[n]

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    @guarded
    def restore_one(self, data):
        self.check_checkpoint(data.draw(st.sampled_from(self.live_ids()), label="checkpoint"))

    @rule()
    @guarded
    def restore_all(self):
        for cid in self.live_ids():
            self.check_checkpoint(cid)

    # ---- invariants (metadata only: cheap) ---------------------------------------------------
    @invariant()
    @guarded
    def listing_matches_model(self):
        if self.store is None:
            return
        infos = self.store.checkpoints()
        assert [c.id for c in infos] == self.live_ids()
        live_streams = sorted({s for s, _ in self.model.values()})
        assert self.store.streams() == live_streams
        for stream in STREAMS:
            ids = self.live_ids(stream)
            listed = self.store.checkpoints(stream)
            assert [c.id for c in listed] == ids
            latest = self.store.latest(stream)
            assert (latest.id if latest else None) == (ids[-1] if ids else None)
            for pos, c in enumerate(listed):
                assert c.stream == stream
                assert c.parent == (ids[pos - 1] if pos else None)
        stats = self.store.stats()
        assert stats["checkpoints"] == len(self.model)
        assert stats["streams"] == len(live_streams)
        assert stats["logical_bytes"] == sum(len(v) for _, bufs in self.model.values()
                                             for v in bufs.values())


StoreMachine.TestCase.settings = settings(
    max_examples=examples(150), stateful_step_count=50, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                           HealthCheck.filter_too_much])
test_store_against_model = StoreMachine.TestCase

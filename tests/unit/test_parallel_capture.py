"""Captures (checkpoint_async, trackers in hash mode) of several buffers diff and stage them on
two threads when they hold PARALLEL_*_BYTES or more: the same checkpoints as one thread, every
round byte-exact, the detectors' baselines right (a page changed after a capture is found by
the next one), for nothing changed, everything changed, one byte and one buffer."""
import numpy as np
import pytest

import snapstore
from snapstore.capture import persister, tracker

PAGE = 4096


@pytest.fixture(params=["two threads", "one thread"])
def threads(request, monkeypatch):
    limit = 0 if request.param == "two threads" else 1 << 62
    monkeypatch.setattr(persister, "PARALLEL_STAGE_BYTES", limit)
    monkeypatch.setattr(tracker, "PARALLEL_DIRTY_BYTES", limit)
    return request.param


def buffers(rng, sizes):
    return {f"b{i}": rng.integers(0, 256, n, dtype=np.uint8) for i, n in enumerate(sizes)}


@pytest.mark.parametrize("sizes", [[5 * PAGE, 3 * PAGE + 7, 64 * PAGE, 1], [9 * PAGE]])
def test_rounds_restore_exactly(tmp_path, threads, sizes):
    rng = np.random.default_rng(len(sizes))
    bufs = buffers(rng, sizes)
    with snapstore.open(str(tmp_path / "s"), durability="none") as s:
        with s.track(bufs, stream="t", mode="hash") as tr:
            want = {}
            for k in range(8):
                if k == 2:                                   # everything changed
                    for b in bufs.values():
                        b[:] = rng.integers(0, 256, b.size, dtype=np.uint8)
                elif k == 3:                                 # one byte
                    bufs["b0"][-1] ^= 0xFF
                elif k > 3:                                  # scattered pages
                    for b in bufs.values():
                        for _ in range(3):
                            b[rng.integers(0, b.size)] ^= 0x5A
                info = tr.checkpoint_async().result()        # k == 1: nothing changed
                want[info.id] = {n: b.tobytes() for n, b in bufs.items()}
            for cid, exp in want.items():
                assert s.restore(cid) == exp
        # checkpoint_async (the implicit capturer) takes the same path
        for k in range(3):
            bufs["b0"][k] ^= 1
            info = s.checkpoint_async(bufs, stream="u").result()
            assert s.restore(info.id) == {n: b.tobytes() for n, b in bufs.items()}

"""snapstore.torch.save_async / Store.save_async / snapstore.objects.save_async: the checkpoint
holds the values as of the call even when training updates the tensors in place right after
it returns; nothing changed, everything changed, empty and one-byte states; errors on the
future and on the next save; staging memory bounded and reported; a closed store, a path
instead of a store, a fork()ed child."""
import copy
import os
import threading

import pytest

torch = pytest.importorskip("torch")

import snapstore  # noqa: E402
import snapstore.torch as st  # noqa: E402
from snapstore.engine.commit import Committer  # noqa: E402
from snapstore.errors import (AsyncSaveError, InvalidArgumentTypeError,  # noqa: E402
                              SnapstoreError, StoreClosedError)

from test_torch import one_step, same, trained  # noqa: E402


@pytest.fixture
def store(tmp_path):
    s = snapstore.open(str(tmp_path / "store"), durability="none")
    yield s
    s.close()


def state_of(model, opt, step):
    return {"model": model, "optim": opt, "step": step}


def test_checkpoint_holds_the_values_as_of_the_call(store):
    model, opt = trained(steps=2)
    futures, expected = [], []
    for k in range(4):
        expected.append(copy.deepcopy({"model": model.state_dict(),
                                       "optim": opt.state_dict(), "step": k}))
        futures.append(st.save_async(store, state_of(model, opt, k), "train"))
        one_step(model, opt, seed=k)          # in place, before the save is durable
    infos = [f.result(timeout=60) for f in futures]
    assert [i.seq for i in infos] == sorted(i.seq for i in infos)
    for info, want in zip(infos, expected):
        assert same(st.load(store, info.id), want)


def test_nothing_changed_adds_no_chunk_bytes(store):
    model, opt = trained()
    first = st.save_async(store, state_of(model, opt, 1), "s").result(timeout=60)
    before = store.stats()["live_chunk_bytes"]
    second = st.save_async(store, state_of(model, opt, 1), "s").result(timeout=60)
    assert second.parent == first.id
    assert store.stats()["live_chunk_bytes"] - before < 4096      # the pickle stream at most
    assert same(st.load(store, second.id), st.load(store, first.id))


def test_everything_changed_empty_and_one_byte(store):
    big = torch.arange(1 << 18, dtype=torch.float32)
    st.save_async(store, {"w": big}, "s").result(timeout=60)
    want = -big.clone() - 1                  # every element, every page changed
    big.copy_(want)
    done = st.save_async(store, {"w": big}, "s")
    big.zero_()
    assert torch.equal(st.load(store, done.result(timeout=60).id)["w"], want)
    assert st.load(store, st.save_async(store, {}, "empty").result(timeout=60).id) == {}
    one = torch.tensor([7], dtype=torch.uint8)
    got = st.load(store, st.save_async(store, {"b": one}, "one").result(timeout=60).id)
    assert got["b"].dtype == torch.uint8 and got["b"].tolist() == [7]


def test_store_method_and_objects_function(store):
    arr = bytearray(b"x" * 10000)
    f = store.save_async({"a": arr, "n": 1}, stream="o")
    arr[:] = b"y" * 10000
    assert store.load(f.result(timeout=60).id) == {"a": bytearray(b"x" * 10000), "n": 1}


def test_errors_surface_on_the_future_and_on_the_next_save(store, monkeypatch):
    w = torch.randn(1 << 16)
    ok = st.save_async(store, {"w": w}, "e").result(timeout=60)
    real = Committer.commit
    calls = {"n": 0}

    def failing_once(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            raise SnapstoreError("injected commit failure")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Committer, "commit", failing_once)
    w.add_(1)
    bad = st.save_async(store, {"w": w}, "e")
    with pytest.raises(SnapstoreError, match="injected"):
        bad.result(timeout=60)
    other = st.save_async(store, {"w": w}, "other").result(timeout=60)   # another stream
    with pytest.raises(AsyncSaveError, match="injected") as raised:      # the next call: once
        st.save_async(store, {"w": w}, "e")
    assert raised.value.stream == "e" and "injected" in str(raised.value.__cause__)
    assert [c.id for c in store.checkpoints("e")] == [ok.id]          # nothing partial
    again = st.save_async(store, {"w": w}, "e").result(timeout=60)    # then saves again
    assert again.parent == ok.id
    assert torch.equal(st.load(store, again.id)["w"], w)
    assert torch.equal(st.load(store, other.id)["w"], w)


def test_saves_queued_behind_a_failure_fail_or_hold_their_values(store, monkeypatch):
    """A save queued after one that fails either fails too (it was a delta on it) or holds
    exactly the values of its call: never anything else."""
    w = torch.randn(1 << 16)
    st.save_async(store, {"w": w}, "q").result(timeout=60)
    real = Committer.commit
    gate = threading.Event()
    calls = {"n": 0}

    def slow_failure(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            gate.wait(5)
            raise SnapstoreError("injected commit failure")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Committer, "commit", slow_failure)
    w[:100] += 1                                    # one page changed: a delta
    bad = st.save_async(store, {"w": w}, "q")
    w[:100] += 1
    want = w.clone()
    threading.Timer(0.2, gate.set).start()          # a save that must wait for it may
    later = st.save_async(store, {"w": w}, "q")
    w.zero_()
    with pytest.raises(SnapstoreError, match="injected"):
        bad.result(timeout=60)
    try:
        info = later.result(timeout=60)
    except SnapstoreError as exc:
        assert "earlier checkpoint" in str(exc)
    else:
        assert torch.equal(st.load(store, info.id)["w"], want)


def test_staging_is_bounded_and_reported(tmp_path):
    with snapstore.open(str(tmp_path / "s"), durability="none", staging_bytes=1 << 20) as s:
        stats = s.stats()
        assert (stats["staging_bytes"], stats["staging_in_use_bytes"],
                stats["staging_peak_bytes"]) == (1 << 20, 0, 0)
        small = torch.randn(1 << 16)                         # 256 KiB: staged
        s.save_async({"w": small}, stream="a").result(timeout=60)
        s.flush()
        stats = s.stats()
        assert stats["staging_in_use_bytes"] == 0
        assert (256 << 10) <= stats["staging_peak_bytes"] <= 1 << 20
        big = torch.randn(1 << 19)                           # 2 MiB: more than all staging
        f = st.save_async(s, {"w": big}, "b")
        assert f.done()                   # written before the call returned, from the tensor
        big.zero_()
        assert not torch.equal(st.load(s, f.result().id)["w"], big)
        assert s.stats()["staging_peak_bytes"] <= 1 << 20


def test_a_path_a_closed_store_and_a_forked_child(tmp_path):
    path = str(tmp_path / "s")
    with pytest.raises(InvalidArgumentTypeError, match="open snapstore.Store"):
        st.save_async(path, {"w": torch.ones(3)})
    s = snapstore.open(path, durability="none")
    st.save_async(s, {"w": torch.ones(3)}).result(timeout=60)
    pid = os.fork()
    if pid == 0:                                  # the child: a clear error, nothing written
        try:
            st.save_async(s, {"w": torch.zeros(3)})
        except SnapstoreError:
            os._exit(0)
        except BaseException:
            os._exit(2)
        os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert len(s.checkpoints()) == 1
    s.close()
    s.close()
    with pytest.raises(StoreClosedError):
        st.save_async(s, {"w": torch.ones(3)})


def test_another_writer_moving_the_head_between_two_async_saves(tmp_path):
    """Regression (a helper's review): the second save_async of a stream after another
    writer's save was an incremental laid onto that writer's checkpoint (its pickle stream, a
    new buffer, made the capture read the moved head and take it as its base): the tensor
    pages it had not changed restored as the other writer's, with no error."""
    path = str(tmp_path / "store")
    with snapstore.open(path, durability="none") as a, \
            snapstore.open(path, durability="none") as b:
        x = torch.zeros(1 << 16)
        st.save_async(a, {"w": x}, "s").result(timeout=60)
        st.save(b, {"w": torch.ones(1 << 16)}, "s")
        x[0] = 5.0
        info = st.save_async(a, {"w": x}, "s").result(timeout=60)
        assert torch.equal(st.load(a, info.id)["w"], x)
        x[-1] = 2.0
        info = st.save(a, {"w": x}, "s")
        assert torch.equal(st.load(b, info.id)["w"], x)

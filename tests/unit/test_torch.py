"""snapstore.torch: state dicts of a real nn.Module + Adam (byte-exact, every dtype, views and
shared storages, in place), device tensors refused, and the torch.distributed.checkpoint
backend (SnapstoreWriter / SnapstoreReader): round trips, incremental saves, checkpoint ids,
a gloo process group of one rank, saves of the old part-checkpoint scheme (several ranks:
test_dcp_ranks.py)."""
import copy
import io
import os
import pickle
import threading
import time

import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

import snapstore  # noqa: E402
import snapstore.torch as st  # noqa: E402
from snapstore import objects  # noqa: E402
from snapstore.objects import DeviceTensorError, StructureMismatchError  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning"),
              pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")]

SAME_SIZE_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def raw(t):
    """A tensor's elements as bytes (any dtype, any strides; no arithmetic on the values)."""
    t = t.detach()
    if t.is_complex() and t.is_conj():
        t = t.resolve_conj()
    if t.element_size() in SAME_SIZE_INT:
        t = t.view(SAME_SIZE_INT[t.element_size()])
    t = t.reshape(-1).contiguous()
    return bytes(t.view(torch.uint8).numpy()) if t.numel() else b""


def same(a, b, path="sd"):
    """Byte-exact deep equality of state dicts (types, dtypes, shapes, strides, bytes)."""
    if isinstance(a, torch.Tensor):
        assert type(a) is type(b), path
        assert (a.dtype, a.shape, a.requires_grad) == (b.dtype, b.shape, b.requires_grad), path
        assert raw(a) == raw(b), path
    elif isinstance(a, dict):
        assert type(a) is type(b) and list(a) == list(b), path
        for k in a:
            same(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{path}[{i}]")
    else:
        assert type(a) is type(b) and a == b, (path, a, b)
    return True


class Net(torch.nn.Module):
    def __init__(self, width=64):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3)
        self.bn = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8 * 6 * 6, width)
        self.head = torch.nn.Linear(width, 10)

    def forward(self, x):
        x = torch.relu(self.bn(self.conv(x)))
        return self.head(torch.relu(self.fc(x.flatten(1))))


def trained(seed=0, width=64, steps=1):
    torch.manual_seed(seed)
    model = Net(width)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(steps):
        loss = model(torch.randn(4, 3, 8, 8)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model, opt


def one_step(model, opt, seed=42):
    torch.manual_seed(seed)
    loss = model(torch.randn(4, 3, 8, 8)).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.item()


@pytest.fixture
def store(tmp_path):
    s = snapstore.open(str(tmp_path / "store"), durability="none")
    yield s
    s.close()


# ---- save / load --------------------------------------------------------------------------------
def test_module_and_adam_round_trip_byte_exact(store):
    model, opt = trained()
    expected = copy.deepcopy({"model": model.state_dict(), "optim": opt.state_dict()})
    info = st.save(store, {"model": model, "optim": opt, "step": 1}, "train", meta={"step": 1})
    assert objects.user_meta(info) == {"step": 1}
    out = st.load(store, "train")
    same({"model": out["model"], "optim": out["optim"]}, expected)
    assert out["step"] == 1
    # resume: fresh objects, optimizer without state yet; the model is written in place
    model2, _ = trained(seed=1, steps=0)
    opt2 = torch.optim.Adam(model2.parameters(), lr=5.0)
    ptrs = [p.data_ptr() for p in model2.parameters()]
    into = {"model": model2, "optim": opt2, "step": 0}
    assert st.load(store, info.id, into=into) is into and into["step"] == 1
    assert [p.data_ptr() for p in model2.parameters()] == ptrs
    same({"model": model2.state_dict(), "optim": opt2.state_dict()}, expected)
    # and training continues identically
    assert one_step(model, opt) == one_step(model2, opt2)
    same(model.state_dict(), model2.state_dict())
    # optimizer with state: its tensors are written in place too
    st.save(store, {"model": model, "optim": opt, "step": 2}, "train")
    exp_avg = opt2.state_dict()["state"][0]["exp_avg"]
    with torch.no_grad():
        for p in model2.parameters():
            p.zero_()
    one_step(model2, opt2, seed=7)
    st.load(store, "train", into=into)
    assert opt2.state_dict()["state"][0]["exp_avg"] is exp_avg
    same({"model": model2.state_dict(), "optim": opt2.state_dict()},
         {"model": model.state_dict(), "optim": opt.state_dict()})


def test_a_state_dict_keeps_its_type_and_metadata(store):
    """Regression (a helper's review): a top-level dict was rebuilt as a plain dict, so
    save(store, model.state_dict()) lost the OrderedDict and its _metadata (the module
    versions load_state_dict reads), and load(into=model) then refused it (dict against
    OrderedDict). It is saved as it is now, as torch.save keeps it; a dict subclass that
    holds modules keeps its type too."""
    import collections
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    sd = model.state_dict()
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    reference = torch.load(buf)
    got = st.load(store, st.save(store, sd, "m").id)
    assert type(got) is collections.OrderedDict and list(got) == list(reference)
    assert got._metadata == reference._metadata
    same(got, reference)
    fresh = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    st.load(store, "m", into=fresh)
    same(fresh.state_dict(), sd)
    counts = collections.defaultdict(list, a=[1])
    got = st.load(store, st.save(store, counts, "d").id)
    assert type(got) is collections.defaultdict and got.default_factory is list
    assert got == counts
    holding = collections.OrderedDict(model=model, step=3)
    got = st.load(store, st.save(store, holding, "h").id)
    assert type(got) is collections.OrderedDict and got["step"] == 3
    same(got["model"], sd)
    assert holding["model"] is model            # the caller's dict is not changed


def all_dtypes():
    out = []
    for name in ["bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32",
                 "uint64", "float16", "bfloat16", "float32", "float64", "complex32",
                 "complex64", "complex128", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2",
                 "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2", "bits8", "bits16"]:
        dt = getattr(torch, name, None)
        if dt is not None:
            out.append(dt)
    return out


def random_tensor(dtype, shape, gen):
    n = 1
    for s in shape:
        n *= s
    size = torch.empty((), dtype=dtype).element_size()
    data = torch.randint(0, 256, (n * size,), dtype=torch.uint8, generator=gen)
    if dtype == torch.bool:
        data &= 1
    return data.view(dtype).reshape(shape) if n else torch.empty(shape, dtype=dtype)


@pytest.mark.parametrize("dtype", all_dtypes(), ids=str)
def test_every_dtype_raw_bytes(store, dtype):
    gen = torch.Generator().manual_seed(3)
    state = {"big": random_tensor(dtype, (64, 80), gen), "scalar": random_tensor(dtype, (), gen),
             "empty": random_tensor(dtype, (0, 4), gen), "small": random_tensor(dtype, (3,), gen)}
    state["t"] = state["big"].t()
    state["strided"] = random_tensor(dtype, (30, 40), gen)[::3, 1::2]
    info = st.save(store, state, "dt")
    out = st.load(store, info.id)
    same(out, state)
    assert out["t"].stride() == state["t"].stride()
    assert out["t"].untyped_storage().data_ptr() == out["big"].untyped_storage().data_ptr()
    assert out["strided"].is_contiguous()


def test_views_shared_storages_and_parameters(store):
    base = torch.arange(40000, dtype=torch.float32).reshape(200, 200)
    lone = torch.arange(100000, dtype=torch.float64)
    p = torch.nn.Parameter(torch.randn(50, 50))
    p.tag = "mine"
    state = {
        "base": base, "rows": base[10:20], "t": base.t(),        # one storage, three views
        "slice": lone[1000:3000],                                # alone: only its elements
        "strided": torch.randn(64, 64)[:, ::2],                  # alone, non-contiguous
        "qkv": [base.new_zeros(3000)[:1000], None],
        "p": p, "grad": torch.ones(100, 100, requires_grad=True),
        "conj": torch.randn(40, 40, dtype=torch.complex64).conj(),
    }
    fused = torch.randn(3, 1000)
    state["q"], state["k"] = fused[0], fused[1]                  # two partial views: shared
    state["qkv"][1] = state["qkv"][0]
    info = st.save(store, state, "v")
    out = st.load(store, info.id)
    for k in ("base", "rows", "t", "slice", "strided", "p", "grad", "q", "k"):
        same(out[k], state[k], k)
    assert torch.equal(out["conj"], state["conj"].resolve_conj())
    ptr = out["base"].untyped_storage().data_ptr()
    assert out["rows"].untyped_storage().data_ptr() == ptr == out["t"].untyped_storage().data_ptr()
    assert out["rows"].storage_offset() == 2000 and out["t"].stride() == (1, 200)
    assert out["slice"].untyped_storage().nbytes() == 2000 * 8
    assert out["strided"].is_contiguous()
    assert out["q"].untyped_storage().data_ptr() == out["k"].untyped_storage().data_ptr()
    assert out["qkv"][0] is out["qkv"][1]
    assert type(out["p"]) is torch.nn.Parameter and out["p"].requires_grad and out["p"].tag == "mine"
    assert out["grad"].requires_grad and out["grad"].is_leaf
    sizes = sorted(info.sizes.values())
    assert 200 * 200 * 4 in sizes and 100000 * 8 not in sizes


def test_store_save_load_entry_points_handle_tensors(store):
    sd = trained()[0].state_dict()
    info = store.save(sd, stream="plain")
    same(store.load(info.id), sd)
    same(objects.load(store, "plain"), sd)


def test_path_instead_of_store(tmp_path):
    path = str(tmp_path / "p")
    model, opt = trained()
    st.save(path, {"model": model}, "s")
    same(st.load(path, "s")["model"], model.state_dict())


# ---- in place and bad input ---------------------------------------------------------------------
def test_load_into_mismatch_leaves_model_unchanged(store):
    model, opt = trained()
    st.save(store, {"model": model, "optim": opt}, "m")
    other, other_opt = trained(seed=5, width=32)                  # fc/head shapes differ
    before = copy.deepcopy(other.state_dict())
    before_opt = copy.deepcopy(other_opt.state_dict())
    with pytest.raises(StructureMismatchError, match="fc.weight"):
        st.load(store, "m", into={"model": other, "optim": other_opt})
    same(other.state_dict(), before)
    same(other_opt.state_dict(), before_opt)
    sd = trained(seed=6)[0].state_dict()
    sd["conv.weight"] = sd["conv.weight"].double()
    with pytest.raises(StructureMismatchError, match="float64"):
        st.load(store, "m", into={"model": sd, "optim": objects.FRESH})


@pytest.mark.parametrize("kind", ["expanded", "as_strided", "inference", "meta"])
def test_load_into_a_target_that_cannot_be_written_writes_nothing(store, kind):
    """Targets copy_ cannot write (elements sharing memory, inference tensors outside
    inference mode) failed half-way with torch's RuntimeError after earlier targets were
    written; meta tensors were 'loaded' silently, holding nothing. Each is now a
    StructureMismatchError before anything is written."""
    st.save(store, {"a": torch.ones(10), "b": torch.arange(10.0).reshape(5, 2)}, "y")
    a = torch.zeros(10)
    if kind == "expanded":
        b = torch.zeros(1, 2).expand(5, 2)
    elif kind == "as_strided":
        b = torch.zeros(6).as_strided((5, 2), (1, 1))      # rows overlap
    elif kind == "inference":
        with torch.inference_mode():
            b = torch.zeros(5, 2)
    else:
        b = torch.zeros(5, 2, device="meta")
    target = {"a": a, "b": b}
    with pytest.raises(StructureMismatchError, match=r"obj\['b'\]"):
        st.load(store, "y", into=target)
    assert not a.any()                                  # nothing was written
    if kind == "inference":
        with torch.inference_mode():                    # where an inference tensor may be
            st.load(store, "y", into=target)
        assert a.eq(1).all() and b.equal(torch.arange(10.0).reshape(5, 2))


@pytest.mark.parametrize("dtype", ["uint1", "uint4", "int3", "float4_e2m1fn_x2",
                                   "float8_e4m3fn", "bfloat16", "complex64"])
def test_load_into_tensors_without_copy_kernels(store, dtype):
    """Regression: load(into=) of a bit dtype (uint1-7, int1-7) raised torch's raw
    NotImplementedError ("copy_kernel" not implemented) after earlier targets were written,
    for tensors not restored straight into their target (small ones, kept in the pickle).
    They are copied bit for bit as same-size integers."""
    if not hasattr(torch, dtype):
        pytest.skip(f"torch {torch.__version__} has no {dtype}")
    as_dtype = getattr(torch, dtype)
    raw = torch.tensor([1, 2, 3, 250], dtype=torch.uint8)
    size = torch.empty(0, dtype=as_dtype).element_size()
    bits = raw.view(torch.uint8).repeat(size).view(as_dtype) if size > 1 else raw.view(as_dtype)
    st.save(store, {"w": torch.arange(4.0), "bits": bits}, "b")
    target = {"w": torch.zeros(4), "bits": torch.zeros_like(bits.view(torch.uint8)).view(as_dtype)}
    st.load(store, "b", into=target)
    assert target["w"].equal(torch.arange(4.0))
    assert target["bits"].view(torch.uint8).equal(bits.view(torch.uint8))


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
@pytest.mark.parametrize("saved, target", [("coo", "coo"), ("coo", "dense"), ("csr", "csr"),
                                           ("dense", "coo")])
def test_load_into_sparse_tensors_is_refused_before_anything_is_written(store, saved, target):
    """Regression: sparse tensors raised torch's NotImplementedError or RuntimeError, and a
    sparse checkpoint passed the check for a dense target of its shape and dtype, wrote the
    earlier targets, then failed in copy_."""
    dense = torch.tensor([[0.0, 2.0], [3.0, 0.0]])
    make = {"coo": lambda t: t.to_sparse(), "csr": lambda t: t.to_sparse_csr(),
            "dense": lambda t: t}
    st.save(store, {"a": torch.ones(4), "s": make[saved](dense)}, "sp")
    a = torch.zeros(4)
    with pytest.raises(StructureMismatchError, match=r"obj\['s'\].*FRESH"):
        st.load(store, "sp", into={"a": a, "s": make[target](torch.zeros(2, 2))})
    assert not a.any()
    fresh = {"a": a, "s": objects.FRESH}
    st.load(store, "sp", into=fresh)
    assert a.eq(1).all() and fresh["s"].to_dense().equal(dense)


def test_overlap_check_matches_the_layouts_torch_allows():
    from snapstore.objects import _overlapping
    cases = [((10,), (1,), False), ((10,), (0,), True), ((1,), (0,), False),
             ((0, 5), (0, 0), False), ((3, 4), (4, 1), False), ((3, 4), (1, 3), False),
             ((3, 4), (1, 2), True), ((2, 3), (3, -1), False), ((2, 2), (1, 1), True),
             ((5, 2), (1, 1), True), ((4, 4), (8, 2), False)]
    for size, stride, overlaps in cases:
        assert _overlapping(size, stride) is overlaps, (size, stride)


def test_load_into_an_optimizer_with_state_for_other_parameters_loads_it_fresh(store):
    """An optimizer that stepped only some parameters (say, a frozen layer) has state for
    other parameters than the checkpoint's: loaded fresh, as documented and as torch's own
    load_state_dict does, instead of a StructureMismatchError."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    st.save(store, {"model": model, "optim": opt}, "t")
    other = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    other_opt = torch.optim.Adam(other.parameters())
    for p in other[1].parameters():
        p.requires_grad_(False)
    other(torch.randn(2, 4)).sum().backward()
    other_opt.step()
    assert len(other_opt.state) == 2 and len(opt.state) == 4
    st.load(store, "t", into={"model": other, "optim": other_opt})
    same(other_opt.state_dict(), opt.state_dict())
    same(other.state_dict(), model.state_dict())
    # a mismatch elsewhere is still one, and still writes nothing
    wrong = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 3))
    with pytest.raises(StructureMismatchError):
        st.load(store, "t", into={"model": wrong, "optim": other_opt})


def test_device_tensors_are_refused_by_name(store):
    st.save(store, {"ok": torch.zeros(3)}, "d")
    before = store.checkpoints()
    state = {"model": {"w": torch.zeros(3), "layer": [torch.empty(10, device="meta")]}}
    with pytest.raises(DeviceTensorError, match=r"obj\['model'\]\['layer'\]\[0\] is a tensor on meta"):
        st.save(store, state, "d")
    with pytest.raises(DeviceTensorError, match="materialise") as caught:
        st.save(store, state, "d", allow_device_copy=True)    # meta tensors have no data
    assert "allow_device_copy" not in str(caught.value)      # no advice that cannot help
    assert store.checkpoints() == before


def test_unpicklable_state_names_the_part(store):
    with pytest.raises(objects.ObjectSaveError, match=r"obj\['hook'\]"):
        st.save(store, {"w": torch.zeros(3), "hook": lambda: None}, "u")
    assert store.latest("u") is None


# ---- torch.distributed.checkpoint -----------------------------------------------------------------
def dcp_state(model, opt):
    return {"model": model.state_dict(), "optim": opt.state_dict(), "extra": {"epoch": 3}}


def test_dcp_round_trip_and_incremental_second_save(tmp_path):
    path = str(tmp_path / "dcp")
    model, opt = trained(width=512)
    writer = st.SnapstoreWriter(path)
    state = dcp_state(model, opt)
    snap1 = copy.deepcopy(state)
    dcp.save(state, checkpoint_id="step-1", storage_writer=writer)
    first = writer.last_info
    assert first.kind == "full" and first.reserved_meta["snapstore.dcp"]["checkpoint_id"] == "step-1"
    assert "item/model.fc.weight" in first.sizes and st.METADATA_BUFFER in first.sizes
    # change 1% of the rows of the big layer and of its Adam moments
    fc = model.fc.weight                                   # (512, 288)
    moments = opt.state[fc]
    with torch.no_grad():
        for t in (fc, moments["exp_avg"], moments["exp_avg_sq"]):
            t[::100] += 1.0
    snap2 = copy.deepcopy(state)
    dcp.save(state, checkpoint_id="step-2", storage_writer=writer)        # same writer again
    second = writer.last_info
    total = sum(first.sizes.values())
    assert second.kind == "incremental" and second.parent == first.id
    assert second.bytes_new < 0.05 * total, (second.bytes_new, total)
    for cid, snap in (("step-1", snap1), ("step-2", snap2)):
        fresh_model, fresh_opt = trained(seed=9, width=512)
        target = dcp_state(fresh_model, fresh_opt)
        target["extra"]["epoch"] = 0
        ptr = fresh_model.fc.weight.data_ptr()
        dcp.load(target, checkpoint_id=cid, storage_reader=st.SnapstoreReader(path))
        same(target, snap, cid)
        assert fresh_model.fc.weight.data_ptr() == ptr
    with snapstore.open(path, readonly=True) as s:
        assert s.verify(deep=True)["ok"] and len(s.checkpoints("dcp")) == 2


def test_dcp_without_checkpoint_id_and_with_store_objects(tmp_path):
    path = str(tmp_path / "dcp2")
    model, opt = trained()
    writer, reader = st.SnapstoreWriter(path, stream="run"), st.SnapstoreReader(path, "run")
    state = dcp_state(model, opt)
    dcp.save(state, checkpoint_id="a", storage_writer=writer)
    state["extra"]["epoch"] = 4
    dcp.save(state, storage_writer=writer)                   # no id: the stream's next one
    assert writer.last_info.reserved_meta["snapstore.dcp"]["checkpoint_id"] is None
    target = dcp_state(*trained(seed=3))
    dcp.load(target, storage_reader=reader)                  # no id: the newest
    assert target["extra"]["epoch"] == 4
    dcp.load(target, checkpoint_id="a", storage_reader=reader)
    assert target["extra"]["epoch"] == 3
    dcp.load(target, storage_reader=reader)                  # the id does not stick
    assert target["extra"]["epoch"] == 4
    dcp.save(state, checkpoint_id="c", storage_writer=writer)
    dcp.save(state, storage_writer=writer)
    assert writer.last_info.reserved_meta["snapstore.dcp"]["checkpoint_id"] is None
    same(target["model"], model.state_dict())
    with pytest.raises(BaseException, match="no DCP checkpoint .nope."):
        dcp.load(target, checkpoint_id="nope", storage_reader=reader)
    with snapstore.open(path, durability="none") as s:       # the caller's own Store
        state["extra"]["epoch"] = 5
        dcp.save(state, checkpoint_id="b", storage_writer=st.SnapstoreWriter(s, "run"))
        dcp.load(target, checkpoint_id="b", storage_reader=st.SnapstoreReader(s, "run"))
        assert target["extra"]["epoch"] == 5 and not s.closed
        with pytest.raises(objects.NotAnObjectCheckpointError):
            s.load("run")                                    # DCP checkpoints are not pickles


def test_dcp_copies_into_other_layouts(tmp_path):
    path = str(tmp_path / "dcp3")
    w = torch.randn(64, 48)
    dcp.save({"w": w, "b": torch.arange(10)}, checkpoint_id="x",
             storage_writer=st.SnapstoreWriter(path))
    target = {"w": torch.zeros(48, 64).t(), "b": torch.zeros(10, dtype=torch.int64)}
    dcp.load(target, checkpoint_id="x", storage_reader=st.SnapstoreReader(path))
    assert torch.equal(target["w"], w) and torch.equal(target["b"], torch.arange(10))
    # a sub-box of a stored chunk reads only the rows it spans
    with snapstore.open(path, readonly=True) as s:
        info = s.latest("dcp")
        loc = st._Location(None, "item/w", (64, 48))
        box = st._read_box(s, info.id, loc, torch.float32, (10, 5), (7, 20))
        assert torch.equal(box, w[10:17, 5:25])


def test_dcp_save_of_a_meta_tensor_is_a_device_tensor_error(tmp_path):
    """Regression (a helper's hunt): DCP's save through SnapstoreWriter surfaced torch's raw
    NotImplementedError ("Cannot copy out of meta tensor") where snapstore.torch.save says
    DeviceTensorError; nothing is committed either way."""
    from torch.distributed.checkpoint.api import CheckpointException
    path = str(tmp_path / "meta")
    state = {"ok": torch.arange(4), "w": torch.empty(4, 3, device="meta")}
    with pytest.raises(CheckpointException) as caught:
        dcp.save(state, checkpoint_id="x", storage_writer=st.SnapstoreWriter(path))
    failures = [f[0] if isinstance(f, tuple) else f for f in caught.value.failures.values()]
    assert [type(f) for f in failures] == [DeviceTensorError]
    assert "w is a tensor on meta" in str(failures[0]) and failures[0].path == "w"
    with snapstore.open(path, readonly=True) as s:
        assert s.checkpoints() == []


def test_dcp_with_a_gloo_process_group_of_one(tmp_path):
    dist = torch.distributed
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0,
                            world_size=1)
    try:
        path = str(tmp_path / "pg-store")
        model, opt = trained()
        state = dcp_state(model, opt)
        dcp.save(state, checkpoint_id="s", storage_writer=st.SnapstoreWriter(path))
        target = dcp_state(*trained(seed=4))
        dcp.load(target, checkpoint_id="s", storage_reader=st.SnapstoreReader(path))
        same(target, state)
    finally:
        dist.destroy_process_group()


def test_dcp_reads_saves_of_the_old_part_checkpoint_scheme(tmp_path):
    """Before format 3, each rank but the coordinator committed its items as a part checkpoint
    of stream "<stream>/rank<N>", and the coordinator's checkpoint named them (the items'
    _Location.checkpoint). Such saves still load, list their tensors, and a new save on the
    stream follows them."""
    from snapstore import tensors
    path = str(tmp_path / "old")
    state = {"a": torch.randn(32, 16), "b": torch.randn(40, 8).to(torch.bfloat16), "n": 3}
    dcp.save(state, checkpoint_id="model", storage_writer=st.SnapstoreWriter(path, "tmp"))
    with snapstore.open(path, durability="none") as s:
        made = s.latest("tmp")
        metadata = pickle.loads(s.read(made.id, st.METADATA_BUFFER))
        items = {name: s.read(made.id, name) for name in made.sizes if name.startswith("item/")}
        # what the old writer committed with 2 ranks, rank 1 holding "b"
        part = s.checkpoint({"item/b": items["item/b"]}, stream="old/rank1",
                            meta={st.DCP_PART_KEY: {"version": 1, "rank": 1,
                                                    "checkpoint_id": "x"}})
        metadata.storage_data = {
            index: loc._replace(checkpoint=part.id) if loc.buffer == "item/b" else loc
            for index, loc in metadata.storage_data.items()}
        main = s.checkpoint({"item/a": items["item/a"], "item/n": items["item/n"],
                             st.METADATA_BUFFER: pickle.dumps(metadata)}, stream="old",
                            meta={st.DCP_META_KEY: {"version": 1, "checkpoint_id": "x",
                                                    "parts": [part.id], "ranks": 2}})
        listed = {t.name: t.checkpoint for t in tensors.tensor_catalogue(s, main)}
        assert listed == {"a": None, "b": part.id}
    target = {"a": torch.zeros(32, 16), "b": torch.zeros(40, 8, dtype=torch.bfloat16), "n": 0}
    dcp.load(target, checkpoint_id="x", storage_reader=st.SnapstoreReader(path, "old"))
    same(target, state)
    box = {"b": torch.zeros(8, 40, dtype=torch.bfloat16).t()}     # another layout: a copy
    dcp.load(box, checkpoint_id="x", storage_reader=st.SnapstoreReader(path, "old"))
    assert torch.equal(box["b"].view(torch.int16), state["b"].view(torch.int16))
    writer = st.SnapstoreWriter(path, "old")
    dcp.save(state, checkpoint_id="y", storage_writer=writer)
    assert writer.last_info.parent == main.id and "item/b" in writer.last_info.sizes
    target["b"].zero_()
    dcp.load(target, checkpoint_id="y", storage_reader=st.SnapstoreReader(path, "old"))
    same(target, state)


class _FailsAfterPlanning(dcp.DefaultSavePlanner):
    """Fails between the global plan and write_data, as when another rank fails: DCP raises
    and never calls the writer's finish()."""

    def finish_plan(self, new_plan):
        raise RuntimeError("planner gave up")


def _stream_reserved(path, stream="dcp") -> bool:
    """Whether a group or commit of the stream is in progress (another Store's group says)."""
    with snapstore.open(path) as other:
        try:
            other.group(stream, ["x"], timeout=5).abort()
            return False
        except snapstore.CommitConflict:
            return True


def test_dcp_save_failing_after_planning_leaves_nothing_and_frees_the_stream(tmp_path):
    path = str(tmp_path / "fail")
    sd = {"w": torch.randn(64, 64)}
    dcp.save(sd, checkpoint_id="ok", storage_writer=st.SnapstoreWriter(path))
    writer = st.SnapstoreWriter(path)
    with pytest.raises(BaseException, match="planner gave up"):
        dcp.save(sd, checkpoint_id="bad", storage_writer=writer, planner=_FailsAfterPlanning())
    # the save's group holds the stream (nothing of it is visible) until close()
    assert _stream_reserved(path) and _ids(path) == ["ok"]
    writer.close()
    assert not _stream_reserved(path) and _ids(path) == ["ok"]
    # ... or until the thread's next save, with any writer
    with pytest.raises(BaseException, match="planner gave up"):
        dcp.save(sd, checkpoint_id="bad", storage_writer=writer, planner=_FailsAfterPlanning())
    assert _stream_reserved(path)
    dcp.save(sd, checkpoint_id="next", storage_writer=st.SnapstoreWriter(path))
    assert _ids(path) == ["ok", "next"] and not _stream_reserved(path)
    # a caller's Store: its group is aborted, the Store stays open
    with snapstore.open(path) as s:
        mine = st.SnapstoreWriter(s)
        with pytest.raises(BaseException, match="planner gave up"):
            dcp.save(sd, checkpoint_id="bad", storage_writer=mine,
                     planner=_FailsAfterPlanning())
        assert _stream_reserved(path)
        mine.close()
        assert not s.closed and not _stream_reserved(path)
        dcp.save(sd, checkpoint_id="last", storage_writer=mine)
    assert _ids(path) == ["ok", "next", "last"]
    target = {"w": torch.zeros(64, 64)}
    dcp.load(target, storage_reader=st.SnapstoreReader(path))
    assert torch.equal(target["w"], sd["w"])


def test_dcp_writer_timeout_is_a_deadline(tmp_path):
    for bad in (0, -1, float("inf"), float("nan")):
        with pytest.raises(snapstore.errors.InvalidArgumentError):
            st.SnapstoreWriter(str(tmp_path / "t"), timeout=bad)
    writer = st.SnapstoreWriter(str(tmp_path / "t"), timeout=0.5)
    assert writer.timeout == 0.5


def _ids(path) -> list:
    with snapstore.open(path, readonly=True) as s:
        return [c.reserved_meta["snapstore.dcp"]["checkpoint_id"] for c in s.checkpoints()]


def test_dcp_async_save(tmp_path):
    path = str(tmp_path / "async")
    state = {"w": torch.randn(100, 100), "n": 3}
    response = dcp.async_save(state, checkpoint_id="x", storage_writer=st.SnapstoreWriter(path))
    (response.result() if hasattr(response, "result") else response.upload_completion.result())
    target = {"w": torch.zeros(100, 100), "n": 0}
    dcp.load(target, checkpoint_id="x", storage_reader=st.SnapstoreReader(path))
    assert torch.equal(target["w"], state["w"]) and target["n"] == 3


def _done(response):
    return response.result() if hasattr(response, "result") else \
        response.upload_completion.result()


def test_dcp_async_saves_made_before_the_previous_ones_landed_follow_them(tmp_path):
    """Regression (a helper's review): DCP runs each async_save on a thread of its own. Four
    async_saves in a row, each with a SnapstoreWriter of its own, failed after the first
    (CommitConflict naming "another writer": the first save's group, in this process); they
    now commit one after another. One writer shared by overlapping saves reset the first
    save's group away (all four failed, one with a raw AttributeError); the second call now
    says to wait for the first future."""
    path = str(tmp_path / "overlap")
    state = {"w": torch.zeros(1 << 16)}
    futures = []
    for i in range(4):
        state["w"].fill_(i)
        futures.append(dcp.async_save(state, checkpoint_id=f"q{i}",
                                      storage_writer=st.SnapstoreWriter(path)))
    for f in futures:
        _done(f)
    for i in range(4):
        target = {"w": torch.empty(1 << 16)}
        dcp.load(target, checkpoint_id=f"q{i}", storage_reader=st.SnapstoreReader(path))
        assert torch.equal(target["w"], torch.full((1 << 16,), float(i)))
    shared = st.SnapstoreWriter(str(tmp_path / "shared"))
    gate = threading.Event()
    real = snapstore.store.Store.stage

    def slow_stage(self, *a, **k):
        gate.wait(60)
        return real(self, *a, **k)
    snapstore.store.Store.stage = slow_stage
    try:
        first = dcp.async_save(state, checkpoint_id="a", storage_writer=shared)
        time.sleep(0.2)
        with pytest.raises(snapstore.errors.SnapstoreError, match="wait for its future"):
            _done(dcp.async_save(state, checkpoint_id="b", storage_writer=shared))
    finally:
        gate.set()
        snapstore.store.Store.stage = real
    _done(first)
    assert _ids(str(tmp_path / "shared")) == ["a"]


def test_a_failed_dcp_async_save_leaves_the_stream_to_the_next_save(tmp_path):
    """Regression (a helper's review): an async_save that failed (DCP never calls finish) left
    its group open on the stream, ended only "by the next save in the same thread", which
    never comes for async_save's threads: every later save of the stream failed with
    CommitConflict until the group's deadline, and the writer's close() from the caller's
    thread raised a raw AttributeError."""
    path = str(tmp_path / "failed")
    state = {"w": torch.randn(64, 64)}
    real = snapstore.store.Store.stage

    def full_disk(self, *a, **k):
        raise OSError(28, "No space left on device (injected)")
    writer = st.SnapstoreWriter(path, timeout=600)
    snapstore.store.Store.stage = full_disk
    try:
        with pytest.raises(BaseException, match="No space left"):
            _done(dcp.async_save(state, checkpoint_id="lost", storage_writer=writer))
    finally:
        snapstore.store.Store.stage = real
    writer.close()
    writer.close()
    dcp.save(state, checkpoint_id="next", storage_writer=st.SnapstoreWriter(path))
    _done(dcp.async_save(state, checkpoint_id="after", storage_writer=writer))
    assert _ids(path) == ["next", "after"]


# ---- the names pickle streams use are part of the format -------------------------------------
class _NamesSeen(pickle.Unpickler):
    """Unpickler recording the snapstore globals a stream names."""

    def find_class(self, module, name):
        if module.split(".")[0] == "snapstore":
            self.names.add((module, name))
        return super().find_class(module, name)


def snapstore_globals(data: bytes, buffers=()) -> set:
    seen = _NamesSeen(io.BytesIO(data), buffers=buffers)
    seen.names = set()
    seen.load()
    return seen.names


def test_pickle_streams_name_the_pinned_names(tmp_path, store):
    """Stores written once must load forever: object checkpoints name snapstore.objects._storage
    and _tensor, DCP metadata names snapstore.torch._Location (never rename or move them)."""
    w = torch.nn.Parameter(torch.randn(64, 64))
    info = st.save(store, {"w": w, "view": torch.randn(100, 100)[::2]}, "pin")
    oob = [bytearray(store.read(info.id, f"{objects.OOB_PREFIX}{i}"))
           for i in range(info.reserved_meta[objects.META_KEY]["buffers"])]
    assert snapstore_globals(store.read(info.id, objects.PICKLE_BUFFER), oob) == {
        ("snapstore.objects", "_storage"), ("snapstore.objects", "_tensor")}
    path = str(tmp_path / "dcp-pin")
    writer = st.SnapstoreWriter(path)
    dcp.save({"w": torch.randn(8, 8)}, checkpoint_id="p", storage_writer=writer)
    with snapstore.open(path, readonly=True) as s:
        metadata = s.read(writer.last_info.id, st.METADATA_BUFFER)
    assert snapstore_globals(metadata) == {("snapstore.torch", "_Location")}


def test_dcp_save_under_an_int_checkpoint_id_is_refused(tmp_path):
    """Regression: saved under checkpoint_id=2, dcp.load(checkpoint_id=2) read snapstore
    checkpoint 2 (another save), silently."""
    path = str(tmp_path / "s")
    state = {"w": torch.ones(4)}
    with pytest.raises(BaseException, match="must be a str") as caught:   # DCP wraps it
        dcp.save(state, checkpoint_id=2, storage_writer=st.SnapstoreWriter(path))
    assert "step-2" in str(caught.value)
    dcp.save(state, checkpoint_id="step-2", storage_writer=st.SnapstoreWriter(path))
    out = {"w": torch.zeros(4)}
    dcp.load(out, checkpoint_id="step-2", storage_reader=st.SnapstoreReader(path))
    assert torch.equal(out["w"], state["w"])


def test_dcp_keys_with_at_signs_do_not_collide_with_shard_names():
    from torch.distributed.checkpoint.metadata import MetadataIndex
    names = {st._item_name(MetadataIndex("w", torch.Size([4, 0]))),
             st._item_name(MetadataIndex("w@4,0")),
             st._item_name(MetadataIndex("w%404,0"))}
    assert len(names) == 3


def test_load_into_an_optimizer_shaped_otherwise_writes_nothing(store):
    """Regression: an optimizer without state was loaded fresh after the model was written
    in place, and torch's load_state_dict then refused the param groups (raw ValueError)."""
    model, opt = trained(width=64)
    info = st.save(store, {"model": model, "optim": opt}, "m")
    other = copy.deepcopy(model)
    with torch.no_grad():
        for p in other.parameters():
            p.zero_()
    params = list(other.parameters())
    two_groups = torch.optim.Adam([{"params": params[:2]}, {"params": params[2:]}])
    with pytest.raises(StructureMismatchError, match="param group"):
        st.load(store, info.id, into={"model": other, "optim": two_groups})
    assert all(not p.any() for p in other.parameters())          # nothing written
    with pytest.raises(StructureMismatchError, match="no optimizer state"):
        st.load(store, info.id, into=torch.optim.Adam(other.parameters()))
    same_shape = torch.optim.Adam(other.parameters())
    st.load(store, info.id, into={"model": other, "optim": same_shape})
    assert all(torch.equal(a, b) for a, b in zip(other.parameters(), model.parameters()))


def test_load_by_name_checks_and_loads_one_checkpoint(store, monkeypatch):
    """The optimizer check and the load resolved the name separately: a checkpoint another
    writer committed in between (here: during the check) was loaded though another one was
    checked. The name is resolved once now."""
    model, opt = trained(width=64)
    first = st.save(store, {"model": model, "optim": opt}, "m")
    changed = copy.deepcopy(model)
    with torch.no_grad():
        for p in changed.parameters():
            p.add_(1)
    real = st._check_optimizer_groups

    def check_then_commit(s, name, optimizers):
        real(s, name, optimizers)
        st.save(store, {"model": changed, "optim": opt}, "m")   # a newer head meanwhile
    monkeypatch.setattr(st, "_check_optimizer_groups", check_then_commit)
    target = copy.deepcopy(model)
    with torch.no_grad():
        for p in target.parameters():
            p.zero_()
    st.load(store, "m", into={"model": target, "optim": torch.optim.Adam(target.parameters())})
    assert all(torch.equal(a, b) for a, b in zip(target.parameters(), model.parameters()))
    assert store.latest("m").id != first.id


def test_dcp_load_into_tied_weights(store):
    """Tied weights (one tensor under two keys) loaded with dcp.load through SnapstoreReader:
    the two targets share memory, which restore_into refuses; the reader restores them one
    after the other, as DCP's own reader would."""
    w = torch.arange(4096, dtype=torch.float32)
    dcp.save({"enc": w, "dec": w}, checkpoint_id="tied", storage_writer=st.SnapstoreWriter(store))
    t = torch.zeros(4096)
    dcp.load({"enc": t, "dec": t}, checkpoint_id="tied", storage_reader=st.SnapstoreReader(store))
    assert torch.equal(t, w)



def test_dcp_storage_of_no_store_is_a_clear_error(tmp_path):
    """SnapstoreWriter(None) raised a raw TypeError from os.fspath (a helper's review)."""
    for bad in (None, 5, 1.5, ["p"]):
        for cls in (st.SnapstoreWriter, st.SnapstoreReader):
            with pytest.raises(snapstore.errors.InvalidArgumentTypeError, match="store path"):
                cls(bad)
    writer = st.SnapstoreWriter(os.fsencode(str(tmp_path / "b")))     # bytes, as open() takes
    dcp.save({"w": torch.ones(4)}, checkpoint_id="b", storage_writer=writer)
    assert _ids(str(tmp_path / "b")) == ["b"]

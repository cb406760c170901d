"""What tensors and arrays a checkpoint holds, by name, and where their bytes lie -- read from
the checkpoint's description, without torch or numpy and without running any code from it.

    for t in snapstore.tensors.tensor_catalogue(store, store.get(7)):
        print(t.name, t.dtype, t.shape, t.buffer, t.offset, t.nbytes)
    # model.0.weight float32 (16, 8) oob/0 0 512

Names are paths in the saved state joined with "." as torch.distributed.checkpoint names them
("model.0.weight", "optim.state.0.exp_avg"), so the same state saved with
snapstore.torch.save, Store.save, save_arrays or DCP lists the same names.

Where the description comes from:

- object checkpoints (Store.save, snapstore.torch.save): the pickle stream (buffer "pickle"),
  read by a restricted unpickler that never imports or calls anything: every global it names
  becomes an inert placeholder, so a hostile stream can describe wrong tensors but run nothing.
  Tensors and NumPy arrays map to their out-of-band buffer ("oob/N") or, when small, to their
  bytes inside the pickle stream (buffer "pickle"). Names are recovered from the structure
  around them, so checkpoints written before this module existed are listed too.
- save_arrays checkpoints: the "snapstore.arrays" meta (one buffer "array/<name>" each).
- DCP checkpoints (SnapstoreWriter): the DCP metadata (buffer "dcp/metadata"), read by the
  same restricted unpickler; one entry per stored chunk ("item/<fqn>"; in multi-rank saves made
  before format 3, the other ranks' shares lie in part checkpoints, named by ``checkpoint``).
- every other checkpoint (plain buffers, LangGraph, workflows): no tensors.
"""
from __future__ import annotations

import io
import pickle
import pickletools
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Optional

from snapstore.arrays import ARRAY_PREFIX, ARRAYS_META_KEY
from snapstore.errors import CorruptionError, InvalidArgumentTypeError
from snapstore.objectlayer import (DCP_META_KEY, DCP_METADATA_BUFFER, DCP_PART_KEY,
                                   require_store, resolve_checkpoint)
from snapstore.objects import META_KEY, OOB_PREFIX, PICKLE_BUFFER

__all__ = ["TensorEntry", "Catalogue", "tensor_catalogue", "catalogue", "checkpoint_kind",
           "DTYPE_ITEMSIZE", "SUB_BYTE_INTS"]


# torch's sub-byte integers (uint1-uint7, int1-int7): one byte per element in memory
SUB_BYTE_INTS = frozenset(f"{sign}int{bits}" for sign in ("u", "") for bits in range(1, 8))

# Bytes per element of the dtypes catalogued (torch's names; numpy's are the same where both
# exist). A dtype missing here is listed as skipped, not guessed. torch's sub-byte integers
# (uint1-uint7, int1-int7) take one byte per element; they are listed, but no export format
# holds them (snapstore.exporter refuses them).
DTYPE_ITEMSIZE = {
    "bool": 1, "uint8": 1, "int8": 1, "uint16": 2, "int16": 2, "uint32": 4, "int32": 4,
    "uint64": 8, "int64": 8, "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8,
    "complex32": 4, "complex64": 8, "complex128": 16, "float8_e4m3fn": 1, "float8_e5m2": 1,
    "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1, "float8_e8m0fnu": 1, "float4_e2m1fn_x2": 1,
    "bits8": 1, "bits16": 2, "bits1x8": 1, "bits2x4": 1, "bits4x2": 1,
    **{name: 1 for name in SUB_BYTE_INTS},
}
_TORCH_ALIASES = {"half": "float16", "float": "float32", "double": "float64", "cfloat":
                  "complex64", "cdouble": "complex128", "chalf": "complex32", "short": "int16",
                  "int": "int32", "long": "int64"}
_MAX_DEPTH = 200


@dataclass(frozen=True)
class TensorEntry:
    """One tensor or array of a checkpoint.

    name: its path in the saved state, DCP style ("model.0.weight"; "obj" for a bare tensor).
    dtype: "float32", "bfloat16", "int64", "datetime64[ns]", ">f4" (non-native byte order)...
    shape: tuple of ints.
    buffer: the buffer holding its bytes ("oob/3", "array/u", "item/model.0.weight", "pickle").
    offset: byte offset of its first element in that buffer.
    nbytes: bytes spanned from offset (numel * itemsize when laid out densely).
    strides: element strides when the layout is not C order (Fortran arrays, views of a shared
        storage), else None: then the bytes are exactly the C-order elements.
    checkpoint: the checkpoint holding the buffer when it is not this one (DCP: another rank's
        part), else None.
    """
    name: str
    dtype: str
    shape: tuple
    buffer: str
    offset: int
    nbytes: int
    strides: Optional[tuple] = None
    checkpoint: Optional[int] = None

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def itemsize(self) -> Optional[int]:
        return dtype_itemsize(self.dtype)

    def to_json(self) -> dict:
        d = {"name": self.name, "dtype": self.dtype, "shape": list(self.shape),
             "buffer": self.buffer, "offset": self.offset, "nbytes": self.nbytes}
        if self.strides is not None:
            d["strides"] = list(self.strides)
        if self.checkpoint is not None:
            d["checkpoint"] = self.checkpoint
        return d


@dataclass
class Catalogue:
    """Everything tensor_catalogue() learns: kind of checkpoint ("objects", "arrays", "dcp",
    "dcp-part", "other"), the tensors, plain values (name -> int/float/bool/str/None, e.g. an
    optimizer's step and hyperparameters) and what was neither (name -> short description)."""
    kind: str
    tensors: list = field(default_factory=list)
    values: dict = field(default_factory=dict)
    skipped: dict = field(default_factory=dict)


def dtype_itemsize(dtype: str) -> Optional[int]:
    """Bytes per element of a catalogue dtype name (None if unknown)."""
    n = DTYPE_ITEMSIZE.get(dtype)
    if n is not None:
        return n
    if dtype.startswith(("datetime64", "timedelta64")) or (dtype[:1] in "<>|="
                                                           and dtype[1:3] in ("M8", "m8")):
        return 8
    if dtype[:1] in "<>|=" and dtype[2:].isdigit():
        size = int(dtype[2:])
        return size * 4 if dtype[1] == "U" else size
    for prefix in ("void", "bytes"):
        if dtype.startswith(prefix) and dtype[len(prefix):].isdigit():
            return int(dtype[len(prefix):])
    if dtype.startswith("str") and dtype[3:].isdigit():
        return int(dtype[3:]) * 4
    return None


def _resolve(store, name: Any, function: str):
    """The CheckpointInfo a catalogue call names (see tensor_catalogue)."""
    require_store(store, function)
    if name is None:
        raise InvalidArgumentTypeError(
            f"{function}: no checkpoint given (None: store.latest() returns None for a stream "
            "without checkpoints); pass a CheckpointInfo, an id or a checkpoint name")
    return resolve_checkpoint(store, name)


def _reserved(info) -> dict:
    """snapstore's reserved meta keys of a checkpoint (CheckpointInfo.reserved_meta)."""
    return info.reserved_meta


def checkpoint_kind(info) -> str:
    """"objects" (Store.save / snapstore.torch.save), "arrays" (save_arrays), "dcp" (a DCP
    save), "dcp-part" (another rank's share of one), or "other"."""
    reserved = _reserved(info)
    sizes = getattr(info, "sizes", {})
    if isinstance(reserved.get(META_KEY), dict) and PICKLE_BUFFER in sizes:
        return "objects"
    if isinstance(reserved.get(ARRAYS_META_KEY), dict):
        return "arrays"
    if isinstance(reserved.get(DCP_META_KEY), dict) and DCP_METADATA_BUFFER in sizes:
        return "dcp"
    if isinstance(reserved.get(DCP_PART_KEY), dict):
        return "dcp-part"
    return "other"


def tensor_catalogue(store, info) -> list:
    """The tensors and arrays of a checkpoint, in the saved order: a list of TensorEntry ([]
    for checkpoints holding none). Reads only the checkpoint's description (pickle stream or
    DCP metadata), never the tensors' bytes.

    Args:
        store: an open Store.
        info: the checkpoint: a CheckpointInfo, an id, or any name Store.resolve takes (a
            stream name for its newest checkpoint, "latest", "STREAM@SEQ", a tag...).
    Raises: InvalidArgumentTypeError (store is not a Store; info is None, as store.latest()
        gives for an empty stream, or not a name), CheckpointNotFound, AmbiguousCheckpointName,
        CorruptionError (the description cannot be read)."""
    return _catalogue(store, info, "snapstore.tensors.tensor_catalogue").tensors


def catalogue(store, info) -> Catalogue:
    """tensor_catalogue() plus the checkpoint's kind, plain values and skipped parts (same
    arguments and errors)."""
    return _catalogue(store, info, "snapstore.tensors.catalogue")


def _catalogue(store, name: Any, function: str) -> Catalogue:
    info = _resolve(store, name, function)
    kind = checkpoint_kind(info)
    out = Catalogue(kind)
    if kind == "objects":
        _objects_catalogue(store, info, out)
    elif kind == "arrays":
        _arrays_catalogue(info, out)
    elif kind == "dcp":
        _dcp_catalogue(store, info, out)
    return out


# ---- a restricted unpickler: globals become inert placeholders ------------------------------
class _Opaque:
    """An object a pickle stream builds: what it was called with and the state it was given.
    Subclasses are made per global name (_opaque_class); nothing of the original runs."""
    module = ""
    qualname = ""

    def __new__(cls, *args, **kwargs):
        self = object.__new__(cls)
        self.args, self.kwargs = args, kwargs
        self.state: Any = None
        self.items: list = []          # (key, value) set by SETITEMS
        self.elements: list = []       # values added by APPENDS
        return self

    def __init__(self, *args, **kwargs) -> None:
        pass

    def __setstate__(self, state) -> None:
        self.state = state

    def __setitem__(self, key, value) -> None:
        self.items.append((key, value))

    def append(self, value) -> None:
        self.elements.append(value)

    def extend(self, values) -> None:
        self.elements.extend(values)

    def attrs(self) -> dict:
        """The attribute dict its state gives (dataclasses, plain objects, slots), else {}."""
        state = self.state
        if isinstance(state, tuple) and len(state) == 2 and \
                (state[0] is None or isinstance(state[0], dict)):
            merged = dict(state[0] or {})
            merged.update(state[1] if isinstance(state[1], dict) else {})
            return merged
        return state if isinstance(state, dict) else {}

    def attr(self, name: str, default: Any = None) -> Any:
        return self.attrs().get(name, default)


_CLASSES: dict = {}
# Only containers whose construction runs no code from the stream are used as themselves.
_REAL = {("collections", "OrderedDict"): OrderedDict}


def _opaque_class(module: str, name: str) -> type:
    key = (module, name)
    cls = _CLASSES.get(key)
    if cls is None:
        cls = type("Opaque", (_Opaque,), {"module": module, "qualname": name})
        _CLASSES[key] = cls
    return cls


def _is_global(x: Any, module: str, *names: str) -> bool:
    return isinstance(x, type) and issubclass(x, _Opaque) and x.module == module and \
        (not names or x.qualname in names)


def _is_call(x: Any, module: str, *names: str) -> bool:
    return isinstance(x, _Opaque) and _is_global(type(x), module, *names)


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        real = _REAL.get((module, name))
        return real if real is not None else _opaque_class(module, name)

    def persistent_load(self, pid):
        return _opaque_class("persistent", str(pid)[:50])()


def _safe_loads(data, buffers: list, what: str) -> Any:
    try:
        return _Unpickler(io.BytesIO(data), buffers=buffers).load()
    except RecursionError:
        raise CorruptionError(f"{what}: the pickle stream is nested too deeply") from None
    except Exception as exc:
        raise CorruptionError(f"{what}: the pickle stream cannot be read: "
                              f"{type(exc).__name__}: {exc}") from None


# ---- dtypes ----------------------------------------------------------------------------------
_NUMPY_KINDS = {"f": "float", "i": "int", "u": "uint", "c": "complex"}


def _numpy_dtype_name(spec: Any, byteorder: str = "<") -> str:
    """A catalogue dtype name for a NumPy type string ("f4", "<f4", "|b1", "M8[ns]")."""
    if not isinstance(spec, str) or not spec:
        return "structured"
    if spec[0] in "<>|=":
        byteorder, spec = spec[0], spec[1:]
    kind, size = spec[:1], spec[1:]
    if byteorder == ">" and (kind in "MmU" or (kind in _NUMPY_KINDS and size.isdigit()
                                              and int(size) > 1)):
        return ">" + spec                # not native: keep the byte order visible
    if kind in "Mm" and size.startswith("8"):
        unit = size[1:]
        return ("datetime64" if kind == "M" else "timedelta64") + unit
    if kind == "b" and size == "1":
        return "bool"
    if kind == "V" and size.isdigit():
        return f"void{size}"
    if kind == "S" and size.isdigit():
        return f"bytes{size}"
    if kind == "U" and size.isdigit():
        return f"str{size}"
    base = _NUMPY_KINDS.get(kind)
    if base is None or not size.isdigit():
        return spec
    return f"{base}{int(size) * 8}"


def _numpy_dtype(stub: Any) -> str:
    """The name of a pickled numpy.dtype (a placeholder: dtype(spec, align, copy) + state)."""
    if not _is_call(stub, "numpy", "dtype") or not stub.args:
        return "unknown"
    spec = stub.args[0]
    state = stub.state if isinstance(stub.state, tuple) else ()
    if len(state) > 3 and state[3] is not None:
        return "structured"
    byteorder = state[1] if len(state) > 1 and isinstance(state[1], str) else "<"
    unit = _datetime_unit(state[8] if len(state) > 8 else None)
    if isinstance(spec, str) and spec[:1] in "Mm" and unit is not None:
        spec = f"{spec}[{unit}]"
    return _numpy_dtype_name(spec, byteorder)


def _datetime_unit(metadata: Any) -> Optional[str]:
    """The unit of a pickled datetime64/timedelta64 dtype with its multiplier ("ns", "5s",
    "generic"), from the dtype state's metadata (None, (b"s", 5, 1, 1)); None if unreadable."""
    if isinstance(metadata, tuple) and len(metadata) == 2 and isinstance(metadata[1], tuple):
        metadata = metadata[1]                 # (unit, count, 1, 1)
    if isinstance(metadata, (bytes, str)):
        metadata = (metadata,)
    if not (isinstance(metadata, tuple) and metadata):
        return None
    unit, count = metadata[0], metadata[1] if len(metadata) > 1 else 1
    if isinstance(unit, bytes):
        unit = unit.decode("ascii", "replace")
    if unit not in _DATETIME_UNITS or type(count) is not int or not 1 <= count < 2 ** 31:
        return None
    return unit if count == 1 else f"{count}{unit}"


_DATETIME_UNITS = frozenset(("Y", "M", "W", "D", "h", "m", "s", "ms", "us", "ns", "ps", "fs",
                             "as", "generic"))


def _torch_dtype(x: Any) -> str:
    if _is_global(x, "torch"):
        return _TORCH_ALIASES.get(x.qualname, x.qualname)
    return "unknown"


# ---- layout ----------------------------------------------------------------------------------
def _c_strides(shape) -> tuple:
    strides, n = [], 1
    for d in reversed(shape):
        strides.append(n)
        n *= d
    return tuple(reversed(strides))


def _layout(shape, strides, itemsize: int) -> tuple[int, Optional[tuple]]:
    """(bytes spanned from the first element, strides or None when C order)."""
    if any(d == 0 for d in shape):
        return 0, None
    last = sum((d - 1) * s for d, s in zip(shape, strides))
    c = _c_strides(shape)
    same = all(s == cs for d, s, cs in zip(shape, strides, c) if d != 1)
    return (last + 1) * itemsize, (None if same else tuple(strides))


def _ints(x: Any) -> Optional[tuple]:
    if _is_call(x, "torch", "Size") and x.args:
        x = x.args[0]
    if isinstance(x, (tuple, list)) and all(type(v) is int for v in x):
        return tuple(x)
    return None


# ---- object checkpoints ------------------------------------------------------------------------
class _Buffers:
    """Where the bytes a pickle stream hands to a rebuild function lie: an out-of-band buffer
    (a marker passed as it), or a bytes value inside the stream itself."""

    def __init__(self, data: bytes, names: list, sizes: list) -> None:
        self.data = data
        self.markers = [bytearray() for _ in names]   # distinct objects, one per buffer
        self.by_id = {id(m): (n, s) for m, n, s in zip(self.markers, names, sizes)}
        self._inband: Optional[dict] = None

    def locate(self, buf: Any) -> Optional[tuple[str, int, int]]:
        """(buffer name, byte offset, length) of buf, or None."""
        if isinstance(buf, memoryview):
            obj = buf.obj
            if id(obj) in self.by_id:
                name, size = self.by_id[id(obj)]
                return name, 0, size
            buf = bytes(buf)
        if isinstance(buf, (bytes, bytearray)):
            if id(buf) in self.by_id:
                name, size = self.by_id[id(buf)]
                return name, 0, size
            pos = self._inband_positions().get(bytes(buf))
            if pos is not None:
                return PICKLE_BUFFER, pos, len(buf)
        return None

    def _inband_positions(self) -> dict:
        """bytes value -> offset of its first occurrence as an argument in the stream."""
        if self._inband is None:
            prefix = {"SHORT_BINBYTES": 1, "BINBYTES": 4, "BINBYTES8": 8, "BYTEARRAY8": 8}
            found: dict = {}
            data = self.data
            for op, arg, pos in pickletools.genops(data):
                n = prefix.get(op.name)
                if n is not None and isinstance(arg, (bytes, bytearray)):
                    start = pos + 1 + n
                    if data[start:start + len(arg)] == arg:
                        found.setdefault(bytes(arg), start)
            self._inband = found
        return self._inband


def _objects_catalogue(store, info, out: Catalogue) -> None:
    count = _reserved(info)[META_KEY].get("buffers")
    if not isinstance(count, int) or count < 0:
        raise CorruptionError(f"checkpoint {info.id}: its object meta names no buffer count")
    if count >= len(info.sizes):        # before making a name per buffer it says it has
        raise CorruptionError(f"checkpoint {info.id}: its object meta names {count} buffers "
                              f"besides the pickle, but it has {len(info.sizes)} in all")
    names = [f"{OOB_PREFIX}{i}" for i in range(count)]
    missing = [n for n in names if n not in info.sizes]
    if missing:
        raise CorruptionError(f"checkpoint {info.id}: buffers {missing[:3]} of its object "
                              "meta are missing")
    data = bytes(store.read(info.id, PICKLE_BUFFER))
    buffers = _Buffers(data, names, [info.sizes[n] for n in names])
    root = _safe_loads(data, list(buffers.markers), f"checkpoint {info.id}")
    _walk(root, buffers, out, info.id)


def _path(prefix: str, key: Any) -> str:
    key = key if isinstance(key, str) else repr(key) if not isinstance(key, int) else str(key)
    return key if not prefix else f"{prefix}.{key}"


def _walk(root: Any, buffers: _Buffers, out: Catalogue, cid: int) -> None:
    seen: set = set()
    stack: list = [("", root, 0)]
    while stack:
        name, x, depth = stack.pop()
        label = name or "obj"
        if depth > _MAX_DEPTH:
            out.skipped[label] = "nested too deeply"
            continue
        if x is None or isinstance(x, (bool, int, float, str)):
            out.values[label] = x
            continue
        entry = _leaf_entry(label, x, buffers, out)
        if entry is not None:
            continue
        children = _children(x)
        if children is None:
            out.skipped[label] = _describe(x)
            continue
        if id(x) in seen:
            continue                     # shared container: listed under its first name
        seen.add(id(x))
        for key, child in reversed(children):
            stack.append((_path(name, key), child, depth + 1))


def _children(x: Any) -> Optional[list]:
    if isinstance(x, dict):
        return list(x.items())
    if isinstance(x, (list, tuple)):
        return list(enumerate(x))
    if isinstance(x, _Opaque):
        if x.items or x.elements:
            return list(x.items) + list(enumerate(x.elements))
        attrs = x.attrs()
        if attrs:
            return list(attrs.items())
    return None


def _describe(x: Any) -> str:
    if isinstance(x, _Opaque):
        return f"{x.module}.{x.qualname} object"
    if isinstance(x, type) and issubclass(x, _Opaque):
        return f"{x.module}.{x.qualname}"
    return type(x).__name__


def _leaf_entry(name: str, x: Any, buffers: _Buffers, out: Catalogue) -> Any:
    """Adds x to out when it is a tensor or array (returns True), else None."""
    if _is_call(x, "snapstore.objects", "_tensor"):
        return _tensor_entry(name, x, buffers, out)
    if _is_call(x, "snapstore.objects", "_datetime_array") and len(x.args) == 2:
        values, dtype = x.args
        return _ndarray_entry(name, values, buffers, out, _numpy_dtype(dtype))
    if _is_call(x, "numpy.core.numeric", "_frombuffer") or \
            _is_call(x, "numpy._core.numeric", "_frombuffer"):
        return _ndarray_entry(name, x, buffers, out)
    if _is_call(x, "numpy.core.multiarray", "_reconstruct") or \
            _is_call(x, "numpy._core.multiarray", "_reconstruct"):
        return _reconstructed_entry(name, x, buffers, out)
    if (_is_call(x, "numpy.core.multiarray", "scalar") or
            _is_call(x, "numpy._core.multiarray", "scalar")) and len(x.args) == 2 \
            and isinstance(x.args[1], bytes):
        dtype, raw = x.args                # a NumPy scalar (np.float32(1.5)): a 0-d array
        return _add(out, name, _numpy_dtype(dtype), (), None, buffers.locate(raw), 0)
    return None


def _add(out: Catalogue, name: str, dtype: str, shape: tuple, strides: Optional[tuple],
         where: Optional[tuple], first: int) -> bool:
    """Adds one entry (first: element offset of its first element). Skips what cannot be
    located or does not fit its buffer."""
    itemsize = dtype_itemsize(dtype)
    if where is None or itemsize is None:
        out.skipped[name] = f"{dtype} tensor {shape}: " + \
            ("a dtype the catalogue does not know" if itemsize is None else "bytes not found")
        return True
    if strides is None:
        strides = _c_strides(shape)
    if any(s < 0 for s in strides) or first < 0:
        out.skipped[name] = f"{dtype} tensor {shape}: negative strides"
        return True
    nbytes, layout = _layout(shape, strides, itemsize)
    buffer, base, size = where
    offset = base + first * itemsize
    if nbytes and offset + nbytes > base + size:
        raise CorruptionError(f"{name}: a {dtype} tensor {shape} does not fit in the "
                              f"{size} bytes of buffer {buffer!r}")
    out.tensors.append(TensorEntry(name, dtype, tuple(shape), buffer, offset, nbytes, layout))
    return True


def _tensor_entry(name, x, buffers, out) -> bool:
    args = x.args
    if len(args) < 5 or not _is_call(args[0], "snapstore.objects", "_storage") \
            or not args[0].args:
        out.skipped[name] = "tensor: unreadable description"
        return True
    storage, dtype, first, shape, strides = args[:5]
    shape, strides = _ints(shape), _ints(strides)
    if shape is None or strides is None or len(shape) != len(strides) or type(first) is not int:
        out.skipped[name] = "tensor: unreadable shape"
        return True
    return _add(out, name, _torch_dtype(dtype), shape, strides,
                buffers.locate(storage.args[0]), first)


def _ndarray_entry(name, x, buffers, out, dtype_name: Optional[str] = None) -> bool:
    if not _is_call(x, "numpy.core.numeric", "_frombuffer") and \
            not _is_call(x, "numpy._core.numeric", "_frombuffer"):
        out.skipped[name] = _describe(x)
        return True
    if len(x.args) != 4:
        out.skipped[name] = "array: unreadable description"
        return True
    buf, dtype, shape, order = x.args
    shape = _ints(shape)
    name_of = _numpy_dtype(dtype)
    if shape is None:
        out.skipped[name] = "array: unreadable shape"
        return True
    strides = None
    if order == "F":
        strides = tuple(reversed(_c_strides(tuple(reversed(shape)))))
    return _add(out, name, dtype_name or name_of, shape, strides, buffers.locate(buf), 0)


def _reconstructed_entry(name, x, buffers, out) -> bool:
    """An array pickled numpy's older way: _reconstruct(...) then state (version, shape,
    dtype, fortran, raw bytes)."""
    state = x.state
    if not (isinstance(state, tuple) and len(state) == 5 and isinstance(state[4], bytes)):
        out.skipped[name] = "array: unreadable description"
        return True
    _, shape, dtype, fortran, raw = state
    shape = _ints(shape)
    if shape is None:
        out.skipped[name] = "array: unreadable shape"
        return True
    strides = tuple(reversed(_c_strides(tuple(reversed(shape))))) if fortran else None
    return _add(out, name, _numpy_dtype(dtype), shape, strides, buffers.locate(raw), 0)


# ---- save_arrays checkpoints ---------------------------------------------------------------------
def _arrays_catalogue(info, out: Catalogue) -> None:
    arrays = _reserved(info)[ARRAYS_META_KEY].get("arrays")
    if not isinstance(arrays, dict):
        raise CorruptionError(f"checkpoint {info.id}: its arrays meta lists no arrays")
    for name, spec in arrays.items():
        buffer = ARRAY_PREFIX + name
        shape = _ints(spec.get("shape")) if isinstance(spec, dict) else None
        if shape is None or buffer not in info.sizes:
            raise CorruptionError(f"checkpoint {info.id}: array {name!r} is not described "
                                  "by its meta")
        strides = None
        if spec.get("order") == "F":
            strides = tuple(reversed(_c_strides(tuple(reversed(shape)))))
        _add(out, name, _numpy_dtype_name(spec.get("dtype")), shape, strides,
             (buffer, 0, info.sizes[buffer]), 0)


# ---- DCP checkpoints ------------------------------------------------------------------------------
def _properties_dtype(props: _Opaque) -> Any:
    """The dtype of DCP's TensorProperties (its state is a tuple starting with it)."""
    state = props.state
    if isinstance(state, tuple) and state and not isinstance(state[0], (dict, type(None))):
        return state[0]
    return props.attr("dtype")


def _dcp_catalogue(store, info, out: Catalogue) -> None:
    what = f"checkpoint {info.id} ({DCP_METADATA_BUFFER})"
    metadata = _safe_loads(bytes(store.read(info.id, DCP_METADATA_BUFFER)), [], what)
    if not isinstance(metadata, _Opaque):
        raise CorruptionError(f"{what} is not DCP metadata")
    described = metadata.attr("state_dict_metadata")
    storage = metadata.attr("storage_data")
    if not isinstance(described, dict) or not isinstance(storage, dict):
        raise CorruptionError(f"{what} is not DCP metadata")
    for index, location in storage.items():
        fqn = index.attr("fqn") if isinstance(index, _Opaque) else None
        if not isinstance(fqn, str) or not isinstance(location, _Opaque) or \
                len(location.args) != 3:
            raise CorruptionError(f"{what}: unreadable storage entry {_describe(index)}")
        checkpoint, buffer, sizes = location.args
        md = described.get(fqn)
        props = md.attr("properties") if isinstance(md, _Opaque) else None
        if sizes is None or not isinstance(props, _Opaque):
            out.skipped[fqn] = "bytes"
            continue
        offsets = _ints(index.attr("offset")) or ()
        name = fqn if not any(offsets) else fqn + "@" + ",".join(map(str, offsets))
        shape = _ints(sizes)
        dtype = _torch_dtype(_properties_dtype(props))
        itemsize = dtype_itemsize(dtype)
        if shape is None or itemsize is None or not isinstance(buffer, str):
            out.skipped[name] = f"{dtype} tensor: unreadable description"
            continue
        nbytes = itemsize
        for d in shape:
            nbytes *= d
        if checkpoint is None:
            size = info.sizes.get(buffer)
            if size is None or size < nbytes:
                raise CorruptionError(f"{what}: {name} needs {nbytes} bytes of buffer "
                                      f"{buffer!r}, which holds {size}")
        out.tensors.append(TensorEntry(name, dtype, shape, buffer, 0, nbytes, None,
                                       checkpoint if isinstance(checkpoint, int) else None))


"""Checkpoints out of snapstore as files other tools read: safetensors, PyTorch (.pt) and NumPy
(.npz), for torch, object (Store.save), save_arrays and DCP checkpoints.

    snapstore.export(store, "train", "model.safetensors")            # format from the suffix
    # (the module is snapstore.exporter: snapstore.export is the function)
    snapstore.export(store, 42, "state.npz", format="npz", force=True)

What goes in the file: every tensor and array the checkpoint holds (snapstore.tensors'
catalogue), flat, under its DCP-style name ("model.0.weight", "optim.state.0.exp_avg"), with
its exact bytes, dtype and shape (in C order). Formats differ in what else they keep:

- safetensors: the plain values of the state (an optimizer's step and hyperparameters, an int
  "step"...) as JSON in the string metadata, key "snapstore.values"; the checkpoint's id,
  stream and user meta as "snapstore.checkpoint", "snapstore.stream", "snapstore.meta".
  Loads with safetensors.torch.load_file / safetensors.numpy.load_file (not bfloat16 there).
- pt: a dict {name: tensor} written by torch.save, loadable with torch.load(weights_only=True).
  Plain values are not written (reported as skipped). Needs torch.
- npz: numpy.load gives {name: array}. NumPy has no bfloat16 or float8: such a checkpoint is
  refused (ExportError) rather than written as reinterpreted integers. Plain values are not
  written (reported as skipped).

torch's sub-byte integers (uint1-uint7, int1-int7) no format holds: a checkpoint with one is
refused (ExportError). Parts that are neither tensors nor plain values (custom objects, arrays
of a dtype the catalogue does not know, such as structured ones) are reported as skipped; when
nothing else is left, the ExportError names them and why. The file is written atomically (a
new temporary file renamed over the path: never through a symlink) and an existing file is
kept unless force=True. The whole content is built in memory before it is written
(safetensors' serializer needs every tensor at once).
"""
from __future__ import annotations

import json
import os
import zipfile
from dataclasses import dataclass, field
from typing import Any, Optional

from snapstore.engine.fsutil import replace_file
from snapstore.engine.reader import retry_moved
from snapstore.engine.validation import validate_flag
from snapstore.errors import ExportError
from snapstore.objectlayer import resolve_checkpoint
from snapstore.savepoints import SUFFIX as SAVEPOINT_SUFFIX
from snapstore.savepoints import check_output, export_savepoint, output_exists
from snapstore.tensors import SUB_BYTE_INTS, Catalogue, TensorEntry, catalogue

__all__ = ["export", "ExportResult", "FORMATS", "format_for_path"]

FORMATS = ("safetensors", "pt", "npz", "snap")
_SUFFIXES = {".safetensors": "safetensors", ".pt": "pt", ".pth": "pt", ".npz": "npz",
             SAVEPOINT_SUFFIX: "snap"}
# dtypes safetensors (>= 0.8) writes, by the catalogue's names
_SAFETENSORS_DTYPES = frozenset((
    "bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float16",
    "float32", "float64", "bfloat16", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2",
    "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2", "complex64"))
# dtypes torch has, by the catalogue's names (= torch's attribute names)
_TORCH_DTYPES = frozenset((
    "bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float16",
    "bfloat16", "float32", "float64", "complex32", "complex64", "complex128", "float8_e4m3fn",
    "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2",
    "bits8", "bits16", "bits1x8", "bits2x4", "bits4x2"))
# dtypes NumPy has not: refused for npz
_NOT_NUMPY = frozenset(_TORCH_DTYPES - {"bool", "int8", "uint8", "int16", "uint16", "int32",
                                        "uint32", "int64", "uint64", "float16", "float32",
                                        "float64", "complex64", "complex128"})


@dataclass
class ExportResult:
    """What export() wrote: path, format, checkpoint id, number of tensors, their bytes,
    values kept (safetensors metadata) and skipped parts (name -> why)."""
    path: str
    format: str
    checkpoint: int
    tensors: int
    bytes: int
    values: dict = field(default_factory=dict)
    skipped: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"path": self.path, "format": self.format, "checkpoint": self.checkpoint,
                "tensors": self.tensors, "bytes": self.bytes, "values": self.values,
                "skipped": self.skipped}


def format_for_path(path: str) -> Optional[str]:
    """The format a file name's suffix names (".safetensors", ".pt", ".pth", ".npz", ".snap"),
    or None."""
    return _SUFFIXES.get(os.path.splitext(os.fspath(path))[1].lower())


def export(store, name: Any, path, format: Optional[str] = None, *,
           force: bool = False) -> ExportResult:
    """Writes the tensors of a checkpoint to one file (see the module doc for what each format
    keeps).

    Args:
        store: an open Store (read-only is fine).
        name: the checkpoint: id, CheckpointInfo, or stream name (its latest checkpoint).
        path: the output file.
        format: "safetensors", "pt", "npz" or "snap"; None: from path's suffix. "snap" is a
            savepoint of the whole checkpoint, whatever it holds
            (snapstore.savepoints.export_savepoint: the result's tensors is 0, bytes the
            file's size).
        force: replace an existing file (atomically) instead of refusing.
    Returns: ExportResult.
    Raises: ExportError (nothing written: no tensors, a dtype the format lacks, a name given
        twice, a sharded DCP tensor, the file exists, path inside the store's own directory,
        the format's library missing),
        InvalidArgumentError (path is a directory, a device, a FIFO or a socket: a file is
        replaced by rename, and they are never replaced; path is not a path),
        InvalidArgumentTypeError (store is not an open Store, path not a str, bytes or
        os.PathLike, force not a bool), CheckpointNotFound (also when another writer deleted
        it while it was exported), CorruptionError,
        ConcurrentCompactionError (compactions moved its chunks READ_ATTEMPTS times in a row
        while it was read: retry), StoreIOError (writing the file; it names path).
    """
    path = check_output(store, path)
    force = validate_flag(force, "force")
    fmt = format if format is not None else format_for_path(path)
    if fmt not in FORMATS:
        what = (f"unknown export format {format!r} for {path!r}" if format is not None
                else f"no export format given, and {path!r} does not end in a format's suffix")
        raise ExportError(f"{what}: use one of {', '.join(FORMATS)} (or a "
                          f".safetensors/.pt/.npz/.snap file name)")
    if not force and os.path.lexists(path):
        raise output_exists(path)
    if fmt == "snap":
        saved = export_savepoint(store, name, path, force=force)
        return ExportResult(path, fmt, saved.checkpoint, 0, saved.bytes)
    info = resolve_checkpoint(store, name)
    # each read made again when a compaction moves its chunks meanwhile (ids: a checkpoint
    # deleted meanwhile is CheckpointNotFound)
    cat = retry_moved(lambda: catalogue(store, info), f"exporting checkpoint {info.id}")
    if cat.kind not in ("objects", "arrays", "dcp"):
        raise ExportError(f"checkpoint {info.id} of stream {info.stream!r} holds no tensors "
                          "(it was not written by snapstore.torch.save, Store.save, "
                          "save_arrays or DCP); `restore` writes its buffers")
    if not cat.tensors:
        raise ExportError(_nothing_to_export(cat, info))
    _check(cat, fmt, info)
    writer = {"safetensors": _write_safetensors, "pt": _write_pt, "npz": _write_npz}[fmt]
    skipped = dict(cat.skipped)
    values: dict = {}
    if fmt == "safetensors":
        values = dict(cat.values)
    else:
        skipped.update({k: f"value {v!r:.40} (kept only by safetensors)"
                        for k, v in cat.values.items()})
    buffers = _read_buffers(store, info, cat.tensors)
    data = [(e, _tensor_data(buffers, info, e, swap=fmt != "npz")) for e in cat.tensors]
    del buffers
    # without force a file created at path meanwhile is kept, never replaced
    writer(path, data, info, values, None if force else output_exists)
    return ExportResult(path, fmt, info.id, len(data), sum(len(d) for _, d in data), values,
                        skipped)


def _nothing_to_export(cat: Catalogue, info) -> str:
    """Why a checkpoint without a catalogued tensor exports nothing: the parts the catalogue
    skipped (a dtype it does not know...), by name and reason, or its plain values."""
    what = f"checkpoint {info.id} of stream {info.stream!r} holds no tensors or arrays to export"
    if not cat.skipped:
        return f"{what} ({len(cat.values)} plain value(s)); `snapstore show` lists them"
    shown = list(cat.skipped.items())[:5]
    more = f", and {len(cat.skipped) - len(shown)} more" if len(cat.skipped) > len(shown) else ""
    listed = "; ".join(f"{name} ({why})" for name, why in shown)
    return f"{what}; skipped: {listed}{more}; `snapstore show` lists them"


def _check(cat: Catalogue, fmt: str, info) -> None:
    """Refuses what the format cannot hold, before anything is read or written."""
    seen: set = set()
    for e in cat.tensors:
        if e.name in seen:
            raise ExportError(f"checkpoint {info.id}: two tensors are named {e.name!r}; "
                              "a flat file cannot hold both")
        seen.add(e.name)
        if cat.kind == "dcp" and "@" in e.name:
            raise ExportError(f"checkpoint {info.id}: {e.name} is one shard of a tensor saved "
                              "by several ranks; load it with torch.distributed.checkpoint")
        dtype = _native_name(e.dtype)
        if dtype in SUB_BYTE_INTS:     # catalogued, but no format holds them (nor torch.save)
            raise ExportError(f"{e.name} is {e.dtype}, which no export format holds (torch.save, "
                              "safetensors and NumPy lack torch's sub-byte integers): load it "
                              "with store.load or snapstore.torch.load")
        if fmt == "npz" and dtype in _NOT_NUMPY:
            raise ExportError(f"{e.name} is {e.dtype}, which NumPy has not: export to "
                              "safetensors or pt instead")
        if fmt == "safetensors" and dtype not in _SAFETENSORS_DTYPES:
            raise ExportError(f"{e.name} is {e.dtype}, which safetensors cannot hold: export "
                              "to " + ("npz" if dtype not in _TORCH_DTYPES else "pt"))
        if fmt == "pt" and dtype not in _TORCH_DTYPES:
            raise ExportError(f"{e.name} is {e.dtype}, which torch has not: export to npz")


def _native_name(dtype: str) -> str:
    """The catalogue name of a non-native byte order dtype (">f4") once swapped ("float32")."""
    if dtype[:1] != ">":
        return dtype
    kind, size = dtype[1:2], dtype[2:]
    base = {"f": "float", "i": "int", "u": "uint", "c": "complex"}.get(kind)
    return f"{base}{int(size) * 8}" if base and size.isdigit() else dtype


def _read_buffers(store, info, entries: list) -> dict:
    """{(checkpoint id, buffer name): its bytes} of every buffer the entries use, each read
    once, one restore per checkpoint (a read per tensor would decode the checkpoint's buffer
    table once per tensor)."""
    wanted: dict = {}
    for e in entries:
        if e.nbytes:
            cid = info.id if e.checkpoint is None else e.checkpoint
            wanted.setdefault(cid, set()).add(e.buffer)
    out = {}
    for cid, names in wanted.items():
        sizes = info.sizes if cid == info.id else store.get(cid).sizes
        targets = {n: bytearray(sizes[n]) for n in names}
        retry_moved(lambda: store.restore_into(cid, targets), f"exporting checkpoint {cid}")
        out.update({(cid, n): memoryview(b) for n, b in targets.items()})
    return out


def _tensor_data(buffers: dict, info, e: TensorEntry, swap: bool) -> bytes:
    """The entry's elements in C order (little-endian if swap; npz keeps the byte order)."""
    cid = info.id if e.checkpoint is None else e.checkpoint
    raw = bytes(buffers[(cid, e.buffer)][e.offset:e.offset + e.nbytes]) if e.nbytes else b""
    swap = swap and e.dtype[:1] == ">"
    if e.strides is None and not swap:
        return raw
    import numpy as np
    if e.strides is not None:
        item = e.itemsize
        view = np.frombuffer(raw, dtype=f"V{item}")
        raw = np.ascontiguousarray(np.lib.stride_tricks.as_strided(
            view, e.shape, [s * item for s in e.strides])).tobytes()
    if swap:
        raw = np.frombuffer(raw, dtype=e.dtype).astype(e.dtype.replace(">", "<")).tobytes()
    return raw


def _need(module: str, what: str):
    import importlib
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ExportError(f"exporting to {what} needs {module.split('.')[0]}: pip install "
                          f"'snapstore[export]'" + (" 'snapstore[torch]'" if module == "torch"
                                                     else "")) from None


def _write_safetensors(path: str, data: list, info, values: dict, refuse_existing) -> None:
    safetensors = _need("safetensors", "safetensors")
    spec_type = getattr(safetensors, "TensorSpec", None)
    if spec_type is None:
        raise ExportError("exporting to safetensors needs safetensors >= 0.8: pip install -U "
                          "safetensors")
    import ctypes
    specs, keep = {}, []
    for e, raw in data:
        buf = bytearray(raw) if raw else bytearray(1)
        keep.append(buf)
        address = ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf))
        specs[e.name] = spec_type(dtype=_native_name(e.dtype), shape=list(e.shape),
                                  data_ptr=address, data_len=len(raw))
    metadata = {"format": "pt", "snapstore.checkpoint": str(info.id),
                "snapstore.stream": info.stream,
                "snapstore.meta": json.dumps(info.meta, default=str),
                "snapstore.values": json.dumps(values, default=str)}
    blob = safetensors.serialize(specs, metadata=metadata)
    del keep
    replace_file(path, lambda f: f.write(blob), refuse_existing=refuse_existing)


def _write_pt(path: str, data: list, info, values: dict, refuse_existing) -> None:
    torch = _need("torch", "pt")
    out = {}
    for e, raw in data:
        dtype = getattr(torch, _native_name(e.dtype))
        if raw:
            t = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype)
            out[e.name] = t.reshape(e.shape)
        else:
            out[e.name] = torch.empty(e.shape, dtype=dtype)

    def fill(f) -> None:
        try:
            torch.save(out, f)
        except RuntimeError as exc:
            # torch reports a failed write (a full disk) as RuntimeError("enforce fail ...")
            # with the OSError as its context: the OSError it is (replace_file names the path)
            if isinstance(exc.__context__, OSError):
                raise exc.__context__ from None
            raise ExportError(f"torch.save could not write {path}: {exc}") from None
    replace_file(path, fill, refuse_existing=refuse_existing)


def _numpy_dtype(np, name: str):
    for prefix, code in (("bytes", "S"), ("str", "U"), ("void", "V")):
        if name.startswith(prefix) and name[len(prefix):].isdigit():
            return np.dtype(code + name[len(prefix):])
    return np.dtype(name)


def _write_npz(path: str, data: list, info, values: dict, refuse_existing) -> None:
    np = _need("numpy", "npz")

    def fill(f) -> None:
        with zipfile.ZipFile(f, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as z:
            for e, raw in data:
                a = np.frombuffer(raw, dtype=_numpy_dtype(np, e.dtype)).reshape(e.shape)
                with z.open(e.name + ".npy", "w", force_zip64=True) as member:
                    np.lib.format.write_array(member, a, allow_pickle=False)
    replace_file(path, fill, refuse_existing=refuse_existing)

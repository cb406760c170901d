"""Memory for restores: uninitialised buffers to restore into, and byte views of raw addresses.

Output memory: large results are built as bytes objects filled in place.

bytes(bytearray) would cost a second copy and twice the memory, and freshly allocated memory
pays a page fault per 4 KiB on first touch (~2.5 s per GiB on small VMs). So on CPython a
large result is allocated uninitialised (PyBytes_FromStringAndSize(NULL, n)), advised to use
transparent huge pages, filled through a writable view before anyone else sees it, and handed
out. Elsewhere it falls back to a bytearray and one copy.
"""
from __future__ import annotations

import ctypes
import sys

_IN_PLACE_MIN = 1 << 20
_MADV_HUGEPAGE = 14
_HUGE = 2 << 20

_CPYTHON = sys.implementation.name == "cpython"
if _CPYTHON:
    _new = ctypes.pythonapi.PyBytes_FromStringAndSize
    _new.restype = ctypes.py_object
    _new.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t)
    _new_bytearray = ctypes.pythonapi.PyByteArray_FromStringAndSize
    _new_bytearray.restype = ctypes.py_object
    _new_bytearray.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t)
    _DATA_OFFSET = bytes.__basicsize__ - 1      # offset of ob_sval in PyBytesObject
    try:
        _madvise = ctypes.CDLL(None, use_errno=True).madvise
        _madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    except (OSError, AttributeError):
        _madvise = None


def uninit_bytearray(n: int) -> bytearray:
    """A writable bytearray of n bytes, not zeroed (on CPython): for a restore that overwrites
    all of it."""
    if _CPYTHON and n:
        return _new_bytearray(None, n)
    return bytearray(n)


def address_view(address: int, n: int) -> memoryview:
    """A writable flat byte view of n bytes at address; whatever owns that memory must outlive
    the view."""
    if n == 0:
        return memoryview(bytearray())
    return memoryview((ctypes.c_ubyte * n).from_address(address)).cast("B")


class OutputBytes:
    """A bytes result under construction: fill .view, then take .finish() exactly once.

    A large result's memory is NOT initialised: it may hold bytes this process freed earlier
    (other data). The filler must write every byte before finish(); the restore path proves
    it will before it writes any (reader.restore_range: extents.check_fills) and raises
    CorruptionError otherwise, so an unfilled result is never handed out."""

    def __init__(self, size: int) -> None:
        if _CPYTHON and size >= _IN_PLACE_MIN:
            self._obj = _new(None, size)
            addr = id(self._obj) + _DATA_OFFSET
            if _madvise is not None:
                start = (addr + _HUGE - 1) & ~(_HUGE - 1)
                end = (addr + size) & ~(_HUGE - 1)
                if end > start:
                    _madvise(start, end - start, _MADV_HUGEPAGE)   # a hint; errors ignored
            self.view = address_view(addr, size)
        else:
            self._obj = bytearray(size)
            self.view = memoryview(self._obj)

    def finish(self) -> bytes:
        self.view.release()
        obj, self._obj = self._obj, None
        return obj if isinstance(obj, bytes) else bytes(obj)

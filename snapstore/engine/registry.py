"""One shared object per directory within the process, reference-counted.

Some things must exist at most once per directory in a process: an LMDB environment (LMDB
forbids opening one environment twice in a process: closing either would drop the other's
locks), or the Store that LangGraph savers opened by path share (one Store per store
directory and process: its savers share its log and caches). A SharedByPath hands out the object of a path, opening it on first use, and closes
it when its last user releases it.

Paths are compared as real paths: a symlink or a relative spelling of the same directory
shares its object. Opening, closing and the bookkeeping happen under one lock, so two threads
never open the same path twice, and an object is closed before anyone can open its path again.
A fork()ed child inherits the entries, but must not use what its parent opened (nor close it:
closing an LMDB environment in the child would release the parent's reader slots). So in the
child every SharedByPath forgets its entries (os.register_at_fork): the child's first acquire()
of a path opens its own object. The inherited objects are kept referenced, never closed.
"""
from __future__ import annotations

import os
import threading
import weakref
from typing import Any, Callable, Generic, TypeVar

__all__ = ["SharedByPath"]

T = TypeVar("T")

_REGISTRIES: "weakref.WeakSet[SharedByPath]" = weakref.WeakSet()
_INHERITED: list = []         # what a forked child's parent opened: kept, never closed


def _forget_inherited() -> None:
    """In a fork()ed child: every registry forgets the parent's objects."""
    for registry in list(_REGISTRIES):
        registry._after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_inherited)


class _Entry:
    __slots__ = ("obj", "users", "settings")

    def __init__(self, obj: Any, settings: Any) -> None:
        self.obj, self.users, self.settings = obj, 1, settings


class SharedByPath(Generic[T]):
    """The process's object of each path, shared by reference count (thread-safe).

    Args:
        close: closes an object once its last user released it.
        is_alive: optional; False for a held object that can no longer be used (closed by
            someone else): the next acquire() of its path opens a new one.
        is_current: optional; False for a held object that still works but is outdated (the
            files it opened were replaced): the next acquire() of its path opens a new one,
            and the old one stays with its holders until the last of them releases it, which
            closes it.
    """

    def __init__(self, close: Callable[[T], None], *,
                 is_alive: Callable[[T], bool] | None = None,
                 is_current: Callable[[T], bool] | None = None) -> None:
        self._close = close
        self._is_alive = is_alive
        self._is_current = is_current
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}
        # outdated entries still held: id(entry) -> (path, entry)
        self._retired: dict[int, tuple[str, _Entry]] = {}
        _REGISTRIES.add(self)

    def _after_fork_in_child(self) -> None:
        # A new lock: a thread of the parent may have held the old one when it forked.
        self._lock = threading.Lock()
        _INHERITED.extend(e.obj for e in self._entries.values())
        _INHERITED.extend(e.obj for _, e in self._retired.values())
        self._entries = {}
        self._retired = {}

    def acquire(self, path, open_object: Callable[[str], T], *, settings: Any = None,
                admit: Callable[[Any], None] | None = None) -> T:
        """The object of path, with one more user.

        On first use (or when the held object is no longer alive, or not current)
        open_object(real path) opens it, remembered with settings; if it raises, nothing is held. Otherwise
        admit(settings of the first acquire) may raise to refuse sharing: nothing changes.
        """
        key = os.path.realpath(os.fspath(path))
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and self._is_alive is not None \
                    and not self._is_alive(entry.obj):
                del self._entries[key]          # its holders' release() will find nothing
                entry = None
            if entry is not None and self._is_current is not None \
                    and not self._is_current(entry.obj):
                del self._entries[key]          # closed by its holders' last release()
                self._retired[id(entry)] = (key, entry)
                entry = None
            if entry is None:
                obj = open_object(key)
                self._entries[key] = _Entry(obj, settings)
                return obj
            if admit is not None:
                admit(entry.settings)
            entry.users += 1
            return entry.obj

    def release(self, obj: T) -> None:
        """One user less for obj (found by identity, also among the outdated ones); at the
        last one it is forgotten, then closed. An object not held (released already, or
        replaced after it died) is ignored."""
        with self._lock:
            found = self._holding(obj)
            if found is None:
                return
            table, slot, entry = found
            entry.users -= 1
            if entry.users == 0:
                del table[slot]
                self._close(obj)

    def _holding(self, obj: T) -> tuple[dict, Any, _Entry] | None:
        """(the table holding obj, its slot there, its entry), or None (lock held)."""
        for key, entry in self._entries.items():
            if entry.obj is obj:
                return self._entries, key, entry
        for slot, (_, entry) in self._retired.items():
            if entry.obj is obj:
                return self._retired, slot, entry
        return None

    def users(self, path) -> int:
        """How many users the objects of path have, outdated ones included (0: none is
        open)."""
        key = os.path.realpath(os.fspath(path))
        with self._lock:
            entry = self._entries.get(key)
            return (entry.users if entry is not None else 0) + \
                sum(e.users for k, e in self._retired.values() if k == key)

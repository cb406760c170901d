"""Dirty-page detectors: which byte ranges of a buffer may have changed since the last look.

One Detector per tracked buffer (make_detector). Modes:

  "uffd"    the kernel records writes: userfaultfd write-protection in asynchronous mode
            (UFFD_FEATURE_WP_ASYNC: a write to a protected page just clears its protection, no
            event, no thread) plus the PAGEMAP_SCAN ioctl on /proc/self/pagemap, which returns
            the pages written since the last scan and re-protects them in the same page-table
            walk (csrc/uffd.c). dirty() costs a page-table walk plus the written pages, not a
            pass over the data. Only whole system pages inside the buffer are protected; the
            partly covered pages at its start and end (a buffer need not be page aligned) are
            compared every time. When the buffer does not start on a system page (numpy's
            malloc'ed data sits 16 bytes into one) or page_size is not a multiple of it, each
            written system page straddles two page_size pages: those candidates are hashed
            against fingerprints (C snap_fp_diff_runs) and only the changed ones reported, so
            the caller stores the changed pages, not twice as many.
  "hash"    XXH3-128 fingerprint of every page_size page kept in the detector; dirty() hashes
            the whole buffer (C snap_fp_diff), except after a dense interval: then it reports
            the whole buffer without a pass, and the fingerprints of the caller's copy tell
            what changed (noted_changes(); see _Hash).
  "shadow"  a full copy of the buffer; dirty() compares exactly (C snap_shadow_diff).
  "full"    no tracking: every dirty() reports the whole buffer.
  "auto"    "uffd" where the kernel supports it for that memory, else "hash"; Detector.reason
            says which and why.

"uffd" needs private, writable, anonymous memory (numpy arrays, bytearrays, MAP_PRIVATE |
MAP_ANONYMOUS mmaps). Anything else falls back to "hash" under "auto" (and raises
TrackingUnavailableError when "uffd" is asked for explicitly): file-backed mappings (the file
can change through write(2) or other processes without a fault here), shared mappings
(MAP_SHARED, including Python's mmap.mmap(-1, n): another process may write them),
read-only buffers, hugetlbfs, memory already tracked by another detector (overlapping
views), or registration failing for any other reason.

Protocol (what the Tracker does):
  ranges = det.dirty()      None the first time and whenever the detector cannot vouch for the
                            whole buffer (after fork(), after a failed scan): diff in full.
                            Otherwise byte ranges (offset, length), ascending, non-overlapping,
                            on the detector's page_size grid (the last clipped to the buffer's
                            end), containing every byte changed since the previous dirty().
  copy the bytes, then det.note_stored(offset, copied_bytes) for every stored range (also after
  a full diff), or det.note_stored_many(ranges, gathered_bytes) once (same effect, far fewer
  Python calls for thousands of scattered pages): hash/shadow detectors take their new
  baseline from the copy, not the live buffer, so a page written between dirty() and the copy
  and later reverted is still reported. After each dirty() a hash/shadow/edge/refinement
  baseline is the live content at that call, corrected by note_stored; pages the kernel tracks
  need no baseline (it records writes, not contents). A failed checkpoint needs nothing: the
  caller diffs in full next time anyway (dirty()'s result is then ignored).

Process-wide state: one userfaultfd and one /proc/self/pagemap descriptor per process, shared
by all detectors (each registers and scans only its own page range; overlapping ranges are
refused, so detectors never steal each other's written bits). After fork() the inherited
descriptors still refer to the PARENT's memory (a scan through them would re-protect the
parent's pages), so the child closes them (os.register_at_fork) and every detector in the child
returns None from its next dirty(); a child's uffd detector then registers its range again with
the child's own userfaultfd (or, failing that, becomes a hash detector). The parent is not
affected: its registrations and written bits survive the fork (a write after fork() to a
copy-on-write page is recorded like any other).

Kernel behaviour relied on (checked by tests/unit/test_dirty.py on Linux 6.18): a write to a
protected transparent huge page splits it and is recorded per base page; MADV_DONTNEED of a
tracked page reports it written; writes by the kernel itself (read(2) into the buffer) are
recorded (async mode never delivers a fault, so UFFD_USER_MODE_ONLY does not interfere).
Not recorded: writes that never touch the page tables, into pages pinned for long-term use
(io_uring registered buffers and IORING_OP_READ_FIXED, RDMA, a device's DMA into pinned host
memory): the kernel or the device writes the physical page, no write-protect fault happens,
and the checkpoint keeps the old bytes (a helper's review reproduced it with io_uring). The
kernel tells no one which pages are pinned, so uffd cannot refuse such memory: the README
says to track it with mode "hash" (or "shadow").
"""
from __future__ import annotations

import errno
import mmap
import os
import sys
import threading
import weakref
from typing import List, Optional, Tuple

from snapstore import _native as nat
from snapstore.errors import InvalidArgumentError, NativeSystemError, TrackingUnavailableError
from snapstore.interrupts import deferred_interrupts

__all__ = ["Detector", "make_detector", "uffd_available", "MODES", "SYS_PAGE"]

MODES = ("auto", "uffd", "hash", "shadow", "full")
SYS_PAGE: int = os.sysconf("SC_PAGE_SIZE")

Ranges = List[Tuple[int, int]]
_FP = nat.FP_BYTES
# A "hash" detector of at least DENSE_MIN_BYTES whose last interval changed at least
# DENSE_FRACTION of its pages reports the whole buffer next time without hashing it first
# (dense state: every weight moves). Smaller buffers are always hashed: it costs little.
DENSE_FRACTION = 0.5
DENSE_MIN_BYTES = 1 << 20


# ---- process-wide kernel state -------------------------------------------------------------
class _Registration:
    """One registered page range [start, end). Shared by a detector and its finalizer (which
    must not reference the detector)."""

    __slots__ = ("start", "end", "pid", "active")

    def __init__(self, start: int, end: int) -> None:
        self.start, self.end, self.pid, self.active = start, end, os.getpid(), True


class _Kernel:
    """The process's userfaultfd, /proc/self/pagemap descriptor and registered ranges."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pid = os.getpid()
        self.uffd = -1
        self.pagemap = -1
        self.status: Optional[Tuple[bool, str]] = None
        self.regs: List[_Registration] = []

    # -- availability
    def _check_pid(self) -> None:
        """A fork that bypassed os.register_at_fork (a C-level fork()): the descriptors still
        refer to the parent's memory; never use them here."""
        if self.pid != os.getpid():
            self.after_fork_in_child()

    def available(self) -> Tuple[bool, str]:
        self._check_pid()
        with self.lock:
            if self.status is None:
                # A few syscalls on 4 pages, never a wait. Ctrl-C inside it left the test's
                # mapping exported (mmap.close raised BufferError in place of the
                # KeyboardInterrupt) and its descriptors open: it lands after it instead.
                with deferred_interrupts():
                    self.status = self._probe()
            return self.status

    def _probe(self) -> Tuple[bool, str]:
        if not sys.platform.startswith("linux"):
            return False, f"userfaultfd is Linux-only (platform {sys.platform})"
        try:
            fd, _features, umo = nat.uffd_open()
        except NativeSystemError as e:
            why = {errno.EPERM: "userfaultfd(2) refused (EPERM): vm.unprivileged_userfaultfd is 0 "
                                "and the kernel lacks UFFD_USER_MODE_ONLY",
                   errno.ENOSYS: "kernel built without userfaultfd (ENOSYS)",
                   errno.EOPNOTSUPP: "kernel lacks UFFD_FEATURE_WP_ASYNC / WP_UNPOPULATED "
                                     "(needs Linux >= 6.7)",
                   errno.EINVAL: "kernel refused UFFD_FEATURE_WP_ASYNC / WP_UNPOPULATED "
                                 "(needs Linux >= 6.7)"}.get(e.errno)
            return False, why or f"userfaultfd unavailable: {e}"
        try:
            pm = os.open("/proc/self/pagemap", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            os.close(fd)
            return False, f"cannot open /proc/self/pagemap: {e.strerror}"
        problem = self._self_test(fd, pm)
        if problem:
            os.close(fd)
            os.close(pm)
            return False, problem
        self.uffd, self.pagemap = fd, pm
        return True, ("userfaultfd async write-protect + PAGEMAP_SCAN work here "
                      f"({os.uname().release}{', user-mode-only uffd' if umo else ''})")

    @staticmethod
    def _self_test(fd: int, pm: int) -> Optional[str]:
        """Register 4 private anonymous pages, write one, scan: exactly that page must come back."""
        m = mmap.mmap(-1, 4 * SYS_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        try:
            addr = nat.buffer_address(m)
            try:
                nat.uffd_register(fd, addr, 4 * SYS_PAGE)
            except NativeSystemError as e:
                return f"userfaultfd write-protect registration failed ({e.strerror})"
            try:
                m[SYS_PAGE + 5] = 1
                try:
                    got, _ = nat.pagemap_scan(pm, addr, addr + 4 * SYS_PAGE)
                except NativeSystemError as e:
                    if e.errno in (errno.ENOTTY, errno.EINVAL):
                        return "PAGEMAP_SCAN ioctl not supported (needs Linux >= 6.7)"
                    return f"PAGEMAP_SCAN failed ({e.strerror})"
                again, _ = nat.pagemap_scan(pm, addr, addr + 4 * SYS_PAGE)
                pages = [(s - addr, e - addr) for s, e, _f in got]
                if pages != [(SYS_PAGE, 2 * SYS_PAGE)] or again:
                    return f"PAGEMAP_SCAN self-test gave wrong pages: {got}, then {again}"
            finally:
                nat.uffd_unregister(fd, addr, 4 * SYS_PAGE)
        finally:
            m.close()
        return None

    # -- registrations
    def register(self, start: int, end: int) -> _Registration:
        """Register and protect [start, end). Raises _Refused with a reason."""
        ok, why = self.available()             # (also drops a forked parent's descriptors)
        if not ok:
            raise _Refused(why)
        with self.lock:
            for r in self.regs:
                if r.active and r.start < end and start < r.end:
                    raise _Refused("its pages overlap memory already tracked by another "
                                   "detector (overlapping views of one buffer)")
            try:
                problem = _mapping_problem(start, end)
            except OSError as e:
                problem = f"cannot read /proc/self/maps ({e.strerror})"
            if problem:
                raise _Refused(problem)
            try:
                nat.uffd_register(self.uffd, start, end - start)
            except NativeSystemError as e:
                raise _Refused(f"userfaultfd registration failed ({e.strerror})") from None
            reg = _Registration(start, end)
            self.regs.append(reg)
            return reg

    def unregister(self, reg: _Registration) -> None:
        """Remove protection and registration (no system call in a forked child)."""
        with self.lock:
            if not reg.active:
                return
            reg.active = False
            if reg in self.regs:
                self.regs.remove(reg)
            if reg.pid != os.getpid() or self.uffd < 0:
                return
            try:
                nat.uffd_unregister(self.uffd, reg.start, reg.end - reg.start)
            except NativeSystemError:
                pass   # the memory is gone or was never registered: nothing left to undo

    def scan(self, reg: _Registration) -> List[Tuple[int, int, int]]:
        """Written ranges (start, end, flags) of reg since the last scan; re-protects them."""
        if reg.pid != os.getpid() or not reg.active:
            raise NativeSystemError("scan: the registration belongs to another process",
                                    function="snap_pagemap_scan", code=-4, errno_=errno.EPERM)
        out: List[Tuple[int, int, int]] = []
        cur = reg.start
        while cur < reg.end:
            got, cur = nat.pagemap_scan(self.pagemap, cur, reg.end)
            out.extend(got)
        return out

    def after_fork_in_child(self) -> None:
        """The inherited descriptors refer to the parent's memory: close them, forget all."""
        for fd in (self.uffd, self.pagemap):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        for r in self.regs:
            r.active = False
        self.__init__()


class _Refused(Exception):
    """uffd cannot track this memory; the message says why."""


_KERNEL = _Kernel()


def uffd_available() -> Tuple[bool, str]:
    """(True, description) if userfaultfd async write-protect + PAGEMAP_SCAN work in this
    process (probed once: a 4-page self-test), else (False, reason)."""
    return _KERNEL.available()


def _mapping_problem(start: int, end: int) -> Optional[str]:
    """Why [start, end) is not private writable anonymous memory (/proc/self/maps); None if it is."""
    cur = start
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(None, 5)
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            if hi <= cur:
                continue
            if lo >= end:
                break
            if lo > cur:
                return "part of the buffer is not mapped"
            perms, inode = fields[1], fields[4]
            path = fields[5].strip() if len(fields) > 5 else ""
            if "w" not in perms:
                return f"read-only mapping ({perms})"
            if "hugepage" in path or "hugetlb" in path:
                return f"hugetlbfs mapping ({path})"
            anon_shared = path.startswith(("/dev/zero", "/memfd:", "/SYSV")) or not path
            if inode != "0" and not anon_shared:
                return (f"file-backed mapping of {path or 'inode ' + inode}: the file can "
                        "change (write(2), other processes) without a write through this "
                        "mapping")
            if perms[3] == "s":
                return (f"shared mapping ({path or 'MAP_SHARED anonymous'}): another process "
                        "can write it without the kernel telling this one")
            if inode != "0" or (path and not (path == "[heap]" or path.startswith("[anon:"))):
                return (f"special mapping ({path or 'inode ' + inode}): not plain private "
                        "anonymous memory")
            cur = hi
            if cur >= end:
                return None
    return "part of the buffer is not mapped"


# ---- detector strategies ----------------------------------------------------------------------
def _align(ranges: Ranges, n: int, ps: int) -> Ranges:
    """Widen sorted byte ranges to the ps grid (clipped to n); merge overlapping/adjacent ones."""
    out: Ranges = []
    for off, length in ranges:
        lo = off // ps * ps
        hi = min(n, -(-(off + length) // ps) * ps)
        if hi <= lo:
            continue
        if out and lo <= out[-1][0] + out[-1][1]:
            plo, plen = out[-1]
            out[-1] = (plo, max(plo + plen, hi) - plo)
        else:
            out.append((lo, hi - lo))
    return out


def _changed_digests(old, new) -> List[Tuple[int, int]]:
    """Runs (first, count) of the digests that differ between two equal-length digest
    arrays."""
    runs, _ = nat.diff_bytes(old, new, gap=_FP)    # bytes of one digest lie < _FP apart
    return [(off // _FP, -(-(off + length) // _FP) - off // _FP) for off, length in runs]


def _runs_ranges(runs, n: int, ps: int) -> Ranges:
    """Page runs (first, count) -> byte ranges on the ps grid, the last clipped to n."""
    return [(f * ps, min((f + c) * ps, n) - f * ps) for f, c in runs]


class _Full:
    mode = "full"
    wants_fingerprints = False      # note_many() uses page fingerprints of the stored bytes

    def __init__(self, view: memoryview, ps: int) -> None:
        self.n = len(view)

    def arm(self, view: memoryview) -> None:
        pass

    def diff(self, view: memoryview, may_skip: bool = True) -> Ranges:
        return [(0, self.n)] if self.n else []

    def note(self, offset: int, data: memoryview) -> None:
        pass

    def note_many(self, ranges, data: memoryview, digests=None) -> None:
        """note() for each range; data holds their bytes back to back (digests: their page
        fingerprints, if the caller has them; only _Hash uses them)."""
        pos = 0
        for off, length in ranges:
            if length:
                self.note(off, data[pos:pos + length])
            pos += length

    def noted_changes(self) -> Optional[Ranges]:
        return None

    def note_store_holds(self, fingerprints) -> None:
        """Detector.note_store_holds (fingerprints: a page_size fingerprint per page)."""

    def stored_fingerprints(self) -> Optional[bytes]:
        """Detector.stored_fingerprints: only _Hash keeps them."""
        return None

    def close(self) -> None:
        pass

    def after_fork(self) -> None:
        pass


class _Hash(_Full):
    """Fingerprints of the caller's stored content (live content at the last dirty(),
    corrected by note_stored).

    Dense intervals skip the pass: when at least DENSE_FRACTION of the pages changed in the
    last interval, diff() reports the whole buffer without hashing it (it would report about
    that anyway), and the caller's copy is hashed as it is made, as always. note_many() then
    compares those fingerprints with the old ones, so the next diff() knows whether the
    buffer is still dense; one sparse interval after dense ones costs one copy of the whole
    buffer, not a wrong answer (reporting more than changed is always allowed). Only whole
    pages noted with their fingerprints (note_many, what the engine's capture does) count as
    evidence; without it the next diff() hashes again."""
    mode = "hash"
    wants_fingerprints = True

    def __init__(self, view: memoryview, ps: int) -> None:
        self.n, self.ps = len(view), ps
        self.table: Optional[nat.PageFingerprints] = None
        self.forced: set = set()       # pages note_stored covered only partly: report them
        self.dense = False             # the last interval changed DENSE_FRACTION of pages
        self.noted_changed: Optional[int] = None   # after a skipped pass: changed pages noted
        self.noted_runs: list = []                 # ... their runs (first page, count)
        self.noted_pages = 0                       # ... and how many pages were noted

    def arm(self, view: memoryview) -> None:
        self.table = nat.PageFingerprints(view, self.ps)
        self.forced.clear()
        self.dense, self.noted_changed = False, None

    def diff(self, view: memoryview, may_skip: bool = True) -> Ranges:
        pages = nat.page_count(self.n, self.ps)
        if self.noted_changed is not None:           # the last pass was skipped
            self.dense = self.noted_changed >= DENSE_FRACTION * pages
            self.noted_changed = None
        if self.dense and may_skip and pages:
            # pages noted only partly before are changed whatever their digests say
            self.noted_runs = [(p, 1) for p in sorted(self.forced)]
            self.forced.clear()
            self.noted_changed, self.noted_pages = 0, 0
            return [(0, self.n)]
        runs = self.table.diff(view)
        self.dense = self.n >= DENSE_MIN_BYTES and \
            sum(c for _, c in runs) >= DENSE_FRACTION * pages
        ranges = _runs_ranges(runs, self.n, self.ps)
        if self.forced:
            extra = [(p * self.ps, self.ps) for p in sorted(self.forced)]
            self.forced.clear()
            ranges = _align(sorted(ranges + extra), self.n, self.ps)
        return ranges

    def note(self, offset: int, data: memoryview) -> None:
        ps, n = self.ps, self.n
        end = offset + len(data)
        if not offset % ps and (not end % ps or end == n):     # whole pages: the usual case
            first = offset // ps
            self.table.update(first, data)
            if self.forced:
                self.forced.difference_update(range(first, -(-end // ps)))
            return
        first = -(-offset // ps)                            # first page wholly covered
        last = -(-n // ps) if end == n else end // ps       # end of the wholly covered pages
        if offset % ps:                                     # partly covered: report next time
            self.forced.add(offset // ps)
        if end != n and end % ps:
            self.forced.add(end // ps)
        if last <= first:
            return
        lo, hi = first * ps - offset, min(last * ps, n) - offset
        self.table.update(first, data if lo == 0 and hi == len(data) else data[lo:hi])
        if self.forced:
            self.forced.difference_update(range(first, last))


    def note_many(self, ranges, data: memoryview, digests=None) -> None:
        ps, n = self.ps, self.n
        pos = 0
        spans = []                                   # (first page, pages, position in data)
        for off, length in ranges:
            end = off + length
            if off % ps or (end % ps and end != n) or (pos % ps and length):
                return _Full.note_many(self, ranges, data)   # not whole pages: one by one
            if length:
                spans.append((off // ps, -(-length // ps), pos))
            pos += length
        if not spans:
            return
        if digests is None:                           # page j of data = page j of the ranges
            digests = nat.page_fingerprints(data, ps)
        fps = self.table.digests
        if self.noted_changed is not None:           # one comparison of all the spans
            runs = _changed_digests(
                b"".join(fps[f * _FP:(f + c) * _FP] for f, c, _ in spans),
                b"".join(digests[at // ps * _FP:(at // ps + c) * _FP] for _, c, at in spans))
            start = spans[0][0]
            if all(f + c == g for (f, c, _), (g, _, _) in zip(spans, spans[1:])):
                runs = [(start + first, count) for first, count in runs]    # one page run
            else:                                    # digest k of the joined spans -> page
                pages = [f + k for f, c, _ in spans for k in range(c)]
                runs = [(pages[i], 1) for first, count in runs
                        for i in range(first, first + count)]      # noted_changes() merges
            self.noted_runs += runs
            self.noted_changed += sum(count for _, count in runs)
            self.noted_pages += sum(c for _, c, _ in spans)
        for first, count, at in spans:
            a = at // ps * _FP
            fps[first * _FP:(first + count) * _FP] = digests[a:a + count * _FP]
        if self.forced:
            for first, count, _ in spans:
                self.forced.difference_update(range(first, first + count))

    def noted_changes(self) -> Optional[Ranges]:
        """The byte ranges the copy noted since a skipped pass changed, once it noted every
        page of the buffer (exactly once: what one capture does); else None. Pages noted only
        partly before the skip are among them, merged as diff() merges them."""
        if self.noted_changed is None or self.noted_pages != nat.page_count(self.n, self.ps):
            return None
        return _align(sorted(_runs_ranges(self.noted_runs, self.n, self.ps)), self.n, self.ps)

    def note_store_holds(self, fingerprints) -> None:
        self.table.digests[:] = fingerprints

    def stored_fingerprints(self) -> Optional[bytes]:
        # a page noted only partly holds the digest of the live page at diff(), not of what
        # was stored: then no page's digest is handed out
        if self.table is None or self.forced:
            return None
        return bytes(self.table.digests)


class _Shadow(_Full):
    """A copy of the caller's stored content (live content at the last dirty(), corrected by
    note_stored)."""
    mode = "shadow"

    def __init__(self, view: memoryview, ps: int) -> None:
        self.n, self.ps = len(view), ps
        self.shadow = bytearray()
        self.forced: set = set()       # pages whose shadow may differ from what is stored

    def arm(self, view: memoryview) -> None:
        self.shadow = bytearray(view)
        self.forced.clear()

    def diff(self, view: memoryview, may_skip: bool = True) -> Ranges:
        runs = nat.shadow_diff(view, self.shadow, self.ps)
        ranges = _runs_ranges(runs, self.n, self.ps)
        if self.forced:
            extra = [(p * self.ps, min(self.ps, self.n - p * self.ps)) for p in self.forced]
            self.forced.clear()
            ranges = _align(sorted(ranges + extra), self.n, self.ps)
        return ranges

    def note(self, offset: int, data: memoryview) -> None:
        self.shadow[offset:offset + len(data)] = data
        ps = self.ps
        if self.forced and not offset % ps:
            end = offset + len(data)
            last = -(-end // ps) if end == self.n else end // ps
            self.forced.difference_update(range(offset // ps, last))

    def note_store_holds(self, fingerprints) -> None:
        # the pages the shadow has otherwise than the store: reported until noted
        mine = nat.page_fingerprints(self.shadow, self.ps)
        for first, count in _changed_digests(mine, fingerprints):
            self.forced.update(range(first, first + count))


class _Uffd(_Full):
    """Kernel-recorded writes for the whole system pages inside the buffer.

    Two variants, chosen by alignment:
      exact grid  the buffer starts on a system page and page_size is a multiple of it: a
                  written system page is reported as the grid page(s) holding it; the partly
                  covered page at the end (if any) is compared against a copy (baseline as for
                  _Shadow);
      refined     otherwise (a numpy array's data usually starts 16 bytes into a page, so each
                  system page straddles two grid pages): the grid pages overlapping written
                  system pages, plus those overlapping the partly covered edges, are hashed and
                  compared against fingerprints (baseline as for _Hash); only the changed ones
                  are reported, instead of both neighbours of every written page.
    """
    mode = "uffd"

    def __init__(self, view: memoryview, ps: int) -> None:
        self.n, self.ps = len(view), ps
        self.base = 0
        if self.n:
            self.base = nat.buffer_address(view)
        start = -(-self.base // SYS_PAGE) * SYS_PAGE
        end = (self.base + self.n) // SYS_PAGE * SYS_PAGE
        self.pages = (start, end) if start < end else None
        if self.pages:
            edges = [(0, start - self.base), (end - self.base, self.n)]
        else:
            edges = [(0, self.n)]
        self.edges = [(lo, hi) for lo, hi in edges if hi > lo]
        self.refine = bool(self.pages) and (self.base % SYS_PAGE != 0 or ps % SYS_PAGE != 0)
        self.fp: Optional[_Hash] = _Hash(view, ps) if self.refine else None
        self.copies = [] if self.refine else [bytearray(hi - lo) for lo, hi in self.edges]
        self.edges_forced = False      # report the edges next time, whatever the copies say
        self.reg: Optional[_Registration] = None
        self._finalizer = None
        self.register()

    def register(self) -> None:
        """Register the whole pages (raises _Refused); a finalizer unregisters if never closed."""
        if self.pages:
            self.reg = _KERNEL.register(*self.pages)
            self._finalizer = weakref.finalize(self, _KERNEL.unregister, self.reg)

    def arm(self, view: memoryview) -> None:
        if self.reg is not None:
            _KERNEL.scan(self.reg)          # forget writes so far: re-protect everything
        if self.fp is not None:
            self.fp.arm(view)
        self.edges_forced = False
        for (lo, hi), copy in zip(self.edges, self.copies):
            copy[:] = view[lo:hi]

    def diff(self, view: memoryview, may_skip: bool = True) -> Ranges:
        scanned = _KERNEL.scan(self.reg) if self.reg is not None else []
        if self.fp is not None:
            return self._refined(view, scanned)
        base = self.base
        written = [(s - base, e - s) for s, e, _flags in scanned]
        ps = self.ps
        forced, self.edges_forced = self.edges_forced, False
        for (lo, hi), copy in zip(self.edges, self.copies):
            if forced:
                written.append((lo, hi - lo))
                copy[:] = view[lo:hi]
            elif view[lo:hi] != copy:
                g = lo                       # report just the grid pages that differ
                while g < hi:
                    nxt = min(hi, (g // ps + 1) * ps)
                    if view[g:nxt] != copy[g - lo:nxt - lo]:
                        written.append((g, nxt - g))
                    g = nxt
                copy[:] = view[lo:hi]
        written.sort()
        return _align(written, self.n, self.ps)

    def _refined(self, view: memoryview, scanned) -> Ranges:
        ps, fp, base, n = self.ps, self.fp, self.base, self.n
        # candidate grid pages [first, end): edges (always) + those holding written system pages
        pairs = [(lo // ps, -(-hi // ps)) for lo, hi in self.edges if lo == 0]
        pairs += [((s - base) // ps, (e - base - 1) // ps + 1) for s, e, _flags in scanned]
        pairs += [(lo // ps, -(-hi // ps)) for lo, hi in self.edges if lo != 0]
        runs: List[Tuple[int, int]] = []
        cf = ce = -1
        for f, e in pairs:                   # ascending: merge overlapping / adjacent
            if f <= ce:
                if e > ce:
                    ce = e
            else:
                if ce >= 0:
                    runs.append((cf, ce - cf))
                cf, ce = f, e
        if ce >= 0:
            runs.append((cf, ce - cf))
        ranges = _runs_ranges(fp.table.diff_runs(view, runs), n, ps) if runs else []
        if fp.forced:
            ranges = _align(sorted(ranges + [(p * ps, ps) for p in fp.forced]), n, ps)
            fp.forced.clear()
        return ranges

    def note_store_holds(self, fingerprints) -> None:
        if self.fp is not None:
            self.fp.note_store_holds(fingerprints)
        else:
            # the kernel reports every page written since arm(), whatever its content; only
            # the edge copies compare content: the edges are reported next time
            self.edges_forced = True

    def note(self, offset: int, data: memoryview) -> None:
        if self.fp is not None:
            self.fp.note(offset, data)
            return
        end = offset + len(data)
        for (lo, hi), copy in zip(self.edges, self.copies):
            a, b = max(lo, offset), min(hi, end)
            if a < b:
                copy[a - lo:b - lo] = data[a - offset:b - offset]

    @property
    def wants_fingerprints(self) -> bool:
        return self.fp is not None

    def note_many(self, ranges, data: memoryview, digests=None) -> None:
        if self.fp is not None:
            self.fp.note_many(ranges, data, digests)
        elif self.edges:
            _Full.note_many(self, ranges, data)

    def close(self) -> None:
        if self._finalizer is not None:
            self._finalizer()               # unregisters once (idempotent)

    def after_fork(self) -> None:
        """In a forked child: the registration belonged to the parent's userfaultfd."""
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        self.reg = None


# ---- the public detector ------------------------------------------------------------------------
_LIVE: "weakref.WeakSet[Detector]" = weakref.WeakSet()


class Detector:
    """Finds the byte ranges of one buffer that may have changed since the previous dirty().

    mode: "uffd" | "hash" | "shadow" | "full" (what is in use now); reason: why this mode.
    Thread-safe (calls are serialised). Holds an export of the buffer until close() (or
    detach()), so the buffer cannot be resized or freed meanwhile (bytearray resize /
    mmap.close raise BufferError in the caller).
    """

    def __init__(self, view: memoryview, impl, page_size: int, reason: str) -> None:
        self._view: Optional[memoryview] = view     # None while detached
        self._n = len(view)
        self._address = nat.buffer_address(view) if len(view) else 0
        self._impl = impl
        self.page_size = page_size
        self.reason = reason
        self._lock = threading.Lock()
        self._armed = False
        self._closed = False
        self._pid = os.getpid()
        _LIVE.add(self)

    @property
    def mode(self) -> str:
        return self._impl.mode

    @property
    def nbytes(self) -> int:
        return self._n if not self._closed else 0

    def dirty(self, may_skip: bool = True) -> Optional[Ranges]:
        """Byte ranges (offset, length), ascending, non-overlapping, on the page_size grid (the
        last clipped to the buffer's end), that may have changed since the previous call; they
        contain every changed byte. None (first call, after fork(), after a failed kernel scan):
        cannot vouch for the buffer, diff it in full. Each call starts a new interval.

        may_skip: a "hash" detector may report the whole buffer without hashing it when its
        last interval was dense (see _Hash); pass False when the caller cannot copy the whole
        buffer before storing it (noted_changes() then has nothing to narrow it with)."""
        with self._lock:
            if self._closed:
                raise InvalidArgumentError("dirty(): the detector is closed")
            if self._view is None:
                raise InvalidArgumentError("dirty(): the detector is detached; attach() first")
            if self._pid != os.getpid():
                self._forked()
            if self._armed:
                try:
                    return self._impl.diff(self._view, may_skip)
                except NativeSystemError as e:
                    self.reason += f"; a kernel scan failed ({e.strerror}): diffed in full once"
            self._arm()
            return None

    def note_stored(self, offset: int, data) -> None:
        """The caller stored `data` as the content of [offset, offset + len(data)), copied after
        dirty() returned: hash/shadow baselines (and uffd edge copies) take these bytes."""
        data = nat.byte_view(data, name="data")
        with self._lock:
            if self._closed:
                return
            if offset < 0 or offset + len(data) > self._n:
                raise InvalidArgumentError(
                    f"note_stored: [{offset}, {offset + len(data)}) is outside the buffer of "
                    f"{self._n} bytes")
            if self._armed and len(data):      # (in a forked child: re-armed by dirty() anyway)
                self._impl.note(offset, data)

    def noted_changes(self) -> Optional[Ranges]:
        """After a dirty() that reported the whole buffer without a pass (a dense interval) and
        note_stored_many() of the copy: the byte ranges (page grid, ascending) whose copied
        bytes differ from the detector's baseline, i.e. what really changed. None otherwise
        (the last dirty() hashed, so its report is exact already; or nothing was noted)."""
        with self._lock:
            return None if self._closed else self._impl.noted_changes()

    def note_store_holds(self, fingerprints) -> None:
        """After a capture that diffed the buffer against what the store holds (the stream
        head's page fingerprints: its first capture, or the one after a failure) instead of
        trusting dirty(): fingerprints are the buffer's page fingerprints (at page_size) as
        that diff read it, which for every page it does not store are what the store holds.
        The baseline is corrected from them, so the next dirty() reports every page whose
        content may differ from what the store holds: a page written between dirty() and
        that diff and back again would otherwise match the baseline dirty() took, and never
        be stored. Call it before note_stored_many() of the capture's copy (which corrects
        the pages it stores)."""
        fingerprints = nat.as_bytes_view(fingerprints, name="fingerprints")
        want = nat.FP_BYTES * nat.page_count(self._n, self.page_size)
        if len(fingerprints) != want:
            raise InvalidArgumentError(
                f"note_store_holds: fingerprints holds {len(fingerprints)} bytes; the buffer "
                f"of {self._n} bytes has {want // nat.FP_BYTES} pages of {self.page_size} "
                "bytes")
        with self._lock:
            if self._closed or not self._armed or self._pid != os.getpid():
                return                      # not armed: the next dirty() diffs in full
            self._impl.note_store_holds(fingerprints)

    def stored_fingerprints(self) -> Optional[bytes]:
        """The page fingerprints (at page_size) of what the caller stored, page for page:
        after the captures whose note_stored calls it was given all landed in the store,
        the fingerprints of that checkpoint's buffer, which a plain checkpoint can diff
        against instead of storing the buffer full. None when the detector cannot vouch for
        every page (not a hash detector, not armed, closed, in a forked child, or a page
        noted only partly)."""
        with self._lock:
            if self._closed or not self._armed or self._pid != os.getpid():
                return None
            return self._impl.stored_fingerprints()

    @property
    def wants_fingerprints(self) -> bool:
        """Whether note_stored_many() can use the page fingerprints (at page_size) of the
        stored bytes, so a caller that computes them while it copies should pass them."""
        return self._impl.wants_fingerprints

    def note_stored_many(self, ranges, data, fingerprints=None) -> None:
        """note_stored() for many ranges in one call: data holds their bytes back to back, in
        the order of ranges (what a gather of the ranges produces). Much cheaper than one call
        per range when there are thousands of scattered pages. fingerprints: the page
        fingerprints of data at page_size (nat.page_fingerprints(data, page_size), e.g. from
        nat.gather_fingerprints), saving the detector a pass over data."""
        data = nat.as_bytes_view(data, name="data")
        ranges = list(ranges)
        if fingerprints is not None:
            fingerprints = nat.as_bytes_view(fingerprints, name="fingerprints")
            want = nat.FP_BYTES * nat.page_count(len(data), self.page_size)
            if len(fingerprints) != want:
                raise InvalidArgumentError(
                    f"note_stored_many: fingerprints holds {len(fingerprints)} bytes; the "
                    f"{len(data)} bytes of data have {want // nat.FP_BYTES} pages of "
                    f"{self.page_size} bytes")
        with self._lock:
            if self._closed:
                return
            n, total = self._n, 0
            for off, length in ranges:
                if off < 0 or length < 0 or off + length > n:
                    raise InvalidArgumentError(
                        f"note_stored_many: [{off}, {off + length}) is outside the buffer of "
                        f"{n} bytes")
                total += length
            if total != len(data):
                raise InvalidArgumentError(f"note_stored_many: the ranges hold {total} bytes, "
                                           f"data {len(data)}")
            if self._armed and total:
                self._impl.note_many(ranges, data, fingerprints)

    def close(self) -> None:
        """Removes write protection, releases the buffer. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                if self._pid == os.getpid():
                    self._impl.close()
                else:
                    self._impl.after_fork()
            finally:
                _LIVE.discard(self)
                self._impl = _Full(memoryview(b""), 1)
                view, self._view = self._view, None
                _release(view)

    def detach(self) -> None:
        """Releases the detector's export of the buffer until attach(), so between two
        captures the caller may resize, free or close it. Only detectors that compare
        contents (hash, shadow, full) can: a uffd detector's registration is of that memory,
        so it keeps it (no-op). Idempotent."""
        with self._lock:
            if self._closed or self._view is None or isinstance(self._impl, _Uffd):
                return
            view, self._view = self._view, None
            _release(view)

    def attach(self, view) -> None:
        """Gives a detached detector its buffer again: the same memory (address and length).
        The next dirty() reports what changed since the previous one, as if never detached.
        InvalidArgumentError for other memory; no-op when attached."""
        mv = memoryview(nat.as_bytes_view(view, name="view"))
        with self._lock:
            if self._closed:
                mv.release()
                raise InvalidArgumentError("attach(): the detector is closed")
            if self._view is not None:
                mv.release()
                return
            if len(mv) != self._n or (self._n and nat.buffer_address(mv) != self._address):
                mv.release()
                raise InvalidArgumentError("attach(): not the memory this detector tracks")
            self._view = mv

    def __enter__(self) -> "Detector":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{self._n} bytes"
        return f"<snapstore.dirty.Detector mode={self.mode} {state}>"

    # -- internals (lock held)
    def _arm(self) -> None:
        try:
            self._impl.arm(self._view)
        except (NativeSystemError, _Refused) as e:
            self._switch_to_hash(f"the kernel scan failed ({e})")
            self._impl.arm(self._view)
        self._armed = True

    def _forked(self) -> None:
        """First use in a forked child: cannot vouch; uffd registers again in the child."""
        self._pid = os.getpid()
        self._armed = False
        if isinstance(self._impl, _Uffd):
            self._impl.after_fork()
            if self._impl.pages:
                try:
                    self._impl.register()
                    if not self.reason.endswith("; registered again after fork()"):
                        self.reason += "; registered again after fork()"
                except _Refused as e:
                    self._switch_to_hash(f"after fork() the child could not register: {e}")

    def _switch_to_hash(self, why: str) -> None:
        old = self._impl
        try:
            old.close()
        except NativeSystemError:
            pass
        self._impl = _Hash(self._view, self.page_size)
        self.reason = f"hash: fell back from {old.mode}: {why}"


def _release(view: Optional[memoryview]) -> None:
    """Releases our export of a buffer (if a slice of it still lives, the export goes with
    the slice)."""
    if view is not None:
        try:
            view.release()
        except (BufferError, ValueError):
            pass


def _after_fork_in_child() -> None:
    _KERNEL.after_fork_in_child()
    for det in list(_LIVE):
        det._lock = threading.Lock()     # another thread may have held it at fork()
        det._armed = False
        if isinstance(det._impl, _Uffd):
            det._impl.after_fork()       # the registration was the parent's


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def make_detector(view, mode: str = "auto", page_size: int = 4096) -> Detector:
    """A Detector for one buffer (any C-contiguous buffer-protocol object; not copied).

    mode "auto" picks "uffd" where the kernel supports it for that memory, else "hash";
    "uffd" raises TrackingUnavailableError (with .reason) where it cannot work.
    page_size is the grid of the reported ranges (and the hash/shadow compare unit).
    """
    if mode not in MODES:
        raise InvalidArgumentError(f"mode must be one of {', '.join(MODES)}; got {mode!r}")
    ps = nat.page_size_arg(page_size)
    mv = nat.as_bytes_view(view, name="view")
    mv = memoryview(mv)       # our own export, released by close()
    n = len(mv)
    if mode == "full":
        return Detector(mv, _Full(mv, ps), ps, "full: no tracking requested; every checkpoint "
                                               "compares the whole buffer")
    if mode == "hash":
        return Detector(mv, _Hash(mv, ps), ps, f"hash: XXH3-128 of every {ps}-byte page "
                                               "(requested)")
    if mode == "shadow":
        return Detector(mv, _Shadow(mv, ps), ps, "shadow: exact compare against a copy "
                                                 "(requested)")
    # uffd or auto
    why = None
    if n == 0 and mv.readonly:
        # an empty buffer has no bytes to protect or to write: the same as bytearray()
        # (as_bytes_view gives every empty non-byte buffer, a writable array too, as b"")
        mv = memoryview(bytearray())
    if mv.readonly:
        why = ("read-only buffer: userfaultfd write-protection needs writable anonymous "
               "memory")
    elif mode == "auto" and n == 0:
        why = "empty buffer: nothing to protect"
    else:
        ok, status = uffd_available()
        if not ok:
            why = status
    if why is None:
        try:
            impl = _Uffd(mv, ps)
        except _Refused as e:
            why = str(e)
        else:
            whole = (impl.pages[1] - impl.pages[0]) if impl.pages else 0
            edge = n - whole
            what = (f"{whole // SYS_PAGE} whole {SYS_PAGE}-byte pages write-protected "
                    "(userfaultfd async + PAGEMAP_SCAN)" if whole else "no whole page inside")
            extra = f"; {edge} edge bytes compared" if edge else ""
            if impl.refine:
                extra += (f"; the buffer is not aligned to system pages (address % {SYS_PAGE} "
                          f"= {impl.base % SYS_PAGE}) or page_size {ps} is not a multiple of "
                          f"them: written pages are narrowed to changed {ps}-byte pages by "
                          "fingerprint")
            return Detector(mv, impl, ps, f"uffd: {what}{extra}")
    if mode == "uffd":
        mv.release()
        raise TrackingUnavailableError(f"mode='uffd' cannot track this buffer: {why}",
                                       reason=why)
    return Detector(mv, _Hash(mv, ps), ps, f"hash: uffd not used: {why}")

"""The index's writer gate: a flock() of STORE/index.gate (fmt.INDEX_GATE_FILE) beside the
index, plus a lock for the threads of a process, held by a writer from before it waits for
LMDB's write lock until its write transaction has ended (docs/design.md, "The lock files").

Why a gate before LMDB's own lock: LMDB's write lock is a process-shared robust mutex. One
whose holder dies is handed on (EOWNERDEAD), but a waiter SIGKILLed after the holder's unlock
woke it, before it took the lock, takes that wake-up with it: the other waiters sleep on
though the lock is free, until some later unlock (the many-writers kill test saw a compactor
wait over 120 s). A flock is the kernel's: its holder's death lets it go, and every waiter is
woken. So only the gate's holder is ever in LMDB's lock.

Why held for the whole transaction: so that a holder that stops inside it (SIGSTOP, Ctrl-Z,
a debugger) is seen by the waiters. The kernel names a flock's holder in /proc/locks (nothing
is written per transaction: a record written and cleared at each one cost a tiny commit 90
us). A waiter that finds the holder stopped at every look for max(timeout, STOPPED_GRACE)
seconds gives up with StoreLocked(lock="index") naming it, instead of waiting behind it for
ever (timeout: the store's, float("inf") waits). A holder that runs is waited for however
long its transaction takes: its writes are under way. Where /proc/locks does not name it (no
/proc, another pid namespace, a file system whose locks it lists under other inodes) a waiter
waits as before.

Waiting: a waiter first polls for POLL_SECONDS, yielding the CPU between tries (most waits are
one short transaction: 4 processes of tiny commits ran 5-10% faster so than when they waited
in LMDB's lock), then waits in the kernel's queue on a thread of its own (flock has no
timeout), looking at the holder every WATCH_SECONDS.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import threading
import time
from typing import Iterator

from snapstore.engine import format as fmt
from snapstore.interrupts import deferred_interrupts
from snapstore.errors import StoreIOError, StoreLocked

STOPPED_GRACE = 2.0     # seconds a holder must be seen stopped before a waiter gives up:
                        # a profiler (py-spy) or a debugger's attach stops a process briefly
WATCH_SECONDS = 0.25    # how often a waiter looks at the holder
POLL_SECONDS = 0.002    # a waiter polls (yielding the CPU) this long before it waits in a thread


class WriterGate:
    """The gate of one store in this process (writer_gate gives it out, one per store)."""

    def __init__(self, path: str, file_mode: int) -> None:
        self.path, self.file_mode = path, file_mode
        self.lock = threading.Lock()
        self.fd: int | None = None
        self.owner: int | None = None   # the thread holding the gate

    def forget(self) -> None:
        """In a forked child: the parent's file and lock are not this process's (a flock
        belongs to the open file, which the child shares while it keeps the descriptor)."""
        if self.fd is not None:
            try:
                os.close(self.fd)
            except OSError:
                pass
        self.lock, self.fd, self.owner = threading.Lock(), None, None

    @contextlib.contextmanager
    def held(self, timeout: float) -> Iterator[None]:
        """Holds the gate for the block (the caller begins and ends its write transaction in
        it). Raises StoreLocked when the holder stays stopped (above), StoreIOError when the
        gate file cannot be locked. A thread that holds the gate already passes (a write
        that opens a replaced index's databases inside another's block).

        Ctrl-C: each lock is taken, and recorded as taken, in a section a SIGINT cannot cut
        (interrupts.deferred_interrupts; the waits between attempts stay interruptible), and
        both are let go in one: an interrupt between taking one and recording it left it held
        for good (this process's next write waited for ever, and every other process's)."""
        if self.owner == threading.get_ident():
            yield
            return
        started, pid = time.monotonic(), os.getpid()
        hold = _Hold(self.lock)
        try:
            self._take_thread_lock(hold, started, timeout)
            fd = self._fd()
            if fd is not None:          # (None: a read-only store directory: LMDB's lock)
                self._take_flock(hold, fd, started, timeout)
            self.owner = threading.get_ident()
            yield
        finally:
            if os.getpid() == pid:      # (a fork()ed child's copy of the block does nothing)
                hold.let_go(self)

    def _take_thread_lock(self, hold: "_Hold", started: float, timeout: float) -> None:
        """Another thread of this process holds the gate, or waits for it behind a holder
        that may be stopped: look at that holder while waiting."""
        watch = None
        while True:
            with deferred_interrupts():
                hold.thread_locked = hold.lock.acquire(timeout=WATCH_SECONDS) \
                    if watch is not None else hold.lock.acquire(False)
            if hold.thread_locked:
                return
            if watch is None:
                watch = _StoppedWatch(self, started, timeout)
            else:
                watch.look()

    def _try_flock(self, hold: "_Hold", fd: int) -> bool:
        with deferred_interrupts():
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            except OSError as exc:
                raise self._io_error(exc) from exc
            hold.flock_fd = fd
            return True

    def _take_flock(self, hold: "_Hold", fd: int, started: float, timeout: float) -> None:
        """Takes the flock: on fd itself when the gate is free, else on the open file of a
        thread that waited in the kernel's queue (woken at once when the gate is let go;
        flock has no timeout of its own) while this one looked at the holder."""
        if self._try_flock(hold, fd):
            return
        # most waits are one short transaction of another writer: polled for a little first
        # (a thread of its own costs more than the wait)
        poll_until = time.monotonic() + POLL_SECONDS
        while time.monotonic() < poll_until:
            os.sched_yield()
            if self._try_flock(hold, fd):
                return
        watch = _StoppedWatch(self, started, timeout)
        waiter: _FlockWaiter | None = None
        try:
            with deferred_interrupts():
                waiter = _FlockWaiter(self.path)
            while not waiter.wait(WATCH_SECONDS):
                watch.look()
            if waiter.error is not None:
                raise self._io_error(waiter.error) from waiter.error
            with deferred_interrupts():
                hold.flock_fd, hold.own_file = waiter.fd, True
        except BaseException:
            if waiter is not None and hold.flock_fd is None:
                waiter.abandon()
            raise

    def holder(self) -> int | None:
        """The pid of the gate's holder as /proc/locks names it (None when unknown)."""
        fd = self._fd()
        return None if fd is None else flock_holder(fd)

    def _io_error(self, exc: OSError) -> StoreIOError:
        return StoreIOError(f"cannot lock {self.path}: {exc.strerror}", exc.errno)

    def _fd(self) -> int | None:
        """The gate file, opened once per process (None where it cannot be created: a
        read-only store, whose index nobody writes; LMDB's lock alone then)."""
        if self.fd is None:
            try:
                self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                                  self.file_mode)
            except OSError as exc:
                if exc.errno not in (errno.EACCES, errno.EROFS, errno.EPERM):
                    raise self._io_error(exc) from exc
        return self.fd


class _StoppedWatch:
    """Raises StoreLocked once the gate's holder was seen stopped at every look for
    max(timeout, STOPPED_GRACE) seconds."""

    def __init__(self, gate: WriterGate, started: float, timeout: float) -> None:
        self.gate, self.started, self.timeout = gate, started, timeout
        self.stopped_since: float | None = None
        self.pid: int | None = None

    def look(self) -> None:
        pid = self.gate.holder()
        if pid is None or pid == os.getpid() or not _stopped(pid):
            self.stopped_since = None
            return
        now = time.monotonic()
        if self.stopped_since is None or pid != self.pid:
            self.stopped_since, self.pid = now, pid
        if now - self.stopped_since < max(self.timeout, STOPPED_GRACE):
            return
        waited = now - self.started
        exc = StoreLocked("", path=os.path.dirname(self.gate.path), waited=waited,
                          lock="index", pid=pid, host=os.uname().nodename)
        exc.reason = (f"{exc.path}: the index's write lock is held by {exc.holder}, which is "
                      f"stopped (SIGSTOP, Ctrl-Z or a debugger; waited {waited:.1f} s, "
                      f"{now - self.stopped_since:.1f} s of them with it stopped).")
        exc.args = (f"{exc.reason} Let it go on (kill -CONT {pid}) or end it; pass "
                    "timeout=SECONDS (float('inf'): for ever) to wait longer for it.",)
        raise exc


def flock_holder(fd: int) -> int | None:
    """The pid /proc/locks names as the holder of an exclusive flock of fd's file (None: no
    holder listed, or no /proc/locks)."""
    try:
        st = os.fstat(fd)
        key = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}".encode()
        with open("/proc/locks", "rb") as f:
            for line in f:
                fields = line.split()
                # "1: FLOCK ADVISORY WRITE <pid> <maj:min:ino> 0 EOF"; a waiter's line has
                # "->" after the number
                if len(fields) >= 6 and fields[1] == b"FLOCK" and fields[3] == b"WRITE" \
                        and fields[5] == key:
                    pid = int(fields[4])
                    return pid if pid > 0 else None
    except (OSError, ValueError):
        pass
    return None


def _stopped(pid: int) -> bool:
    """Whether the process is stopped (state T) or stopped by its tracer (t)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    fields = stat[stat.rfind(b")") + 1:].split()    # the name in parentheses may hold spaces
    return bool(fields) and fields[0] in (b"T", b"t")


class _Hold:
    """What one held() block has taken, for its finally."""
    __slots__ = ("lock", "thread_locked", "flock_fd", "own_file")

    def __init__(self, lock: threading.Lock) -> None:
        self.lock, self.thread_locked = lock, False
        self.flock_fd: int | None = None
        self.own_file = False           # flock_fd is a waiter's open file, closed after

    def let_go(self, gate: WriterGate) -> None:
        """Lets go of what is held: the flock with an explicit LOCK_UN, which frees it
        whoever else has the open file (a fork()ed child keeps a copy of every descriptor:
        closing ours alone left the gate locked for as long as the child lived), then the
        thread lock. Each step is a section a SIGINT cannot cut, and an interrupt before one
        begins is kept until all are done (then raised): the finally of held() must never
        leave a lock behind."""
        interrupted = None
        while self.flock_fd is not None or self.thread_locked:
            try:
                with deferred_interrupts():
                    if self.flock_fd is not None:
                        fd, self.flock_fd = self.flock_fd, None
                        try:
                            fcntl.flock(fd, fcntl.LOCK_UN)
                        except OSError:
                            pass            # (closing it lets go, ours being the last copy)
                        if self.own_file:
                            _close_waiter_file(fd)
                with deferred_interrupts():
                    if self.thread_locked and self.flock_fd is None:
                        gate.owner, self.thread_locked = None, False
                        self.lock.release()
            except KeyboardInterrupt as exc:
                interrupted = interrupted or exc
        if interrupted is not None:
            raise interrupted


class _FlockWaiter:
    """A thread blocked in flock(LOCK_EX) on an open file of its own. Abandoned (its caller
    gave up), it lets the lock go as soon as it gets it. Its caller waits on a one-shot lock
    (one C call: Event.wait, a Condition's, could be cut by Ctrl-C half way, wakeups.py)."""

    def __init__(self, path: str) -> None:
        try:
            self.fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except OSError as exc:
            raise StoreIOError(f"cannot open {path}: {exc.strerror}", exc.errno) from exc
        _WAITER_FILES.add(self.fd)
        self._signal = threading.Lock()
        self._signal.acquire()              # released once the flock is taken (or failed)
        self.error: OSError | None = None
        self._lock = threading.Lock()
        self._abandoned = self._finished = False
        threading.Thread(target=self._wait, name="snapstore-index-gate", daemon=True).start()

    def wait(self, seconds: float) -> bool:
        """Whether the flock was taken (or failed: error) within `seconds`."""
        return self._signal.acquire(timeout=seconds)

    def _wait(self) -> None:
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        except OSError as exc:
            self.error = exc
        with self._lock:
            self._finished = True
            if self._abandoned:
                self._let_go()
            else:
                self._signal.release()

    def abandon(self) -> None:
        with self._lock:
            self._abandoned = True
            if self._finished:
                self._let_go()

    def _let_go(self) -> None:
        try:
            if self.error is None:
                fcntl.flock(self.fd, fcntl.LOCK_UN)
        except OSError:
            pass
        _close_waiter_file(self.fd)


_WAITER_FILES: set[int] = set()     # waiters' open files: a fork()ed child closes its copies


def _close_waiter_file(fd: int) -> None:
    _WAITER_FILES.discard(fd)
    try:
        os.close(fd)
    except OSError:
        pass


_GATES: dict[str, WriterGate] = {}
_GATES_LOCK = threading.Lock()


def writer_gate(index_path: str, file_mode: int) -> WriterGate:
    """The gate of the index at index_path (one per store and process)."""
    path = os.path.join(os.path.dirname(os.path.abspath(index_path)), fmt.INDEX_GATE_FILE)
    with _GATES_LOCK:
        gate = _GATES.get(path)
        if gate is None:
            gate = _GATES[path] = WriterGate(path, file_mode)
        return gate


def _forget_gates() -> None:
    global _GATES_LOCK
    _GATES_LOCK = threading.Lock()      # a thread of the parent may have held it at the fork
    for gate in _GATES.values():
        gate.forget()
    for fd in list(_WAITER_FILES):      # the parent's waiters' files (never unlocked here:
        _close_waiter_file(fd)          # LOCK_UN would let go of a lock the parent holds)


os.register_at_fork(after_in_child=_forget_gates)

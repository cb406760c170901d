"""Lock errors (issue 15): the writer records its pid, host and since-when in the lock file;
StoreLocked carries and names them in a complete sentence; the CLI advises --timeout, which
every writing command takes. A real second process holds the lock in every test."""
import calendar
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from cli_runner import ROOT, snapstore_cli

import snapstore
from snapstore.engine import format as fmt
from snapstore.errors import StoreLocked

HOST = os.uname().nodename

HOLD_STORE = """
import sys, snapstore
s = snapstore.open(sys.argv[1])
print("ready", flush=True)
sys.stdin.read()
s.close()
"""

HOLD_RAW_FLOCK = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
print("ready", flush=True)
sys.stdin.read()
"""

HOLD_CREATING = """
import sys, time
from snapstore.engine.storedir import take_lock
fd = take_lock(sys.argv[1], time.monotonic())
print("ready", flush=True)
sys.stdin.read()
"""


class Holder:
    """A second process running one of the scripts above on `arg`; release() ends it."""

    def __init__(self, script: str, arg: str) -> None:
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.proc = subprocess.Popen([sys.executable, "-c", script, arg], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "ready"
        self.pid = self.proc.pid

    def release(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(30)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)


@pytest.fixture
def holders():
    started = []

    def start(script, arg):
        h = Holder(script, arg)
        started.append(h)
        return h
    yield start
    for h in started:
        if h.proc.poll() is None:
            h.kill()


@pytest.fixture
def path(tmp_path):
    p = str(tmp_path / "s")
    with snapstore.open(p) as s:
        s.checkpoint({"x": b"1"}, "train")
        s.checkpoint({"x": b"2"}, "train")
    return p


def lock_file(path):
    return os.path.join(path, fmt.LOCK_FILE)


# ---- the API --------------------------------------------------------------------------------
def test_store_locked_names_the_holder_in_a_complete_sentence(path, holders):
    holder = holders(HOLD_STORE, path)
    t0 = time.time()
    with pytest.raises(StoreLocked) as exc:
        snapstore.open(path, timeout=0.2)
    e = exc.value
    assert (e.pid, e.host, e.path) == (holder.pid, HOST, path)
    since = calendar.timegm(time.strptime(e.since, "%Y-%m-%dT%H:%M:%SZ"))
    assert t0 - 60 <= since <= t0 + 1
    assert e.waited >= 0.2
    msg = str(e)
    assert f"locked by another process (pid {holder.pid} on host {HOST} since {e.since})" in msg
    assert msg.endswith("to wait for the lock.") and "timeout=SECONDS" in msg
    assert "readonly=True" in msg and "--timeout" not in msg      # Python advice in Python
    with snapstore.open(path, readonly=True) as reader:           # readers never wait
        assert reader.resolve("latest").id == 2


def test_a_second_store_object_of_this_process_is_named_as_such(path):
    with snapstore.open(path):
        with pytest.raises(StoreLocked, match=f"another Store object of this process "
                                              f"\\(pid {os.getpid()} on host"):
            snapstore.open(path)


def test_timeout_waits_for_the_holder(path, holders):
    holder = holders(HOLD_STORE, path)
    threading.Timer(0.5, holder.release).start()
    t0 = time.monotonic()
    with snapstore.open(path, timeout=30) as s:
        assert time.monotonic() - t0 >= 0.4
        record = json.loads(open(lock_file(path), "rb").read())
        assert record["pid"] == os.getpid() and record["host"] == HOST
        assert s.resolve("latest").id == 2


def test_a_killed_holder_never_blocks_and_its_record_is_replaced(path, holders):
    holder = holders(HOLD_STORE, path)
    holder.kill()                                    # its record stays in the lock file
    assert json.loads(open(lock_file(path), "rb").read())["pid"] == holder.pid
    t0 = time.monotonic()
    with snapstore.open(path, timeout=0):            # the flock died with it
        assert time.monotonic() - t0 < 5
        assert json.loads(open(lock_file(path), "rb").read())["pid"] == os.getpid()


def dead_pid():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


@pytest.mark.parametrize("record", [
    b"", b"\0" * 300, b"\xff\xfe garbage", b'{"pid": 12', b"[1, 2, 3]", b"null",
    b'{"pid": "12", "host": "h", "since": "t"}', b'{"pid": true, "host": "h", "since": "t"}',
    b'{"pid": -4, "host": "h", "since": "t"}', b'{"pid": 5, "host": 7, "since": "t"}',
    b'{"pid": 5, "host": "h\\u001b[31m", "since": "t"}', b"{" * 5000,
    "stale"])
def test_torn_garbage_or_stale_records_read_as_unknown(path, holders, record):
    if record == "stale":       # names a process of this host that is gone
        record = json.dumps({"pid": dead_pid(), "host": HOST, "since": "2020-01-01T00:00:00Z"})
        record = record.encode()
    with open(lock_file(path), "wb") as f:
        f.write(record)
    holders(HOLD_RAW_FLOCK, lock_file(path))        # a holder that writes no record
    with pytest.raises(StoreLocked) as exc:
        snapstore.open(path)
    assert (exc.value.pid, exc.value.host, exc.value.since) == (None, None, None)
    assert "locked by another process or Store object, which" in str(exc.value)


def test_garbage_record_without_a_holder_is_just_overwritten(path):
    with open(lock_file(path), "wb") as f:
        f.write(os.urandom(5000))
    with snapstore.open(path) as s:
        s.checkpoint({"x": b"3"}, "train")
        record = json.loads(open(lock_file(path), "rb").read())
        assert record["pid"] == os.getpid()
    assert os.path.getsize(lock_file(path)) == 256


def test_a_holder_on_another_host_is_reported_as_recorded(path, holders):
    with open(lock_file(path), "wb") as f:
        f.write(json.dumps({"pid": 4242, "host": "elsewhere", "since": "2026-01-02T03:04:05Z"})
                .encode())
    holders(HOLD_RAW_FLOCK, lock_file(path))
    with pytest.raises(StoreLocked, match="pid 4242 on host elsewhere since "
                                          "2026-01-02T03:04:05Z"):
        snapstore.open(path)


def test_repair_names_the_holder_too(path, holders):
    holder = holders(HOLD_STORE, path)
    with pytest.raises(StoreLocked, match=f"pid {holder.pid}"):
        snapstore.repair(path)


# ---- the command line -----------------------------------------------------------------------
WRITING = {
    "rm": ["rm", "1"], "tag": ["tag", "1", "t"], "retain": ["retain", "--all-streams", "--keep-last", "1"],
    "compact": ["compact"], "repair": ["repair"], "init": ["init"]}


@pytest.mark.parametrize("command", sorted(WRITING))
def test_every_writing_command_takes_timeout_and_names_the_holder(tmp_path, path, holders,
                                                                 command):
    if command == "init":       # another `init` is creating this store right now
        target = str(tmp_path / "new")
        os.mkdir(target)
        holder = holders(HOLD_CREATING, target)
    else:
        target = path
        holder = holders(HOLD_STORE, path)
    t0 = time.monotonic()
    p = snapstore_cli("-s", target, *WRITING[command], "--timeout", "0.3")
    assert time.monotonic() - t0 >= 0.3
    assert p.returncode == 1, (p.stdout, p.stderr)
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("snapstore: error: "), p.stderr
    line = lines[0]
    assert f"locked by another process (pid {holder.pid} on host {HOST} since " in line
    assert "Wait for it with --timeout SECONDS" in line and "(waited 0.3" in line
    assert "readonly=True" not in line and "timeout=" not in line     # no Python advice
    holder.release()
    p = snapstore_cli("-s", target, *WRITING[command], "--timeout", "5")
    assert p.returncode == 0, (p.stdout, p.stderr)


def test_timeout_may_come_before_the_command_and_waits(path, holders):
    holder = holders(HOLD_STORE, path)
    threading.Timer(0.5, holder.release).start()
    p = snapstore_cli("--timeout", "30", "-s", path, "rm", "latest")
    assert p.returncode == 0, p.stderr
    with snapstore.open(path, readonly=True) as s:
        assert [c.id for c in s.checkpoints()] == [1]


def test_reading_commands_ignore_the_lock(path, holders):
    holders(HOLD_STORE, path)
    for args in (["ls"], ["show", "latest"], ["stats"], ["verify"]):
        p = snapstore_cli("-s", path, *args)
        assert p.returncode == 0, (args, p.stderr)

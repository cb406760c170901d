"""Issue 14, defects 8a and 10: bad arguments get a clear SnapstoreError (the CLI: a usage
error, exit 2) before any side effect, and no numeric option can hang the CLI."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from cli_runner import console_script
import snapstore
from snapstore import diff
from snapstore.engine.validation import MAX_CHECKPOINT_ID, validate_checkpoint_id
from snapstore.errors import (CheckpointNotFound, InvalidArgumentError,
                              InvalidArgumentTypeError, SnapstoreError, StoreIOError)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BAD_IDS = [-1, -(1 << 64), 1 << 64, 99999999999999999999, 1 << 200]


@pytest.fixture
def store(tmp_path):
    with snapstore.open(tmp_path / "s", durability="none") as s:
        s.checkpoint({"a": b"x" * 5000}, "main")
        s.checkpoint({"a": b"y" * 5000}, "main")
        yield s


def test_defect10_one_checkpoint_id_rule():
    assert validate_checkpoint_id(0) == 0
    assert validate_checkpoint_id(MAX_CHECKPOINT_ID) == 2 ** 64 - 1
    for bad in BAD_IDS:
        with pytest.raises(InvalidArgumentError):
            validate_checkpoint_id(bad)
    for bad in ("1", 1.0, True, None):
        with pytest.raises(InvalidArgumentTypeError) as info:
            validate_checkpoint_id(bad)
        assert isinstance(info.value, TypeError)     # Python's convention still holds


@pytest.mark.parametrize("bad", BAD_IDS)
def test_defect10_ids_out_of_range_are_invalid_arguments_everywhere(store, bad):
    calls = [lambda: store.get(bad), lambda: store.restore(bad),
             lambda: store.read(bad, "a"), lambda: store.restore_into(bad, {}),
             lambda: store.delete(bad), lambda: store.delete_many([1, bad]),
             lambda: store.tag(bad, "t"), lambda: store.untag(bad, "t")]
    for call in calls:
        with pytest.raises(InvalidArgumentError):
            call()
    assert [c.id for c in store.checkpoints()] == [1, 2]        # delete_many: all or none
    with pytest.raises(CheckpointNotFound):
        store.get(MAX_CHECKPOINT_ID)                            # in range, just absent


@pytest.mark.parametrize("level", [23, 99, -(1 << 17) - 1, 1 << 70])
def test_defect10_compression_level_is_checked_at_open(tmp_path, level):
    with pytest.raises(InvalidArgumentError, match="compression_level"):
        snapstore.open(tmp_path / "s", compression_level=level)
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("level", ["3", 3.0, None, True])
def test_defect10_compression_level_type(tmp_path, level):
    with pytest.raises(InvalidArgumentTypeError, match="compression_level"):
        snapstore.open(tmp_path / "s", compression_level=level)
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("level", [-(1 << 17), -5, 0, 1, 19, 22])
def test_defect10_every_zstd_level_works(tmp_path, level):
    with snapstore.open(tmp_path / "s", compression_level=level, durability="none") as s:
        data = bytes(100_000)
        info = s.checkpoint({"a": data})
        assert s.restore(info.id)["a"] == data


@pytest.mark.parametrize("kwargs", [{"timeout": "x"}, {"timeout": -1},
                                    {"timeout": float("nan")}, {"staging_bytes": 2 ** 50},
                                    {"staging_bytes": 1.5e9}, {"create": "no"},
                                    {"readonly": None}, {"segment_size": "256M"},
                                    {"backend": "local"}, {"cdc_sizes": 5},
                                    {"cdc_sizes": (1, 2)}, {"max_chain": True},
                                    {"full_threshold": float("nan")}])
def test_defect10_open_validates_before_creating_anything(tmp_path, kwargs):
    with pytest.raises(InvalidArgumentError):
        snapstore.open(tmp_path / "s", **kwargs)
    assert os.listdir(tmp_path) == []


def test_defect10_bad_path_types(tmp_path):
    for bad in (None, 5, 1.5, ["a"]):
        with pytest.raises(InvalidArgumentTypeError):
            snapstore.open(bad)
    with pytest.raises(InvalidArgumentError):
        snapstore.open(str(tmp_path / "a\0b"))
    with snapstore.open(os.fsencode(tmp_path / "bytes"), durability="none") as s:
        assert s.path == str(tmp_path / "bytes")


STAGING_FAILURE = textwrap.dedent(r"""
    import resource, sys
    import numpy as np
    import snapstore
    from snapstore.errors import StoreIOError

    path = sys.argv[1]
    s = snapstore.open(path, durability="none", staging_bytes=8 << 30)
    a = np.zeros(1 << 20, np.uint8)
    first = s.checkpoint({"a": a}, "t")               # a plain checkpoint needs no staging
    import snapstore.capture.dirty
    a[:4096] = 1
    vm = next(int(l.split()[1]) << 10 for l in open("/proc/self/status")
              if l.startswith("VmSize:"))
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (vm + (2 << 30), hard))  # 8 GiB cannot be mapped
    try:
        s.checkpoint_async({"a": a}, "t")
        print("no error")
    except StoreIOError as exc:
        print("StoreIOError", "staging" in str(exc))
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    a[-4096:] = 2                                     # after the failed capture, too
    info = s.checkpoint_async({"a": a}, "t").result()
    print("restored", s.restore(info.id)["a"] == a.tobytes())
    s.close()
""")


def test_defect10_staging_memory_that_cannot_be_mapped_is_a_store_io_error(tmp_path):
    """staging_bytes above physical memory is refused at open; one that the process cannot
    map (here: an address-space limit) fails the capture with StoreIOError, and the next
    capture diffs in full, so nothing changed before the failure is lost."""
    from snapstore.capture.staging import max_staging_bytes
    if max_staging_bytes() < 8 << 30:
        pytest.skip("needs 8 GiB of physical memory to pass staging_bytes=8 GiB")
    p = subprocess.run([sys.executable, "-c", STAGING_FAILURE, str(tmp_path / "s")], cwd=ROOT,
                       capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": ROOT})
    assert p.returncode == 0, p.stderr
    assert p.stdout.split("\n")[:2] == ["StoreIOError True", "restored True"], p.stdout


def test_defect10_staging_bytes_above_physical_memory(tmp_path):
    from snapstore.capture.staging import max_staging_bytes
    with pytest.raises(InvalidArgumentError, match="staging_bytes"):
        snapstore.open(tmp_path / "s", staging_bytes=max_staging_bytes() + 1)
    assert os.listdir(tmp_path) == []


def test_defect8_diff_window_must_be_positive_in_the_api():
    read = lambda off, n: bytes(n)        # noqa: E731
    for window in (0, -1, 1.5, None):
        with pytest.raises(InvalidArgumentError):
            diff.diff_buffer(read, read, 100, 100, window=window)
    assert diff.diff_buffer(read, read, 100, 100, window=1)["status"] == "unchanged"


# ---- the command line: every numeric option at 0, negative and huge ------------------------
def cli(*args, timeout=60):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SNAPSTORE_")}
    env["PYTHONPATH"] = ROOT
    return subprocess.run([console_script()] + [str(a) for a in args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def cli_store(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("cli") / "s")
    with snapstore.open(path, durability="none") as s:
        s.checkpoint({"a": bytes(200_000)}, "main")
        s.checkpoint({"a": b"\1" * 200_000}, "main")
    return path


HUGE = "9" * 400
USAGE_CASES = [
    ["show", "99999999999999999999"], ["show", str(1 << 64)], ["show", "-1"],
    ["rm", "99999999999999999999"], ["tag", str(1 << 64), "x"],
    ["restore", "99999999999999999999", "--out", "OUT"],
    ["diff", "1", "99999999999999999999"],
    ["diff", "1", "2", "--window", "0"], ["diff", "1", "2", "--window", "-1"],
    ["diff", "1", "2", "--window", "1"], ["diff", "1", "2", "--window", "2GiB"],
    ["diff", "1", "2", "--window", HUGE], ["diff", "1", "2", "--gap", HUGE],
    ["diff", "1", "2", "--gap", "-1"], ["diff", "1", "2", "--max-ranges", "-1"],
    ["--timeout", "-1", "rm", "1"], ["--timeout", "nan", "rm", "1"],
    ["--timeout", "x", "ls"], ["ls", "--last", "0"], ["ls", "--last", "-5"],
    ["compact", "--threshold", "nan"], ["compact", "--threshold", "-1"],
    ["compact", "--threshold", "2"], ["compact", "--max-chain", "0"],
    ["retain", "--stream", "main", "--keep-last", "-1"],
    ["retain", "--stream", "main", "--keep-every", "0"],
    ["restore", "1", "--out", "OUT", "--range", f"{HUGE}:1"],
    ["bench", "--size", "0"], ["bench", "--size", HUGE], ["bench", "--buffers", "0"],
    ["bench", "--checkpoints", "0"], ["bench", "--dirty", "-0.5"],
    ["bench", "--restore-repeats", "0"],
]


@pytest.mark.parametrize("argv", USAGE_CASES, ids=lambda a: " ".join(a)[:50])
def test_defect8_and_10_cli_numeric_options_are_usage_errors(cli_store, tmp_path, argv):
    argv = [str(tmp_path / "out") if a == "OUT" else a for a in argv]
    p = cli("-s", cli_store, *argv)
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert "internal error" not in p.stderr and p.stderr.startswith("snapstore: error:")
    assert len(p.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("argv", [["diff", "1", "2", "--window", "4KiB"],
                                  ["diff", "1", "2", "--window", "1GiB"],
                                  ["diff", "1", "2", "--gap", HUGE[:30]],
                                  ["diff", "1", "2", "--max-ranges", "0"],
                                  ["show", "latest"], ["--timeout", "inf", "ls"],
                                  ["ls", "--last", HUGE[:40]],
                                  ["retain", "--stream", "none", "--keep-last", HUGE[:40]]],
                         ids=lambda a: " ".join(a)[:50])
def test_defect8_cli_extreme_but_valid_values_finish(cli_store, argv):
    p = cli("-s", cli_store, *argv)
    assert p.returncode == 0, (p.stdout, p.stderr)


def test_defect8_diff_window_zero_does_not_hang(cli_store):
    p = cli("-s", cli_store, "diff", "1", "2", "--window", "0", timeout=30)
    assert p.returncode == 2 and "--window" in p.stderr


@pytest.mark.parametrize("sizes", [(1, 64, 256), (32, 32, 32), (63, 64, 65), (64, 96, 256),
                                   (64, 128, 100), (64, 64, 16 << 20)])
def test_cdc_sizes_refused_with_the_rule_they_break(tmp_path, sizes):
    """The message states the whole rule (min 64, avg a power of two), not one the refused
    values satisfy, nor the C core's generic complaint."""
    with pytest.raises(InvalidArgumentError, match="64 <= min <= avg <= max") as raised:
        snapstore.open(tmp_path / "s", cdc_sizes=sizes)
    assert "power of two" in str(raised.value) and "NULL" not in str(raised.value)


@pytest.mark.parametrize("page_size", [128 << 10, 1 << 20])
def test_a_page_size_above_64_kib_needs_no_chunk_size(tmp_path, page_size):
    """chunk_size defaults to 64 KiB or page_size, whichever is larger: the documented
    page_size range works alone (a larger page used to fail on the chunk_size the caller
    never gave)."""
    data = os.urandom(3 * page_size + 5)
    with snapstore.open(tmp_path / "s", page_size=page_size) as s:
        info = s.checkpoint({"a": data})
        assert s.restore(info.id)["a"] == data
    with pytest.raises(InvalidArgumentError, match="at least page_size"):
        snapstore.open(tmp_path / "t", page_size=page_size, chunk_size=64 << 10)


@pytest.mark.parametrize("kwargs, name", [({"refresh": -1}, "refresh"),
                                          ({"refresh": "1s"}, "refresh"),
                                          ({"remote_timeout": 0}, "remote_timeout"),
                                          ({"remote_timeout": float("inf")}, "remote_timeout")])
def test_s3_options_are_checked_for_local_stores_too(tmp_path, kwargs, name):
    """They do nothing for a local store, but a bad value is a mistake all the same, named."""
    with pytest.raises(InvalidArgumentError, match=name):
        snapstore.open(tmp_path / "s", **kwargs)
    assert os.listdir(tmp_path) == []

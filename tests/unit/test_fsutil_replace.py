"""fsutil.replace_file: a whole file written next to its path and published atomically; with
refuse_existing, never over a file that exists, also one created while the file was written."""
from __future__ import annotations

import errno
import os

import pytest

from snapstore.engine import fsutil
from snapstore.errors import InvalidArgumentError, StoreIOError


class Exists(InvalidArgumentError):
    pass


def refuse(path):
    return Exists(f"{path} exists")


@pytest.mark.parametrize("hard_links", [True, False])
def test_a_file_created_while_writing_is_kept(tmp_path, monkeypatch, hard_links):
    if not hard_links:              # a file system without them: EPERM from link()
        def no_link(*_):
            raise OSError(errno.EPERM, "Operation not permitted")
        monkeypatch.setattr(os, "link", no_link)
    path = tmp_path / "out"

    def fill(f):
        f.write(b"new")
        path.write_bytes(b"theirs")         # another process creates the file meanwhile
    with pytest.raises(Exists):
        fsutil.replace_file(str(path), fill, refuse_existing=refuse)
    assert path.read_bytes() == b"theirs"
    assert os.listdir(tmp_path) == ["out"]  # no temporary file left


@pytest.mark.parametrize("hard_links", [True, False])
def test_a_new_file_is_published_whole_with_its_mode(tmp_path, monkeypatch, hard_links):
    if not hard_links:
        def no_link(*_):
            raise OSError(errno.EOPNOTSUPP, "Operation not supported")
        monkeypatch.setattr(os, "link", no_link)
    path = tmp_path / "out"
    fsutil.replace_file(str(path), lambda f: f.write(b"x" * 3), refuse_existing=refuse,
                        sync=True)
    assert path.read_bytes() == b"xxx" and os.stat(path).st_mode & 0o777 == 0o600
    assert os.listdir(tmp_path) == ["out"]
    with pytest.raises(Exists):             # now it exists: refused before any writing
        fsutil.replace_file(str(path), lambda f: pytest.fail("written"), refuse_existing=refuse)
    fsutil.replace_file(str(path), lambda f: f.write(b""))      # no refuse_existing: replaced
    assert path.read_bytes() == b""


def test_a_dangling_symlink_counts_as_existing(tmp_path):
    path = tmp_path / "out"
    path.symlink_to(tmp_path / "nowhere")
    with pytest.raises(Exists):
        fsutil.replace_file(str(path), lambda f: f.write(b"x"), refuse_existing=refuse)
    assert path.is_symlink() and not (tmp_path / "nowhere").exists()


def test_another_link_error_is_a_store_io_error_naming_the_path(tmp_path, monkeypatch):
    def no_space(*_):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "link", no_space)
    with pytest.raises(StoreIOError, match="cannot write .*out"):
        fsutil.replace_file(str(tmp_path / "out"), lambda f: f.write(b"x"),
                            refuse_existing=refuse)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("name", ["n" * 255, "é" * 127, "x" + "€" * 84, "short"],
                         ids=["255 ascii bytes", "254 bytes of 2-byte chars",
                              "253 bytes of 3-byte chars", "short"])
@pytest.mark.parametrize("refusing", [False, True])
def test_a_name_up_to_the_limit_is_written(tmp_path, name, refusing):
    """The temporary file's name is shortened to fit: a name the file system takes is
    written, whole characters only."""
    path = tmp_path / name
    fsutil.replace_file(str(path), lambda f: f.write(b"data"),
                        refuse_existing=refuse if refusing else None)
    assert path.read_bytes() == b"data"
    assert os.listdir(tmp_path) == [name]


def test_a_name_over_the_limit_is_a_store_io_error(tmp_path):
    with pytest.raises(StoreIOError, match="File name too long"):
        fsutil.replace_file(str(tmp_path / ("n" * 256)), lambda f: f.write(b"data"))
    assert os.listdir(tmp_path) == []

"""The ways of checkpointing a state that the harness compares, run in this process: snapstore
itself and the raw-file, pickle and numpy baselines (restic and borg are in peers.py)."""
from __future__ import annotations

import errno
import os
import pickle
from typing import Optional

from snapstore.bench.workloads import Workload
from snapstore.engine.fsutil import fsync_directory, pread_into, write_all
from snapstore.store import open as open_store


def write_buffers(path: str, state: dict, sync=None) -> None:
    """Writes the buffers of state one after the other into a new file at path, each whole:
    a raw write may write less than asked (a full disk; Linux's cap of about 2 GiB per call),
    so it is repeated for the rest, and one that writes nothing is ENOSPC. sync(f), if given,
    runs before the file is closed."""
    with open(path, "wb", buffering=0) as f:
        for buf in state.values():
            write_all(f, buf, path)
        if sync is not None:
            sync(f)


def read_buffers(path: str, sizes: dict) -> dict:
    """{name: bytearray} read back from a file holding the buffers of `sizes` ({name: size}) one
    after the other, in that order, each whole (a raw read may return less than asked);
    OSError when the file ends early."""
    out, offset = {}, 0
    with open(path, "rb", buffering=0) as f:
        for name, size in sizes.items():
            data = bytearray(size)
            got = pread_into(f.fileno(), data, offset)
            if got < size:
                raise OSError(errno.EIO, f"{path}: the file ends {size - got} bytes early (in "
                                         f"buffer {name!r})")
            out[name] = data           # (a bytes() copy cost the baselines' restores 65%)
            offset += size
    return out


class Method:
    """One way of checkpointing the state: setup(), checkpoint(state, step) (timed by the
    caller), restore(step) -> {name: bytes-like} (timed), close() (also called when setup()
    failed part-way, so it must not assume setup() finished)."""
    name = ""
    notes = ""
    # True for a tool run as a child process: what it writes is measured as its directory's
    # growth and its peak memory is the child's own (max_rss), not this process's.
    external = False

    def __init__(self, w: Workload, directory: str) -> None:
        self.w = w
        self.dir = directory
        self.sizes: list = []        # per step: {name: size}

    @classmethod
    def unavailable(cls) -> Optional[str]:
        """Why this method cannot run here, or None."""
        return None

    @property
    def stored_dir(self) -> str:
        """The directory whose growth is what this method stored (disk figures)."""
        return self.dir

    def setup(self) -> None:
        os.makedirs(self.dir, exist_ok=True)

    def checkpoint(self, state: dict, step: int) -> None:
        raise NotImplementedError

    def restore(self, step: int) -> dict:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def _sync(self, f) -> None:
        if self.w.durability == "fsync":
            f.flush()
            os.fsync(f.fileno())

    def _path(self, step: int, ext: str) -> str:
        return os.path.join(self.dir, f"ckpt{step:05d}.{ext}")

    def _finish_file(self) -> None:
        if self.w.durability == "fsync":
            fsync_directory(self.dir)


class SnapstoreMethod(Method):
    name = "snapstore"

    def __init__(self, w: Workload, directory: str) -> None:
        super().__init__(w, directory)
        self.store = None            # until setup() has opened it
        self.ids: list = []
        self.infos: list = []

    def setup(self) -> None:
        self.store = open_store(os.path.join(self.dir, "store"), durability=self.w.durability,
                                chunking=self.w.chunking, compression=self.w.compression)

    def checkpoint(self, state: dict, step: int) -> None:
        info = self.store.checkpoint(state, stream="bench", meta={"step": step})
        self.ids.append(info.id)
        self.infos.append(info)

    def restore(self, step: int) -> dict:
        return self.store.restore(self.ids[step])

    def close(self) -> None:
        """Closes the store; nothing to do when setup() failed to open it (or twice)."""
        store, self.store = self.store, None
        if store is not None:
            store.close()


class RawMethod(Method):
    name = "raw"

    def checkpoint(self, state: dict, step: int) -> None:
        write_buffers(self._path(step, "bin"), state, self._sync)
        self._finish_file()
        self.sizes.append({n: len(b) for n, b in state.items()})

    def restore(self, step: int) -> dict:
        return read_buffers(self._path(step, "bin"), self.sizes[step])


class PickleMethod(Method):
    name = "pickle"

    def checkpoint(self, state: dict, step: int) -> None:
        with open(self._path(step, "pkl"), "wb") as f:
            pickle.dump(state, f, protocol=5)
            self._sync(f)
        self._finish_file()

    def restore(self, step: int) -> dict:
        with open(self._path(step, "pkl"), "rb") as f:
            return pickle.load(f)


class NumpyMethod(Method):
    name = "numpy"

    @classmethod
    def unavailable(cls) -> Optional[str]:
        try:
            import numpy  # noqa: F401
        except ImportError:
            return "numpy is not installed"
        return None

    def checkpoint(self, state: dict, step: int) -> None:
        import numpy as np
        with open(self._path(step, "npy"), "wb") as f:
            for buf in state.values():
                np.save(f, np.frombuffer(buf, dtype=np.uint8), allow_pickle=False)
            self._sync(f)
        self._finish_file()
        self.sizes.append(list(state))

    def restore(self, step: int) -> dict:
        import numpy as np
        with open(self._path(step, "npy"), "rb") as f:
            return {name: np.load(f, allow_pickle=False) for name in self.sizes[step]}

"""The backup tools measured as baselines, run as child processes on the state written to one
file: restic and borg (each only when it is on PATH)."""
from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import tempfile
from typing import Optional

from snapstore.bench.errors import BenchError
from snapstore.bench.methods import Method, read_buffers, write_buffers


@functools.lru_cache(maxsize=None)
def _gnu_time() -> Optional[str]:
    """The path of GNU time (`time -f FORMAT -o FILE`), or None (looked up once)."""
    path = shutil.which("time") or ("/usr/bin/time" if os.path.exists("/usr/bin/time") else None)
    if path is None:
        return None
    try:
        done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return path if "GNU" in done.stdout + done.stderr else None


# How much of a failed tool's stderr its error keeps (the end: where the reason is).
STDERR_TAIL = 300


def _failure(argv, status: int, stderr: str) -> str:
    """The error of a tool run that failed: the tool and its subcommand (never the GNU time
    wrapped around it), how it ended, and the end of its stderr."""
    how = f"killed by signal {-status}" if status < 0 else f"exit status {status}"
    tail = stderr.strip()
    tail = ("..." + tail[-STDERR_TAIL:]) if len(tail) > STDERR_TAIL else tail
    return f"{' '.join(argv[:2])} failed ({how}): {tail or '(nothing on stderr)'}"


class ExternalTool(Method):
    """A backup tool run as a child process on the state written to one file. max_rss: the
    largest peak RSS of its backups so far (its restores and its init are not checkpoints).
    What it stores is its repository (stored_dir), not the scratch file it backs up."""
    tool = ""
    external = True

    @classmethod
    def unavailable(cls) -> Optional[str]:
        return None if shutil.which(cls.tool) else f"{cls.tool} not found on PATH"

    def setup(self) -> None:
        super().setup()
        self.max_rss = 0
        self._backing_up = False
        self.repo = os.path.join(self.dir, "repo")
        self.work = os.path.join(self.dir, "work")
        os.makedirs(self.work)
        self.env = dict(os.environ)
        self._init_repo()

    def _run(self, *argv, cwd=None) -> str:
        """Runs the tool; during a backup, records its peak RSS. A child of this process
        starts with this process's memory (Linux's high-water mark of a fork() carries over
        exec()), so wait4's figure would include the harness and the whole state: with GNU
        time the tool is a child of that small program instead, which reports the tool's own
        peak; without it wait4's figure is kept (an upper bound)."""
        measure = self._backing_up
        timer = _gnu_time() if measure else None
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
                tempfile.NamedTemporaryFile(prefix="rss-") as rss:
            command = argv if timer is None else (timer, "-f", "%M", "-o", rss.name, *argv)
            proc = subprocess.Popen(command, cwd=cwd, env=self.env, stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=err)
            try:
                _, status, usage = os.wait4(proc.pid, 0)
            except BaseException:
                proc.kill()
                proc.wait()
                raise
            proc.returncode = os.waitstatus_to_exitcode(status)
            peak = usage.ru_maxrss * 1024
            if timer is not None:
                try:
                    peak = int(rss.read().split()[-1]) * 1024
                except (ValueError, IndexError):
                    pass                # (time's own output missing: keep the upper bound)
            if measure:
                self.max_rss = max(self.max_rss, peak)
            out.seek(0)
            err.seek(0)
            stdout = out.read().decode(errors="replace")
            stderr = err.read().decode(errors="replace")
        if proc.returncode != 0:
            raise BenchError(_failure(argv, proc.returncode, stderr))
        return stdout

    def checkpoint(self, state: dict, step: int) -> None:
        path = os.path.join(self.work, "state.bin")
        write_buffers(path, state)
        self._backing_up = True
        try:
            self._backup(step)
        finally:
            self._backing_up = False
        self.sizes.append({n: len(b) for n, b in state.items()})

    @property
    def stored_dir(self) -> str:
        return self.repo

    def restore(self, step: int) -> dict:
        target = tempfile.mkdtemp(dir=self.dir, prefix="restore-")
        try:
            return read_buffers(self._restore_file(step, target), self.sizes[step])
        finally:
            shutil.rmtree(target, ignore_errors=True)

    def _init_repo(self) -> None:
        raise NotImplementedError

    def _backup(self, step: int) -> None:
        raise NotImplementedError

    def _restore_file(self, step: int, target: str) -> str:
        raise NotImplementedError


class ResticMethod(ExternalTool):
    name = tool = "restic"
    notes = "peak memory is restic's own max RSS; bytes written is the repository's growth"

    def _init_repo(self) -> None:
        self.env["RESTIC_PASSWORD"] = "snapstore-bench"
        self.env["RESTIC_REPOSITORY"] = self.repo
        self._run("restic", "init", "--quiet")
        self.snapshots: list = []

    def _backup(self, step: int) -> None:
        out = self._run("restic", "backup", "--json", "--quiet", "state.bin", cwd=self.work)
        snap = None
        for line in out.splitlines():
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if msg.get("message_type") == "summary":
                snap = msg.get("snapshot_id")
        if snap is None:
            raise BenchError("restic backup printed no snapshot id")
        self.snapshots.append(snap)

    def _restore_file(self, step: int, target: str) -> str:
        self._run("restic", "restore", "--quiet", self.snapshots[step], "--target", target)
        for root, _, files in os.walk(target):
            if "state.bin" in files:
                return os.path.join(root, "state.bin")
        raise BenchError("restic restore produced no state.bin")


class BorgMethod(ExternalTool):
    name = tool = "borg"
    notes = "peak memory is borg's own max RSS; bytes written is the repository's growth"

    def _init_repo(self) -> None:
        self.env["BORG_PASSPHRASE"] = ""
        self.env["BORG_UNKNOWN_UNENCRYPTED_REPO_ACCESS_IS_OK"] = "yes"
        self.env["BORG_RELOCATED_REPO_ACCESS_IS_OK"] = "yes"
        self._run("borg", "init", "--encryption=none", self.repo)

    def _backup(self, step: int) -> None:
        self._run("borg", "create", f"{self.repo}::ckpt{step:05d}", "state.bin", cwd=self.work)

    def _restore_file(self, step: int, target: str) -> str:
        self._run("borg", "extract", f"{self.repo}::ckpt{step:05d}", cwd=target)
        return os.path.join(target, "state.bin")

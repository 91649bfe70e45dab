"""The one way lowband writes a file someone may read at any moment: whole, or not at all.

`write_atomic(path, write)` lets `write(tmp)` fill a temporary file beside `path` (same directory,
so the rename cannot cross file systems), flushes it to disk, and renames it over `path`: a reader,
or a crash, sees the old file or the new one, never half of one. The temporary is removed when
`write` fails; a process that leaves at once (a worker's `launch.leave_now`, say while a second signal
interrupts the first one's clean-up) removes the ones it was writing (`discard_pending`); one that a
killed writer left (its process gone) is removed by the next write of the same file. Run directories,
checkpoints, the data-set cache and calibrations all write this way.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable

_pending: set[str] = set()  # this process's temporaries not yet renamed or removed


def write_atomic(path: str, write: Callable[[str], object]) -> None:
    """Fill a temporary file with `write(tmp)`, fsync it, and rename it to `path`."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    _pending.add(tmp)
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
        _pending.discard(tmp)
    _remove_orphans(path)


def discard_pending() -> None:
    """Remove every temporary this process is still writing: called by a process about to leave without
    unwinding (os._exit), whose `write_atomic` may have been interrupted before its clean-up ran."""
    for tmp in list(_pending):
        with contextlib.suppress(OSError):
            os.remove(tmp)
        _pending.discard(tmp)


def _remove_orphans(path: str) -> None:
    """Remove `path`.tmp-PID files whose writer no longer runs (it was killed mid-write)."""
    folder, name = os.path.split(path)
    for entry in os.listdir(folder or "."):
        pid = entry.removeprefix(f"{name}.tmp-")
        if entry != pid and pid.isdigit() and not process_running(int(pid)):
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(folder, entry))


def process_running(pid: int) -> bool:
    """Whether process `pid` exists (a zombie counts: it still holds its id)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def write_text_atomic(path: str, text: str, private: bool = False) -> None:
    """`text` into `path`, whole or not at all; `private`: readable by its owner alone (mode 0600, set before a
    byte is written), for a file that holds a secret."""
    def write(tmp: str) -> None:
        if private:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600))
            os.chmod(tmp, 0o600)
        with open(tmp, "w") as f:
            f.write(text)
    write_atomic(path, write)


def copy_atomic(source: str, path: str) -> None:
    write_atomic(path, lambda tmp: shutil.copyfile(source, tmp))


def move(source: str, path: str) -> None:
    """Rename a finished file into `path` (same file system): readers see it whole or not at all."""
    os.replace(source, path)

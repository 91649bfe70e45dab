"""Every path a user gives lowband to write into, checked once, before any worker starts.

A folder is proven writable by creating and removing a file in it: an existing file being writable proves
nothing (an immutable folder still lets its old files be written), and root passes every permission bit.
A lock file is opened without following a link and only when it is a regular file, so a link planted in
its place is never written through. Each refusal is one `UsageError` naming the flag the user gave, the
path and why, with what to do instead (exit code 2).

Nothing here imports torch: the CLI and the tools shipped in benchmarks/ call it cheaply.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import uuid

from lowband.errors import UsageError

#: what an OSError's errno means to a user who gave a path
WHY = {errno.EEXIST: "a file is in the way", errno.ENOTDIR: "a part of the path is a file, not a directory",
       errno.EACCES: "permission denied", errno.EPERM: "new files are refused there: immutable, or not yours",
       errno.EROFS: "the file system is read-only", errno.ENOSPC: "the disk is full",
       errno.EISDIR: "it is a directory", errno.ENOENT: "a part of the path does not exist",
       errno.ENAMETOOLONG: "the name is too long", errno.ELOOP: "it is a symbolic link"}

#: what a path that exists but is not a regular file or a folder is, in words
KINDS = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
         (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a directory"),
         (stat.S_ISREG, "a regular file"))


def why(error: OSError) -> str:
    """An OSError in a user's words."""
    return WHY.get(error.errno or 0, error.strerror or type(error).__name__)


def kind(path: str) -> str | None:
    """What `path` is ("a FIFO", "a symbolic link", ...), not following a link; None when nothing is there."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return None
    return next((name for test, name in KINDS if test(mode)), "a special file")


def writable_dir(path: str, field: str, make: bool = True) -> None:
    """`path` is a folder lowband can create files in: made (with its parents) when `make`, then proven by
    creating and removing a probe file. Refused in one line naming `field`."""
    if not path or not path.strip():
        raise UsageError(f"{field} is empty; give a directory, or leave the option off")
    found = kind(path)
    if found not in (None, "a directory") and not (found == "a symbolic link" and os.path.isdir(path)):
        raise UsageError(f"{field} {path} is {found}, not a directory; give a directory lowband can create and write")
    try:
        if make:
            os.makedirs(path, exist_ok=True)
        elif found is None:
            raise UsageError(f"{field} {path} does not exist; give an existing directory")
        probe = os.path.join(path, f".lowband-probe-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
        os.remove(probe)
    except OSError as e:
        raise UsageError(f"{field} {path} cannot be written ({why(e)}); give a directory lowband can create and "
                         "write") from None


def can_make_dir(path: str, field: str) -> None:
    """`path` is a folder lowband can write, or can be made: the nearest part of it that exists is a
    folder that is proven writable. Nothing is made, so a command refused later leaves nothing behind."""
    if not path or not path.strip():
        raise UsageError(f"{field} is empty; give a directory, or leave the option off")
    here = os.path.abspath(path)
    while not os.path.lexists(here) and os.path.dirname(here) != here:
        here = os.path.dirname(here)
    if not os.path.isdir(here):
        where = "" if here == os.path.abspath(path) else f": {here} on its way"
        raise UsageError(f"{field} {path}{where} is {kind(here)}, not a directory; give a directory lowband can "
                         "create and write")
    try:
        writable_dir(here, field, make=False)
    except UsageError as e:
        raise UsageError(str(e).replace(f"{field} {here}", f"{field} {path}", 1)) from None


def writable_file(path: str, field: str) -> None:
    """`path` can be written as a file: nothing there or a regular file (a link to one is followed), and its
    folder made and proven writable. Refused in one line naming `field`."""
    if not path or not path.strip():
        raise UsageError(f"{field} is empty; give a file name, or leave the option off")
    found = kind(path)
    target = kind(os.path.realpath(path)) if found == "a symbolic link" else found
    if target not in (None, "a regular file"):
        raise UsageError(f"{field} {path} is {target}, not a file; give a file name lowband can write")
    folder = os.path.dirname(os.path.abspath(path))
    if kind(folder) not in (None, "a directory") and not os.path.isdir(folder):
        raise UsageError(f"{field} {path}: {folder} is {kind(folder)}, not a directory; give a file in a directory")
    writable_dir(folder, field)


def open_lock(folder: str, name: str, field: str) -> int:
    """A descriptor of `folder`/`name` opened for reading and writing, created if missing: refused in one line
    when it is anything but a regular file (a link is never followed, a FIFO never waited on)."""
    path = os.path.join(folder, name)
    found = kind(path)
    if found not in (None, "a regular file"):
        raise UsageError(f"{field} {folder}: its lock file {name} is {found}, not a regular file; lowband writes "
                         f"its lock only into a regular file of its own: remove {path}, or give another directory")
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise UsageError(f"{field} {folder}: its lock file {name} cannot be opened ({why(e)}); remove it, or give "
                         "another directory") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped in between the look and the open
        os.close(fd)
        raise UsageError(f"{field} {folder}: its lock file {name} is not a regular file; remove {path}")
    return fd


def lock_holder(fd: int) -> str:
    """Who holds the flock on `fd`, from /proc/locks: 'another lowband process (pid N)', 'another program
    (pid N, NAME)', or 'another process' when the kernel does not say."""
    st = os.fstat(fd)
    key = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    pid = None
    with contextlib.suppress(OSError), open("/proc/locks") as f:
        for line in f:
            parts = line.split()
            if "FLOCK" in parts and len(parts) >= 6:
                i = parts.index("FLOCK")
                if len(parts) > i + 4 and parts[i + 4] == key and parts[i + 3].isdigit():
                    pid = int(parts[i + 3])
                    break
    if pid is None:
        return "another process"
    if pid == os.getpid():  # a second launcher in this very process (the Python API called twice)
        return f"another lowband process (pid {pid})"
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return f"another process (pid {pid})"
    if any(os.path.basename(a) == "lowband" or a.startswith("lowband.") for a in argv):
        return f"another lowband process (pid {pid})"
    return f"another program (pid {pid}: {' '.join(argv)[:60] or '?'})"

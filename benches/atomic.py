"""Whole-file writes for the bench scripts (compare.py, torch_peers.py): the content goes to a
temporary file in the target's directory, which is then renamed over the target, so a reader
never sees half a file and a failure leaves the previous one in place."""

import os
import tempfile


def umask_mode():
    """0666 less the umask: mkstemp makes 0600 files, a report should be readable."""
    um = os.umask(0)
    os.umask(um)
    return 0o666 & ~um


def replace(path, produce, prefix, suffix):
    """Calls produce(tmp_path) to write the new file, then renames it over `path`."""
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=d)
    os.close(fd)
    try:
        produce(tmp)
        os.chmod(tmp, umask_mode())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_text(path, fill, prefix, suffix):
    """Like replace, for text: fill(f) writes to the open file (newline=""), which is synced
    to disk before the rename."""
    def produce(tmp):
        with open(tmp, "w", newline="") as f:
            fill(f)
            f.flush()
            os.fsync(f.fileno())
    replace(path, produce, prefix, suffix)

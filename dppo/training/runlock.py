"""A lock file so that two processes never train in the same run directory at once."""
from __future__ import annotations

import fcntl
import os

from dppo.errors import ConfigError


class RunLock:
    """Exclusive ``flock`` on ``<run_dir>/.lock``, released at exit (also when the process is killed)."""

    def __init__(self, run_dir: str):
        self.path = os.path.join(run_dir, ".lock")
        self.fd = None

    def acquire(self) -> None:
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            raise ConfigError(f"cannot write in the run directory {os.path.dirname(self.path)}: "
                              f"{err.strerror}; choose a writable hydra.run.dir") from None
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self.fd)
            self.fd = None
            raise ConfigError(f"another process is already training in {os.path.dirname(self.path)}; "
                              f"wait for it or use another run directory") from None
        os.ftruncate(self.fd, 0)
        os.write(self.fd, str(os.getpid()).encode())

    def release(self) -> None:
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None

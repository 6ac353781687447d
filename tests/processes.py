"""Helpers for tests about other processes' files: a pid no process has, and a file made to look old."""
from __future__ import annotations

import os
import subprocess
import sys
import time


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped), so that no live process has it for now."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def age(path, seconds: float = 3600) -> None:
    """Set ``path``'s access and modification times ``seconds`` into the past."""
    t = time.time() - seconds
    os.utime(path, (t, t))

"""What the benches read and set of the processes they start (Linux ``/proc``)."""

from __future__ import annotations

import os
from pathlib import Path


def cpu_seconds(pid: int) -> float:
    """CPU time the process has used so far, all threads (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pin(pid: int, cpus: set[int]) -> None:
    """Move every thread of process ``pid`` and of its children onto ``cpus``."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        os.sched_setaffinity(int(tid), cpus)
        for child in Path(f"/proc/{pid}/task/{tid}/children").read_text().split():
            pin(int(child), cpus)

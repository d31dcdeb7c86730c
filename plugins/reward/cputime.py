"""The reward path's clock: CPU time, which does not stretch when the machine is loaded (wall time does)."""

from __future__ import annotations

import os

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pid: int | None = None) -> float | None:
    """User + system CPU time of process ``pid`` (default: this one) and of the children it has waited
    for, from Linux ``/proc/PID/stat``; None when the process is gone."""
    try:
        with open(f"/proc/{pid or os.getpid()}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2:].split()  # after "pid (comm)": utime, stime, cutime, cstime at 11..14
    return sum(int(v) for v in fields[11:15]) / _CLOCK_TICKS

"""The rendezvous port of a process group that rlforge starts itself (the Ray ranks' ``MASTER_PORT``)."""

from __future__ import annotations

import random
import socket
from pathlib import Path


def rendezvous_port(host: str = "") -> int:
    """A free port for a process group's rendezvous, below the kernel's ephemeral range: a port that ``bind(0)`` found
    and released is one of the ports every outgoing connection draws from, so another process could take it before
    the group's store binds it (EADDRINUSE on a busy machine); below that range only a listener can take it. Drawn
    from the system's randomness: ranks seed ``random`` alike."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768  # Linux's default; elsewhere a port below it is as good
    draw = random.SystemRandom()
    for _ in range(100):
        port = draw.randrange(10000, max(low, 10001))
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        return port
    with socket.socket() as s:  # every draw taken: the kernel's choice
        s.bind((host, 0))
        return int(s.getsockname()[1])

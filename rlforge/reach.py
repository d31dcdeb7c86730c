"""Whether a server answers at an address, checked before a library that would retry it for ever or for minutes
(Ray's GCS client, mlflow's HTTP client) is handed the address."""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

TIMEOUT_S = 10.0  # how long an address may take to accept a connection before the run stops


def silent(url: str, default_port: int | None = None) -> str:
    """"" where something accepts a TCP connection at ``url``'s host and port (``host:port``, ``scheme://host:port``;
    ``default_port`` where the URL names none) within :data:`TIMEOUT_S`, else why not. An address without a host or
    port to try gives "" (not checked)."""
    parts = urlsplit(url if "://" in url else f"tcp://{url}")
    try:
        host, port = parts.hostname, parts.port or default_port
    except ValueError:  # a port that is no number: the library words its own error
        return ""
    if not host or not port:
        return ""
    try:
        socket.create_connection((host, port), timeout=TIMEOUT_S).close()
    except OSError as exc:
        return f"nothing answers at {host}:{port} ({exc.strerror or exc}, after at most {TIMEOUT_S:g} s)"
    return ""

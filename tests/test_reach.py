"""rlforge.reach: an address is tried once, with a timeout, before a library that would retry it is handed it."""

from __future__ import annotations

import socket

from rlforge import reach


def test_an_address_something_listens_at_answers_and_a_closed_one_is_named() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        for url in (f"127.0.0.1:{port}", f"ray://127.0.0.1:{port}", f"http://127.0.0.1:{port}/api"):
            assert reach.silent(url) == "", url
    assert reach.silent(f"http://127.0.0.1:{port}").startswith(f"nothing answers at 127.0.0.1:{port} (")
    assert reach.silent("auto") == "" and reach.silent("http://host:notaport", 80) == ""  # not checked: no port
    assert reach.silent("http://127.0.0.1", 1).startswith("nothing answers at 127.0.0.1:1 (")  # the scheme's port

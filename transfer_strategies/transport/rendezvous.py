"""How the two workers find each other: the prefill worker binds a free port itself, keeps it,
and publishes it in the rendezvous file (so no other process can take the port in between);
the decode worker reads it there."""

from __future__ import annotations

import os
import socket
import time


def listen(host: str, rendezvous: str) -> socket.socket:
    """A listening socket on a free port, published in `rendezvous`."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((host, 0))
    sock.listen()
    tmp = f"{rendezvous}.tmp"
    with open(tmp, "w") as f:
        f.write(str(sock.getsockname()[1]))
    os.replace(tmp, rendezvous)
    return sock


def published_port(rendezvous: str) -> int | None:
    try:
        return int(open(rendezvous).read())
    except (FileNotFoundError, ValueError):
        return None


def wait_for_port(rendezvous: str, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while (port := published_port(rendezvous)) is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the prefill worker did not publish its KV channel port in {rendezvous} "
                               f"within {timeout_s:.0f} s")
        time.sleep(0.05)
    return port


def accept(listener: socket.socket, timeout_s: float) -> socket.socket:
    listener.settimeout(timeout_s)
    try:
        conn, _ = listener.accept()
    except TimeoutError:
        raise TimeoutError(f"the decode worker did not connect to the KV channel within {timeout_s:.0f} s") from None
    finally:
        listener.close()
    conn.settimeout(None)
    return conn


def connect(host: str, port: int, timeout_s: float) -> socket.socket:
    conn = socket.create_connection((host, port), timeout=timeout_s)
    conn.settimeout(None)
    return conn

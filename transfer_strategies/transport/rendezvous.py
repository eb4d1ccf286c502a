"""How the two workers find each other. Two ways:

  a file (one host, the default): the prefill worker binds a free port itself, keeps it, and
      publishes it in the rendezvous file (so no other process can take the port in between);
      the decode worker reads it there.
  an address, tcp://HOST:PORT (transport.address; engines on different hosts, or in different
      network namespaces): the prefill worker binds HOST:PORT, an address of its own host, and
      the decode worker connects to it, retrying until the prefill worker is up.
"""

from __future__ import annotations

import os
import socket
import time

SCHEME = "tcp://"


def address(rendezvous: str) -> tuple[str, int] | None:
    """(host, port) of a rendezvous given as tcp://HOST:PORT; None for a file."""
    if not rendezvous.startswith(SCHEME):
        return None
    host, _, port = rendezvous[len(SCHEME):].rpartition(":")
    return host, int(port)


def listen(host: str, rendezvous: str) -> socket.socket:
    """A listening socket on the rendezvous address, or on a free port published in the file."""
    fixed = address(rendezvous)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if fixed is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a run right after another on the same port
        try:
            sock.bind(fixed)
        except OSError as e:
            sock.close()
            raise OSError(e.errno, f"the prefill worker cannot listen on {fixed[0]}:{fixed[1]} (transport.address): "
                                   f"{e.strerror}") from None
        sock.listen()
        return sock
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


def peer(rendezvous: str, host: str, timeout_s: float) -> tuple[str, int]:
    """Where the decode worker connects: the address, or `host` and the port published in the file."""
    fixed = address(rendezvous)
    if fixed is not None:
        return fixed
    deadline = time.monotonic() + timeout_s
    while (port := published_port(rendezvous)) is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the prefill worker did not publish its KV channel port in {rendezvous} "
                               f"within {timeout_s:.0f} s")
        time.sleep(0.05)
    return host, port


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
    """Connected to the prefill worker, retrying while it is not listening yet (an address given
    in config is known before the prefill engine has started)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            conn = socket.create_connection((host, port), timeout=max(deadline - time.monotonic(), 0.1))
            break
        except (ConnectionRefusedError, TimeoutError, OSError) as e:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no prefill worker reachable at {host}:{port} within {timeout_s:.0f} s "
                                   f"({e})") from None
            time.sleep(0.1)
    conn.settimeout(None)
    return conn

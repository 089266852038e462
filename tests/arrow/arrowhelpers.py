"""Helpers of the icecrypt.arrow tests: a byte-counting TCP proxy in front of a server.

:class:`CountingProxy` sits between pyarrow's S3 client and the moto server and counts
what actually crosses the wire: every byte the server sends back, and the ``Range``
headers of the requests the client sends.  It understands nothing else of HTTP: bytes
are pumped both ways unchanged.
"""

from __future__ import annotations

import re
import socket
import threading

from servers import HOST

_RANGE = re.compile(rb"\r\nrange: *bytes=(\d+)-(\d+)\r\n", re.IGNORECASE)
_REQUEST = re.compile(rb"(?:^|\r\n\r\n|\n)(GET|PUT|POST|HEAD|DELETE) ", re.IGNORECASE)


class CountingProxy:
    """A TCP proxy on 127.0.0.1 to ``upstream``; ``port`` is where clients connect."""

    def __init__(self, upstream_host: str, upstream_port: int):
        self._upstream = (upstream_host, upstream_port)
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((HOST, 0))
        self._listener.listen(64)
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._closed = False
        self._sockets: list[socket.socket] = []
        self.reset()
        threading.Thread(target=self._accept, name="counting-proxy", daemon=True).start()

    def reset(self) -> None:
        """Zero the counters (call when the client is idle)."""
        with self._lock:
            self.server_bytes = 0  # bytes the server sent (headers and bodies)
            self.client_bytes = 0
            self._requests: list[bytearray] = []

    @property
    def ranges(self) -> list[tuple[int, int]]:
        """``(first, last)`` of every ``Range: bytes=first-last`` header sent since reset."""
        with self._lock:
            return [(int(a), int(b)) for data in self._requests for a, b in _RANGE.findall(bytes(data))]

    @property
    def request_count(self) -> int:
        """Requests sent since reset (request lines seen at the start of a message)."""
        with self._lock:
            return sum(len(_REQUEST.findall(bytes(data))) for data in self._requests)

    def close(self) -> None:
        self._closed = True
        for sock in [self._listener, *self._sockets]:
            try:
                sock.close()
            except OSError:
                pass

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self._upstream)
            except OSError:
                client.close()
                continue
            self._sockets += [client, server]
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, from_client: bool) -> None:
        log = bytearray()
        if from_client:
            with self._lock:
                self._requests.append(log)
        try:
            while True:
                data = src.recv(1 << 16)
                if not data:
                    break
                with self._lock:
                    if from_client:
                        self.client_bytes += len(data)
                        if not _is_logged(self._requests, log):  # reset() since: a fresh log
                            log = bytearray()
                            self._requests.append(log)
                        log += data
                    else:
                        self.server_bytes += len(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


def _is_logged(requests: list[bytearray], log: bytearray) -> bool:
    return any(entry is log for entry in requests)

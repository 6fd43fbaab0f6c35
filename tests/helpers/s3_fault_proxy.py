"""An HTTP proxy on loopback that forwards S3 API requests, breaks some ranged GETs on purpose, and
can emulate a real network link (first-byte latency, a bandwidth shared by all connections).

Used by the remote tests and by ``tools/benchmarks/bench_remote.py`` to show that retries lose and duplicate
nothing. Faults follow a fixed schedule over the ranged GETs the proxy sees (so a run is
repeatable): the 2nd and 9th stall (longer than a short client read timeout), every 3rd is cut
in the middle of its body, every 5th (+1) is answered ``503 SlowDown``.

    url, handler, stop = start_fault_proxy("http://127.0.0.1:5000")
    ...  # point AWS_ENDPOINT_URL at url; handler.faults counts what was injected
    stop()

As a program it runs without faults, as an emulated link in its own process (so that its work does
not compete with the measured process's interpreter):

    python -m tests.helpers.s3_fault_proxy UPSTREAM_URL --port 0 --latency-ms 20 --bandwidth-mbps 16
"""

from __future__ import annotations

import http.client
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FaultProxy(BaseHTTPRequestHandler):
    """Request handler; ``start_fault_proxy`` makes a subclass per proxy with its own counters."""

    protocol_version = "HTTP/1.1"
    upstream: tuple[str, int]
    lock = threading.Lock()
    ranged = 0
    faults: dict[str, int] = {"drop": 0, "slowdown": 0, "stall": 0}
    stall_s = 1.5
    stalls_ended = 0  # stalled requests whose stall is over (they then go on to the server)
    inject_faults = True
    latency_s = 0.0  # before the first byte of every response
    bandwidth = 0.0  # bytes/s of the emulated link, shared by all connections (0: unlimited)
    link_free_at = 0.0
    requests: list[tuple[str, str, str | None]]  # (method, path with query, Range header)

    def log_message(self, *args) -> None:
        pass

    def _send_paced(self, data: bytes) -> None:
        """Write ``data`` as an emulated link would: chunks queue for the shared bandwidth."""
        cls = type(self)
        if not cls.bandwidth:
            self.wfile.write(data)
            return
        for i in range(0, len(data), 65536):
            chunk = data[i : i + 65536]
            with cls.lock:
                start = max(time.monotonic(), cls.link_free_at)
                cls.link_free_at = start + len(chunk) / cls.bandwidth
                done = cls.link_free_at
            time.sleep(max(0.0, done - time.monotonic()))
            self.wfile.write(chunk)

    @staticmethod
    def schedule(n: int) -> str | None:
        """The fault for the n-th ranged GET (1-based): "stall", "drop", "slowdown" or None."""
        if n in (2, 9):
            return "stall"
        if n % 3 == 0:
            return "drop"
        if n % 5 == 1:
            return "slowdown"
        return None

    def _fault(self) -> str | None:
        if not self.inject_faults or self.command != "GET" or "Range" not in self.headers:
            return None
        cls = type(self)
        with cls.lock:
            cls.ranged += 1
            n = cls.ranged
        return cls.schedule(n)

    def _forward(self) -> None:
        with type(self).lock:
            type(self).requests.append((self.command, self.path, self.headers.get("Range")))
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        fault = self._fault()
        if fault == "slowdown":
            self._count(fault)
            payload = b"<Error><Code>SlowDown</Code><Message>Reduce your rate</Message></Error>"
            self.send_response(503)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            return
        if fault == "stall":
            self._count(fault)
            time.sleep(self.stall_s)
            with type(self).lock:
                type(self).stalls_ended += 1
        conn = http.client.HTTPConnection(*self.upstream, timeout=10)
        headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
        conn.request(self.command, self.path, body=body, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        conn.close()
        self.send_response(resp.status)
        for k, v in resp.getheaders():
            if k.lower() not in ("connection", "transfer-encoding", "content-length"):
                self.send_header(k, v)
        upstream_length = resp.getheader("Content-Length")
        is_head = self.command == "HEAD"
        self.send_header("Content-Length", upstream_length if is_head else str(len(data)))
        if self.latency_s:
            time.sleep(self.latency_s)
        self.end_headers()
        if fault == "drop" and len(data) > 1:
            self._count(fault)
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        if self.command != "HEAD":
            self._send_paced(data)

    def _count(self, fault: str) -> None:
        with type(self).lock:
            type(self).faults[fault] += 1

    def _forward_quietly(self) -> None:
        try:
            self._forward()
        except OSError:
            pass  # the client gave up on a stalled request, or the test ended during a stall

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward_quietly


def start_fault_proxy(
    upstream_url: str,
    *,
    faults: bool = True,
    schedule: Callable[[int], str | None] | None = None,
    latency_s: float = 0.0,
    bandwidth: float = 0.0,
    port: int = 0,
) -> tuple[str, type[FaultProxy], Callable[[], None]]:
    """Start a proxy to ``upstream_url`` (``http://host:port``) on a loopback port (free if 0);
    returns (proxy url, handler class with the ``faults`` counters and the ``requests`` it
    forwarded, a function that stops it).
    ``schedule(n)`` replaces the fixed fault schedule (the fault for the n-th ranged GET)."""
    host, upstream_port = upstream_url.rsplit("/", 1)[1].split(":")
    handler = type("Proxy", (FaultProxy,), {"upstream": (host, int(upstream_port)), "ranged": 0})
    handler.faults = {"drop": 0, "slowdown": 0, "stall": 0}
    handler.stalls_ended = 0
    handler.requests = []
    handler.lock = threading.Lock()
    handler.inject_faults = faults
    if schedule is not None:
        handler.schedule = staticmethod(schedule)
    handler.latency_s = latency_s
    handler.bandwidth = bandwidth
    server = ThreadingHTTPServer(("127.0.0.1", port), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()

    def stop() -> None:
        server.shutdown()
        server.server_close()

    return f"http://127.0.0.1:{server.server_address[1]}", handler, stop


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(
        description="An emulated network link in front of an S3 server"
    )
    parser.add_argument("upstream", help="http://host:port of the S3 API server")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--bandwidth-mbps", type=float, default=16.0, help="MB/s, all connections")
    parser.add_argument("--faults", action="store_true", help="also inject the fault schedule")
    args = parser.parse_args()
    url, _, _ = start_fault_proxy(
        args.upstream,
        faults=args.faults,
        latency_s=args.latency_ms / 1000,
        bandwidth=args.bandwidth_mbps * 1e6,
        port=args.port,
    )
    print(url, flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()

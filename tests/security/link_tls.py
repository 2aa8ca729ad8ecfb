#!/usr/bin/env python3
"""TLS on the daemons' tcp links (issue 55 item 3), against the real daemons.

A recorder on the loopback interface (an AF_PACKET socket on `lo`: every
TCP byte between the daemons, control and data links alike, without
changing what address any daemon dials) runs while a client sends one
inference whose input is a known pattern (every FP32 element 1234.5678),
first to a plaintext cluster, then to one started with `up --link-tls`
(mutual TLS, throwaway certificates).

- Plaintext (the self-check that the recorder sees what it must): the
  pattern (the emulated model's 16 input elements in a row, as the
  backend's READ of the staged input carries them) and the wire magic `SYMP` are in the recording. If they are
  not, the recorder is broken and the TLS check below would prove nothing.
- TLS: neither the pattern, nor `SYMP`, nor the join token is in the
  recording; a plaintext client on the scheduler's TLS control port gets no
  Challenge (the link is closed), and the cluster goes on serving (every
  daemon alive, another inference answered).

Needs CAP_NET_RAW for the recorder (root in CI's container); without it the
script says so and exits 0 (a capability skip, as io_uring's).

Usage: link_tls.py SYMPHONY_BINARY
"""
import os
import socket
import struct
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster  # noqa: E402

cluster.use_label("security link tls")
fail = cluster.fail

FILL = 1234.5678
PATTERN = struct.pack("<f", FILL) * 16
RECORD_CAP = 256 << 20
ETH_P_ALL = 0x0003
HTTP_STARTS = (b"GET ", b"POST ", b"PUT ", b"HEAD ", b"HTTP/1.")


class Recorder:
    """TCP payload bytes seen on `lo` while running (IPv4; bounded)."""

    def __init__(self):
        self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.ntohs(ETH_P_ALL))
        self.sock.bind(("lo", 0))
        self.sock.settimeout(0.2)
        self.data = bytearray()
        self.http = set()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self.stop.is_set():
            try:
                pkt = self.sock.recv(70000)
            except socket.timeout:
                continue
            if len(pkt) < 14 + 20 or pkt[12:14] != b"\x08\x00" or pkt[14 + 9] != 6:
                continue
            ip = pkt[14:]
            ihl = (ip[0] & 0x0F) * 4
            total = struct.unpack("!H", ip[2:4])[0]
            tcp = ip[ihl:total]
            if len(tcp) < 20:
                continue
            payload = tcp[(tcp[12] >> 4) * 4:]
            # HTTP (the client's JSON request, metrics scrapes) is not a
            # daemon link: a connection that starts like HTTP is left out.
            conn = frozenset((tcp[0:2], tcp[2:4]))
            if payload.startswith(HTTP_STARTS):
                self.http.add(conn)
            if conn in self.http or not payload:
                continue
            if len(self.data) + len(payload) <= RECORD_CAP:
                self.data += payload

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *_exc):
        self.stop.set()
        self.thread.join(timeout=5)
        self.sock.close()
        return False


def recorded_inference(c):
    """The loopback bytes of one inference with the known input."""
    url = c.url()
    cluster.infer_within(url, cluster.BOUND_S)
    with Recorder() as rec:
        cluster.infer(url, fill=FILL)
        time.sleep(0.3)  # the last segments reach the recorder's socket
    return bytes(rec.data)


def plaintext_client_is_refused(c):
    """A plaintext peer on the TLS control port: no Challenge, link closed."""
    host, port = c.printed(r"^scheduler control: (\S+)$").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.settimeout(5)
        s.sendall(cluster.frame(cluster.VERSION, cluster.KIND_HEARTBEAT, 0))
        got = b""
        try:
            while len(got) < 4096:
                chunk = s.recv(4096)
                if not chunk:
                    break
                got += chunk
        except socket.timeout:
            fail("the TLS port kept a plaintext client's link open for 5 s")
        except ConnectionResetError:
            pass
    if cluster.MAGIC in got:
        fail(f"the TLS port spoke plaintext wire to a plaintext client: {got[:32]!r}")


def main():
    binary = sys.argv[1]
    try:
        socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.ntohs(ETH_P_ALL)).close()
    except PermissionError:
        print("security link tls: SKIP: the loopback recorder needs CAP_NET_RAW", flush=True)
        return
    with cluster.Cluster(binary, prefix="symphony-security-tls-") as c:
        seen = recorded_inference(c)
    if PATTERN not in seen or cluster.MAGIC not in seen:
        fail(f"self-check: the recorder saw {len(seen)} bytes of a plaintext cluster without the input pattern or the wire magic: {seen[:200]!r}")
    print(f"plaintext cluster: the recorder saw the input pattern and the wire magic in {len(seen)} bytes", flush=True)
    with cluster.Cluster(binary, prefix="symphony-security-tls-", extra=["--link-tls"]) as c:
        seen = recorded_inference(c)
        token = c.token()
        for what, needle in (("the request's input", PATTERN), ("the wire magic", cluster.MAGIC), ("the join token", token)):
            if needle in seen:
                fail(f"{what} crossed a --link-tls cluster's links in plaintext")
        sched_metrics = c.printed(r"^scheduler metrics: (http://\S+)$")
        tls_closed = 'symphony_links_closed_total{reason="tls"}'
        before = cluster.metric(sched_metrics, tls_closed) or 0
        plaintext_client_is_refused(c)
        # The refusal is counted where an operator looks (bounded wait: the
        # scheduler closes the link as it polls it).
        until = time.monotonic() + cluster.BOUND_S
        while (cluster.metric(sched_metrics, tls_closed) or 0) <= before:
            if time.monotonic() >= until:
                fail(f"the scheduler's {tls_closed} did not count the plaintext client")
            time.sleep(0.05)
        c.check_alive()
        cluster.infer_within(c.url(), cluster.BOUND_S)
        c.check_alive()
    print(f"--link-tls cluster: {len(seen)} bytes recorded, no input, wire magic or token among them; "
          "a plaintext client was refused and the cluster kept serving", flush=True)
    print("security link tls: ok", flush=True)


if __name__ == "__main__":
    main()

"""What the attack scripts share: one `symphony up --serve` cluster (started,
waited for, its printed addresses parsed, torn down), the wire frames an
attacker sends and reads, and the checks on the daemons (alive, listening
ports, an inference end to end, a metric).

A script names itself once (`use_label`), so that `fail` prints whose check
failed. The wire version is read off the wire (the scheduler's Challenge
on a fresh control connection) when the cluster starts, so a format bump
needs no edit here; `VERSION` is the fallback until then.
"""
import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request

MAGIC = b"SYMP"
VERSION = 8  # dataplane::wire::VERSION; replaced by what the scheduler speaks (Cluster.__enter__)
(KIND_REGISTER, KIND_HEARTBEAT, KIND_COMPLETION, KIND_READ_REQUEST, KIND_READ_RESPONSE, KIND_CHALLENGE,
 KIND_JOIN) = 1, 2, 5, 8, 9, 11, 12
ROLE_BACKEND, JOIN_HAS_MAC = 2, 1
HEADER = struct.Struct("<4sHHII")  # magic, version, kind, len, reserved
MAC_DOMAIN = b"symphony-join\0"           # dataplane::join::MAC_DOMAIN
DATA_LINK_LABEL = b"symphony-data-link"   # dataplane::join::DATA_LINK_LABEL
ENDPOINT_LEN = 64
NONCE_LEN = 32  # a Join carries the peer's nonce before its MAC (wire version 9)
READ_STATUS_OK = 0
BOUND_S = 60

_label = "security"


def use_label(label):
    """The prefix of this script's messages ("security bounds", ...)."""
    global _label
    _label = label


def fail(why):
    print(f"{_label}: FAIL: {why}", flush=True)
    sys.exit(1)


# ---- frames -----------------------------------------------------------------

def frame(version, kind, length, body=b""):
    return HEADER.pack(MAGIC, version, kind, length, 0) + body


def read_request(key, offset, length, version=None, task=0, capability=b"\0" * 16):
    """A ReadRequest: wr_id, RemoteRef{key, len, offset}, and from wire
    version 9 on the task it serves and the plan's capability for it."""
    version = VERSION if version is None else version
    body = struct.pack("<QIIQ", 1, key, length, offset)
    if version >= 9:
        body += struct.pack("<Q", task) + capability
    return frame(version, KIND_READ_REQUEST, len(body), body)


def register_backend(backend_id):
    """An unsigned Register{Backend}: role, id, count, reserved, 64-byte endpoint."""
    body = struct.pack("<IIII", ROLE_BACKEND, backend_id, 1, 0) + b"\0" * ENDPOINT_LEN
    return frame(VERSION, KIND_REGISTER, len(body), body)


def forged_join(backend_id, mac):
    """A Join{Backend} claiming a MAC it cannot have made (no token)."""
    body = struct.pack("<IIII", ROLE_BACKEND, backend_id, 1, JOIN_HAS_MAC) + b"\0" * (ENDPOINT_LEN + NONCE_LEN) + mac
    return frame(VERSION, KIND_JOIN, len(body), body)


def recv_exact(s, n):
    got = b""
    while len(got) < n:
        try:
            chunk = s.recv(n - len(got))
        except OSError:
            return None
        if not chunk:
            return None
        got += chunk
    return got


def recv_frame(s):
    """One wire frame from `s` (kind, body), or None if it closed first."""
    head = recv_exact(s, HEADER.size)
    if head is None:
        return None
    magic, _version, kind, length, _ = HEADER.unpack(head)
    if magic != MAGIC or length > 1 << 20:
        fail(f"not a wire frame: {head!r}")
    body = recv_exact(s, length)
    return None if body is None else (kind, body)


def member_link(port, token, backend_id):
    """A data link that answers the frontend's challenge with the token, as
    a backend does (`JoinToken::for_purpose(DATA_LINK_LABEL).sign`)."""
    import hashlib
    import hmac
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    first = recv_frame(s)
    if first is None or first[0] != KIND_CHALLENGE:
        fail(f"port {port} sent no challenge: {first!r}")
    data_key = hmac.new(token, DATA_LINK_LABEL, hashlib.sha256).digest()
    s.sendall(join_answer(first[1][:32], data_key, ROLE_BACKEND, backend_id))
    return s


def join_answer(nonce, key, role, peer_id, count=1):
    """A Join of `role` and `peer_id` answering `nonce` with `key` (the
    token for a scheduler, its data-link form for a frontend's data port);
    from wire version 9 on it carries a fresh peer nonce before its MAC."""
    import hashlib
    import hmac
    signed = struct.pack("<IIII", role, peer_id, count, JOIN_HAS_MAC) + b"\0" * ENDPOINT_LEN
    if VERSION >= 9:
        signed += os.urandom(NONCE_LEN)
    mac = hmac.new(key, MAC_DOMAIN + nonce + struct.pack("<H", VERSION) + signed, hashlib.sha256).digest()
    return frame(VERSION, KIND_JOIN, len(signed) + len(mac), signed + mac)


def challenged(port, source="127.0.0.1"):
    """A connection to `port` from `source` and the nonce of the Challenge
    it was greeted with (not answered yet)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind((source, 0))
    s.settimeout(5)
    s.connect(("127.0.0.1", port))
    first = recv_frame(s)
    if first is None or first[0] != KIND_CHALLENGE:
        fail(f"port {port} sent no challenge: {first!r}")
    return s, first[1][:32]


def spoken_version(host_port):
    """The wire version of the Challenge a fresh connection to `host_port`
    (a scheduler's control port) is greeted with; None if none comes."""
    host, port = host_port.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=2) as s:
            s.settimeout(2)
            head = recv_exact(s, HEADER.size)
    except OSError:
        return None
    if head is None:
        return None
    magic, version, kind, _length, _ = HEADER.unpack(head)
    return version if magic == MAGIC and kind == KIND_CHALLENGE else None


# ---- the daemons --------------------------------------------------------------

def children(pid):
    out = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(x) for x in f.read().split()]
    except OSError:
        pass
    return out


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except OSError:
        return False


def listening_ports(pid):
    """TCP ports `pid` listens on: its socket inodes matched in /proc/net/tcp{,6}."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            m = re.fullmatch(r"socket:\[(\d+)\]", link)
            if m:
                inodes.add(m.group(1))
    except OSError:
        return []
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if cols[3] == "0A" and cols[9] in inodes:  # LISTEN
                ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return sorted(ports)


def data_port(pid):
    """The frontend's data port: the one of its ports that greets a fresh
    connection with a Challenge."""
    for port in listening_ports(pid):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
                s.settimeout(1)
                f = recv_frame(s)
                if f is not None and f[0] == KIND_CHALLENGE:
                    return port
        except OSError:
            continue
    return None


def metric(url, name):
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    m = re.search(r"^%s (\S+)$" % re.escape(name), text, re.M)
    return float(m.group(1)) if m else None


def infer(url, fill=0):
    """One KServe v2 inference of ResNet50 at frontend `url` whose input is
    all `fill`; its answer (raises if it has no outputs)."""
    meta = json.load(urllib.request.urlopen(f"http://{url}/v2/models/ResNet50", timeout=10))
    inp = meta["inputs"][0]
    shape = [1 if d < 0 else d for d in inp["shape"]]
    n = 1
    for d in shape:
        n *= d
    body = {"inputs": [{"name": inp["name"], "datatype": inp["datatype"], "shape": shape, "data": [fill] * n}]}
    req = urllib.request.Request(
        f"http://{url}/v2/models/ResNet50/infer",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    res = json.load(urllib.request.urlopen(req, timeout=10))
    if not res.get("outputs"):
        raise RuntimeError(f"no outputs: {res}")
    return res


def infer_within(url, seconds):
    deadline = time.monotonic() + seconds
    last = None
    while time.monotonic() < deadline:
        try:
            return infer(url)
        except Exception as e:  # noqa: BLE001 - reported below
            last = e
            time.sleep(0.2)
    fail(f"frontend 1 at {url} serves no inference: {last}")


class Cluster:
    """`symphony up --serve --transport tcp --models ResNet50 --frontends 1
    --backends 1` as a context manager: entered once `up` printed
    `serving;` (within BOUND_S), left by SIGINT (then SIGKILL of its
    process group after 20 s). `text` is what `up` printed; `daemons` its
    children (a scheduler, a frontend and a backend). `extra`: more flags
    for `up` (e.g. `--link-tls`)."""

    def __init__(self, binary, prefix="symphony-security-", extra=()):
        self.binary = binary
        self.extra = list(extra)
        self.tmp = tempfile.mkdtemp(prefix=prefix)
        self.out_path = os.path.join(self.tmp, "out")
        self.err_path = os.path.join(self.tmp, "err")
        self.up = None
        self.text = ""
        self.daemons = []

    def __enter__(self):
        args = [self.binary, "up", "--serve", "--transport", "tcp", "--models", "ResNet50",
                "--frontends", "1", "--backends", "1"] + self.extra
        with open(self.out_path, "w") as out, open(self.err_path, "w") as err:
            self.up = subprocess.Popen(args, stdout=out, stderr=err, start_new_session=True)
        try:
            self._wait_serving()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _wait_serving(self):
        global VERSION
        deadline = time.monotonic() + BOUND_S
        while time.monotonic() < deadline:
            self.text = open(self.out_path).read()
            if "serving;" in self.text:
                break
            if self.up.poll() is not None:
                fail("symphony up exited early:\n" + self.stderr_tail())
            time.sleep(0.1)
        else:
            fail("symphony up did not start within %d s" % BOUND_S)
        self.daemons = children(self.up.pid)
        if len(self.daemons) < 3:
            fail(f"expected a scheduler, a frontend and a backend under up, found pids {self.daemons}")
        VERSION = spoken_version(self.printed(r"^scheduler control: (\S+)$")) or VERSION

    def __exit__(self, *_exc):
        up = self.up
        if up is not None and up.poll() is None:
            up.send_signal(signal.SIGINT)
            try:
                up.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(up.pid, signal.SIGKILL)
                up.wait()
        return False

    def printed(self, pattern):
        """The first group of the line of `up`'s output matching `pattern`."""
        m = re.search(pattern, self.text, re.M)
        if not m:
            fail(f"up printed no line matching {pattern!r}:\n{self.text}")
        return m.group(1)

    def url(self):
        """Frontend 1's HTTP address (host:port)."""
        return self.printed(r"^frontend 1: http://(\S+)$")

    def token(self):
        """The cluster's join token (the bytes of the file `up` printed)."""
        with open(self.printed(r"^join token: (\S+)$"), "rb") as f:
            return f.read().strip()

    def role_pids(self, role):
        """The daemons of `role` ("frontend", "backend", "scheduler")."""
        out = []
        for pid in self.daemons:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if role.encode() in f.read().split(b"\0"):
                        out.append(pid)
            except OSError:
                continue
        return out

    def stderr_tail(self):
        return open(self.err_path).read()[-3000:]

    def check_alive(self):
        """Fails unless `up` and every daemon under it still run."""
        dead = [pid for pid in self.daemons if not alive(pid)]
        if self.up.poll() is not None or dead:
            fail(f"daemons died: {dead} (up exit status {self.up.poll()}); stderr tail:\n" + self.stderr_tail())

"""Test hosts for the zcio Python tests, as zcio-testnet makes them: network namespaces with
iptables NFQUEUE rules, joined by veth where a test needs a second host.

A test runs *inside* its namespace: the fixture moves the test's thread there with
setns(2) (a thread's network namespace is its own; sockets keep the namespace they were
made in, threads started meanwhile inherit it) and moves it back afterwards. Needs root (or
CAP_SYS_ADMIN + CAP_NET_ADMIN); without it the tests skip with the reason, and with
ZCIO_REQUIRE_PRIV=1 (CI) such a skip fails.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import shutil
import socket
import subprocess
import sys
import time
from typing import List, Optional

import pytest

CLONE_NEWNET = 0x40000000
PORT = 9999
_libc = ctypes.CDLL(None, use_errno=True)
_seq = itertools.count()


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def require(reason: Optional[str]) -> None:
    """Skips (or, under ZCIO_REQUIRE_PRIV=1, fails) with `reason` when it is not None."""
    if reason is None:
        return
    name = os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0]
    print(f"SKIP {name}: {reason}", file=sys.stderr)
    if os.environ.get("ZCIO_REQUIRE_PRIV") == "1":
        pytest.fail(f"{reason} (ZCIO_REQUIRE_PRIV=1: privileged tests must run)")
    pytest.skip(reason)


def privilege_problem() -> Optional[str]:
    if os.geteuid() != 0:
        return "needs root (network namespaces, iptables, NFQUEUE bind)"
    for tool in ("ip", "iptables"):
        if shutil.which(tool) is None and not os.path.exists(f"/usr/sbin/{tool}"):
            return f"{tool} not found: apt-get install -y iproute2 iptables"
    return None


def sh(*args: str, ns: Optional[str] = None, check: bool = True) -> subprocess.CompletedProcess:
    cmd = (["ip", "netns", "exec", ns] if ns else []) + list(args)
    return subprocess.run(cmd, check=check, capture_output=True, text=True)


class Host:
    """A namespace the test thread has entered; `rule()` adds NFQUEUE rules."""

    def __init__(self, tag: str):
        self.name = f"zcio-py-{os.getpid()}-{next(_seq)}-{tag}"[:40]
        self.peers: List[str] = []
        sh("ip", "netns", "add", self.name)
        sh("ip", "-n", self.name, "link", "set", "lo", "up")
        self._home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        fd = os.open(f"/run/netns/{self.name}", os.O_RDONLY)
        try:
            _setns(fd)
        finally:
            os.close(fd)

    def iptables(self, *rule: str) -> None:
        r = sh("iptables", *rule, ns=self.name, check=False)
        if r.returncode != 0:
            raise RuntimeError(f"iptables {' '.join(rule)}: {r.stderr.strip()}")

    def rule(self, queue: int, *, port: int = PORT, chain: str = "INPUT", extra: str = "") -> None:
        """`iptables -A CHAIN -p udp --dport PORT -j NFQUEUE --queue-num QUEUE`."""
        target = ["-j", "NFQUEUE"] + (extra.split() if extra else ["--queue-num", str(queue)])
        self.iptables("-A", chain, "-p", "udp", "--dport", str(port), *target)

    def peer(self) -> "Peer":
        """A second host joined by a veth pair: 198.18.0.1 (here) <-> 198.18.0.2 (peer)."""
        p = Peer(self)
        self.peers.append(p.name)
        return p

    def close(self) -> None:
        _setns(self._home)
        os.close(self._home)
        for n in [self.name, *self.peers]:
            sh("ip", "netns", "del", n, check=False)


class Peer:
    def __init__(self, host: Host):
        self.name = host.name[:34] + "-peer"
        sh("ip", "netns", "add", self.name)
        sh("ip", "-n", self.name, "link", "set", "lo", "up")
        sh("ip", "-n", host.name, "link", "add", "veth0", "type", "veth", "peer", "name", "veth1",
           "netns", self.name)
        sh("ip", "-n", host.name, "addr", "add", "198.18.0.1/24", "dev", "veth0")
        sh("ip", "-n", self.name, "addr", "add", "198.18.0.2/24", "dev", "veth1")
        sh("ip", "-n", host.name, "link", "set", "veth0", "up")
        sh("ip", "-n", self.name, "link", "set", "veth1", "up")
        # Wait for the carrier, as zcio-testnet does: packets sent before it are lost.
        end = time.time() + 5
        while time.time() < end:
            out = sh("ip", "-n", host.name, "link", "show", "veth0").stdout
            if "LOWER_UP" in out and "NO-CARRIER" not in out:
                break
            time.sleep(0.01)
        self.mac = sh("cat", "/sys/class/net/veth1/address", ns=self.name).stdout.strip()

    def send_udp(self, payloads: List[bytes], port: int = PORT) -> None:
        code = (
            "import socket,sys\n"
            "s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n"
            f"for p in {payloads!r}: s.sendto(p,('198.18.0.1',{port}))\n"
        )
        sh(sys.executable, "-c", code, ns=self.name)


@pytest.fixture
def host(request):
    require(privilege_problem())
    h = Host(request.node.name.replace("test_", "")[:12])
    try:
        yield h
    finally:
        h.close()


class Udp:
    """A UDP receiver on 127.0.0.1:PORT and a sender to it (made inside the namespace)."""

    def __init__(self, port: int = PORT):
        self.rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        self.rx.bind(("127.0.0.1", port))
        self.rx.setblocking(False)
        self.tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.tx.connect(("127.0.0.1", port))
        self.got: List[bytes] = []

    def send(self, *payloads: bytes) -> None:
        for p in payloads:
            self.tx.send(p)

    def drain(self) -> List[bytes]:
        while True:
            try:
                self.got.append(self.rx.recv(65536))
            except BlockingIOError:
                return self.got

    def wait_for(self, n: int, timeout: float = 3.0) -> List[bytes]:
        end = time.time() + timeout
        while len(self.drain()) < n and time.time() < end:
            time.sleep(0.002)
        return self.got

    def close(self):
        self.rx.close()
        self.tx.close()


@pytest.fixture
def udp(host):
    u = Udp()
    try:
        yield u
    finally:
        u.close()


def waiting(queue: int) -> int:
    """Packets the kernel holds for `queue` (in the calling thread's namespace)."""
    with open("/proc/thread-self/net/netfilter/nfnetlink_queue") as f:
        for line in f:
            fields = line.split()
            if int(fields[0]) == queue:
                return int(fields[2])
    return 0


def _audit_status() -> dict:
    out = subprocess.run(["auditctl", "-s"], check=True, capture_output=True, text=True).stdout
    st = {}
    for line in out.splitlines():
        k, _, v = line.partition(" ")
        if v.split() and v.split()[0].isdigit():
            st[k] = int(v.split()[0])
    return st


class AuditHost:
    """The host's audit state for a test that changes it (audit is global, in the initial
    namespaces only), as zcio_testnet::audit::AuditHost keeps it for the Rust tests: one test
    at a time across processes (``flock /tmp/zcio-audit.lock``), refused where another daemon
    is registered, and set back afterwards — the enabled flag, the limits, the registered pid
    and the rules the test added (each tagged with its own key)."""

    def __init__(self, name: str, tmp: str):
        self.name, self.tmp, self.rules = name, tmp, []
        self.saved = _audit_status()

    status = staticmethod(_audit_status)

    def watch(self, name: str):
        """A read watch on a fresh file, tagged with a key of its own: (file, key)."""
        path = os.path.join(self.tmp, name)
        with open(path, "w") as f:
            f.write("x")
        key = f"zcio-py-{name}-{os.getpid()}"
        subprocess.run(["auditctl", "-w", path, "-p", "r", "-k", key], check=True,
                       capture_output=True)
        self.rules.append((path, key))
        return path, key

    def restore(self) -> None:
        for path, key in self.rules:
            subprocess.run(["auditctl", "-W", path, "-p", "r", "-k", key], capture_output=True)
        s = self.saved
        subprocess.run(["auditctl", "-e", str(s["enabled"]), "-b", str(s["backlog_limit"]),
                        "--backlog_wait_time", str(s["backlog_wait_time"]),
                        "-r", str(s["rate_limit"])], check=True, capture_output=True)


@pytest.fixture
def audit_host(request, tmp_path):
    """An ``AuditHost``: skipped without root or auditctl (a failure under
    ZCIO_REQUIRE_PRIV=1); checks on the way out that everything was set back."""
    import fcntl

    if os.geteuid() != 0:
        require("needs root (CAP_AUDIT_CONTROL)")
    if shutil.which("auditctl") is None and not os.path.exists("/usr/sbin/auditctl"):
        require("auditctl not found (scripts/deps installs auditd)")
    lock = open("/tmp/zcio-audit.lock", "w")
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
        h = AuditHost(request.node.name, str(tmp_path))
        if h.saved.get("enabled") == 2:
            require("audit is locked (enabled 2)")
        assert h.saved.get("pid") == 0, (
            f"pid {h.saved.get('pid')} is registered as the audit daemon: refusing to change "
            "the host's audit state beside it")
        try:
            yield h
        finally:
            h.restore()
        after = _audit_status()
        for k in ("enabled", "pid", "backlog_limit", "backlog_wait_time", "rate_limit"):
            assert after[k] == h.saved[k], f"audit {k} not set back: {after[k]} != {h.saved[k]}"
    finally:
        lock.close()

"""zcio's own API: batches of held packets, zero-copy payload views, batch verdicts."""

import asyncio
import gc
import struct
import threading
import time

import pytest
import zcio
from conftest import waiting


def udp_seq(payload) -> int:
    """The sequence number the tests put in the first 4 bytes of each UDP datagram."""
    ihl = (payload[0] & 0xF) * 4
    return struct.unpack(">I", bytes(payload[ihl + 8 : ihl + 12]))[0]


def dgram(i: int, size: int = 64) -> bytes:
    return struct.pack(">I", i) + bytes(size - 4)


def collect(q, n, max=64, timeout=3.0):
    """Batches until `n` packets came, each held past its batch: the caller decides."""
    got = []
    end = time.time() + timeout
    while len(got) < n and time.time() < end:
        b = q.next_batch(max, 0.05)
        for p in b:
            p.hold()
        got.extend(b)
    return got


def test_batches_hold_packets_with_zero_copy_views_and_send_batch_verdicts(host, udp):
    host.rule(1)
    with zcio.NfQueue(1, copy_range=2048) as q:
        assert q.path == "frame-ring+io_uring", q.fallbacks
        udp.send(*(dgram(i, 100) for i in range(64)))
        seen, dropped = [], 0
        for batch in q.batches(max=64, timeout=0.1):
            for p in batch:
                view = p.payload
                assert isinstance(view, memoryview) and view.readonly
                assert len(view) == p.payload_len == 128
                assert type(view.obj).__name__ == "FrameView", "a view into the frame, not a copy"
                s = udp_seq(view)
                seen.append(s)
                if s % 8 == 7:
                    p.drop()
                    dropped += 1
            batch.accept()
            if len(seen) >= 64:
                break
        assert seen == list(range(64)), "every packet once, in order"
        got = udp.wait_for(56)
        assert sorted(udp_seq(b"\x45" + bytes(19) + bytes(8) + g) for g in got) == [
            i for i in range(64) if i % 8 != 7
        ]
        st = q.stats
        assert st["received"] == 64 and st["accepted"] == 56 and st["dropped"] == dropped == 8
        assert st["batches"] >= 1, "verdicts went out as VERDICT_BATCH messages"
        assert st["batches"] + st["singles"] < 64, st
        assert waiting(1) == 0


def test_a_payload_view_is_released_at_the_verdict_and_a_slice_never_sees_reused_bytes(host, udp):
    host.rule(2)
    # Eight frames: the packets below cycle through the seven left many times.
    with zcio.NfQueue(2, copy_range=2048, frames=8) as q:
        udp.send(dgram(1000, 100))
        (p,) = collect(q, 1)
        view = p.payload
        head = view[:32]  # a slice shares the frame
        before = bytes(head)
        p.accept()
        with pytest.raises(ValueError):
            view[0]
        with pytest.raises(ValueError, match="released at its verdict"):
            p.payload
        with pytest.raises(RuntimeError, match="no longer available"):
            p.get_payload()
        for r in range(20):
            udp.send(*(dgram(r * 7 + i, 100) for i in range(7)))
            b = collect(q, 7, max=7)
            assert len(b) == 7, f"round {r}: seven frames free"
            for x in b:
                x.accept()
        assert bytes(head) == before, "the pinned frame was never reused"
        del head, view
        gc.collect()
        udp.send(*(dgram(9000 + i, 100) for i in range(8)))
        last = collect(q, 8, max=8)
        assert len(last) == 8, "the slice's frame came back"
        with pytest.raises(zcio.FramesExhausted, match="all 8 frames"):
            q.next_batch(64, 0.0)
        for x in last:
            x.accept()
        q.flush()
        assert len(udp.wait_for(1 + 140 + 8)) == 149


def test_undecided_packets_get_the_default_verdict_when_the_next_batch_is_fetched(host, udp):
    host.rule(3)
    with zcio.NfQueue(3, copy_range=2048, default_verdict=zcio.ACCEPT) as q:
        udp.send(*(dgram(i) for i in range(10)))
        time.sleep(0.05)
        first = q.next_batch(64, 1.0)
        assert len(first) == 10
        first[0].drop()
        assert waiting(3) == 10, "verdicts go out with the next fetch"
        q.next_batch(64, 0.0)
        assert [p.decided for p in first] == [True] * 10
        assert len(udp.wait_for(9)) == 9
        with pytest.raises(RuntimeError, match="default verdict"):
            first[1].drop()
        assert q.stats["default_verdicts"] == 9


def test_a_held_packet_outlives_its_batch_and_is_decided_later(host, udp):
    host.rule(4)
    with zcio.NfQueue(4, copy_range=2048) as q:
        udp.send(*(dgram(i) for i in range(5)))
        b = collect(q, 5)
        b[2].hold()
        for p in b:
            if p is not b[2]:
                p.accept()
        nxt = q.next_batch(64, 0.05)
        assert len(nxt) == 0
        assert len(udp.wait_for(4)) == 4
        assert waiting(4) == 1, "the held packet is still queued"
        assert udp_seq(b[2].payload) == 2, "its view is valid until its verdict"
        b[2].accept()  # flushed at once: it is past its batch
        assert len(udp.wait_for(5)) == 5
        assert waiting(4) == 0


def test_set_payload_mangles_and_fix_checksums_makes_the_packet_valid(host, udp):
    host.rule(5)
    with zcio.NfQueue(5, copy_range=2048) as q:
        udp.send(b"plain text one", b"plain text two")
        a, b = collect(q, 2)
        for p, fix in ((a, False), (b, True)):
            data = bytearray(p.payload)
            data[28:] = b"REWRITTEN!" + bytes(data[38:])
            p.set_payload(bytes(data), fix_checksums=fix)
            assert p.get_payload() == bytes(data) if not fix else zcio.checksums_ok(p.get_payload())
            p.accept()
        q.flush()
        got = udp.wait_for(1, timeout=0.5)
        assert got == [b"REWRITTEN! two"], "only the packet with fixed checksums arrives"
    with pytest.raises(ValueError, match="cannot fix checksums"):
        zcio.fix_checksums(b"\x60not ip")


def test_fail_open_accepts_while_the_kernel_queue_is_full(host, udp):
    host.rule(6)
    with zcio.NfQueue(6, max_len=4, fail_open=True) as q:
        udp.send(*(dgram(i) for i in range(20)))
        got = udp.wait_for(16, timeout=1)
        assert len(got) == 16, "past max_len the kernel accepts"
        assert waiting(6) == 4
        b = collect(q, 4)
        for p in b:
            p.accept()
        q.flush()
        assert len(udp.wait_for(20)) == 20
    with zcio.NfQueue(6, max_len=4) as q:
        udp.send(*(dgram(i) for i in range(20)))
        time.sleep(0.1)
        assert len(udp.drain()) == 20, "without fail_open the kernel drops the rest"
        assert waiting(6) == 4


def test_enobufs_is_counted_and_survived(host, udp):
    host.rule(7)
    with zcio.NfQueue(7, copy_range=2048, sock_len=8192, max_len=10000, frames=16) as q:
        for i in range(2000):
            udp.send(dgram(i, 1000))
        done = 0
        end = time.time() + 5
        while time.time() < end:
            b = q.next_batch(16, 0.05)
            b.accept()
            done += len(b)
            if not b and q.stats["overruns"]:
                break
        st = q.stats
        assert st["overruns"] >= 1, st
        assert done > 0
        # Still working after the overruns:
        udp.send(dgram(99999))
        assert any(udp_seq(p.payload) == 99999 for p in collect(q, 1))


def test_the_gil_is_released_while_waiting(host):
    host.rule(8)
    with zcio.NfQueue(8) as q:
        ticks = 0
        stop = threading.Event()

        def spin():
            nonlocal ticks
            while not stop.is_set():
                ticks += 1

        t = threading.Thread(target=spin)
        t.start()
        t0 = time.time()
        b = q.next_batch(64, 0.3)
        stop.set()
        t.join()
        assert len(b) == 0 and time.time() - t0 >= 0.29
        assert ticks > 10000, "the other thread ran while next_batch waited"


def test_a_verdict_given_on_another_thread_is_applied_by_the_queue_thread(host, udp):
    host.rule(9)
    with zcio.NfQueue(9) as q:
        udp.send(dgram(1))
        (p,) = collect(q, 1)
        p.hold()
        t = threading.Thread(target=p.accept)
        t.start()
        t.join()
        assert p.decided
        assert waiting(9) == 1, "not applied yet: the queue's thread does it"
        q.next_batch(64, 0.05)
        assert len(udp.wait_for(1)) == 1
        assert waiting(9) == 0


def test_async_for_batches_under_asyncio(host, udp):
    host.rule(10)

    async def main(q):
        n = 0
        async for batch in q:
            n += batch.accept()
            if n >= 30:
                return n

    with zcio.NfQueue(10, copy_range=2048) as q:
        loop = asyncio.new_event_loop()
        try:
            loop.call_later(0.05, lambda: udp.send(*(dgram(i) for i in range(30))))
            assert loop.run_until_complete(asyncio.wait_for(main(q), 5)) == 30
        finally:
            loop.close()
        assert len(udp.wait_for(30)) == 30


def test_fan_out_serves_a_queue_range_one_queue_per_thread(host, udp):
    import os
    import socket

    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("one CPU: --queue-cpu-fanout has one queue to pick")
    # The queue is picked by the CPU the packet is queued on: loopback queues it on the
    # sender's CPU.
    host.rule(0, extra="--queue-balance 20:21 --queue-cpu-fanout")
    seen = set()
    lock = threading.Lock()

    def handler(batch):
        with lock:
            seen.update(p.queue for p in batch)
        batch.accept()

    def send_from(cpu, base):
        os.sched_setaffinity(0, {cpu})
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for i in range(32):
                s.sendto(dgram(base + i), ("127.0.0.1", 9999))

    fan = zcio.FanOut(20, 21, handler, threads=2, copy_range=2048).start()
    senders = [threading.Thread(target=send_from, args=(c, 32 * k)) for k, c in enumerate(cpus[:2])]
    for t in senders:
        t.start()
    for t in senders:
        t.join()
    got = udp.wait_for(64)
    st = fan.stop()
    assert len(got) == 64
    assert seen == {20, 21}
    assert st["received"] == st["accepted"] == 64


def test_binding_a_bound_queue_says_it_is_busy(host):
    with zcio.NfQueue(11):
        with pytest.raises(zcio.QueueBusy, match="already bound"):
            zcio.NfQueue(11)
        with pytest.raises(OSError):
            zcio.NfQueue(11)


def test_without_cap_net_admin_binding_says_what_to_do(host):
    import shutil
    import subprocess
    import sys

    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("setpriv (util-linux) not found")
    code = (
        "import zcio\n"
        "try:\n"
        "    zcio.NfQueue(12)\n"
        "except PermissionError as e:\n"
        "    print('PERM', e)\n"
    )
    r = subprocess.run(
        ["ip", "netns", "exec", host.name, setpriv, "--inh-caps=-net_admin", "--bounding-set=-net_admin",
         sys.executable, "-c", code],
        capture_output=True, text=True, timeout=30,
    )
    assert "PERM" in r.stdout, (r.stdout, r.stderr)
    assert "CAP_NET_ADMIN" in r.stdout


def test_the_readme_example_drops_udp_to_port_53_and_accepts_the_rest(host, udp):
    import re
    import signal
    import socket
    import subprocess
    import sys
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    section = readme.split("## Python\n", 1)[1]
    code = re.findall(r"```python\n(.*?)```", section, re.S)[0]
    host.iptables("-A", "INPUT", "-p", "udp", "-j", "NFQUEUE", "--queue-num", "1")
    dns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    dns.bind(("127.0.0.1", 53))
    dns.setblocking(False)
    p = subprocess.Popen(["ip", "netns", "exec", host.name, sys.executable, "-c", code],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        end = time.time() + 10
        while not udp.drain() and time.time() < end:
            udp.send(b"before")  # dropped (no listener) until the example has bound queue 1
            time.sleep(0.05)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.sendto(b"query", ("127.0.0.1", 53))
        udp.send(b"after")
        assert b"after" in udp.wait_for(len(udp.got) + 1)
        time.sleep(0.05)
        try:
            dns.recv(100)
            raise AssertionError("UDP to port 53 was not dropped")
        except BlockingIOError:
            pass
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=5)
        assert "KeyboardInterrupt" in err
    finally:
        if p.poll() is None:
            p.kill()
        dns.close()

"""Audit: the kernel's audit events on the frame ring, from Python, on the host's kernel
(audit is global: every test takes the ``audit_host`` fixture, which serialises with the Rust
audit tests and sets the host's audit state back)."""

import asyncio
import subprocess
import time

import zcio


def storm(path: str, n: int) -> subprocess.Popen:
    """A process that opens ``path`` ``n`` times (one openat each)."""
    loop = f"i=0; while [ $i -lt {n} ]; do : < '{path}'; i=$((i+1)); done"
    return subprocess.Popen(["sh", "-c", loop])


def key_of(ev: dict):
    sc = [r for r in ev["records"] if r["type"] == 1300]
    return sc[0]["fields"].get("key") if sc else None


def whole(ev: dict, path: str) -> bool:
    types = [r["type"] for r in ev["records"]]
    return (ev["end"] == "eoe" and not ev["incomplete"] and types[:1] == [1300]
            and 1327 in types
            and any(r["type"] == 1302 and r["fields"].get("name") == path for r in ev["records"]))


def test_audit_storm_arrives_once_and_whole_in_batches_with_exact_counters(audit_host):
    path, key = audit_host.watch("pystorm")
    n = 1000
    with zcio.Audit(fallback=False) as a:
        assert a.mode == "primary" and a.fallbacks == []
        st0 = audit_host.status()
        assert st0["pid"] > 0 and st0["enabled"] == 1
        child = storm(path, n)
        got, other, batches = {}, 0, 0
        dup = 0
        end = time.time() + 60
        while len(got) < n and time.time() < end:
            b = a.next_batch(0.2)
            batches += 1 if b else 0
            for ev in b:
                if key_of(ev) != key:
                    other += 1
                    continue
                if ev["serial"] in got:
                    dup += 1
                got[ev["serial"]] = ev
        assert child.wait() == 0
        # Anything late or doubled shows now.
        late = [ev for ev in a.next_batch(0.7) + a.flush() if key_of(ev) == key]
        assert (len(got), dup, len(late)) == (n, 0, 0)
        broken = [ev for ev in got.values() if not whole(ev, path)]
        assert not broken, broken[:2]
        ev = next(iter(got.values()))
        # Records in order, fields decoded (proctitle is hex on the wire), the raw text beside.
        sc, = [r for r in ev["records"] if r["type"] == 1300]
        assert sc["name"] == "SYSCALL" and sc["fields"]["key"] == key
        assert f'key="{key}"' in sc["text"]
        pt, = [r for r in ev["records"] if r["type"] == 1327]
        assert pt["fields"]["proctitle"].startswith("sh\0-c"), pt
        assert pt["text"].startswith("proctitle=7368002D63"), pt["text"]
        assert isinstance(ev["time"], float) and ev["serial"] > 0
        st = a.stats
        assert st["mode"] == "primary"
        assert st["events"] >= n and st["records"] >= 3 * n
        assert st["incomplete"] == 0 and st["kernel_drops"] == 0 and st["parse_errors"] == 0
        assert st["kernel_lost_now"] == st["kernel_lost_at_open"] == st0["lost"]
        assert st["lost_exact"] and st["lost_at_least"] == 0 and st["lost_at_most"] == 0
        assert st["loss_summary"].startswith("no loss"), st["loss_summary"]
        assert batches < n, "events came in batches, not one per call"
    # Closed: unregistered, the enabled flag set back.
    after = audit_host.status()
    assert after["pid"] == 0 and after["enabled"] == audit_host.saved["enabled"]
    try:
        a.next_batch(0)
        raise AssertionError("a closed consumer read")
    except RuntimeError as e:
        assert "closed" in str(e)


def test_audit_under_asyncio(audit_host):
    path, key = audit_host.watch("pyasync")
    n = 200

    async def main(a):
        seen = set()
        child = storm(path, n)
        async for ev in a:
            if key_of(ev) == key:
                assert whole(ev, path)
                seen.add(ev["serial"])
                if len(seen) == n:
                    break
        assert await asyncio.get_running_loop().run_in_executor(None, child.wait) == 0
        return len(seen)

    with zcio.Audit(fallback=False) as a:
        loop = asyncio.new_event_loop()
        try:
            assert loop.run_until_complete(asyncio.wait_for(main(a), 30)) == n
        finally:
            loop.close()
    assert audit_host.status()["pid"] == 0


def test_audit_under_asyncio_closes_an_event_without_its_end_record(audit_host):
    # ANOM_ABEND (1701): a shell that sends itself SIGABRT dies outside any syscall, so the
    # record has no end-of-event record after it. Nothing else arrives: only the wait bounded
    # by next_close() can hand the event over under `async for`.
    async def main(a):
        t0 = time.monotonic()
        rc = subprocess.call(["sh", "-c", "ulimit -c 0; kill -ABRT $$"])
        assert rc == -6
        async for ev in a:
            if any(r["type"] == 1701 for r in ev["records"]):
                return ev, time.monotonic() - t0

    with zcio.Audit(fallback=False, event_wait=0.3) as a:
        loop = asyncio.new_event_loop()
        try:
            ev, took = loop.run_until_complete(asyncio.wait_for(main(a), 10))
        finally:
            loop.close()
        assert ev["end"] == "wait"
        assert took >= 0.3
        assert a.stats["waited"] >= 1

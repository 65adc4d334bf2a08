#!/usr/bin/env python3
"""Helper of scripts/vmtest: kernel-module closure, cargo artifact list, guest-result report.

Subcommands:
  artifacts JSON                   cargo --message-format=json -> "name<TAB>path" of test binaries
  modules MODDIR DEST NAME...      copy NAME... and their dependencies (from MODDIR/modules.dep),
                                   decompressed, under DEST/lib/modules/VER/; print load order
  report KVER RESULTS CONSOLE      parse the guest's result log; print the summary line, skip
                                   reasons and failures; exit 1 on failure or missing results
"""
import json
import lzma
import os
import re
import shutil
import subprocess
import sys


def artifacts(path):
    seen = set()
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            m = json.loads(line)
            if m.get("reason") != "compiler-artifact" or not m.get("profile", {}).get("test"):
                continue
            exe = m.get("executable")
            if not exe:
                continue
            t = m["target"]
            name = "lib" if "lib" in t["kind"] else t["name"]
            if (name, exe) in seen:
                continue
            seen.add((name, exe))
            print(f"{name}\t{exe}")


def _decompress(src, dst):
    if src.endswith(".xz"):
        with lzma.open(src) as i, open(dst, "wb") as o:
            shutil.copyfileobj(i, o)
    elif src.endswith(".zst"):
        subprocess.run(["zstd", "-q", "-d", "-f", src, "-o", dst], check=True)
    elif src.endswith(".gz"):
        import gzip

        with gzip.open(src) as i, open(dst, "wb") as o:
            shutil.copyfileobj(i, o)
    else:
        shutil.copyfile(src, dst)


def _strip_ext(p):
    for ext in (".xz", ".zst", ".gz"):
        if p.endswith(ext):
            p = p[: -len(ext)]
    return p


def modules(moddir, dest, names):
    """Copies modules NAMES and what they depend on (the `depends=` entry of each module's
    .modinfo, so no modules.dep/depmod is needed), decompressed; prints them in load order."""
    ver = os.path.basename(os.path.normpath(moddir))
    by_name = {}
    for d, _, files in os.walk(moddir):
        for fn in files:
            base = _strip_ext(fn)
            if base.endswith(".ko"):
                by_name[base[: -len(".ko")].replace("-", "_")] = os.path.join(d, fn)
    outdir = os.path.join(dest, "lib", "modules", ver)
    order, done = [], set()

    def visit(name, stack=()):
        name = name.replace("-", "_")
        if name in done or name in stack:
            return True
        src = by_name.get(name)
        if src is None:
            return False
        rel = _strip_ext(os.path.relpath(src, moddir))
        out = os.path.join(outdir, rel)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        _decompress(src, out)
        with open(out, "rb") as f:
            data = f.read()
        m = re.search(rb"(?:^|\x00)depends=([^\x00]*)\x00", data)
        for dep in (m.group(1).decode().split(",") if m and m.group(1) else []):
            if dep and not visit(dep, stack + (name,)):
                print(f"vmtest: {name} needs {dep}, which {ver} does not have", file=sys.stderr)
        done.add(name)
        order.append(f"/lib/modules/{ver}/{rel}")
        return True

    for n in names:
        if not visit(n):
            print(f"vmtest: kernel {ver} has no module {n} (built in or not built)", file=sys.stderr)
    print("\n".join(order))


BEGIN = re.compile(r"^@@VMTEST BEGIN (\S+)")
END = re.compile(r"^@@VMTEST END (\S+) rc=(-?\d+)")
RESULT = re.compile(
    r"^test result: \w+\. (\d+) passed; (\d+) failed; (\d+) ignored; (\d+) measured; (\d+) filtered out"
)
SKIP = re.compile(r"SKIP (\S+?): (.*)$")
SECTION = re.compile(r"^---- (\S+) stdout ----$")
TESTLINE = re.compile(r"^test (\S+) \.\.\. (ok|FAILED|ignored)(?:, (.*))?$")


FINISHED = re.compile(r"; finished in [0-9.]+s")
# Measured durations a test or the kernel printed (`in 2.69s`, `1.5ms`, `[  584.27]`): removed
# from every line the report echoes, since emulation makes them meaningless.
DURATION = re.compile(r"\b(?:in )?\d+(?:\.\d+)?(?:s|ms|µs|us|ns)\b(?! *[/a-z])|^\[ *\d+\.\d+\] ?")


def scrub(line):
    return DURATION.sub("", line)


def report(kver, results_path, console_path):
    try:
        with open(results_path, errors="replace") as f:
            # No timing figure from a guest is passed on: emulation makes them meaningless.
            lines = [FINISHED.sub("", l.rstrip("\r\n").replace("\r", "")) for l in f]
    except FileNotFoundError:
        lines = []
    passed = failed = skipped = 0
    skips = {}  # test -> reason
    ignored = {}
    failures = []  # (binary, test, message lines)
    complete = any(l.startswith("@@VMTEST DONE") for l in lines)
    bins_ok = True
    cur = None
    section = None
    section_lines = []
    failed_names = set()
    bin_passed_names = []
    notes = []

    def close_section():
        nonlocal section, section_lines
        if section is not None:
            key = (cur, section)
            sec_texts[key] = section_lines
        section = None
        section_lines = []

    sec_texts = {}
    for l in lines:
        m = BEGIN.match(l)
        if m:
            cur = m.group(1)
            section = None
            continue
        m = END.match(l)
        if m:
            close_section()
            rc = int(m.group(2))
            if rc != 0 and not any(b == cur for b, _ in failed_names):
                # A crash (signal, abort) or a harness error without a libtest failure line.
                failures.append((cur, "(binary)", [f"exited with status {rc}"]))
                bins_ok = False
            cur = None
            continue
        if l.startswith("@@VMTEST NOTE "):
            notes.append(l[len("@@VMTEST NOTE "):])
            continue
        m = SECTION.match(l)
        if m:
            close_section()
            section = m.group(1)
            continue
        if section is not None:
            if l in ("successes:", "failures:") or l.startswith("test result:"):
                close_section()
            else:
                section_lines.append(l)
        m = TESTLINE.match(l)
        if m:
            name, res = m.group(1), m.group(2)
            if res == "FAILED":
                failed_names.add((cur, name))
            elif res == "ignored":
                ignored[name] = m.group(3) or "#[ignore]"
            continue
        m = RESULT.match(l)
        if m:
            p, fl, ig = int(m.group(1)), int(m.group(2)), int(m.group(3))
            passed += p
            failed += fl
            skipped += ig
            continue
    close_section()
    # Skips: tests print `SKIP <test>: <reason>` (captured; shown by --show-output).
    for (b, name), text in sec_texts.items():
        if (b, name) in failed_names:
            continue
        for t in text:
            m = SKIP.search(t)
            if m:
                skips[name] = m.group(2).strip()
                break
    n_skip = len(skips)
    passed -= n_skip
    skipped += n_skip
    for b, name in sorted(failed_names, key=lambda x: (x[0] or "", x[1])):
        failures.append((b, name, sec_texts.get((b, name), [])))
    failed = max(failed, len([f for f in failures]))
    print(f"vmtest {kver}: {passed} passed, {failed} failed, {skipped} skipped")
    for name, reason in sorted(skips.items()):
        print(f"  skipped {name}: {reason}")
    for name, reason in sorted(ignored.items()):
        print(f"  skipped {name}: ignored ({reason})")
    for n in notes:
        print(f"  note: {n}")
    for b, name, text in failures:
        print(f"  FAILED {b}::{name}")
        text = [t for t in text if t.strip() and not t.startswith("note: run with")]
        # The panic message first: a test's own debug output before it can be long.
        at = next((i for i, t in enumerate(text) if " panicked at " in t), 0)
        for t in text[at : at + 12]:
            print(f"    {scrub(t)}")
    ok = failed == 0 and complete and bins_ok
    if not complete:
        print(f"  guest {kver} did not finish; last console lines:")
        try:
            with open(console_path, errors="replace") as f:
                tail = [l.rstrip("\r\n") for l in f][-30:]
        except FileNotFoundError:
            tail = ["(no console log)"]
        for t in tail:
            print(f"    | {scrub(t)}")
        if lines:
            print("  last result lines:")
            for t in lines[-15:]:
                print(f"    | {scrub(t)}")
    return 0 if ok else 1


def main():
    cmd = sys.argv[1]
    if cmd == "artifacts":
        artifacts(sys.argv[2])
    elif cmd == "modules":
        modules(sys.argv[2], sys.argv[3], sys.argv[4:])
    elif cmd == "report":
        sys.exit(report(sys.argv[2], sys.argv[3], sys.argv[4]))
    else:
        sys.exit(f"unknown subcommand {cmd}")


if __name__ == "__main__":
    main()

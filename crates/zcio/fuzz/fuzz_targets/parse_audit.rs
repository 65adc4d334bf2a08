//! The audit record parser over arbitrary bytes (one netlink datagram, audit's length quirk
//! included): errors are fine, panics (and a record that changes through parse → auditd's log
//! line → parse) are bugs. The seed corpus is `corpus/parse_audit/` (SYSCALL, CWD, PATH,
//! PROCTITLE, EOE, EXECVE, CONFIG_CHANGE and user-message records in the kernel's unicast and
//! multicast framings, and its AUDIT_REPLACE probe); `tests/audit.rs::
//! audit_parser_survives_fuzz_corpus_and_mutations` runs the same function over the corpus and
//! deterministic mutations on stable Rust.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = zcio::netlink::fuzz_parse_audit(data);
});

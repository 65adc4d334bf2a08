//! The conntrack event parser over arbitrary bytes: errors are fine, panics (and an event that
//! changes through parse → emit → parse) are bugs. The seed corpus is `corpus/parse_ctevents/`
//! (NEW, UPDATE and DESTROY events of TCP, UDP and UDPv6 connections captured from the kernel);
//! `tests/ct_events.rs::ctevent_parser_survives_fuzz_corpus_and_mutations` runs the same
//! function over the corpus and deterministic mutations on stable Rust.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = zcio::netlink::fuzz_parse_ctevents(data);
});

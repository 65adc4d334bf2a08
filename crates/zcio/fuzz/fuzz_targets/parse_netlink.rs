//! Every netlink / nfqueue / rtnetlink parser over arbitrary bytes: errors are fine, panics are
//! bugs. The seed corpus is `corpus/parse_netlink/` (captured kernel datagrams and emitted
//! verdict/config messages); `tests/nfqueue.rs::parsers_survive_fuzz_corpus_and_mutations`
//! runs the same function over the corpus and deterministic mutations on stable Rust.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = zcio::netlink::fuzz_parse(data);
});

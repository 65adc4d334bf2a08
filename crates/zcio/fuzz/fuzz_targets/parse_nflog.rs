//! The NFLOG parser over arbitrary bytes: errors are fine, panics (and a packet that changes
//! through parse → emit → parse) are bugs. The seed corpus is `corpus/parse_nflog/` (datagrams
//! captured from the kernel: single messages and a batch ending in NLMSG_DONE);
//! `tests/nflog.rs::nflog_parser_survives_fuzz_corpus_and_mutations` runs the same function
//! over the corpus and deterministic mutations on stable Rust.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = zcio::netlink::fuzz_parse_nflog(data);
});

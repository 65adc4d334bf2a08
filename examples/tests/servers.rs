//! The example servers on both loops: echo returns every byte; HTTP answers every request,
//! keep-alive and one connection per request.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;
use zcio_examples::loadgen::{self, Load};
use zcio_examples::{LoopKind, Running, Trigger};

const ALL: [(LoopKind, Trigger); 4] = [
    (LoopKind::Epoll, Trigger::Edge),
    (LoopKind::Epoll, Trigger::Level),
    (LoopKind::Ring, Trigger::Edge),
    (LoopKind::Ring, Trigger::Level),
];

#[test]
fn echo_returns_every_byte_on_both_loops() {
    for (kind, trig) in ALL {
        let srv = Running::start(kind, trig, false, None).unwrap();
        let mut s = TcpStream::connect(srv.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let data: Vec<u8> = (0..200_000u32).map(|i| (i * 7) as u8).collect();
        let mut w = s.try_clone().unwrap();
        let d2 = data.clone();
        let writer = std::thread::spawn(move || w.write_all(&d2));
        let mut got = vec![0u8; data.len()];
        s.read_exact(&mut got).unwrap();
        writer.join().unwrap().unwrap();
        assert!(got == data, "{kind:?}/{trig:?}: echo differs");
        drop(s);
        let (st, desc) = srv.stop().unwrap();
        assert_eq!(st.accepted, 1, "{desc}");
    }
}

#[test]
fn http_answers_every_request_keep_alive_and_per_connection() {
    for (kind, trig) in ALL {
        for keep_alive in [true, false] {
            let srv = Running::start(kind, trig, true, None).unwrap();
            let r = loadgen::run(&Load {
                addr: srv.addr,
                conns: 16,
                max_requests: 400,
                max_time: Duration::from_secs(20),
                keep_alive,
            })
            .unwrap();
            let (st, desc) = srv.stop().unwrap();
            assert_eq!(r.errors, 0, "{desc} {trig:?} keep_alive={keep_alive}");
            assert_eq!(r.requests, 400, "{desc} {trig:?} keep_alive={keep_alive}");
            if keep_alive {
                assert_eq!(st.accepted, 16, "{desc}");
            } else {
                assert_eq!(st.accepted, 400, "{desc}");
            }
        }
    }
}

//! Echo server on 127.0.0.1: every byte back, on zcio's EventRing or on epoll (`--loop ring|epoll`); everything but the loop is
//! shared (`zcio_examples::serve`).

use clap::Parser;
use std::net::TcpListener;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;
use zcio_examples::{make_loop, serve, Echo, Http, LoopKind, Protocol, Trigger};

#[derive(Parser)]
#[command(about = "Echo server on 127.0.0.1: every byte back")]
struct Args {
    /// Event loop.
    #[arg(long = "loop", value_enum, default_value = "ring")]
    lp: LoopKind,
    /// Edge- or level-triggered registrations.
    #[arg(long, value_enum, default_value = "edge")]
    trigger: Trigger,
    /// Port on 127.0.0.1 (0: any; the chosen one is printed).
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Stop after this many seconds (0: run until killed).
    #[arg(long, default_value_t = 0)]
    seconds: u64,
}

fn main() -> std::io::Result<()> {
    let a = Args::parse();
    let listener = TcpListener::bind(("127.0.0.1", a.port))?;
    let mut lp = make_loop(a.lp)?;
    println!(
        "listening on {} with {}",
        listener.local_addr()?,
        lp.describe()
    );
    let stop = Arc::new(AtomicBool::new(false));
    if a.seconds > 0 {
        let s = stop.clone();
        let secs = a.seconds;
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs(secs));
            s.store(true, std::sync::atomic::Ordering::Relaxed);
        });
    }
    let mut proto: Box<dyn Protocol> = if false {
        Box::new(Http)
    } else {
        Box::new(Echo)
    };
    let st = serve(listener, lp.as_mut(), proto.as_mut(), a.trigger, &stop)?;
    println!(
        "events {} accepted {} loop syscalls {} wait entries {}",
        st.events, st.accepted, st.loop_syscalls, st.wait_entries
    );
    Ok(())
}

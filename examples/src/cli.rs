//! The `main` shared by the example servers: options, loop choice, run, final stats.

use crate::{make_loop, serve, LoopKind, Protocol, Trigger};
use std::net::TcpListener;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

/// Command-line options shared by the example servers.
#[derive(clap::Args, Debug)]
pub struct ServerArgs {
    /// Event loop.
    #[arg(long = "loop", value_enum, default_value = "ring")]
    pub lp: LoopKind,
    /// Edge- or level-triggered registrations.
    #[arg(long, value_enum, default_value = "edge")]
    pub trigger: Trigger,
    /// Port on 127.0.0.1 (0: any; the chosen one is printed).
    #[arg(long, default_value_t = 0)]
    pub port: u16,
    /// Stop after this many seconds (0: run until killed).
    #[arg(long, default_value_t = 0)]
    pub seconds: u64,
}

/// Runs a server for `proto` with the parsed arguments until `--seconds` pass (or forever).
pub fn run_server(a: &ServerArgs, proto: &mut dyn Protocol) -> std::io::Result<()> {
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
    let st = serve(listener, lp.as_mut(), proto, a.trigger, &stop)?;
    println!(
        "events {} accepted {} loop syscalls {} wait entries {}",
        st.events, st.accepted, st.loop_syscalls, st.wait_entries
    );
    Ok(())
}

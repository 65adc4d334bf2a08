//! The shape of every two-sided bench case: a server side and a client side, each on its own
//! thread pinned to a core (optionally inside a test namespace), joined with both results. A
//! side that panics is reported by side and case, not as a bare "thread panicked"; what the
//! server received is checked against what the client sent ([`ensure_bytes`]). (No suite checks
//! content in its measured path: that would change what it measures; `zcio perf --verify`
//! does, with `perf::pattern`.)

use anyhow::{anyhow, Context, Result};
use std::thread::JoinHandle;
use zcio_testnet::Netns;

/// Which side of a pair a thread runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// Receives (accepts, consumes).
    Server,
    /// Sends (connects, produces).
    Client,
}

impl Side {
    fn name(self) -> &'static str {
        match self {
            Side::Server => "server",
            Side::Client => "client",
        }
    }
}

/// One running side; [`Running::join`] returns its result or names the side that panicked.
#[must_use = "join the side to get its result and see its panic"]
pub struct Running<T> {
    case: String,
    side: Side,
    handle: JoinHandle<T>,
}

impl<T> Running<T> {
    /// Waits for the side; a panic becomes an error naming the case and the side.
    pub fn join(self) -> Result<T> {
        self.handle.join().map_err(|p| {
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "non-string panic payload".into());
            anyhow!("{}: {} side panicked: {msg}", self.case, self.side.name())
        })
    }
}

impl<T> Running<Result<T>> {
    /// [`Running::join`] for a side that returns a `Result`: its error gets the same context.
    pub fn result(self) -> Result<T> {
        let (case, side) = (self.case.clone(), self.side);
        self.join()?
            .with_context(|| format!("{case}: {} side", side.name()))
    }
}

impl<T> Running<std::io::Result<T>> {
    /// [`Running::result`] for a side that returns an `io::Result`.
    pub fn io_result(self) -> Result<T> {
        let (case, side) = (self.case.clone(), self.side);
        self.join()?
            .with_context(|| format!("{case}: {} side", side.name()))
    }
}

/// Where and on which cores a case's two sides run.
pub struct Pair<'a> {
    case: String,
    server_cpu: Option<usize>,
    client_cpu: Option<usize>,
    server_ns: Option<&'a Netns>,
    client_ns: Option<&'a Netns>,
}

/// A pair for `case`: both sides in this namespace, unpinned until [`Pair::cores`].
pub fn pair<'a>(case: impl Into<String>) -> Pair<'a> {
    Pair {
        case: case.into(),
        server_cpu: None,
        client_cpu: None,
        server_ns: None,
        client_ns: None,
    }
}

impl<'a> Pair<'a> {
    /// Pins the client side to `client` and the server side to `server` (the order of
    /// [`core_plan`](super::measure::core_plan): sender first).
    pub fn cores(mut self, (client, server): (usize, usize)) -> Self {
        self.client_cpu = Some(client);
        self.server_cpu = Some(server);
        self
    }

    /// Pins only the server side.
    pub fn server_core(mut self, cpu: usize) -> Self {
        self.server_cpu = Some(cpu);
        self
    }

    /// Runs the server side inside `ns`.
    pub fn server_in(mut self, ns: &'a Netns) -> Self {
        self.server_ns = Some(ns);
        self
    }

    /// Runs the client side inside `ns`.
    pub fn client_in(mut self, ns: &'a Netns) -> Self {
        self.client_ns = Some(ns);
        self
    }

    /// Starts the server side.
    pub fn server<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<Running<T>> {
        self.start(Side::Server, f)
    }

    /// Starts the client side.
    pub fn client<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<Running<T>> {
        self.start(Side::Client, f)
    }

    fn start<T: Send + 'static>(
        &self,
        side: Side,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<Running<T>> {
        let (cpu, ns) = match side {
            Side::Server => (self.server_cpu, self.server_ns),
            Side::Client => (self.client_cpu, self.client_ns),
        };
        let body = move || {
            if let Some(c) = cpu {
                // Best effort, as everywhere in the benches: an unpinned run is still a run.
                let _ = zcio_testnet::cpu::pin_thread(c);
            }
            f()
        };
        let handle = match ns {
            Some(ns) => ns
                .spawn(body)
                .map_err(|e| anyhow!("{}: {} side: {e}", self.case, side.name()))?,
            None => std::thread::Builder::new()
                .name(side.name().into())
                .spawn(body)
                .with_context(|| format!("{}: spawning the {} side", self.case, side.name()))?,
        };
        Ok(Running {
            case: self.case.clone(),
            side,
            handle,
        })
    }
}

/// Fails unless the server received exactly what the client sent.
pub fn ensure_bytes(received: u64, sent: u64) -> Result<()> {
    anyhow::ensure!(received == sent, "receiver got {received} of {sent} bytes");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panicking_side_is_reported_with_its_side_and_case() {
        let p = pair("tcp 4K same-core");
        let s = p.server(|| -> u32 { panic!("accept failed") }).unwrap();
        let e = s.join().unwrap_err().to_string();
        assert_eq!(e, "tcp 4K same-core: server side panicked: accept failed");
        let c = p.client(|| -> u32 { panic!("{} bytes", 7) }).unwrap();
        let e = c.join().unwrap_err().to_string();
        assert_eq!(e, "tcp 4K same-core: client side panicked: 7 bytes");
    }

    #[test]
    fn both_sides_results_come_back_and_errors_name_the_side() {
        let p = pair("case").cores((0, 0));
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let server = p
            .server(move || -> std::io::Result<u64> {
                use std::io::Read;
                let (mut s, _) = l.accept()?;
                let mut v = Vec::new();
                Ok(s.read_to_end(&mut v)? as u64)
            })
            .unwrap();
        let client = p
            .client(move || -> std::io::Result<u64> {
                use std::io::Write;
                let mut s = std::net::TcpStream::connect(addr)?;
                s.write_all(&[0x5a; 1000])?;
                Ok(1000)
            })
            .unwrap();
        let sent = client.io_result().unwrap();
        let got = server.io_result().unwrap();
        ensure_bytes(got, sent).unwrap();
        let e = ensure_bytes(999, 1000).unwrap_err().to_string();
        assert_eq!(e, "receiver got 999 of 1000 bytes");
        let failing = p
            .client(|| -> Result<()> { anyhow::bail!("connect refused") })
            .unwrap();
        let e = format!("{:#}", failing.result().unwrap_err());
        assert_eq!(e, "case: client side: connect refused");
    }
}

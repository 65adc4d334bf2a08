//! HTTP/1.1 file server under tokio on 127.0.0.1: responses through zcio's `Sender`,
//! requests through its `Receiver` (`--io zcio`), or through tokio's `TcpStream`
//! (`--io tokio`). Serves the files of `--root` by plain name: `curl
//! http://127.0.0.1:8080/big.bin`.

use clap::Parser;
use std::net::{Ipv4Addr, SocketAddr};
use zcio::rx::RxMode;
use zcio::tx::TxMode;
use zcio_examples::fileserver::{FileServer, FileServerConfig, Io};

#[derive(Parser)]
#[command(about = "HTTP/1.1 file server under tokio on 127.0.0.1 (zcio or tokio socket I/O)")]
struct Args {
    /// Directory whose files are served.
    #[arg(long)]
    root: std::path::PathBuf,
    /// Port on 127.0.0.1 (0: any).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Socket I/O.
    #[arg(long, value_enum, default_value = "zcio")]
    io: Io,
    /// Worker threads (one current-thread runtime each).
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Send path (zcio): copy, msg-zc, uring-zc, uring-zc-fixed, auto.
    #[arg(long, default_value = "auto")]
    tx_mode: TxMode,
    /// Receive backend (zcio): plain, bufring.
    #[arg(long, default_value = "bufring")]
    rx_mode: RxMode,
    /// Send buffer size in bytes.
    #[arg(long, default_value_t = 256 << 10)]
    chunk: usize,
}

fn main() -> std::io::Result<()> {
    let a = Args::parse();
    let cfg = FileServerConfig {
        workers: a.workers,
        chunk: a.chunk,
        tx_mode: a.tx_mode,
        rx_mode: a.rx_mode,
        ..FileServerConfig::new(a.io, a.root)
    };
    let srv = FileServer::start(cfg, SocketAddr::from((Ipv4Addr::LOCALHOST, a.port)))?;
    println!("listening on http://{}", srv.addr);
    loop {
        std::thread::park();
    }
}

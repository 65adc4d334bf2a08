//! Minimal HTTP/1.1 keep-alive server on 127.0.0.1, on zcio's EventRing or on epoll (`--loop ring|epoll`);
//! everything but the loop is shared (`zcio_examples::serve`).

use clap::Parser;
use zcio_examples::cli::{run_server, ServerArgs};
use zcio_examples::Http;

#[derive(Parser)]
#[command(about = "Minimal HTTP/1.1 keep-alive server on 127.0.0.1")]
struct Args {
    #[command(flatten)]
    server: ServerArgs,
}

fn main() -> std::io::Result<()> {
    run_server(&Args::parse().server, &mut Http)
}

//! Echo server on 127.0.0.1: every byte back, on zcio's EventRing or on epoll (`--loop ring|epoll`);
//! everything but the loop is shared (`zcio_examples::serve`).

use clap::Parser;
use zcio_examples::cli::{run_server, ServerArgs};
use zcio_examples::Echo;

#[derive(Parser)]
#[command(about = "Echo server on 127.0.0.1: every byte back")]
struct Args {
    #[command(flatten)]
    server: ServerArgs,
}

fn main() -> std::io::Result<()> {
    run_server(&Args::parse().server, &mut Echo)
}

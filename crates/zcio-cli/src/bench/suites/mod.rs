//! The registered suites, in the order `zcio bench` runs them.

mod event;
mod fileserver;
mod go;
mod loopback;
mod netlink;
mod nfq;
mod notify;
mod proxy;
mod python;
mod rx;
mod shim;
mod tokio_streams;
mod tx;
mod tx_many;
mod tx_peers;
pub(crate) mod tx_scale;
mod wrk;

use super::Suite;

/// Every suite.
pub fn all() -> Vec<Box<dyn Suite>> {
    vec![
        Box::new(loopback::Loopback),
        Box::new(tx::Tx),
        Box::new(notify::Notify),
        Box::new(rx::Rx),
        Box::new(event::EventSuite),
        Box::new(fileserver::FileServerSuite),
        Box::new(tokio_streams::TokioSuite),
        Box::new(proxy::ProxySuite),
        Box::new(nfq::Nfq),
        Box::new(netlink::NetlinkSuite),
        Box::new(python::Python),
        Box::new(go::GoSuite),
        Box::new(shim::Shim),
    ]
}

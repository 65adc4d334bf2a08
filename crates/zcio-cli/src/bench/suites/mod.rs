//! The registered suites, in the order `zcio bench` runs them.

mod loopback;
mod rx;

use super::Suite;

/// Every suite.
pub fn all() -> Vec<Box<dyn Suite>> {
    vec![Box::new(loopback::Loopback), Box::new(rx::Rx)]
}

//! The registered suites, in the order `zcio bench` runs them.

mod loopback;
mod shim;

use super::Suite;

/// Every suite.
pub fn all() -> Vec<Box<dyn Suite>> {
    vec![Box::new(loopback::Loopback), Box::new(shim::Shim)]
}

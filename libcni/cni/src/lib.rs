//! The CNI protocol in Rust: spec types for every version, errors, the plugin skeleton, invocation,
//! conflists, the result cache and the runtime API. No netlink here, so a runtime can embed it.

pub mod error;
pub mod types;
pub mod version;

pub use error::{code, Error, Errors, Result};

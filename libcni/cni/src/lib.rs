//! The CNI protocol in Rust: spec types for every version, errors, the plugin skeleton, invocation,
//! conflists, the result cache and the runtime API. No netlink here, so a runtime can embed it.

pub mod args;
pub mod cache;
pub mod conf;
pub mod conflist;
pub mod durable;
pub mod error;
pub mod fault;
pub mod gojson;
pub mod invoke;
pub mod limits;
pub mod registry;
pub mod runtime;
pub mod skel;
pub mod types;
pub mod version;

pub use error::{code, Error, Errors, Result};
pub use fault::fault_point;
pub use skel::{Command, Plugin, Request};
pub use types::CniResult;

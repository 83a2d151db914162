//! The installer's building blocks, shared with the node agent (`cni-rs-node`): CIDR parsing,
//! atomic plugin and file installation, conflist rendering, and the command line's outcome. The `cni-installer` binary
//! compiles the same modules itself. Errors are libcni's (a code, a message naming the file).

// Tests may unwrap: a panic there is a failed assertion. The library itself is still checked.
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

pub mod cidr;
pub mod cli;
pub mod install;
pub mod render;

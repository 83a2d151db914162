//! The one error type of the CNI protocol: a spec code, a message that names the object, and details.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Spec error codes (0-99 reserved by the spec) and our own (100+).
pub mod code {
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    pub const UNSUPPORTED_FIELD: u32 = 2;
    pub const UNKNOWN_CONTAINER: u32 = 3;
    pub const INVALID_ENV: u32 = 4;
    pub const IO: u32 = 5;
    pub const DECODE: u32 = 6;
    pub const INVALID_CONFIG: u32 = 7;
    /// Go skel's code for a netns that is the plugin's own; kept for compatibility.
    pub const INVALID_NETNS: u32 = 8;
    pub const TRY_AGAIN: u32 = 11;
    pub const NOT_AVAILABLE: u32 = 50;
    pub const LIMITED_CONNECTIVITY: u32 = 51;
    /// Our own: a netlink, sysctl or firewall operation failed.
    pub const NETWORK: u32 = 100;
    /// Our own: an address range has no free address.
    pub const RANGE_EXHAUSTED: u32 = 101;
    /// Our own: a delegated plugin could not be run or answered nonsense.
    pub const PLUGIN_EXEC: u32 = 102;
    /// Our own: CHECK found state that differs from prevResult.
    pub const CHECK_FAILED: u32 = 103;
    /// Our own: a bug (a caught panic).
    pub const INTERNAL: u32 = 110;
    /// The reference skel's code for an error its plugin returned without a CNI code (Go's
    /// `types.ErrInternal`). Ours only where the reference's plugins fail the same way for a
    /// reason upstream's shared code gives, so a runtime sees the same code from either.
    pub const UNTYPED: u32 = 999;
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Error {
    pub code: u32,
    pub msg: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub details: String,
    /// The OS error number the failure came from (a syscall's or the kernel's netlink answer), so
    /// callers can tell "already there" or "not there" apart without reading the message. Not
    /// part of the spec's error JSON.
    #[serde(skip)]
    pub errno: Option<i32>,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn new(code: u32, msg: impl Into<String>) -> Self {
        Error { code, msg: msg.into(), details: String::new(), errno: None }
    }
    /// A failed OS operation on a named object, code NETWORK: `"<what>: <os error text>"`, with
    /// the errno kept as data.
    pub fn os(errno: i32, what: impl fmt::Display) -> Self {
        Self::new(code::NETWORK, format!("{what}: {}", std::io::Error::from_raw_os_error(errno))).with_errno(errno)
    }
    /// The same error, carrying `errno` as its OS error number.
    pub fn with_errno(mut self, errno: i32) -> Self {
        self.errno = Some(errno);
        self
    }
    pub fn with_details(mut self, details: impl Into<String>) -> Self {
        self.details = details.into();
        self
    }
    pub fn version(msg: impl Into<String>) -> Self {
        Self::new(code::INCOMPATIBLE_VERSION, msg)
    }
    pub fn env(msg: impl Into<String>) -> Self {
        Self::new(code::INVALID_ENV, msg)
    }
    pub fn decode(msg: impl Into<String>) -> Self {
        Self::new(code::DECODE, msg)
    }
    pub fn config(msg: impl Into<String>) -> Self {
        Self::new(code::INVALID_CONFIG, msg)
    }
    pub fn network(msg: impl Into<String>) -> Self {
        Self::new(code::NETWORK, msg)
    }
    /// An I/O error on a named object: `"<what>: <os error>"`, keeping its errno if it has one.
    pub fn io(what: impl fmt::Display, err: &std::io::Error) -> Self {
        Error { errno: err.raw_os_error(), ..Self::new(code::IO, format!("{what}: {err}")) }
    }
    /// Prefix the message with context, keeping the code and the errno.
    pub fn context(mut self, what: impl fmt::Display) -> Self {
        self.msg = format!("{what}: {}", self.msg);
        self
    }
    /// The spec's error JSON, with the config's cniVersion.
    pub fn to_json(&self, cni_version: &str) -> serde_json::Value {
        let mut v = serde_json::json!({
            "cniVersion": cni_version,
            "code": self.code,
            "msg": self.msg,
        });
        if !self.details.is_empty() {
            v["details"] = serde_json::Value::String(self.details.clone());
        }
        v
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.msg)?;
        if !self.details.is_empty() {
            write!(f, "; {}", self.details)?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {}

/// Keeps going past failures (DEL, GC) and reports them all at the end.
#[derive(Debug, Default)]
pub struct Errors(Vec<Error>);

impl Errors {
    pub fn new() -> Self {
        Errors(Vec::new())
    }
    pub fn record<T>(&mut self, r: Result<T>) -> Option<T> {
        match r {
            Ok(v) => Some(v),
            Err(e) => {
                self.0.push(e);
                None
            }
        }
    }
    pub fn push(&mut self, e: Error) {
        self.0.push(e);
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    /// Ok if nothing failed; else the first error (its code, details and errno) with every
    /// message joined.
    pub fn finish(self) -> Result<()> {
        let mut it = self.0.into_iter();
        let Some(first) = it.next() else { return Ok(()) };
        let rest: Vec<String> = it.map(|e| e.to_string()).collect();
        if rest.is_empty() {
            Err(first)
        } else {
            let msg = format!("{}; {}", first.msg, rest.join("; "));
            Err(Error { msg, ..first })
        }
    }
}

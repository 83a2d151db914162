//! What the plugin and the daemon say to each other over the unix socket: one JSON object per
//! line, a call from the plugin and the daemon's answer, then the connection closes. The plugin
//! resolves the configuration before it calls, so the daemon never parses a netconf.

use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Write};
use std::net::Ipv4Addr;
use std::os::unix::net::UnixStream;
use std::path::Path;

/// The largest line either side reads (a call carries at most a few kilobytes of options).
pub const MAX_LINE: u64 = 1 << 20;

/// Who a lease is for: the reference's client id is made of these three.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseKey {
    pub container_id: String,
    pub network: String,
    pub ifname: String,
}

impl LeaseKey {
    /// `<containerID>/<network>/<ifname>`, cut to 254 bytes as the reference cuts it (an option
    /// holds 255 bytes, one of which is the type byte).
    pub fn client_id(&self) -> Vec<u8> {
        let mut id = format!("{}/{}/{}", self.container_id, self.network, self.ifname).into_bytes();
        id.truncate(254);
        id
    }

    pub fn display(&self) -> String {
        String::from_utf8_lossy(&self.client_id()).into_owned()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseRequest {
    pub key: LeaseKey,
    /// The pod's netns path, absolute, as the runtime gave it (the daemon prepends its -hostprefix).
    pub netns: String,
    pub request: Vec<u8>,
    pub provide: Vec<(u8, Vec<u8>)>,
    pub suppress_gateway: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "method", rename_all = "camelCase")]
pub enum Call {
    /// A lease for the key: the one held, else a new one from the server.
    Allocate(LeaseRequest),
    /// The lease held for the key, if any (no traffic).
    Check {
        key: LeaseKey,
    },
    /// Stop renewing and send DHCPRELEASE; an unknown key is success.
    Release {
        key: LeaseKey,
    },
    /// Release every lease of `network` whose key is not in `keep`.
    Gc {
        network: String,
        keep: Vec<LeaseKey>,
    },
    Status,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteInfo {
    pub dst: Ipv4Addr,
    pub prefix: u8,
    pub gw: Option<Ipv4Addr>,
}

/// A bound lease as the result needs it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseInfo {
    pub address: Ipv4Addr,
    pub prefix: u8,
    pub gateway: Option<Ipv4Addr>,
    pub routes: Vec<RouteInfo>,
    pub nameservers: Vec<Ipv4Addr>,
    pub domain: Option<String>,
    pub server: Ipv4Addr,
    /// Seconds until the lease expires, counted when the answer was made.
    pub expires_in: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Answer {
    Lease(LeaseInfo),
    NoLease,
    Done,
    Error { code: u32, msg: String },
}

/// Reads one line of at most MAX_LINE bytes.
pub fn read_line(stream: impl std::io::Read) -> std::io::Result<String> {
    let mut line = String::new();
    BufReader::new(stream.take(MAX_LINE)).read_line(&mut line)?;
    Ok(line)
}

/// Sends `call` to the daemon at `socket` and waits for its answer.
pub fn call(socket: &Path, call: &Call) -> Result<Answer, CallError> {
    let mut stream = UnixStream::connect(socket).map_err(CallError::Connect)?;
    let mut text = serde_json::to_string(call).map_err(|e| CallError::Protocol(e.to_string()))?;
    text.push('\n');
    stream.write_all(text.as_bytes()).map_err(|e| CallError::Protocol(e.to_string()))?;
    let line = read_line(&stream).map_err(|e| CallError::Protocol(e.to_string()))?;
    if line.is_empty() {
        return Err(CallError::Protocol("the daemon closed the connection without an answer".into()));
    }
    if line.starts_with("HTTP/") {
        return Err(CallError::Protocol(format!(
            "the daemon there answers HTTP ({:?}): it is the reference's dhcp daemon (Go net/rpc), which the \
             cni-rs dhcp plugin cannot talk to; run the cni-rs `dhcp daemon` on this socket instead",
            line.trim_end()
        )));
    }
    serde_json::from_str(&line).map_err(|e| CallError::Protocol(format!("unreadable answer {line:?}: {e}")))
}

#[derive(Debug)]
pub enum CallError {
    /// Nothing listens there (no daemon, or a stale socket file).
    Connect(std::io::Error),
    Protocol(String),
}

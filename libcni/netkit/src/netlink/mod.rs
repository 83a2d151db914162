//! rtnetlink behind a small synchronous API.
//!
//! A [`Netlink`] owns one blocking NETLINK_ROUTE socket created in a chosen network namespace;
//! every method sends one request and reads the kernel's answer to it. Plugins are short-lived
//! single-threaded processes, so a blocking API is the simple one (and starts no runtime).
//!
//! A netlink socket stays bound to the namespace it was created in, so [`Netlink::open_in`] enters
//! the namespace through [`NetNs::enter`]'s guard only to create the socket and leaves it before
//! any request.

mod addr;
mod link;
mod policy;
mod route;
mod sublink;
pub mod tc;
mod tune;
mod virt;

pub use addr::Address;
pub use link::{format_mac, parse_mac, BridgeVlan, Link};
pub use policy::{RawRoute, Rule};
pub use route::RouteSpec;
pub use sublink::{IpvlanMode, MacvlanMode, SubLink};
pub use tune::LinkTuning;
pub use virt::NewLink;

use crate::netns::NetNs;
use crate::nlsock::Socket;
use libcni::{Error, Result};
use netlink_packet_core::{
    NetlinkBuffer, NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_DUMP, NLM_F_DUMP_INTR, NLM_F_MULTIPART,
    NLM_F_REQUEST,
};
use netlink_packet_route::RouteNetlinkMessage;
use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};

/// How often a dump that the kernel flags as interrupted (NLM_F_DUMP_INTR, or EINTR) is retried.
const DUMP_ATTEMPTS: usize = 10;

/// The receive buffer a request starts with: a dump's datagrams are at most 32 KiB; a larger
/// single answer grows it ([`Socket::recv_whole`]).
const RECV_BUF: usize = 32 * 1024;

/// IP family selector for dumps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpFamily {
    V4,
    V6,
    /// Both families.
    Any,
}

/// An rtnetlink connection bound to one network namespace, with blocking methods.
pub struct Netlink {
    sock: Socket,
    /// The sequence number of the last request: answers carry it, so a stale answer is told apart.
    seq: AtomicU32,
}

impl fmt::Debug for Netlink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Netlink")
    }
}

/// Why a request failed, before it is turned into an error naming the operation.
#[derive(Debug)]
pub(crate) enum RequestFailure {
    /// The kernel answered with this (positive) errno.
    Errno(i32),
    /// A dump stayed inconsistent after every retry.
    Interrupted,
    /// The connection or the decoding failed.
    Other(String),
}

impl RequestFailure {
    pub(crate) fn errno(&self) -> Option<i32> {
        match self {
            RequestFailure::Errno(e) => Some(*e),
            _ => None,
        }
    }

    /// `"<op> <object>: <os error text>"`, code NETWORK.
    pub(crate) fn into_error(self, what: impl fmt::Display) -> Error {
        match self {
            RequestFailure::Errno(e) => Error::os(e, what),
            RequestFailure::Interrupted => Error::os(
                libc::EINTR,
                format_args!("{what}: dump interrupted {DUMP_ATTEMPTS} times by concurrent changes"),
            ),
            RequestFailure::Other(msg) => Error::network(format!("{what}: {msg}")),
        }
    }
}

impl Netlink {
    /// A connection in the calling thread's current network namespace.
    pub fn open() -> Result<Netlink> {
        let sock = Socket::open(libc::NETLINK_ROUTE).map_err(|e| Error::io("open netlink socket", &e))?;
        Ok(Netlink { sock, seq: AtomicU32::new(0) })
    }

    /// A connection over `sock`: tests play the kernel on the other end of a socket pair.
    #[cfg(test)]
    fn over(sock: Socket) -> Netlink {
        Netlink { sock, seq: AtomicU32::new(0) }
    }

    /// A connection whose socket lives in `ns`: the thread enters `ns` only to create the socket,
    /// and every later request acts in `ns`.
    pub fn open_in(ns: &NetNs) -> Result<Netlink> {
        let guard = ns.enter()?;
        let nl = Netlink::open();
        guard.leave()?;
        nl.map_err(|e| e.context(format_args!("in netns {}", ns.path().display())))
    }

    /// Sends `msg` with `flags` and collects the messages that answer it, up to the one that ends
    /// the request: an error or acknowledgement, NLMSG_DONE, or (when no acknowledgement was asked
    /// for) a message that is not part of a multipart answer. A multipart message that does not
    /// decode is skipped; a single answer that does not decode is a failure.
    fn exchange(
        &self,
        msg: RouteNetlinkMessage,
        flags: u16,
    ) -> std::result::Result<Vec<NetlinkMessage<RouteNetlinkMessage>>, RequestFailure> {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
        let mut req = NetlinkMessage::from(msg);
        req.header.flags = flags;
        req.header.sequence_number = seq;
        req.finalize();
        let mut buf = vec![0u8; req.buffer_len()];
        req.serialize(&mut buf);
        self.sock.send(&buf).map_err(|e| RequestFailure::Other(format!("send to the kernel: {e}")))?;
        let expecting_ack = flags & NLM_F_ACK != 0;
        let mut answers = Vec::new();
        buf.resize(RECV_BUF, 0);
        loop {
            let len = self
                .sock
                .recv_whole(&mut buf)
                .map_err(|e| RequestFailure::Other(format!("read the kernel's answer: {e}")))?;
            let mut rest = buf.get(..len).unwrap_or_default();
            while !rest.is_empty() {
                let Ok(header) = NetlinkBuffer::new_checked(rest) else { break };
                let size = (header.length() as usize).min(rest.len());
                let (one, tail) = rest.split_at(size);
                rest = tail.get(size.next_multiple_of(4) - size..).unwrap_or_default();
                if header.sequence_number() != seq {
                    continue;
                }
                let multipart = header.flags() & NLM_F_MULTIPART != 0;
                match NetlinkMessage::<RouteNetlinkMessage>::deserialize(one) {
                    Ok(m) => {
                        let done = match m.payload {
                            NetlinkPayload::InnerMessage(_) => !multipart && !expecting_ack,
                            _ => true,
                        };
                        answers.push(m);
                        if done {
                            return Ok(answers);
                        }
                    }
                    Err(_) if multipart => {}
                    Err(e) => return Err(RequestFailure::Other(format!("decode the kernel's answer: {e}"))),
                }
            }
        }
    }

    /// Sends a request that expects only an acknowledgement.
    pub(crate) fn ack(&self, msg: RouteNetlinkMessage, flags: u16) -> std::result::Result<(), RequestFailure> {
        for reply in self.exchange(msg, NLM_F_REQUEST | NLM_F_ACK | flags)? {
            if let NetlinkPayload::Error(err) = reply.payload {
                if let Some(code) = err.code {
                    return Err(RequestFailure::Errno(code.get().saturating_abs()));
                }
            }
        }
        Ok(())
    }

    /// Sends a `GET` for one object; its answer, or the kernel's errno.
    pub(crate) fn get_one(
        &self,
        msg: RouteNetlinkMessage,
    ) -> std::result::Result<Option<RouteNetlinkMessage>, RequestFailure> {
        let mut answer = None;
        for reply in self.exchange(msg, NLM_F_REQUEST)? {
            match reply.payload {
                NetlinkPayload::InnerMessage(m) => answer = Some(m),
                NetlinkPayload::Error(err) => {
                    if let Some(code) = err.code {
                        return Err(RequestFailure::Errno(code.get().saturating_abs()));
                    }
                }
                _ => {}
            }
        }
        Ok(answer)
    }

    /// Dumps, retrying while the kernel reports that the dump was interrupted by a change (the
    /// reference plugins needed the same in `netlinksafe`).
    pub(crate) fn dump(
        &self,
        msg: RouteNetlinkMessage,
    ) -> std::result::Result<Vec<RouteNetlinkMessage>, RequestFailure> {
        for _ in 0..DUMP_ATTEMPTS {
            match self.dump_once(msg.clone()) {
                Err(RequestFailure::Interrupted) | Err(RequestFailure::Errno(libc::EINTR)) => continue,
                other => return other,
            }
        }
        Err(RequestFailure::Interrupted)
    }

    fn dump_once(&self, msg: RouteNetlinkMessage) -> std::result::Result<Vec<RouteNetlinkMessage>, RequestFailure> {
        let mut out = Vec::new();
        let mut interrupted = false;
        for reply in self.exchange(msg, NLM_F_REQUEST | NLM_F_DUMP)? {
            interrupted |= reply.header.flags & NLM_F_DUMP_INTR != 0;
            match reply.payload {
                NetlinkPayload::InnerMessage(m) => out.push(m),
                NetlinkPayload::Error(err) => {
                    if let Some(code) = err.code {
                        return Err(RequestFailure::Errno(code.get().saturating_abs()));
                    }
                }
                NetlinkPayload::Done(done) if done.code < 0 => {
                    return Err(RequestFailure::Errno(done.code.saturating_abs()));
                }
                _ => {}
            }
        }
        if interrupted {
            Err(RequestFailure::Interrupted)
        } else {
            Ok(out)
        }
    }

    /// `"<name> (index N)"` for messages, best effort.
    pub(crate) fn describe(&self, index: u32) -> String {
        match self.link_by_index(index) {
            Ok(Some(l)) => format!("{} (index {index})", l.name),
            _ => format!("index {index}"),
        }
    }
}

#[cfg(test)]
mod tests;

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

pub use addr::{Address, RawAddress};
pub use link::{format_mac, parse_mac, BridgeVlan, Link};
pub use policy::{RawRoute, Rule};
pub use route::{FibMatch, RouteSpec};
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

/// Requests per datagram in [`Netlink::batch`]: each acknowledgement counts about 1 KiB against
/// the socket's receive buffer (~208 KiB by default) until it is read, and the kernel queues them
/// all before `send` returns; past the buffer it would drop them.
const BATCH_MAX: usize = 64;

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

/// One request that expects only an acknowledgement, for [`Netlink::batch`]: the message, its
/// flags besides NLM_F_REQUEST and NLM_F_ACK, and what it does for an error message (given the
/// connection, asked only when it failed: naming a link by index asks the kernel for its name).
pub struct BatchOp {
    msg: RouteNetlinkMessage,
    flags: u16,
    what: Box<dyn Fn(&Netlink) -> String>,
}

impl fmt::Debug for BatchOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BatchOp").field("msg", &self.msg).field("flags", &self.flags).finish_non_exhaustive()
    }
}

impl BatchOp {
    fn new(msg: RouteNetlinkMessage, flags: u16, what: impl Fn(&Netlink) -> String + 'static) -> BatchOp {
        BatchOp { msg, flags, what: Box::new(what) }
    }
}

/// The messages of one datagram from the kernel, each with its sequence number and flags; a tail
/// too short for a header ends it.
fn messages(datagram: &[u8]) -> impl Iterator<Item = (u32, u16, &[u8])> {
    let mut rest = datagram;
    std::iter::from_fn(move || {
        let header = NetlinkBuffer::new_checked(rest).ok()?;
        let (seq, flags) = (header.sequence_number(), header.flags());
        let size = (header.length() as usize).min(rest.len());
        let (one, tail) = rest.split_at(size);
        rest = tail.get(size.next_multiple_of(4) - size..).unwrap_or_default();
        Some((seq, flags, one))
    })
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
        let mut buf = Vec::new();
        let seq = self.append(&mut buf, msg, flags);
        self.sock.send(&buf).map_err(|e| RequestFailure::Other(format!("send to the kernel: {e}")))?;
        let expecting_ack = flags & NLM_F_ACK != 0;
        let mut answers = Vec::new();
        buf.resize(RECV_BUF, 0);
        loop {
            let len = self
                .sock
                .recv_whole(&mut buf)
                .map_err(|e| RequestFailure::Other(format!("read the kernel's answer: {e}")))?;
            for (msg_seq, msg_flags, one) in messages(buf.get(..len).unwrap_or_default()) {
                if msg_seq != seq {
                    continue;
                }
                let multipart = msg_flags & NLM_F_MULTIPART != 0;
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

    /// Appends `msg` with `flags` and the next sequence number to `buf`; that sequence number.
    fn append(&self, buf: &mut Vec<u8>, msg: RouteNetlinkMessage, flags: u16) -> u32 {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
        let mut req = NetlinkMessage::from(msg);
        req.header.flags = flags;
        req.header.sequence_number = seq;
        req.finalize();
        let start = buf.len();
        buf.resize(start + req.buffer_len(), 0);
        req.serialize(&mut buf[start..]);
        seq
    }

    /// Sends `ops` in one datagram (up to [`BATCH_MAX`] per datagram) and reads every
    /// acknowledgement: one round trip instead of one per request. The kernel handles the messages
    /// of a datagram in order and goes on past one that fails, so each gets its own outcome, in
    /// `ops`' order, a failure naming its object as the one-request method does. A later request
    /// that needs an earlier one's effect (a route through an address) fails as well when that
    /// one failed: the caller reports the first failure.
    pub fn batch(&self, ops: Vec<BatchOp>) -> Result<Vec<Result<()>>> {
        let mut out = Vec::with_capacity(ops.len());
        for chunk in ops.chunks(BATCH_MAX) {
            let outcomes = self.batch_round(chunk)?;
            out.extend(chunk.iter().zip(outcomes).map(|(op, o)| o.map_err(|f| f.into_error((op.what)(self)))));
        }
        Ok(out)
    }

    fn batch_round(&self, ops: &[BatchOp]) -> Result<Vec<std::result::Result<(), RequestFailure>>> {
        let mut buf = Vec::new();
        let seqs: Vec<u32> =
            ops.iter().map(|op| self.append(&mut buf, op.msg.clone(), NLM_F_REQUEST | NLM_F_ACK | op.flags)).collect();
        self.sock.send(&buf).map_err(|e| Error::network(format!("send {} requests to the kernel: {e}", ops.len())))?;
        let mut outcomes: Vec<Option<std::result::Result<(), RequestFailure>>> = seqs.iter().map(|_| None).collect();
        buf.resize(RECV_BUF, 0);
        while outcomes.iter().any(Option::is_none) {
            let len = self
                .sock
                .recv_whole(&mut buf)
                .map_err(|e| Error::network(format!("read the kernel's answers to {} requests: {e}", ops.len())))?;
            for (msg_seq, _, one) in messages(buf.get(..len).unwrap_or_default()) {
                let Some(slot) = seqs.iter().position(|s| *s == msg_seq) else { continue };
                let outcome = match NetlinkMessage::<RouteNetlinkMessage>::deserialize(one) {
                    Ok(NetlinkMessage { payload: NetlinkPayload::Error(err), .. }) => match err.code {
                        Some(code) => Err(RequestFailure::Errno(code.get().saturating_abs())),
                        None => Ok(()),
                    },
                    // Only acknowledgements end a request here; anything else is not an answer.
                    Ok(_) => continue,
                    Err(e) => Err(RequestFailure::Other(format!("decode the kernel's answer: {e}"))),
                };
                if let Some(o) = outcomes.get_mut(slot) {
                    *o = Some(outcome);
                }
            }
        }
        Ok(outcomes.into_iter().map(|o| o.unwrap_or(Ok(()))).collect())
    }

    /// Sends one [`BatchOp`] and waits for its acknowledgement.
    pub(crate) fn run(&self, op: BatchOp) -> Result<()> {
        self.ack(op.msg, op.flags).map_err(|f| f.into_error((op.what)(self)))
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

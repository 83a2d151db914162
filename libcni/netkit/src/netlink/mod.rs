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
pub use link::{BridgeVlan, Link};
pub use policy::{RawRoute, Rule};
pub use route::{FibMatch, RouteSpec};
pub use sublink::{IpvlanMode, MacvlanMode, SubLink};
pub use tune::LinkTuning;
pub use virt::NewLink;

use crate::netns::NetNs;
use crate::nlsock::{Answer, Exchange};
use crate::Family;
use libcni::{Error, Result};
use netlink_packet_core::{NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_DUMP, NLM_F_MULTIPART, NLM_F_REQUEST};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use nix::sys::socket::SockProtocol;
use std::fmt;

pub(crate) use crate::nlsock::Failure as RequestFailure;

/// The rtnetlink family of a dump over `family` (`None`: both).
fn address_family(family: Option<Family>) -> AddressFamily {
    match family {
        Some(Family::V4) => AddressFamily::Inet,
        Some(Family::V6) => AddressFamily::Inet6,
        None => AddressFamily::Unspec,
    }
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

/// An rtnetlink connection bound to one network namespace, with blocking methods.
pub struct Netlink {
    nl: Exchange,
}

impl fmt::Debug for Netlink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Netlink")
    }
}

/// One rtnetlink message from the kernel, decoded; a message that does not decode is skipped
/// when it is part of a multipart answer (a dump goes on past an object it cannot read), and a
/// failure otherwise.
fn decode(flags: u16, msg: &[u8]) -> std::result::Result<Option<RouteNetlinkMessage>, RequestFailure> {
    match NetlinkMessage::<RouteNetlinkMessage>::deserialize(msg) {
        Ok(NetlinkMessage { payload: NetlinkPayload::InnerMessage(m), .. }) => Ok(Some(m)),
        Ok(_) => Ok(None),
        Err(_) if flags & NLM_F_MULTIPART != 0 => Ok(None),
        Err(e) => Err(RequestFailure::Decode(e.to_string())),
    }
}

impl Netlink {
    /// A connection in the calling thread's current network namespace.
    pub fn open() -> Result<Netlink> {
        let nl = Exchange::open(SockProtocol::NetlinkRoute).map_err(|e| Error::io("open netlink socket", &e))?;
        Ok(Netlink { nl })
    }

    /// A connection over `nl`: tests play the kernel on the other end of a socket pair.
    #[cfg(test)]
    fn over(nl: Exchange) -> Netlink {
        Netlink { nl }
    }

    /// A connection whose socket lives in `ns`: the thread enters `ns` only to create the socket,
    /// and every later request acts in `ns`.
    pub fn open_in(ns: &NetNs) -> Result<Netlink> {
        let guard = ns.enter()?;
        let nl = Netlink::open();
        guard.leave()?;
        nl.map_err(|e| e.context(format_args!("in netns {}", ns.path().display())))
    }

    /// Appends `msg` with `flags` and sequence number `seq` to `buf`.
    fn append(buf: &mut Vec<u8>, msg: RouteNetlinkMessage, flags: u16, seq: u32) {
        let mut req = NetlinkMessage::from(msg);
        req.header.flags = flags;
        req.header.sequence_number = seq;
        req.finalize();
        let start = buf.len();
        buf.resize(start + req.buffer_len(), 0);
        req.serialize(&mut buf[start..]);
    }

    /// `msg` with `flags` and a new sequence number, encoded; that number.
    fn encode(&self, msg: RouteNetlinkMessage, flags: u16) -> (Vec<u8>, u32) {
        let seq = self.nl.next_seqs(1);
        let mut buf = Vec::new();
        Netlink::append(&mut buf, msg, flags, seq);
        (buf, seq)
    }

    /// Sends `ops` in one datagram (as many per datagram as the socket's receive buffer holds the
    /// acknowledgements of) and reads every
    /// acknowledgement: one round trip instead of one per request. The kernel handles the messages
    /// of a datagram in order and goes on past one that fails, so each gets its own outcome, in
    /// `ops`' order, a failure naming its object as the one-request method does. A later request
    /// that needs an earlier one's effect (a route through an address) fails as well when that
    /// one failed: the caller reports the first failure.
    pub fn batch(&self, ops: Vec<BatchOp>) -> Result<Vec<Result<()>>> {
        let mut out = Vec::with_capacity(ops.len());
        let room = self.nl.requests_per_send(ops.len());
        for chunk in ops.chunks(room) {
            let outcomes = self.batch_round(chunk)?;
            out.extend(chunk.iter().zip(outcomes).map(|(op, o)| o.map_err(|f| f.into_error((op.what)(self)))));
        }
        Ok(out)
    }

    fn batch_round(&self, ops: &[BatchOp]) -> Result<Vec<std::result::Result<(), RequestFailure>>> {
        let count = ops.len() as u32;
        let first = self.nl.next_seqs(count);
        let mut buf = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            Netlink::append(
                &mut buf,
                op.msg.clone(),
                NLM_F_REQUEST | NLM_F_ACK | op.flags,
                first.wrapping_add(i as u32),
            );
        }
        self.nl.make_room(ops.len(), buf.len());
        let mut outcomes: Vec<Option<std::result::Result<(), RequestFailure>>> = ops.iter().map(|_| None).collect();
        let mut pending = ops.len();
        self.nl
            .acks(&buf, first, count, |offset, outcome| {
                if let Some(slot @ None) = outcomes.get_mut(offset as usize) {
                    *slot = Some(outcome);
                    pending -= 1;
                }
                pending == 0
            })
            .map_err(|f| f.into_error(format_args!("{} requests", ops.len())))?;
        Ok(outcomes.into_iter().map(|o| o.unwrap_or(Ok(()))).collect())
    }

    /// Sends one [`BatchOp`] and waits for its acknowledgement.
    pub(crate) fn run(&self, op: BatchOp) -> Result<()> {
        self.ack(op.msg, op.flags).map_err(|f| f.into_error((op.what)(self)))
    }

    /// Sends a request that expects only an acknowledgement.
    pub(crate) fn ack(&self, msg: RouteNetlinkMessage, flags: u16) -> std::result::Result<(), RequestFailure> {
        let (buf, seq) = self.encode(msg, NLM_F_REQUEST | NLM_F_ACK | flags);
        self.nl.request(&buf, seq, Answer::Ack, |_, _| Ok(()))
    }

    /// Sends a `GET` for one object; its answer, or the kernel's errno.
    pub(crate) fn get_one(
        &self,
        msg: RouteNetlinkMessage,
    ) -> std::result::Result<Option<RouteNetlinkMessage>, RequestFailure> {
        let (buf, seq) = self.encode(msg, NLM_F_REQUEST);
        let mut answer = None;
        self.nl.request(&buf, seq, Answer::One, |h, m| {
            answer = decode(h.flags, m)?.or(answer.take());
            Ok(())
        })?;
        Ok(answer)
    }

    /// Dumps, asking again while the kernel reports that a change interrupted the dump.
    pub(crate) fn dump(
        &self,
        msg: RouteNetlinkMessage,
    ) -> std::result::Result<Vec<RouteNetlinkMessage>, RequestFailure> {
        self.nl.dump(
            |seq| {
                let mut buf = Vec::new();
                Netlink::append(&mut buf, msg.clone(), NLM_F_REQUEST | NLM_F_DUMP, seq);
                buf
            },
            |out: &mut Vec<RouteNetlinkMessage>, h, m| {
                out.extend(decode(h.flags, m)?);
                Ok(())
            },
        )
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

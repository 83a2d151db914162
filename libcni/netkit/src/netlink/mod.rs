//! rtnetlink behind a small synchronous API.
//!
//! A [`Netlink`] owns a current-thread tokio runtime and one rtnetlink connection whose socket was
//! created in a chosen network namespace; every method blocks on one request. Plugins are
//! short-lived single-threaded processes, so a blocking API is the simple one.
//!
//! A netlink socket stays bound to the namespace it was created in, so [`Netlink::open_in`] enters
//! the namespace through [`NetNs::enter`]'s guard only to create the socket and leaves it before
//! any request. No task ever calls setns: setns changes only the calling thread's namespace, and
//! the namespace a task would see must not depend on which thread polls it.

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
use futures::StreamExt;
use libcni::{Error, Result};
use rtnetlink::packet_core::{NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_DUMP, NLM_F_DUMP_INTR, NLM_F_REQUEST};
use rtnetlink::packet_route::RouteNetlinkMessage;
use rtnetlink::Handle;
use std::fmt;

/// How often a dump that the kernel flags as interrupted (NLM_F_DUMP_INTR, or EINTR) is retried.
const DUMP_ATTEMPTS: usize = 10;

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
    handle: Handle,
    runtime: tokio::runtime::Runtime,
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
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(|e| Error::io("create netlink runtime", &e))?;
        let (mut connection, handle, _) = {
            // The socket registers with the runtime's reactor when it is created.
            let _rt = runtime.enter();
            rtnetlink::new_connection().map_err(|e| Error::io("open netlink socket", &e))?
        };
        // Done messages carry NLM_F_DUMP_INTR (and, on newer kernels, a dump's error code).
        connection.set_forward_done(true);
        runtime.spawn(connection);
        Ok(Netlink { handle, runtime })
    }

    /// A connection whose socket lives in `ns`: the thread enters `ns` only to create the socket,
    /// and every later request acts in `ns`.
    pub fn open_in(ns: &NetNs) -> Result<Netlink> {
        let guard = ns.enter()?;
        let nl = Netlink::open();
        guard.leave()?;
        nl.map_err(|e| e.context(format_args!("in netns {}", ns.path().display())))
    }

    /// Sends a request that expects only an acknowledgement.
    pub(crate) fn ack(&self, msg: RouteNetlinkMessage, flags: u16) -> std::result::Result<(), RequestFailure> {
        let mut handle = self.handle.clone();
        self.runtime.block_on(async move {
            let mut req = NetlinkMessage::from(msg);
            req.header.flags = NLM_F_REQUEST | NLM_F_ACK | flags;
            let mut responses = handle.request(req).map_err(|e| RequestFailure::Other(e.to_string()))?;
            while let Some(reply) = responses.next().await {
                if let NetlinkPayload::Error(err) = reply.payload {
                    if let Some(code) = err.code {
                        return Err(RequestFailure::Errno(code.get().saturating_abs()));
                    }
                }
            }
            Ok(())
        })
    }

    /// Sends a `GET` for one object; its answer, or the kernel's errno.
    pub(crate) fn get_one(
        &self,
        msg: RouteNetlinkMessage,
    ) -> std::result::Result<Option<RouteNetlinkMessage>, RequestFailure> {
        let mut handle = self.handle.clone();
        self.runtime.block_on(async move {
            let mut req = NetlinkMessage::from(msg);
            req.header.flags = NLM_F_REQUEST;
            let mut responses = handle.request(req).map_err(|e| RequestFailure::Other(e.to_string()))?;
            let mut answer = None;
            while let Some(reply) = responses.next().await {
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
        })
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
        let mut handle = self.handle.clone();
        self.runtime.block_on(async move {
            let mut req = NetlinkMessage::from(msg);
            req.header.flags = NLM_F_REQUEST | NLM_F_DUMP;
            let mut responses = handle.request(req).map_err(|e| RequestFailure::Other(e.to_string()))?;
            let mut out = Vec::new();
            let mut interrupted = false;
            while let Some(reply) = responses.next().await {
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
        })
    }

    /// `"<name> (index N)"` for messages, best effort.
    pub(crate) fn describe(&self, index: u32) -> String {
        match self.link_by_index(index) {
            Ok(Some(l)) => format!("{} (index {index})", l.name),
            _ => format!("index {index}"),
        }
    }
}

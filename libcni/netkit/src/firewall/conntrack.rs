//! Conntrack entries over ctnetlink (`NETLINK_NETFILTER`, subsystem `NFNL_SUBSYS_CTNETLINK`), in
//! process.
//!
//! An entry, as a dump (`IPCTNL_MSG_CT_GET` with `NLM_F_DUMP`, one family) lists it:
//!
//! ```text
//!   nfgenmsg { family, version 0, res_id 0 }
//!   CTA_TUPLE_ORIG  { CTA_TUPLE_IP { src, dst }, CTA_TUPLE_PROTO { num, sport, dport }, [CTA_TUPLE_ZONE] }
//!   CTA_TUPLE_REPLY { ... the same, as the answer is expected (after NAT) ... }
//!   CTA_ZONE (when not the default zone in both directions), CTA_ID, CTA_STATUS, CTA_TIMEOUT, ...
//! ```
//!
//! An entry is deleted (`IPCTNL_MSG_CT_DELETE`) by its original tuple as listed, with its zone
//! and its id, so an entry made again since the dump (same tuple, another id) stays. The kernel
//! answers ENOENT for one that expired meanwhile: that is success here.

use crate::nlsock::{self, Exchange, Failure, NLMSG_HDRLEN};
use crate::Family;
use libcni::{Error, Result};
use nix::sys::socket::SockProtocol;

const NFNL_SUBSYS_CTNETLINK: u16 = 1;
const IPCTNL_MSG_CT_GET: u16 = 1;
const IPCTNL_MSG_CT_DELETE: u16 = 2;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_DUMP: u16 = 0x300;
const NLA_F_NESTED: u16 = 0x8000;

const CTA_TUPLE_ORIG: u16 = 1;
const CTA_ID: u16 = 12;
const CTA_ZONE: u16 = 18;
const CTA_TUPLE_PROTO: u16 = 2;
const CTA_PROTO_NUM: u16 = 1;
const CTA_PROTO_DST_PORT: u16 = 3;

const AF_INET: u8 = libc::AF_INET as u8;
const AF_INET6: u8 = libc::AF_INET6 as u8;
const UDP: u8 = 17;

/// What a conntrack entry is matched on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Filter {
    pub family: Family,
    /// The IP protocol number of the original tuple.
    pub proto: u8,
    /// The destination port of the original tuple.
    pub orig_dst_port: u16,
}

impl Filter {
    /// UDP entries of one family whose original destination port is `port`: what
    /// `conntrack -D -f <family> -p udp --orig-port-dst <port>` deletes (in every zone).
    pub(crate) fn udp_to_port(port: u16, family: Family) -> Filter {
        Filter { family, proto: UDP, orig_dst_port: port }
    }

    fn describe(&self) -> String {
        let family = self.family.pick("ipv4", "ipv6");
        let proto = match self.proto {
            UDP => "UDP".to_string(),
            6 => "TCP".to_string(),
            n => format!("protocol {n}"),
        };
        format!("{family} {proto} conntrack entries to port {}", self.orig_dst_port)
    }

    /// Whether the entry whose attributes (after the nfgenmsg) are `attrs` matches; then the
    /// attributes that name it in a delete.
    fn select(&self, attrs: &[u8]) -> Option<Vec<u8>> {
        let orig = find(attrs, CTA_TUPLE_ORIG)?;
        let proto = find(orig, CTA_TUPLE_PROTO)?;
        let num = find(proto, CTA_PROTO_NUM).and_then(|v| v.first().copied());
        let dport = find(proto, CTA_PROTO_DST_PORT).and_then(|v| <[u8; 2]>::try_from(v).ok()).map(u16::from_be_bytes);
        if num != Some(self.proto) || dport != Some(self.orig_dst_port) {
            return None;
        }
        let mut key = Vec::new();
        put(&mut key, CTA_TUPLE_ORIG | NLA_F_NESTED, orig);
        for ty in [CTA_ZONE, CTA_ID] {
            if let Some(v) = find(attrs, ty) {
                put(&mut key, ty, v);
            }
        }
        Some(key)
    }
}

/// Deletes the entries `filter` matches in the calling thread's network namespace; how many
/// were deleted (those gone by themselves meanwhile not counted).
pub(crate) fn delete(filter: Filter) -> Result<usize> {
    let what = filter.describe();
    let nl = Exchange::open(SockProtocol::NetlinkNetFilter)
        .map_err(|e| Error::network(format!("delete {what}: open a netfilter netlink socket: {e}")))?;
    let family = filter.family.pick(AF_INET, AF_INET6);
    let keys: Vec<Vec<u8>> = nl
        .dump(
            |seq| message(ctnl(IPCTNL_MSG_CT_GET), NLM_F_REQUEST | NLM_F_DUMP, seq, family, &[]),
            |keys: &mut Vec<Vec<u8>>, _, msg| {
                keys.extend(filter.select(msg.get(NLMSG_HDRLEN + 4..).unwrap_or_default()));
                Ok(())
            },
        )
        .map_err(|f| f.into_error(format_args!("list {what}")))?;
    let mut deleted = 0;
    for chunk in keys.chunks(nl.requests_per_send(keys.len())) {
        let first = nl.next_seqs(chunk.len() as u32);
        let mut batch = Vec::new();
        for (i, key) in chunk.iter().enumerate() {
            let seq = first.wrapping_add(i as u32);
            batch.extend(message(ctnl(IPCTNL_MSG_CT_DELETE), NLM_F_REQUEST | NLM_F_ACK, seq, family, key));
        }
        nl.make_room(chunk.len(), batch.len());
        let mut pending = chunk.len();
        let mut refused: Option<Failure> = None;
        nl.acks(&batch, first, chunk.len() as u32, |_, outcome| {
            pending -= 1;
            match outcome {
                Ok(()) => deleted += 1,
                Err(f) if f.errno() == Some(libc::ENOENT) => {}
                Err(f) => {
                    refused.get_or_insert(f);
                }
            }
            pending == 0
        })
        .map_err(|f| f.into_error(format_args!("delete {what}")))?;
        if let Some(f) = refused {
            return Err(f.into_error(format_args!("delete {what}")));
        }
    }
    Ok(deleted)
}

/// A ctnetlink message type.
fn ctnl(msg: u16) -> u16 {
    (NFNL_SUBSYS_CTNETLINK << 8) | msg
}

/// One netlink message: header, nfgenmsg (`family`, version 0, resource id 0), `attrs`.
fn message(ty: u16, flags: u16, seq: u32, family: u8, attrs: &[u8]) -> Vec<u8> {
    let len = (NLMSG_HDRLEN + 4 + attrs.len()) as u32;
    let mut out = Vec::with_capacity(len as usize);
    out.extend_from_slice(&len.to_ne_bytes());
    out.extend_from_slice(&ty.to_ne_bytes());
    out.extend_from_slice(&flags.to_ne_bytes());
    out.extend_from_slice(&seq.to_ne_bytes());
    out.extend_from_slice(&0u32.to_ne_bytes());
    out.extend_from_slice(&[family, 0, 0, 0]);
    out.extend_from_slice(attrs);
    out
}

/// The value of the first attribute of type `ty` in `attrs`.
fn find(attrs: &[u8], ty: u16) -> Option<&[u8]> {
    nlsock::attributes(attrs).find(|(t, _)| *t == ty).map(|(_, v)| v)
}

/// Appends attribute `ty` (flags included) holding `value`, padded to 4 bytes. Values come from
/// the kernel's own attributes, so their length fits.
fn put(out: &mut Vec<u8>, ty: u16, value: &[u8]) {
    let len = (4 + value.len()) as u16;
    out.extend_from_slice(&len.to_ne_bytes());
    out.extend_from_slice(&ty.to_ne_bytes());
    out.extend_from_slice(value);
    out.resize(out.len().next_multiple_of(4), 0);
}

#[cfg(test)]
mod tests;

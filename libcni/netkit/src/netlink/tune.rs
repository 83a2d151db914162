//! The link attributes the tuning plugin reads, sets and restores: MAC, MTU, promiscuous and
//! all-multicast flags and the transmit queue length.

use super::{Netlink, RequestFailure};
use libcni::Result;
use netlink_packet_route::link::{LinkAttribute, LinkFlags, LinkMessage};
use netlink_packet_route::RouteNetlinkMessage;

/// A link's tunable attributes as the kernel reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkTuning {
    pub index: u32,
    pub mac: Option<crate::Mac>,
    pub mtu: u32,
    /// IFF_PROMISC as set by the administrator (not the promiscuity counter).
    pub promisc: bool,
    /// IFF_ALLMULTI as set by the administrator.
    pub allmulti: bool,
    pub txqlen: u32,
}

fn by_index(index: u32) -> LinkMessage {
    let mut msg = LinkMessage::default();
    msg.header.index = index;
    msg
}

impl Netlink {
    /// The tunable attributes of the link called `name`, or `None` if there is none.
    pub fn link_tuning(&self, name: &str) -> Result<Option<LinkTuning>> {
        if !crate::valid_ifname(name) {
            return Ok(None);
        }
        let mut msg = LinkMessage::default();
        msg.attributes.push(LinkAttribute::IfName(name.to_string()));
        let reply = match self.get_one(RouteNetlinkMessage::GetLink(msg)) {
            Ok(Some(RouteNetlinkMessage::NewLink(m))) => m,
            Ok(_) | Err(RequestFailure::Errno(libc::ENODEV, _)) => return Ok(None),
            Err(f) => return Err(f.into_error(format_args!("get link {name}"))),
        };
        let mut t = LinkTuning {
            index: reply.header.index,
            mac: None,
            mtu: 0,
            promisc: reply.header.flags.contains(LinkFlags::Promisc),
            allmulti: reply.header.flags.contains(LinkFlags::Allmulti),
            txqlen: 0,
        };
        for attr in &reply.attributes {
            match attr {
                LinkAttribute::Address(a) => t.mac = crate::Mac::from_slice(a),
                LinkAttribute::Mtu(m) => t.mtu = *m,
                LinkAttribute::TxQueueLen(q) => t.txqlen = *q,
                _ => {}
            }
        }
        Ok(Some(t))
    }

    /// Sets or clears IFF_ALLMULTI (`ip link set X allmulticast on|off`).
    pub fn set_allmulti(&self, index: u32, on: bool) -> Result<()> {
        let mut msg = by_index(index);
        if on {
            msg.header.flags |= LinkFlags::Allmulti;
        }
        msg.header.change_mask |= LinkFlags::Allmulti;
        self.ack(RouteNetlinkMessage::NewLink(msg), 0)
            .map_err(|f| f.into_error(format_args!("set allmulticast {} on link {}", on_off(on), self.describe(index))))
    }

    /// Sets the transmit queue length (`ip link set X txqueuelen N`).
    pub fn set_txqlen(&self, index: u32, qlen: u32) -> Result<()> {
        let mut msg = by_index(index);
        msg.attributes.push(LinkAttribute::TxQueueLen(qlen));
        self.ack(RouteNetlinkMessage::NewLink(msg), 0)
            .map_err(|f| f.into_error(format_args!("set txqueuelen {qlen} on link {}", self.describe(index))))
    }
}

fn on_off(on: bool) -> &'static str {
    if on {
        "on"
    } else {
        "off"
    }
}

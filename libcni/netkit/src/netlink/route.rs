//! Routes.

use super::{address_family, BatchOp, Netlink, RequestFailure};
use crate::Family;
use ipnetwork::IpNetwork;
use libcni::Result;
use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteFlags, RouteHeader, RouteMessage, RouteMetric, RouteProtocol, RouteScope,
    RouteType,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

const RT_TABLE_MAIN: u32 = 254;
/// Header value when the real table id only fits in RTA_TABLE.
const RT_TABLE_COMPAT: u8 = 252;

/// A unicast route, as given to [`Netlink::add_route`] and returned by [`Netlink::routes`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteSpec {
    pub dst: IpNetwork,
    pub gw: Option<IpAddr>,
    /// Output interface index.
    pub oif: Option<u32>,
    /// Routing table; `None` is main (254).
    pub table: Option<u32>,
    /// Metric (RTA_PRIORITY).
    pub metric: Option<u32>,
    /// RT_SCOPE_*; `None` picks like `ip route`: link for IPv4 routes without a gateway, else
    /// universe.
    pub scope: Option<u8>,
    pub mtu: Option<u32>,
    pub advmss: Option<u32>,
    /// Preferred source address (RTA_PREFSRC).
    pub src: Option<IpAddr>,
}

impl RouteSpec {
    /// A route to `dst` with nothing else set.
    pub fn new(dst: IpNetwork) -> RouteSpec {
        RouteSpec {
            dst,
            gw: None,
            oif: None,
            table: None,
            metric: None,
            scope: None,
            mtu: None,
            advmss: None,
            src: None,
        }
    }

    /// The default route of `gw`'s family, via `gw`.
    pub fn default_via(gw: IpAddr) -> RouteSpec {
        let dst = match gw {
            IpAddr::V4(_) => IpNetwork::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0),
            IpAddr::V6(_) => IpNetwork::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 0),
        };
        // Prefix 0 is always valid.
        let dst = dst.unwrap_or(IpNetwork::V4(ipnetwork::Ipv4Network::from(Ipv4Addr::UNSPECIFIED)));
        RouteSpec { gw: Some(gw), ..RouteSpec::new(dst) }
    }

    fn family(&self) -> AddressFamily {
        if self.dst.is_ipv4() {
            AddressFamily::Inet
        } else {
            AddressFamily::Inet6
        }
    }

    fn message(&self, for_delete: bool) -> RouteMessage {
        let mut msg = RouteMessage::default();
        let table = self.table.unwrap_or(RT_TABLE_MAIN);
        msg.header.address_family = self.family();
        msg.header.destination_prefix_length = self.dst.prefix();
        msg.header.table = u8::try_from(table).unwrap_or(RT_TABLE_COMPAT);
        if for_delete {
            // Unspecified protocol and type, scope "nowhere": match any, as `ip route del`.
            msg.header.scope = self.scope.map_or(RouteScope::NoWhere, RouteScope::from);
        } else {
            msg.header.protocol = RouteProtocol::Boot;
            msg.header.kind = RouteType::Unicast;
            msg.header.scope = match self.scope {
                Some(s) => RouteScope::from(s),
                None if self.gw.is_none() && self.dst.is_ipv4() => RouteScope::Link,
                None => RouteScope::Universe,
            };
        }
        if self.dst.prefix() > 0 {
            msg.attributes.push(RouteAttribute::Destination(RouteAddress::from(self.dst.network())));
        }
        if let Some(gw) = self.gw {
            msg.attributes.push(RouteAttribute::Gateway(RouteAddress::from(gw)));
        }
        if let Some(oif) = self.oif {
            msg.attributes.push(RouteAttribute::Oif(oif));
        }
        if let Some(m) = self.metric {
            msg.attributes.push(RouteAttribute::Priority(m));
        }
        if let Some(src) = self.src {
            msg.attributes.push(RouteAttribute::PrefSource(RouteAddress::from(src)));
        }
        msg.attributes.push(RouteAttribute::Table(table));
        let mut metrics = Vec::new();
        if let Some(mtu) = self.mtu {
            metrics.push(RouteMetric::Mtu(mtu));
        }
        if let Some(advmss) = self.advmss {
            metrics.push(RouteMetric::Advmss(advmss));
        }
        if !metrics.is_empty() {
            msg.attributes.push(RouteAttribute::Metrics(metrics));
        }
        msg
    }

    fn from_message(msg: &RouteMessage) -> Option<RouteSpec> {
        let ip = |a: &RouteAddress| match a {
            RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
            RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
            _ => None,
        };
        let unspecified = match msg.header.address_family {
            AddressFamily::Inet => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            AddressFamily::Inet6 => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
            _ => return None,
        };
        let mut dst_ip = unspecified;
        let mut spec = RouteSpec::new(IpNetwork::new(unspecified, 0).ok()?);
        spec.table = Some(u32::from(msg.header.table));
        spec.scope = Some(msg.header.scope.into());
        for attr in &msg.attributes {
            match attr {
                RouteAttribute::Destination(a) => dst_ip = ip(a)?,
                RouteAttribute::Gateway(a) => spec.gw = ip(a),
                RouteAttribute::Oif(i) => spec.oif = Some(*i),
                RouteAttribute::Priority(p) => spec.metric = Some(*p),
                RouteAttribute::Table(t) => spec.table = Some(*t),
                RouteAttribute::PrefSource(a) => spec.src = ip(a),
                RouteAttribute::Metrics(ms) => {
                    for m in ms {
                        match m {
                            RouteMetric::Mtu(v) => spec.mtu = Some(*v),
                            RouteMetric::Advmss(v) => spec.advmss = Some(*v),
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
        }
        spec.dst = IpNetwork::new(dst_ip, msg.header.destination_prefix_length).ok()?;
        Some(spec)
    }
}

impl fmt::Display for RouteSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.dst)?;
        if let Some(gw) = self.gw {
            write!(f, " via {gw}")?;
        }
        if let Some(oif) = self.oif {
            write!(f, " dev index {oif}")?;
        }
        if let Some(t) = self.table {
            write!(f, " table {t}")?;
        }
        if let Some(m) = self.metric {
            write!(f, " metric {m}")?;
        }
        Ok(())
    }
}

/// The route the kernel picks for one address, as `ip route get <addr> fibmatch` shows it: the
/// entry itself (its destination prefix and output interface), not a route made for the packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FibMatch {
    pub dst: IpNetwork,
    /// The address is the node's own (a route of type local; `oif` is a link holding it).
    pub local: bool,
    pub oif: Option<u32>,
    pub gw: Option<IpAddr>,
}

impl Netlink {
    /// The route the kernel uses for `addr` (policy rules, then the longest prefix), or `None`
    /// when it has none (unreachable).
    pub fn fib_match(&self, addr: IpAddr) -> Result<Option<FibMatch>> {
        Ok(self.get_route(addr, RouteFlags::FibMatch)?.and_then(|m| {
            RouteSpec::from_message(&m).map(|r| FibMatch {
                dst: r.dst,
                local: m.header.kind == RouteType::Local,
                oif: r.oif,
                gw: r.gw,
            })
        }))
    }

    /// The index of the link a packet from this node to `addr` leaves through, as `ip route get
    /// <addr>` picks it (policy rules, then the longest prefix, then one path of a multipath
    /// route), or `None` when the node has no route to it.
    pub fn output_link(&self, addr: IpAddr) -> Result<Option<u32>> {
        Ok(self.get_route(addr, RouteFlags::empty())?.and_then(|m| RouteSpec::from_message(&m)).and_then(|r| r.oif))
    }

    /// RTM_GETROUTE for `addr` with `flags` (RTM_F_*): the kernel's answer, or `None` when it
    /// has no route to `addr`.
    fn get_route(&self, addr: IpAddr, flags: RouteFlags) -> Result<Option<RouteMessage>> {
        let mut req = RouteMessage::default();
        let dst = IpNetwork::from(addr);
        req.header.address_family = if addr.is_ipv4() { AddressFamily::Inet } else { AddressFamily::Inet6 };
        req.header.destination_prefix_length = dst.prefix();
        req.header.flags = flags;
        req.attributes.push(RouteAttribute::Destination(RouteAddress::from(addr)));
        match self.get_one(RouteNetlinkMessage::GetRoute(req)) {
            Ok(Some(RouteNetlinkMessage::NewRoute(m))) => Ok(Some(m)),
            Ok(_) => Ok(None),
            Err(RequestFailure::Errno(
                libc::ENETUNREACH | libc::EHOSTUNREACH | libc::ESRCH | libc::EACCES | libc::EINVAL,
                _,
            )) => Ok(None),
            Err(f) => Err(f.into_error(format_args!("look up the route to {addr}"))),
        }
    }

    /// Adds a route; one that already exists fails with EEXIST ([`crate::is_exists`]).
    pub fn add_route(&self, route: &RouteSpec) -> Result<()> {
        self.run(Netlink::add_route_op(route))
    }

    /// [`Netlink::add_route`] as a request of a [`Netlink::batch`].
    pub fn add_route_op(route: &RouteSpec) -> BatchOp {
        let what = format!("add route {route}");
        BatchOp::new(RouteNetlinkMessage::NewRoute(route.message(false)), NLM_F_CREATE | NLM_F_EXCL, move |_| {
            what.clone()
        })
    }

    /// Adds or replaces a route (`ip route replace`).
    pub fn replace_route(&self, route: &RouteSpec) -> Result<()> {
        self.ack(RouteNetlinkMessage::NewRoute(route.message(false)), NLM_F_CREATE | NLM_F_REPLACE)
            .map_err(|f| f.into_error(format_args!("replace route {route}")))
    }

    /// Deletes a route; the fields left `None` match anything. `Ok(false)` if none matched.
    pub fn del_route(&self, route: &RouteSpec) -> Result<bool> {
        match self.ack(RouteNetlinkMessage::DelRoute(route.message(true)), 0) {
            Ok(()) => Ok(true),
            Err(RequestFailure::Errno(libc::ESRCH | libc::ENOENT | libc::ENODEV, _)) => Ok(false),
            Err(f) => Err(f.into_error(format_args!("delete route {route}"))),
        }
    }

    /// The unicast routes of `family` (`None`: both) in `table` (`None`: main; `Some(0)`: every table).
    pub fn routes(&self, family: impl Into<Option<Family>>, table: Option<u32>) -> Result<Vec<RouteSpec>> {
        let mut req = RouteMessage::default();
        req.header.address_family = address_family(family.into());
        let want = table.unwrap_or(RT_TABLE_MAIN);
        let msgs = self.dump(RouteNetlinkMessage::GetRoute(req)).map_err(|f| f.into_error("list routes"))?;
        Ok(msgs
            .iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewRoute(r) if r.header.kind == RouteType::Unicast => RouteSpec::from_message(r),
                _ => None,
            })
            .filter(|r| want == u32::from(RouteHeader::RT_TABLE_UNSPEC) || r.table == Some(want))
            .collect())
    }

    /// The routes of `table` (default main) that go out through link `index`.
    pub fn routes_of(&self, index: u32, family: impl Into<Option<Family>>) -> Result<Vec<RouteSpec>> {
        Ok(self.routes(family, None)?.into_iter().filter(|r| r.oif == Some(index)).collect())
    }

    /// Whether `route` (dst, and gw/oif/table when given) is present.
    pub fn has_route(&self, route: &RouteSpec) -> Result<bool> {
        let family = Family::of_net(&route.dst);
        let table = route.table.or(Some(RT_TABLE_MAIN));
        let found = self.routes(family, table)?.into_iter().any(|r| {
            r.dst == route.dst
                && (route.gw.is_none() || r.gw == route.gw)
                && (route.oif.is_none() || r.oif == route.oif)
                && (route.metric.is_none() || r.metric == route.metric)
        });
        Ok(found)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn default_route_spec() {
        let r = RouteSpec::default_via("10.0.0.1".parse().unwrap());
        assert_eq!(r.dst.to_string(), "0.0.0.0/0");
        let r = RouteSpec::default_via("fd00::1".parse().unwrap());
        assert_eq!(r.dst.to_string(), "::/0");
        let m = r.message(false);
        assert_eq!(m.header.scope, RouteScope::Universe);
        assert!(!m.attributes.iter().any(|a| matches!(a, RouteAttribute::Destination(_))));
    }

    #[test]
    fn link_scope_for_v4_without_gateway() {
        let mut r = RouteSpec::new("10.1.0.0/16".parse().unwrap());
        r.oif = Some(3);
        assert_eq!(r.message(false).header.scope, RouteScope::Link);
        assert_eq!(r.message(true).header.scope, RouteScope::NoWhere);
        r.table = Some(1000);
        assert_eq!(r.message(false).header.table, RT_TABLE_COMPAT);
    }
}

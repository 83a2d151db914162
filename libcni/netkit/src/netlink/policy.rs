//! Policy routing: routing rules (`ip rule`), and routes handled as the kernel reported them, so
//! one can be moved to another table with everything it carries (protocol, scope, preferred
//! source, metrics), as `ip route` would show it there.

use super::{address_family, Netlink, RequestFailure};
use crate::Family;
use ipnetwork::IpNetwork;
use libcni::Result;
use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE};
use netlink_packet_route::route::{RouteAddress, RouteAttribute, RouteFlags, RouteMessage};
use netlink_packet_route::rule::{RuleAction, RuleAttribute, RuleMessage};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use std::fmt;
use std::net::IpAddr;

const RT_TABLE_MAIN: u32 = 254;
/// Header value when the real table id only fits in the table attribute.
const RT_TABLE_COMPAT: u8 = 252;

/// A routing rule as the kernel reported it.
#[derive(Debug, Clone)]
pub struct Rule {
    msg: RuleMessage,
}

impl Rule {
    /// The table the rule looks up (the attribute, else the header's).
    pub fn table(&self) -> u32 {
        self.msg
            .attributes
            .iter()
            .find_map(|a| match a {
                RuleAttribute::Table(t) => Some(*t),
                _ => None,
            })
            .unwrap_or(u32::from(self.msg.header.table))
    }

    /// The source selector (`from <net>`), if any.
    pub fn src(&self) -> Option<IpNetwork> {
        self.msg.attributes.iter().find_map(|a| match a {
            RuleAttribute::Source(ip) => IpNetwork::new(*ip, self.msg.header.src_len).ok(),
            _ => None,
        })
    }

    pub fn priority(&self) -> Option<u32> {
        self.msg.attributes.iter().find_map(|a| match a {
            RuleAttribute::Priority(p) => Some(*p),
            _ => None,
        })
    }

    /// A plain `from <ip> lookup <table>` rule: a full-length source, a table lookup, and no other
    /// selector (no destination, iif/oif, fwmark, ...).
    pub fn is_plain_source_lookup(&self) -> bool {
        let full = if self.msg.header.family == AddressFamily::Inet { 32 } else { 128 };
        self.msg.header.action == RuleAction::ToTable
            && self.msg.header.src_len == full
            && self.msg.header.dst_len == 0
            && self.msg.attributes.iter().all(|a| {
                matches!(
                    a,
                    RuleAttribute::Source(_)
                        | RuleAttribute::Table(_)
                        | RuleAttribute::Priority(_)
                        | RuleAttribute::Protocol(_)
                        | RuleAttribute::SuppressPrefixLen(_)
                        | RuleAttribute::SuppressIfGroup(_)
                )
            })
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(p) = self.priority() {
            write!(f, "{p}: ")?;
        }
        match self.src() {
            Some(src) => write!(f, "from {src}")?,
            None => f.write_str("from all")?,
        }
        write!(f, " lookup {}", self.table())
    }
}

/// A route as the kernel reported it (any table, any type).
#[derive(Debug, Clone)]
pub struct RawRoute {
    msg: RouteMessage,
}

impl RawRoute {
    fn addr(a: &RouteAddress) -> Option<IpAddr> {
        match a {
            RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
            RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
            _ => None,
        }
    }

    pub fn table(&self) -> u32 {
        self.msg
            .attributes
            .iter()
            .find_map(|a| match a {
                RouteAttribute::Table(t) => Some(*t),
                _ => None,
            })
            .unwrap_or(u32::from(self.msg.header.table))
    }

    pub fn oif(&self) -> Option<u32> {
        self.msg.attributes.iter().find_map(|a| match a {
            RouteAttribute::Oif(i) => Some(*i),
            _ => None,
        })
    }

    pub fn gateway(&self) -> Option<IpAddr> {
        self.msg.attributes.iter().find_map(|a| match a {
            RouteAttribute::Gateway(g) => Self::addr(g),
            _ => None,
        })
    }

    /// RTPROT_*: who made it (2 the kernel, for an address's own routes; 9 a router
    /// advertisement; 3 boot and 4 static for `ip route add`).
    pub fn protocol(&self) -> u8 {
        self.msg.header.protocol.into()
    }

    /// RT_SCOPE_*: 0 universe, 253 link, 254 host.
    pub fn scope(&self) -> u8 {
        self.msg.header.scope.into()
    }

    /// The preferred source address (`src` in `ip route`).
    pub fn pref_src(&self) -> Option<IpAddr> {
        self.msg.attributes.iter().find_map(|a| match a {
            RouteAttribute::PrefSource(s) => Self::addr(s),
            _ => None,
        })
    }

    /// The destination (`default` is the family's /0).
    pub fn dst(&self) -> Option<IpNetwork> {
        let ip = self.msg.attributes.iter().find_map(|a| match a {
            RouteAttribute::Destination(d) => Self::addr(d),
            _ => None,
        });
        let ip = match (ip, self.msg.header.address_family) {
            (Some(ip), _) => ip,
            (None, AddressFamily::Inet) => IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
            (None, AddressFamily::Inet6) => IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
            _ => return None,
        };
        IpNetwork::new(ip, self.msg.header.destination_prefix_length).ok()
    }

    /// The same route in `table`, with the header flags cleared (the kernel refuses a route
    /// flagged as cloned or notified) and the attributes that only describe kernel state dropped.
    fn in_table(&self, table: u32) -> RouteMessage {
        let mut msg = self.msg.clone();
        msg.header.table = u8::try_from(table).unwrap_or(RT_TABLE_COMPAT);
        msg.header.flags = RouteFlags::empty();
        msg.attributes.retain(|a| {
            !matches!(
                a,
                RouteAttribute::Table(_)
                    | RouteAttribute::CacheInfo(_)
                    | RouteAttribute::Expires(_)
                    | RouteAttribute::MulticastExpires(_)
                    | RouteAttribute::MfcStats(_)
            )
        });
        msg.attributes.push(RouteAttribute::Table(table));
        msg
    }

    /// The same route through link `oif`, keeping `onlink` (the kernel refuses the other flags a
    /// listing carries, such as `linkdown`).
    fn through(&self, oif: u32) -> RouteMessage {
        let mut msg = self.in_table(self.table());
        msg.header.flags = self.msg.header.flags & RouteFlags::Onlink;
        msg.attributes.retain(|a| !matches!(a, RouteAttribute::Oif(_)));
        msg.attributes.push(RouteAttribute::Oif(oif));
        msg
    }
}

impl fmt::Display for RawRoute {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.dst() {
            Some(dst) => write!(f, "{dst}")?,
            None => f.write_str("?")?,
        }
        if let Some(gw) = self.gateway() {
            write!(f, " via {gw}")?;
        }
        if let Some(oif) = self.oif() {
            write!(f, " dev index {oif}")?;
        }
        if let Some(src) = self.pref_src() {
            write!(f, " src {src}")?;
        }
        write!(f, " table {}", self.table())
    }
}

impl Netlink {
    /// Every routing rule of `family` (`None`: both).
    pub fn rules(&self, family: impl Into<Option<Family>>) -> Result<Vec<Rule>> {
        let mut req = RuleMessage::default();
        req.header.family = address_family(family.into());
        let msgs = self.dump(RouteNetlinkMessage::GetRule(req)).map_err(|f| f.into_error("list rules"))?;
        Ok(msgs
            .into_iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewRule(msg) => Some(Rule { msg }),
                _ => None,
            })
            .collect())
    }

    /// Adds `from <src>/32 (or /128) lookup <table>` with no priority, so the kernel places it just
    /// before the first rule after priority 0 (32765 on a fresh namespace, then 32764, ...), as
    /// `ip rule add` and the reference plugins' netlink library do.
    pub fn add_source_rule(&self, src: IpAddr, table: u32) -> Result<()> {
        let mut msg = RuleMessage::default();
        msg.header.family = if src.is_ipv4() { AddressFamily::Inet } else { AddressFamily::Inet6 };
        msg.header.src_len = if src.is_ipv4() { 32 } else { 128 };
        msg.header.table = u8::try_from(table).unwrap_or(0);
        msg.header.action = RuleAction::ToTable;
        msg.attributes.push(RuleAttribute::Source(src));
        msg.attributes.push(RuleAttribute::Table(table));
        self.ack(RouteNetlinkMessage::NewRule(msg), NLM_F_CREATE | NLM_F_EXCL)
            .map_err(|f| f.into_error(format_args!("add rule from {src} lookup {table}")))
    }

    /// Deletes a rule as it was listed; `Ok(false)` if it is already gone.
    pub fn del_rule(&self, rule: &Rule) -> Result<bool> {
        match self.ack(RouteNetlinkMessage::DelRule(rule.msg.clone()), 0) {
            Ok(()) => Ok(true),
            Err(RequestFailure::Errno(libc::ENOENT | libc::ESRCH, _)) => Ok(false),
            Err(f) => Err(f.into_error(format_args!("delete rule {rule}"))),
        }
    }

    /// Every route of `family` (`None`: both) in every table, of every type.
    pub fn raw_routes(&self, family: impl Into<Option<Family>>) -> Result<Vec<RawRoute>> {
        let mut req = RouteMessage::default();
        req.header.address_family = address_family(family.into());
        let msgs = self.dump(RouteNetlinkMessage::GetRoute(req)).map_err(|f| f.into_error("list routes"))?;
        Ok(msgs
            .into_iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewRoute(msg) => Some(RawRoute { msg }),
                _ => None,
            })
            .collect())
    }

    /// The routes of the main table that go out through link `index`.
    pub fn raw_routes_of(&self, index: u32) -> Result<Vec<RawRoute>> {
        Ok(self
            .raw_routes(None)?
            .into_iter()
            .filter(|r| r.table() == RT_TABLE_MAIN && r.oif() == Some(index))
            .collect())
    }

    /// Adds (or replaces) `route` in `table`.
    pub fn copy_route_to_table(&self, route: &RawRoute, table: u32) -> Result<RawRoute> {
        let msg = route.in_table(table);
        self.ack(RouteNetlinkMessage::NewRoute(msg.clone()), NLM_F_CREATE | NLM_F_REPLACE)
            .map_err(|f| f.into_error(format_args!("copy route {route} to table {table}")))?;
        Ok(RawRoute { msg })
    }

    /// Adds `route` back as it was listed (to undo a deletion); one already there is fine.
    pub fn restore_route(&self, route: &RawRoute) -> Result<()> {
        let msg = route.in_table(route.table());
        self.ack(RouteNetlinkMessage::NewRoute(msg), NLM_F_CREATE | NLM_F_REPLACE)
            .map_err(|f| f.into_error(format_args!("restore route {route}")))
    }

    /// Adds `route` as it was listed (its table, metric, protocol, `onlink`...), through link
    /// `oif`, to give it back to a link that lost it. One already there fails with EEXIST
    /// ([`crate::is_exists`]): it is not replaced, as it is someone else's now.
    pub fn readd_route(&self, route: &RawRoute, oif: u32) -> Result<()> {
        self.ack(RouteNetlinkMessage::NewRoute(route.through(oif)), NLM_F_CREATE | NLM_F_EXCL)
            .map_err(|f| f.into_error(format_args!("restore route {route}")))
    }

    /// Deletes a route as it was listed; `Ok(false)` if it is already gone.
    pub fn del_raw_route(&self, route: &RawRoute) -> Result<bool> {
        let mut msg = route.in_table(route.table());
        msg.attributes.retain(|a| !matches!(a, RouteAttribute::Metrics(_)));
        match self.ack(RouteNetlinkMessage::DelRoute(msg), 0) {
            Ok(()) => Ok(true),
            Err(RequestFailure::Errno(libc::ESRCH | libc::ENOENT | libc::ENODEV, _)) => Ok(false),
            Err(f) => Err(f.into_error(format_args!("delete route {route}"))),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_copied_route_carries_the_new_table_and_no_flags() {
        let mut msg = RouteMessage::default();
        msg.header.address_family = AddressFamily::Inet;
        msg.header.table = 254;
        msg.header.flags = RouteFlags::Cloned;
        msg.attributes.push(RouteAttribute::Table(254));
        msg.attributes.push(RouteAttribute::Oif(3));
        let r = RawRoute { msg };
        assert_eq!(r.dst().unwrap().to_string(), "0.0.0.0/0");
        let moved = r.in_table(1000);
        assert_eq!(moved.header.table, RT_TABLE_COMPAT);
        assert!(moved.header.flags.is_empty());
        let tables: Vec<_> =
            moved.attributes.iter().filter(|a| matches!(a, RouteAttribute::Table(_))).cloned().collect();
        assert_eq!(tables, [RouteAttribute::Table(1000)]);
        assert_eq!(RawRoute { msg: moved }.table(), 1000);
    }

    #[test]
    fn a_route_given_back_keeps_onlink_and_names_its_new_link() {
        let mut msg = RouteMessage::default();
        msg.header.address_family = AddressFamily::Inet;
        msg.header.table = 254;
        msg.header.flags = RouteFlags::Onlink | RouteFlags::Linkdown;
        msg.attributes.push(RouteAttribute::Oif(3));
        let back = RawRoute { msg }.through(9);
        assert_eq!(back.header.flags, RouteFlags::Onlink);
        let oifs: Vec<_> = back.attributes.iter().filter(|a| matches!(a, RouteAttribute::Oif(_))).cloned().collect();
        assert_eq!(oifs, [RouteAttribute::Oif(9)]);
    }

    #[test]
    fn plain_source_rules() {
        let mut msg = RuleMessage::default();
        msg.header.family = AddressFamily::Inet;
        msg.header.src_len = 32;
        msg.header.action = RuleAction::ToTable;
        msg.attributes.push(RuleAttribute::Source("10.0.0.5".parse().unwrap()));
        msg.attributes.push(RuleAttribute::Table(100));
        msg.attributes.push(RuleAttribute::Priority(32765));
        let rule = Rule { msg: msg.clone() };
        assert!(rule.is_plain_source_lookup());
        assert_eq!(rule.to_string(), "32765: from 10.0.0.5/32 lookup 100");
        msg.attributes.push(RuleAttribute::FwMark(1));
        assert!(!Rule { msg }.is_plain_source_lookup());
    }
}

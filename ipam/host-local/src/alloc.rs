//! Pure allocation logic over range sets: which address comes next, round-robin after the last
//! reservation, wrapping, never handing out the gateway, the network address or the IPv4 broadcast.
//! Nothing here touches the disk; the store answers "is this address taken?".

use ipnetwork::IpNetwork;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// An address as a number, so ranges can be walked the same way for both families.
pub fn to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

/// The inverse of [`to_u128`] for the family of `like`.
pub fn from_u128(n: u128, v4: bool) -> IpAddr {
    if v4 {
        // A v4 value never exceeds u32 here: callers stay inside a v4 subnet.
        IpAddr::V4(Ipv4Addr::from(u32::try_from(n).unwrap_or(u32::MAX)))
    } else {
        IpAddr::V6(Ipv6Addr::from(n))
    }
}

/// One range of a set: a subnet and the inclusive span allocated from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Range {
    /// The network address and prefix (host bits are zero, checked while parsing).
    pub subnet: IpNetwork,
    pub start: IpAddr,
    pub end: IpAddr,
    pub gateway: IpAddr,
}

impl Range {
    /// The reference's defaults: gateway and start subnet+1, end broadcast−1 (IPv4) or the last address (IPv6).
    pub fn with_defaults(
        subnet: IpNetwork,
        start: Option<IpAddr>,
        end: Option<IpAddr>,
        gateway: Option<IpAddr>,
    ) -> Range {
        let v4 = subnet.is_ipv4();
        let first = from_u128(to_u128(subnet.network()) + 1, v4);
        let last = if v4 { from_u128(to_u128(subnet.broadcast()).saturating_sub(1), v4) } else { subnet.broadcast() };
        Range { subnet, start: start.unwrap_or(first), end: end.unwrap_or(last), gateway: gateway.unwrap_or(first) }
    }

    pub fn is_ipv4(&self) -> bool {
        self.subnet.is_ipv4()
    }

    /// True when `ip` lies between start and end (inclusive) and is of the same family.
    pub fn contains(&self, ip: IpAddr) -> bool {
        ip.is_ipv4() == self.is_ipv4() && to_u128(self.start) <= to_u128(ip) && to_u128(ip) <= to_u128(self.end)
    }

    /// Why `ip` can never be handed out from this range, if it can't.
    pub fn unusable(&self, ip: IpAddr) -> Option<&'static str> {
        if ip == self.gateway {
            Some("is the gateway")
        } else if ip == self.subnet.network() {
            Some("is the network address")
        } else if self.is_ipv4() && ip == self.subnet.broadcast() {
            Some("is the broadcast address")
        } else {
            None
        }
    }

    pub fn overlaps(&self, other: &Range) -> bool {
        self.is_ipv4() == other.is_ipv4()
            && to_u128(self.start) <= to_u128(other.end)
            && to_u128(other.start) <= to_u128(self.end)
    }
}

impl fmt::Display for Range {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.start, self.end)
    }
}

/// Ranges of one family that together yield one address per ADD.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeSet {
    pub ranges: Vec<Range>,
}

impl fmt::Display for RangeSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.ranges.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

/// Why a requested address cannot be reserved from a set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    NotInSet,
    Unusable(&'static str),
}

impl RangeSet {
    pub fn is_ipv4(&self) -> bool {
        self.ranges.first().is_some_and(Range::is_ipv4)
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        self.range_for(ip).is_some()
    }

    pub fn range_for(&self, ip: IpAddr) -> Option<&Range> {
        self.ranges.iter().find(|r| r.contains(ip))
    }

    pub fn overlaps(&self, other: &RangeSet) -> bool {
        self.ranges.iter().any(|a| other.ranges.iter().any(|b| a.overlaps(b)))
    }

    /// The range a requested address would come from, or why it can't be handed out.
    pub fn check_requested(&self, ip: IpAddr) -> Result<&Range, Refusal> {
        let range = self.range_for(ip).ok_or(Refusal::NotInSet)?;
        match range.unusable(ip) {
            Some(why) => Err(Refusal::Unusable(why)),
            None => Ok(range),
        }
    }

    /// Every usable address once, starting after `last_reserved` when that is in the set (round-robin),
    /// else at the first range's start, wrapping around the end of the last range.
    pub fn candidates(&self, last_reserved: Option<IpAddr>) -> Candidates<'_> {
        let start = last_reserved
            .and_then(|ip| self.ranges.iter().position(|r| r.contains(ip)).map(|i| self.step((i, to_u128(ip)))))
            .unwrap_or((0, self.ranges.first().map_or(0, |r| to_u128(r.start))));
        Candidates { set: self, start, pos: start, done: self.ranges.is_empty() }
    }

    /// The first candidate that `taken` does not claim.
    pub fn next_free(&self, last_reserved: Option<IpAddr>, taken: impl Fn(IpAddr) -> bool) -> Option<IpAddr> {
        self.candidates(last_reserved).find(|ip| !taken(*ip))
    }

    /// The position after `pos`, moving to the next range (cyclically) past a range's end.
    fn step(&self, (ri, n): (usize, u128)) -> (usize, u128) {
        let Some(r) = self.ranges.get(ri) else { return (0, 0) };
        if n >= to_u128(r.end) {
            let next = (ri + 1) % self.ranges.len();
            (next, self.ranges.get(next).map_or(0, |r| to_u128(r.start)))
        } else {
            (ri, n + 1)
        }
    }
}

/// Iterator over a set's usable addresses, one full cycle. Lazy, so a huge IPv6 range costs only what is read.
pub struct Candidates<'a> {
    set: &'a RangeSet,
    start: (usize, u128),
    pos: (usize, u128),
    done: bool,
}

impl Iterator for Candidates<'_> {
    type Item = IpAddr;

    fn next(&mut self) -> Option<IpAddr> {
        while !self.done {
            let (ri, n) = self.pos;
            self.pos = self.set.step(self.pos);
            if self.pos == self.start {
                self.done = true;
            }
            let range = self.set.ranges.get(ri)?;
            let ip = from_u128(n, range.is_ipv4());
            if range.unusable(ip).is_none() {
                return Some(ip);
            }
        }
        None
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }
    fn range(subnet: &str, start: Option<&str>, end: Option<&str>, gw: Option<&str>) -> Range {
        Range::with_defaults(subnet.parse().unwrap(), start.map(ip), end.map(ip), gw.map(ip))
    }
    fn set(ranges: Vec<Range>) -> RangeSet {
        RangeSet { ranges }
    }

    #[test]
    fn defaults_match_reference() {
        let r = range("10.0.0.0/24", None, None, None);
        assert_eq!((r.start, r.end, r.gateway), (ip("10.0.0.1"), ip("10.0.0.254"), ip("10.0.0.1")));
        let r = range("fd00::/120", None, None, None);
        assert_eq!((r.start, r.end, r.gateway), (ip("fd00::1"), ip("fd00::ff"), ip("fd00::1")));
    }

    #[test]
    fn first_allocation_skips_gateway() {
        let s = set(vec![range("10.0.0.0/29", None, None, None)]);
        let all: Vec<IpAddr> = s.candidates(None).collect();
        let want: Vec<IpAddr> = (2..=6).map(|i| ip(&format!("10.0.0.{i}"))).collect();
        assert_eq!(all, want);
    }

    #[test]
    fn round_robin_after_last_reserved_and_wraps() {
        let s = set(vec![range("10.0.0.0/29", None, None, None)]);
        assert_eq!(s.next_free(Some(ip("10.0.0.3")), |_| false), Some(ip("10.0.0.4")));
        // After the last address: wraps to the start, skipping the gateway.
        assert_eq!(s.next_free(Some(ip("10.0.0.6")), |_| false), Some(ip("10.0.0.2")));
        let order: Vec<IpAddr> = s.candidates(Some(ip("10.0.0.4"))).collect();
        assert_eq!(order, ["10.0.0.5", "10.0.0.6", "10.0.0.2", "10.0.0.3", "10.0.0.4"].map(ip));
        // A last_reserved outside the set (config changed) starts over from the beginning.
        assert_eq!(s.next_free(Some(ip("192.168.0.9")), |_| false), Some(ip("10.0.0.2")));
    }

    #[test]
    fn taken_addresses_are_skipped_and_exhaustion_is_none() {
        let s = set(vec![range("10.0.0.0/29", None, None, None)]);
        let taken: HashSet<IpAddr> = ["10.0.0.2", "10.0.0.3", "10.0.0.5"].map(ip).into();
        assert_eq!(s.next_free(None, |a| taken.contains(&a)), Some(ip("10.0.0.4")));
        assert_eq!(s.next_free(Some(ip("10.0.0.5")), |a| taken.contains(&a)), Some(ip("10.0.0.6")));
        assert_eq!(s.next_free(None, |_| true), None);
    }

    #[test]
    fn network_and_broadcast_never_handed_out_even_inside_explicit_bounds() {
        let s = set(vec![range("10.0.0.0/30", Some("10.0.0.0"), Some("10.0.0.3"), Some("10.0.0.2"))]);
        assert_eq!(s.candidates(None).collect::<Vec<_>>(), vec![ip("10.0.0.1")]);
        assert_eq!(s.check_requested(ip("10.0.0.3")), Err(Refusal::Unusable("is the broadcast address")));
        assert_eq!(s.check_requested(ip("10.0.0.2")), Err(Refusal::Unusable("is the gateway")));
        assert_eq!(s.check_requested(ip("10.0.0.9")), Err(Refusal::NotInSet));
        assert!(s.check_requested(ip("10.0.0.1")).is_ok());
    }

    #[test]
    fn multiple_ranges_in_a_set_chain_and_wrap() {
        let s = set(vec![
            range("10.0.0.0/24", Some("10.0.0.10"), Some("10.0.0.11"), None),
            range("10.1.0.0/24", Some("10.1.0.5"), Some("10.1.0.6"), Some("10.1.0.6")),
        ]);
        let order: Vec<IpAddr> = s.candidates(Some(ip("10.0.0.11"))).collect();
        assert_eq!(order, ["10.1.0.5", "10.0.0.10", "10.0.0.11"].map(ip));
        assert_eq!(s.to_string(), "10.0.0.10-10.0.0.11,10.1.0.5-10.1.0.6");
    }

    #[test]
    fn ipv6_keeps_last_address_and_large_ranges_are_lazy() {
        let s = set(vec![range("fd00::/126", None, None, None)]);
        assert_eq!(s.candidates(None).collect::<Vec<_>>(), ["fd00::2", "fd00::3"].map(ip));
        let big = set(vec![range("fd00::/64", None, None, None)]);
        assert_eq!(big.next_free(Some(ip("fd00::ffff:ffff:ffff:ffff")), |_| false), Some(ip("fd00::2")));
        assert_eq!(big.candidates(None).take(3).count(), 3);
    }

    #[test]
    fn single_address_range_that_is_the_gateway_is_exhausted() {
        let s = set(vec![range("10.0.0.0/24", Some("10.0.0.1"), Some("10.0.0.1"), None)]);
        assert_eq!(s.next_free(None, |_| false), None);
    }

    #[test]
    fn overlap() {
        let a = set(vec![range("10.0.0.0/24", None, Some("10.0.0.100"), None)]);
        let b = set(vec![range("10.0.0.0/24", Some("10.0.0.101"), None, None)]);
        let c = set(vec![range("10.0.0.0/16", None, None, None)]);
        let v6 = set(vec![range("fd00::/64", None, None, None)]);
        assert!(!a.overlaps(&b));
        assert!(a.overlaps(&c) && c.overlaps(&b));
        assert!(!a.overlaps(&v6));
    }
}

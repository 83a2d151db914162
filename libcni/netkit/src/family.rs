//! The address family of an IP address, a route or a sysctl: one type for every part of netkit and
//! the plugins. A dump over both families takes `Option<Family>` (`None`: both). (nf_tables' table
//! families, `inet`/`ip`/`ip6`/`bridge`, are another concept: `firewall::nfnl`.)

use ipnetwork::IpNetwork;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// IPv4 or IPv6 (IPv4 orders first).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    /// The family of `addr`.
    pub fn of(addr: &IpAddr) -> Family {
        if addr.is_ipv4() {
            Family::V4
        } else {
            Family::V6
        }
    }

    /// The family of `net`.
    pub fn of_net(net: &IpNetwork) -> Family {
        Family::of(&net.ip())
    }

    /// `v4` for IPv4, `v6` for IPv6.
    pub fn pick<T>(self, v4: T, v6: T) -> T {
        match self {
            Family::V4 => v4,
            Family::V6 => v6,
        }
    }

    /// Bits in an address: 32 or 128.
    pub fn bits(self) -> u8 {
        self.pick(32, 128)
    }

    /// The directory of its sysctls under `/proc/sys/net`: `ipv4` or `ipv6`.
    pub fn sysctl_dir(self) -> &'static str {
        self.pick("ipv4", "ipv6")
    }

    /// The default route's destination: `0.0.0.0/0` or `::/0`.
    pub fn default_dst(self) -> IpNetwork {
        let unspecified = self.pick(IpAddr::V4(Ipv4Addr::UNSPECIFIED), IpAddr::V6(Ipv6Addr::UNSPECIFIED));
        // A prefix of 0 fits either family: the fallback (a host route) is never taken.
        IpNetwork::new(unspecified, 0).unwrap_or(IpNetwork::from(unspecified))
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.pick("IPv4", "IPv6"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn of_pick_and_names() {
        let v4: IpAddr = "10.1.2.3".parse().unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
        let v6: IpAddr = "fd00::1".parse().unwrap_or(IpAddr::V6(Ipv6Addr::LOCALHOST));
        assert_eq!((Family::of(&v4), Family::of(&v6)), (Family::V4, Family::V6));
        assert_eq!(Family::V6.bits(), 128);
        assert_eq!(Family::V4.sysctl_dir(), "ipv4");
        assert_eq!(Family::V4.default_dst().to_string(), "0.0.0.0/0");
        assert_eq!(Family::V6.default_dst().to_string(), "::/0");
        assert_eq!(Family::of_net(&Family::V6.default_dst()), Family::V6);
        assert_eq!(Family::V6.to_string(), "IPv6");
    }
}

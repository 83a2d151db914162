//! Pod CIDRs as host-local will accept them.

use libcni::{Error, Result};
use std::fmt;
use std::net::IpAddr;

/// A network prefix with no host bits set, large enough for host-local to allocate from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    pub addr: IpAddr,
    pub prefix: u8,
}

impl Cidr {
    pub fn is_v4(&self) -> bool {
        self.addr.is_ipv4()
    }

    /// Parses `10.244.1.0/24` or `fd00:10:244:1::/64`.
    ///
    /// host-local refuses a subnet with host bits set ("Network has host bits set") and one too
    /// small to hold a gateway plus an address, so both are rejected here, before anything is
    /// written to the node.
    pub fn parse(text: &str) -> Result<Cidr> {
        let text = text.trim();
        let (addr_text, prefix_text) =
            text.split_once('/').ok_or_else(|| Error::config(format!("pod CIDR {text:?}: missing /prefix")))?;
        let addr: IpAddr = addr_text
            .parse()
            .map_err(|_| Error::config(format!("pod CIDR {text:?}: {addr_text:?} is not an IP address")))?;
        let bits: u8 = if addr.is_ipv4() { 32 } else { 128 };
        let prefix: u8 = prefix_text.parse().ok().filter(|p| *p <= bits).ok_or_else(|| {
            Error::config(format!("pod CIDR {text:?}: prefix {prefix_text:?} is not a number in 0..={bits}"))
        })?;
        // host-local needs room for at least the gateway and one pod.
        if bits - prefix < 2 {
            return Err(Error::config(format!(
                "pod CIDR {text:?}: /{prefix} is too small to allocate pod addresses from"
            )));
        }
        let cidr = Cidr { addr, prefix };
        let network = cidr.network();
        if network != addr {
            return Err(Error::config(format!(
                "pod CIDR {text:?}: host bits are set (did you mean {network}/{prefix}?)"
            )));
        }
        Ok(cidr)
    }

    /// Parses a comma-separated list, ignoring blanks; at least one CIDR is required.
    pub fn parse_list(text: &str) -> Result<Vec<Cidr>> {
        let cidrs =
            text.split(',').filter(|item| !item.trim().is_empty()).map(Cidr::parse).collect::<Result<Vec<_>, _>>()?;
        if cidrs.is_empty() {
            return Err(Error::config(format!("pod CIDR list {text:?} is empty")));
        }
        Ok(cidrs)
    }

    fn network(&self) -> IpAddr {
        match self.addr {
            IpAddr::V4(v4) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(self.prefix)).unwrap_or(0);
                IpAddr::V4((u32::from(v4) & mask).into())
            }
            IpAddr::V6(v6) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(self.prefix)).unwrap_or(0);
                IpAddr::V6((u128::from(v6) & mask).into())
            }
        }
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_v4_and_v6() {
        let cidrs = Cidr::parse_list(" 10.244.1.0/24, fd00:10:244:1::/64 ,").unwrap();
        assert_eq!(cidrs.len(), 2);
        assert_eq!(cidrs[0].to_string(), "10.244.1.0/24");
        assert!(cidrs[0].is_v4());
        assert_eq!(cidrs[1].to_string(), "fd00:10:244:1::/64");
        assert!(!cidrs[1].is_v4());
    }

    #[test]
    fn rejects_bad_cidrs() {
        for (bad, why) in [
            ("10.244.1.0", "missing /prefix"),
            ("10.244.1.0/33", "prefix"),
            ("10.244.1.0/x", "prefix"),
            ("10.244.300.0/24", "not an IP address"),
            ("10.244.1.5/24", "host bits are set (did you mean 10.244.1.0/24?)"),
            ("fd00::1/64", "did you mean fd00::/64?"),
            ("10.244.1.0/31", "too small"),
            ("fd00::/127", "too small"),
            ("", "empty"),
            (" , ", "empty"),
            ("10.244.1.0/24,bogus", "missing /prefix"),
        ] {
            let err = Cidr::parse_list(bad).unwrap_err();
            assert!(err.msg.contains(why), "{bad:?}: {err}");
        }
    }

    #[test]
    fn accepts_whole_address_space() {
        assert_eq!(Cidr::parse("0.0.0.0/0").unwrap().to_string(), "0.0.0.0/0");
        assert_eq!(Cidr::parse("::/0").unwrap().to_string(), "::/0");
    }
}

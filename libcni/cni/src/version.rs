//! Spec versions: the seven we speak, parsing and comparison by upstream's rules.

use crate::error::{Error, Result};

/// Every spec version we implement, oldest first.
pub const SUPPORTED: [&str; 7] = ["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];
pub const CURRENT: &str = "1.1.0";

/// A parsed version: numeric parts, missing parts are 0, "" is 0.1.0, four or more parts are an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version(pub u32, pub u32, pub u32);

impl Version {
    pub fn parse(s: &str) -> Result<Version> {
        if s.is_empty() {
            return Ok(Version(0, 1, 0));
        }
        let parts: Vec<&str> = s.split('.').collect();
        if parts.len() > 3 {
            return Err(Error::version(format!("invalid version {s:?}: too many parts")));
        }
        let mut n = [0u32; 3];
        for (i, p) in parts.iter().enumerate() {
            n[i] = p.parse().map_err(|_| Error::version(format!("invalid version {s:?}: {p:?} is not a number")))?;
        }
        Ok(Version(n[0], n[1], n[2]))
    }
}

/// True when `v` is at least `min` (both parsed by upstream's rules; unparsable is false).
pub fn at_least(v: &str, min: &str) -> bool {
    match (Version::parse(v), Version::parse(min)) {
        (Ok(a), Ok(b)) => a >= b,
        _ => false,
    }
}

/// Ok when `v` is one of the seven versions we speak ("" means 0.1.0).
pub fn check_supported(v: &str) -> Result<()> {
    let v = if v.is_empty() { "0.1.0" } else { v };
    if SUPPORTED.contains(&v) {
        Ok(())
    } else {
        Err(Error::version(format!(
            "incompatible CNI versions: config is {v:?}, plugin supports [{}]",
            SUPPORTED.join(", ")
        )))
    }
}

/// Ok when a result of version `v` can hold `v4` IPv4 and `v6` IPv6 addresses: before 0.3.0 a
/// result has one `ip4` and one `ip6` block, so at most one per family (code 7 otherwise).
pub fn check_addresses_per_family(v: &str, v4: usize, v6: usize) -> Result<()> {
    if (v4 > 1 || v6 > 1) && !at_least(v, "0.3.0") {
        return Err(Error::config(format!("CNI version {v} does not support more than 1 address per family")));
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn compares_numerically() {
        assert!(at_least("0.10.0", "0.4.0"));
        assert!(at_least("1.0", "1.0.0"));
        assert!(!at_least("0.3.1", "0.4.0"));
        assert!(at_least("", "0.1.0"));
        assert!(Version::parse("1.0.0.0").is_err());
        assert!(check_supported("9.9.9").is_err());
        assert!(check_supported("").is_ok());
    }
}

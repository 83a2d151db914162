//! MAC addresses: [`Mac`], what netkit's links and the plugins' configurations hold, and the one
//! grammar every key and record that holds a MAC is read with ([`parse_mac`], Go's net.ParseMAC).

use std::fmt;
use std::str::FromStr;

/// A 48-bit Ethernet address. Shown as `aa:bb:cc:dd:ee:ff`; parsed with [`parse_mac`]'s grammar.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Mac(pub [u8; 6]);

impl Mac {
    /// The six bytes, as the kernel and the wire carry them.
    pub const fn octets(self) -> [u8; 6] {
        self.0
    }

    /// The group bit: a multicast (or broadcast) address, which cannot name an interface.
    pub const fn is_multicast(self) -> bool {
        self.0[0] & 1 == 1
    }

    /// `bytes` as a MAC when it is six bytes long (a netlink attribute).
    pub fn from_slice(bytes: &[u8]) -> Option<Mac> {
        <[u8; 6]>::try_from(bytes).ok().map(Mac)
    }
}

impl From<[u8; 6]> for Mac {
    fn from(bytes: [u8; 6]) -> Mac {
        Mac(bytes)
    }
}

impl From<Mac> for [u8; 6] {
    fn from(mac: Mac) -> [u8; 6] {
        mac.0
    }
}

impl fmt::Display for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&format_mac(&self.0))
    }
}

/// Why a text is not a MAC an interface can have; callers put it after the key and the text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadMac {
    Malformed,
    Multicast,
}

impl fmt::Display for BadMac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BadMac::Malformed => "expected six hex bytes like 0a:58:0a:f4:01:02",
            BadMac::Multicast => "a multicast address cannot name an interface",
        })
    }
}

impl std::error::Error for BadMac {}

impl FromStr for Mac {
    type Err = BadMac;
    fn from_str(s: &str) -> Result<Mac, BadMac> {
        parse_mac(s).map(Mac).ok_or(BadMac::Malformed)
    }
}

/// A MAC for an interface ([`parse_mac`]'s grammar): a multicast address cannot name one.
pub fn parse_unicast_mac(s: &str) -> Result<Mac, BadMac> {
    let mac: Mac = s.parse()?;
    if mac.is_multicast() {
        return Err(BadMac::Multicast);
    }
    Ok(mac)
}

/// `aa:bb:cc:dd:ee:ff`.
pub fn format_mac(mac: &[u8; 6]) -> String {
    mac.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}

/// A 48-bit MAC as Go's net.ParseMAC reads it, the one grammar every key and record that holds a
/// MAC is read with: `aa:bb:cc:dd:ee:ff`, `aa-bb-cc-dd-ee-ff` (one separator throughout) or
/// `aabb.ccdd.eeff`, hex digits of either case; `None` if malformed.
pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let dotted = s.contains('.');
    let groups: Vec<&str> = if dotted { s.split('.').collect() } else { s.split([':', '-']).collect() };
    let hex: String = match groups.len() {
        6 if !dotted && groups.iter().all(|g| g.len() == 2) && (s.contains(':') != s.contains('-')) => groups.concat(),
        3 if dotted && groups.iter().all(|g| g.len() == 4) => groups.concat(),
        _ => return None,
    };
    let mut out = [0u8; 6];
    for (i, b) in out.iter_mut().enumerate() {
        let pair = hex.get(2 * i..2 * i + 2)?;
        if !pair.bytes().all(|c| c.is_ascii_hexdigit()) {
            return None;
        }
        *b = u8::from_str_radix(pair, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_and_from_str_round_trip() {
        let m = Mac([0x0a, 0x58, 0x0a, 0xf4, 0x00, 0xff]);
        assert_eq!(m.to_string(), "0a:58:0a:f4:00:ff");
        assert_eq!("0A-58-0A-F4-00-FF".parse::<Mac>(), Ok(m));
        assert_eq!("0a58.0af4.00ff".parse::<Mac>(), Ok(m));
        assert_eq!("0a:58:0a:f4:00".parse::<Mac>(), Err(BadMac::Malformed));
        assert_eq!(parse_unicast_mac("0a58.0af4.00ff"), Ok(m));
        assert_eq!(parse_unicast_mac("01:00:5e:00:00:01"), Err(BadMac::Multicast));
        assert_eq!(
            parse_unicast_mac("x").map_err(|e| e.to_string()),
            Err("expected six hex bytes like 0a:58:0a:f4:01:02".into())
        );
        assert_eq!(Mac::from_slice(&[1, 2, 3]), None);
        assert_eq!(<[u8; 6]>::from(m), m.octets());
    }

    #[test]
    fn mac_round_trip() {
        let m = [0x0a, 0x58, 0x0a, 0xf4, 0x00, 0xff];
        assert_eq!(format_mac(&m), "0a:58:0a:f4:00:ff");
        assert_eq!(parse_mac("0a:58:0a:f4:00:ff"), Some(m));
        assert_eq!(parse_mac("0A-58-0A-F4-00-FF"), Some(m));
        assert_eq!(parse_mac("0a:58:0a:f4:00"), None);
        assert_eq!(parse_mac("0a:58:0a:f4:00:ff:00"), None);
        assert_eq!(parse_mac("0a:58:0a:f4:00:fg"), None);
        assert_eq!(parse_mac("a:58:0a:f4:00:ff"), None);
        // Go's dotted form, and what Go refuses: mixed separators, signs, short groups.
        assert_eq!(parse_mac("0a58.0af4.00ff"), Some(m));
        assert_eq!(parse_mac("0A58.0AF4.00FF"), Some(m));
        assert_eq!(parse_mac("0a:58-0a:f4:00:ff"), None);
        assert_eq!(parse_mac("+a:58:0a:f4:00:ff"), None);
        assert_eq!(parse_mac("0a58.0af4.0ff"), None);
        assert_eq!(parse_mac("0a58.0af4.00ff.0000"), None);
    }
}

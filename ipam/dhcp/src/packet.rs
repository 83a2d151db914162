//! DHCPv4 messages (RFC 2131/2132): building the client's DISCOVER, REQUEST and RELEASE, and reading
//! the server's OFFER, ACK and NAK with the options a lease needs (subnet mask, router, DNS servers,
//! domain name, lease time, T1/T2, server identifier, static routes 33 and classless routes 121).

use std::net::Ipv4Addr;

pub const SERVER_PORT: u16 = 67;
pub const CLIENT_PORT: u16 = 68;
const MAGIC: [u8; 4] = [99, 130, 83, 99];
/// The fixed BOOTP header before the options (op .. file, plus the magic cookie).
const HEADER_LEN: usize = 240;
/// Some servers and relays drop BOOTP messages shorter than the 300 bytes of RFC 951.
const MIN_LEN: usize = 300;

pub mod opt {
    pub const PAD: u8 = 0;
    pub const SUBNET_MASK: u8 = 1;
    pub const ROUTER: u8 = 3;
    pub const DNS: u8 = 6;
    pub const HOST_NAME: u8 = 12;
    pub const DOMAIN_NAME: u8 = 15;
    pub const STATIC_ROUTES: u8 = 33;
    pub const REQUESTED_IP: u8 = 50;
    pub const LEASE_TIME: u8 = 51;
    pub const MESSAGE_TYPE: u8 = 53;
    pub const SERVER_ID: u8 = 54;
    pub const PARAMETER_LIST: u8 = 55;
    pub const RENEWAL_TIME: u8 = 58;
    pub const REBINDING_TIME: u8 = 59;
    pub const VENDOR_CLASS: u8 = 60;
    pub const CLIENT_ID: u8 = 61;
    pub const USER_CLASS: u8 = 77;
    pub const CLASSLESS_ROUTES: u8 = 121;
    pub const END: u8 = 255;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageType {
    Discover = 1,
    Offer = 2,
    Request = 3,
    Decline = 4,
    Ack = 5,
    Nak = 6,
    Release = 7,
    Inform = 8,
}

impl MessageType {
    /// The RFC's name: `DHCPDISCOVER`.
    pub fn name(self) -> &'static str {
        use MessageType::*;
        match self {
            Discover => "DHCPDISCOVER",
            Offer => "DHCPOFFER",
            Request => "DHCPREQUEST",
            Decline => "DHCPDECLINE",
            Ack => "DHCPACK",
            Nak => "DHCPNAK",
            Release => "DHCPRELEASE",
            Inform => "DHCPINFORM",
        }
    }

    fn from_u8(v: u8) -> Option<MessageType> {
        use MessageType::*;
        Some(match v {
            1 => Discover,
            2 => Offer,
            3 => Request,
            4 => Decline,
            5 => Ack,
            6 => Nak,
            7 => Release,
            8 => Inform,
            _ => return None,
        })
    }
}

/// A message the client sends.
#[derive(Debug, Clone)]
pub struct Outgoing {
    pub kind: MessageType,
    pub xid: u32,
    pub mac: [u8; 6],
    /// Ask the server to broadcast its answer (the BOOTP broadcast flag).
    pub broadcast: bool,
    /// The client's address when it holds one (RENEW, REBIND, RELEASE).
    pub ciaddr: Ipv4Addr,
    /// Options in the order they are written; the message type goes first and END last on their own.
    pub options: Vec<(u8, Vec<u8>)>,
}

impl Outgoing {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; HEADER_LEN];
        b[0] = 1; // BOOTREQUEST
        b[1] = 1; // Ethernet
        b[2] = 6;
        b[4..8].copy_from_slice(&self.xid.to_be_bytes());
        if self.broadcast {
            b[10] = 0x80;
        }
        b[12..16].copy_from_slice(&self.ciaddr.octets());
        b[28..34].copy_from_slice(&self.mac);
        b[236..240].copy_from_slice(&MAGIC);
        b.extend_from_slice(&[opt::MESSAGE_TYPE, 1, self.kind as u8]);
        for (code, value) in &self.options {
            // Longer values are split over several instances of the option (RFC 3396).
            let mut chunks = value.chunks(255).peekable();
            if chunks.peek().is_none() {
                b.extend_from_slice(&[*code, 0]);
            }
            for chunk in chunks {
                b.push(*code);
                b.push(chunk.len() as u8);
                b.extend_from_slice(chunk);
            }
        }
        b.push(opt::END);
        if b.len() < MIN_LEN {
            b.resize(MIN_LEN, opt::PAD);
        }
        b
    }
}

/// A route from option 33 or 121.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaticRoute {
    pub dst: Ipv4Addr,
    pub prefix: u8,
    /// None for an on-link route (router 0.0.0.0 in option 121).
    pub gw: Option<Ipv4Addr>,
}

/// A server's answer, with the options a lease uses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reply {
    pub kind: Option<MessageType>,
    pub xid: u32,
    pub yiaddr: Option<Ipv4Addr>,
    pub chaddr: [u8; 6],
    pub subnet_mask: Option<Ipv4Addr>,
    pub routers: Vec<Ipv4Addr>,
    pub dns: Vec<Ipv4Addr>,
    pub domain: Option<String>,
    pub lease_secs: Option<u32>,
    pub renewal_secs: Option<u32>,
    pub rebinding_secs: Option<u32>,
    pub server_id: Option<Ipv4Addr>,
    pub static_routes: Vec<StaticRoute>,
    pub classless_routes: Vec<StaticRoute>,
}

fn addrs(v: &[u8]) -> Vec<Ipv4Addr> {
    v.chunks_exact(4).map(|c| Ipv4Addr::new(c[0], c[1], c[2], c[3])).collect()
}

fn secs(v: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(v.try_into().ok()?))
}

/// The classful prefix of an option-33 destination (RFC 2132 5.8): A /8, B /16, C /24, else /32.
fn classful_prefix(dst: Ipv4Addr) -> u8 {
    match dst.octets()[0] {
        0..=127 => 8,
        128..=191 => 16,
        192..=223 => 24,
        _ => 32,
    }
}

/// Option 121 (RFC 3442): prefix length, the significant octets of the destination, the router.
fn classless_routes(mut v: &[u8]) -> Option<Vec<StaticRoute>> {
    let mut out = Vec::new();
    while let Some((&prefix, rest)) = v.split_first() {
        if prefix > 32 {
            return None;
        }
        let n = (prefix as usize).div_ceil(8);
        if rest.len() < n + 4 {
            return None;
        }
        let mut dst = [0u8; 4];
        dst[..n].copy_from_slice(&rest[..n]);
        let gw = Ipv4Addr::new(rest[n], rest[n + 1], rest[n + 2], rest[n + 3]);
        let mask = if prefix == 0 { 0 } else { u32::MAX << (32 - prefix) };
        out.push(StaticRoute {
            dst: Ipv4Addr::from(u32::from_be_bytes(dst) & mask),
            prefix,
            gw: (!gw.is_unspecified()).then_some(gw),
        });
        v = &rest[n + 4..];
    }
    Some(out)
}

impl Reply {
    /// Reads a BOOTREPLY; None for anything else or a malformed message.
    pub fn parse(b: &[u8]) -> Option<Reply> {
        if b.len() < HEADER_LEN || b[0] != 2 || b[236..240] != MAGIC {
            return None;
        }
        let mut r = Reply {
            xid: u32::from_be_bytes(b[4..8].try_into().ok()?),
            chaddr: b[28..34].try_into().ok()?,
            ..Reply::default()
        };
        let yiaddr = Ipv4Addr::new(b[16], b[17], b[18], b[19]);
        r.yiaddr = (!yiaddr.is_unspecified()).then_some(yiaddr);
        // Options that appear more than once are concatenated (RFC 3396) before they are read.
        let mut values: Vec<(u8, Vec<u8>)> = Vec::new();
        let mut i = HEADER_LEN;
        while i < b.len() {
            let code = b[i];
            match code {
                opt::PAD => {
                    i += 1;
                    continue;
                }
                opt::END => break,
                _ => {}
            }
            let len = *b.get(i + 1)? as usize;
            let value = b.get(i + 2..i + 2 + len)?;
            match values.iter_mut().find(|(c, _)| *c == code) {
                Some((_, v)) => v.extend_from_slice(value),
                None => values.push((code, value.to_vec())),
            }
            i += 2 + len;
        }
        for (code, v) in &values {
            match *code {
                opt::MESSAGE_TYPE => r.kind = v.first().copied().and_then(MessageType::from_u8),
                opt::SUBNET_MASK => r.subnet_mask = addrs(v).first().copied(),
                opt::ROUTER => r.routers = addrs(v),
                opt::DNS => r.dns = addrs(v),
                opt::DOMAIN_NAME => {
                    let name = String::from_utf8_lossy(v).trim_end_matches('\0').to_string();
                    r.domain = (!name.is_empty()).then_some(name);
                }
                opt::LEASE_TIME => r.lease_secs = secs(v),
                opt::RENEWAL_TIME => r.renewal_secs = secs(v),
                opt::REBINDING_TIME => r.rebinding_secs = secs(v),
                opt::SERVER_ID => r.server_id = addrs(v).first().copied(),
                opt::STATIC_ROUTES => {
                    r.static_routes = v
                        .chunks_exact(8)
                        .map(|c| {
                            let dst = Ipv4Addr::new(c[0], c[1], c[2], c[3]);
                            StaticRoute {
                                dst,
                                prefix: classful_prefix(dst),
                                gw: Some(Ipv4Addr::new(c[4], c[5], c[6], c[7])),
                            }
                        })
                        .collect()
                }
                opt::CLASSLESS_ROUTES => r.classless_routes = classless_routes(v).unwrap_or_default(),
                _ => {}
            }
        }
        Some(r)
    }
}

/// The DHCP payload of an IPv4 packet (as an AF_PACKET SOCK_DGRAM socket delivers it) addressed to
/// the client port; None for anything else.
pub fn udp_payload_to_client(ip: &[u8]) -> Option<&[u8]> {
    let first = *ip.first()?;
    if first >> 4 != 4 || ip.get(9) != Some(&17) {
        return None;
    }
    let ihl = (first & 0x0f) as usize * 4;
    let total = (u16::from_be_bytes([*ip.get(2)?, *ip.get(3)?]) as usize).min(ip.len());
    let udp = ip.get(ihl..total)?;
    if udp.len() < 8 || u16::from_be_bytes([udp[2], udp[3]]) != CLIENT_PORT {
        return None;
    }
    let len = (u16::from_be_bytes([udp[4], udp[5]]) as usize).clamp(8, udp.len());
    Some(&udp[8..len])
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn reply_with(options: &[u8]) -> Vec<u8> {
        let mut b = vec![0u8; HEADER_LEN];
        b[0] = 2;
        b[4..8].copy_from_slice(&0x1234_5678u32.to_be_bytes());
        b[16..20].copy_from_slice(&[10, 0, 0, 7]);
        b[236..240].copy_from_slice(&MAGIC);
        b.extend_from_slice(options);
        b.push(opt::END);
        b
    }

    #[test]
    fn encodes_a_discover_with_flag_cookie_and_padding() {
        let m = Outgoing {
            kind: MessageType::Discover,
            xid: 7,
            mac: [2, 0, 0, 0, 0, 1],
            broadcast: true,
            ciaddr: Ipv4Addr::UNSPECIFIED,
            options: vec![(opt::CLIENT_ID, b"\0abc".to_vec()), (opt::PARAMETER_LIST, vec![1, 3])],
        };
        let b = m.encode();
        assert_eq!(b.len(), MIN_LEN);
        assert_eq!(&b[..4], &[1, 1, 6, 0]);
        assert_eq!(&b[4..8], &7u32.to_be_bytes());
        assert_eq!(b[10], 0x80);
        assert_eq!(&b[28..34], &[2, 0, 0, 0, 0, 1]);
        assert_eq!(&b[236..240], &MAGIC);
        assert_eq!(&b[240..243], &[53, 1, 1]);
        assert_eq!(&b[243..249], &[61, 4, 0, b'a', b'b', b'c']);
        assert_eq!(&b[249..253], &[55, 2, 1, 3]);
        assert_eq!(b[253], 255);
    }

    #[test]
    fn splits_long_options() {
        let m = Outgoing {
            kind: MessageType::Request,
            xid: 1,
            mac: [0; 6],
            broadcast: false,
            ciaddr: Ipv4Addr::UNSPECIFIED,
            options: vec![(opt::HOST_NAME, vec![b'x'; 300])],
        };
        let b = m.encode();
        assert_eq!(&b[243..245], &[12, 255]);
        assert_eq!(&b[500..502], &[12, 45]);
    }

    #[test]
    fn parses_an_ack_with_every_option_a_lease_uses() {
        let b = reply_with(&[
            53, 1, 5, 1, 4, 255, 255, 255, 0, 3, 8, 10, 0, 0, 1, 10, 0, 0, 2, 6, 4, 10, 0, 0, 53, 15, 5, b'l', b'o',
            b'c', b'a', b'l', 51, 4, 0, 0, 0, 60, 58, 4, 0, 0, 0, 30, 59, 4, 0, 0, 0, 50, 54, 4, 10, 0, 0, 1, 33, 8,
            172, 16, 0, 0, 10, 0, 0, 9, 121, 13, 24, 192, 168, 5, 10, 0, 0, 254, 0, 10, 0, 0, 1,
        ]);
        let r = Reply::parse(&b).unwrap();
        assert_eq!(r.kind, Some(MessageType::Ack));
        assert_eq!(r.xid, 0x1234_5678);
        assert_eq!(r.yiaddr, Some(Ipv4Addr::new(10, 0, 0, 7)));
        assert_eq!(r.subnet_mask, Some(Ipv4Addr::new(255, 255, 255, 0)));
        assert_eq!(r.routers, vec![Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2)]);
        assert_eq!(r.dns, vec![Ipv4Addr::new(10, 0, 0, 53)]);
        assert_eq!(r.domain.as_deref(), Some("local"));
        assert_eq!((r.lease_secs, r.renewal_secs, r.rebinding_secs), (Some(60), Some(30), Some(50)));
        assert_eq!(r.server_id, Some(Ipv4Addr::new(10, 0, 0, 1)));
        assert_eq!(
            r.static_routes,
            vec![StaticRoute { dst: Ipv4Addr::new(172, 16, 0, 0), prefix: 16, gw: Some(Ipv4Addr::new(10, 0, 0, 9)) }]
        );
        assert_eq!(
            r.classless_routes,
            vec![
                StaticRoute { dst: Ipv4Addr::new(192, 168, 5, 0), prefix: 24, gw: Some(Ipv4Addr::new(10, 0, 0, 254)) },
                StaticRoute { dst: Ipv4Addr::UNSPECIFIED, prefix: 0, gw: Some(Ipv4Addr::new(10, 0, 0, 1)) },
            ]
        );
    }

    #[test]
    fn classless_route_with_router_zero_is_on_link_and_bad_lengths_are_dropped() {
        assert_eq!(
            classless_routes(&[32, 10, 1, 2, 3, 0, 0, 0, 0]).unwrap(),
            vec![StaticRoute { dst: Ipv4Addr::new(10, 1, 2, 3), prefix: 32, gw: None }]
        );
        assert!(classless_routes(&[33, 0, 0, 0, 0]).is_none());
        assert!(classless_routes(&[24, 10, 1]).is_none());
        let r = Reply::parse(&reply_with(&[53, 1, 5, 121, 3, 24, 10, 1])).unwrap();
        assert!(r.classless_routes.is_empty());
    }

    #[test]
    fn refuses_requests_short_messages_and_truncated_options() {
        let mut b = reply_with(&[53, 1, 2]);
        assert!(Reply::parse(&b[..100]).is_none());
        b[0] = 1;
        assert!(Reply::parse(&b).is_none());
        let mut t = reply_with(&[]);
        t.pop();
        t.extend_from_slice(&[1, 4, 255]);
        assert!(Reply::parse(&t).is_none());
    }

    #[test]
    fn finds_the_dhcp_payload_in_an_ip_packet() {
        let payload = [9u8, 8, 7];
        let mut ip = vec![0x45, 0, 0, 0, 0, 0, 0, 0, 64, 17, 0, 0, 10, 0, 0, 1, 255, 255, 255, 255];
        ip.extend_from_slice(&[0, 67, 0, 68, 0, 11, 0, 0]);
        ip.extend_from_slice(&payload);
        let total = ip.len() as u16;
        ip[2..4].copy_from_slice(&total.to_be_bytes());
        assert_eq!(udp_payload_to_client(&ip), Some(&payload[..]));
        ip[23] = 69;
        assert_eq!(udp_payload_to_client(&ip), None);
        ip[23] = 68;
        ip[9] = 6;
        assert_eq!(udp_payload_to_client(&ip), None);
    }
}

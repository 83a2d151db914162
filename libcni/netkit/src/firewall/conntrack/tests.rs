#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::*;

const CTA_TUPLE_REPLY: u16 = 2;
const CTA_TUPLE_IP: u16 = 1;
const CTA_PROTO_SRC_PORT: u16 = 2;
const CTA_STATUS: u16 = 3;

fn nested(ty: u16, parts: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    put(&mut out, ty | NLA_F_NESTED, &parts.concat());
    out
}

fn attr(ty: u16, value: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    put(&mut out, ty, value);
    out
}

fn tuple(ty: u16, proto: u8, sport: u16, dport: u16) -> Vec<u8> {
    let ip = nested(CTA_TUPLE_IP, &[attr(1, &[10, 0, 0, 1]), attr(2, &[10, 0, 0, 2])]);
    let proto = nested(
        CTA_TUPLE_PROTO,
        &[
            attr(CTA_PROTO_NUM, &[proto]),
            attr(CTA_PROTO_SRC_PORT, &sport.to_be_bytes()),
            attr(CTA_PROTO_DST_PORT, &dport.to_be_bytes()),
        ],
    );
    nested(ty, &[ip, proto])
}

/// An entry's attributes as a dump lists them.
fn entry(proto: u8, sport: u16, dport: u16, zone: Option<u16>) -> Vec<u8> {
    let mut parts = vec![
        tuple(CTA_TUPLE_ORIG, proto, sport, dport),
        tuple(CTA_TUPLE_REPLY, proto, dport, sport),
        attr(CTA_STATUS, &8u32.to_be_bytes()),
    ];
    if let Some(z) = zone {
        parts.push(attr(CTA_ZONE, &z.to_be_bytes()));
    }
    parts.push(attr(CTA_ID, &0xdead_beef_u32.to_be_bytes()));
    parts.concat()
}

#[test]
fn selects_by_protocol_and_original_destination_port() {
    let f = Filter::udp_to_port(5300, Family::V4);
    assert!(f.select(&entry(UDP, 40000, 5300, None)).is_some());
    assert!(f.select(&entry(UDP, 40000, 5301, None)).is_none(), "another port");
    assert!(f.select(&entry(6, 40000, 5300, None)).is_none(), "TCP");
    assert!(f.select(&entry(UDP, 5300, 40000, None)).is_none(), "the port as the source (the reply's destination)");
    assert!(f.select(&[]).is_none(), "no tuple");
}

#[test]
fn a_delete_names_the_entry_by_original_tuple_zone_and_id() {
    let f = Filter::udp_to_port(5300, Family::V4);
    let key = f.select(&entry(UDP, 40000, 5300, Some(7))).unwrap();
    let want = [
        tuple(CTA_TUPLE_ORIG, UDP, 40000, 5300),
        attr(CTA_ZONE, &7u16.to_be_bytes()),
        attr(CTA_ID, &0xdead_beef_u32.to_be_bytes()),
    ]
    .concat();
    assert_eq!(key, want);
    let key = f.select(&entry(UDP, 40000, 5300, None)).unwrap();
    assert_eq!(key, [tuple(CTA_TUPLE_ORIG, UDP, 40000, 5300), attr(CTA_ID, &0xdead_beef_u32.to_be_bytes())].concat());
}

#[test]
fn messages_carry_the_family_and_ask_for_what_they_need() {
    let m = message(ctnl(IPCTNL_MSG_CT_DELETE), NLM_F_REQUEST | NLM_F_ACK, 9, AF_INET6, &[1, 2, 3, 4]);
    assert_eq!(u32::from_ne_bytes(m[0..4].try_into().unwrap()) as usize, m.len());
    assert_eq!(u16::from_ne_bytes([m[4], m[5]]), 0x0102);
    assert_eq!(u16::from_ne_bytes([m[6], m[7]]), NLM_F_REQUEST | NLM_F_ACK);
    assert_eq!(u32::from_ne_bytes(m[8..12].try_into().unwrap()), 9);
    assert_eq!(&m[16..20], &[libc::AF_INET6 as u8, 0, 0, 0]);
    assert_eq!(&m[20..], &[1, 2, 3, 4]);
    assert_eq!(ctnl(IPCTNL_MSG_CT_GET), 0x0101);
}

//! The request/answer exchange against a fake kernel: the test holds the other end of a datagram
//! socket pair, queues the kernel's answers before the call and reads the request it sent. No root.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::*;
use crate::nlsock::{Exchange, DUMP_ATTEMPTS, RECV_BUF};
use netlink_packet_core::{DefaultNla, Emitable, NLMSG_DONE, NLMSG_ERROR};
use netlink_packet_core::{NLM_F_DUMP_INTR, NLM_F_MULTIPART};
use netlink_packet_route::link::{LinkAttribute, LinkMessage};
use std::os::unix::net::UnixDatagram;

const RTM_NEWLINK: u16 = 16;
const RTM_GETLINK: u16 = 18;

fn pair() -> (Netlink, UnixDatagram) {
    let (ours, kernel) = UnixDatagram::pair().unwrap();
    // A read that would wait for an answer never sent fails the test instead of hanging it.
    ours.set_read_timeout(Some(std::time::Duration::from_secs(2))).unwrap();
    (Netlink::over(Exchange::from_fd(std::os::fd::OwnedFd::from(ours))), kernel)
}

/// One netlink message, padded to 4 bytes as the kernel lays them out in a datagram.
fn raw(ty: u16, flags: u16, seq: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(16 + payload.len() as u32).to_ne_bytes());
    out.extend_from_slice(&ty.to_ne_bytes());
    out.extend_from_slice(&flags.to_ne_bytes());
    out.extend_from_slice(&seq.to_ne_bytes());
    out.extend_from_slice(&0u32.to_ne_bytes());
    out.extend_from_slice(payload);
    out.resize(out.len().next_multiple_of(4), 0);
    out
}

fn link(index: u32, name: &str, extra: Option<LinkAttribute>) -> Vec<u8> {
    let mut m = LinkMessage::default();
    m.header.index = index;
    m.attributes.push(LinkAttribute::IfName(name.into()));
    m.attributes.extend(extra);
    let mut buf = vec![0; m.buffer_len()];
    m.emit(&mut buf);
    buf
}

/// An NLMSG_ERROR payload: the negated errno (0: an ack) and the request's header.
fn error(errno: i32) -> Vec<u8> {
    let mut p = (-errno).to_ne_bytes().to_vec();
    p.extend_from_slice(&[0; 16]);
    p
}

/// The request the plugin sent: (type, flags, sequence number).
fn request(kernel: &UnixDatagram) -> (u16, u16, u32) {
    let mut buf = [0u8; 4096];
    let n = kernel.recv(&mut buf).unwrap();
    assert!(n >= 16);
    let ty = u16::from_ne_bytes([buf[4], buf[5]]);
    let flags = u16::from_ne_bytes([buf[6], buf[7]]);
    (ty, flags, u32::from_ne_bytes([buf[8], buf[9], buf[10], buf[11]]))
}

#[test]
fn a_get_reads_its_own_answer_past_stale_ones() {
    let (nl, kernel) = pair();
    // An answer to an earlier request (another sequence number) comes first and is not ours.
    kernel.send(&raw(NLMSG_ERROR, 0, 7, &error(libc::EEXIST))).unwrap();
    kernel.send(&raw(RTM_NEWLINK, 0, 1, &link(4, "eth0", None))).unwrap();
    let got = nl.link_by_index(4).unwrap().unwrap();
    assert_eq!((got.index, got.name.as_str()), (4, "eth0"));
    assert_eq!(request(&kernel), (RTM_GETLINK, NLM_F_REQUEST, 1));
    // The next request has the next sequence number; the kernel's ENODEV is "no such link".
    kernel.send(&raw(NLMSG_ERROR, 0, 2, &error(libc::ENODEV))).unwrap();
    assert!(nl.link_by_index(9).unwrap().is_none());
    assert_eq!(request(&kernel).2, 2);
}

#[test]
fn a_single_answer_larger_than_the_buffer_is_read_whole() {
    let (nl, kernel) = pair();
    let big = LinkAttribute::Other(DefaultNla::new(0x7fff, vec![0xab; 60_000]));
    let answer = raw(RTM_NEWLINK, 0, 1, &link(5, "vf-parent", Some(big)));
    assert!(answer.len() > RECV_BUF);
    kernel.send(&answer).unwrap();
    assert_eq!(nl.link_by_index(5).unwrap().unwrap().name, "vf-parent");
}

#[test]
fn a_dump_spans_datagrams_and_skips_what_does_not_decode() {
    let (nl, kernel) = pair();
    let multi = NLM_F_MULTIPART;
    let mut first = raw(RTM_NEWLINK, multi, 1, &link(1, "lo", None));
    first.extend(raw(RTM_NEWLINK, multi, 1, &link(2, "eth0", None)));
    kernel.send(&first).unwrap();
    // A link message too short for its header does not decode; the rest of the datagram does.
    let mut second = raw(RTM_NEWLINK, multi, 1, &[0; 4]);
    second.extend(raw(RTM_NEWLINK, multi, 1, &link(3, "eth1", None)));
    kernel.send(&second).unwrap();
    kernel.send(&raw(NLMSG_DONE, multi, 1, &0i32.to_ne_bytes())).unwrap();
    let names: Vec<String> = nl.links().unwrap().into_iter().map(|l| l.name).collect();
    assert_eq!(names, ["lo", "eth0", "eth1"]);
    assert_eq!(request(&kernel), (RTM_GETLINK, NLM_F_REQUEST | NLM_F_DUMP, 1));
}

/// A dump the kernel flags as interrupted is read to its end and asked again, with a new sequence
/// number; one that stays interrupted fails after DUMP_ATTEMPTS; a DONE with an error is its errno.
#[test]
fn an_interrupted_dump_is_asked_again_and_a_done_error_is_its_errno() {
    let (nl, kernel) = pair();
    let interrupted = |seq: u32| {
        let mut d = raw(RTM_NEWLINK, NLM_F_MULTIPART | NLM_F_DUMP_INTR, seq, &link(1, "lo", None));
        d.extend(raw(NLMSG_DONE, NLM_F_MULTIPART, seq, &0i32.to_ne_bytes()));
        d
    };
    kernel.send(&interrupted(1)).unwrap();
    let mut second = raw(RTM_NEWLINK, NLM_F_MULTIPART, 2, &link(1, "lo", None));
    second.extend(raw(RTM_NEWLINK, NLM_F_MULTIPART, 2, &link(2, "eth0", None)));
    second.extend(raw(NLMSG_DONE, NLM_F_MULTIPART, 2, &0i32.to_ne_bytes()));
    kernel.send(&second).unwrap();
    let names: Vec<String> = nl.links().unwrap().into_iter().map(|l| l.name).collect();
    assert_eq!(names, ["lo", "eth0"]);
    assert_eq!((request(&kernel).2, request(&kernel).2), (1, 2));

    for seq in 3..3 + DUMP_ATTEMPTS as u32 {
        kernel.send(&interrupted(seq)).unwrap();
    }
    let e = nl.links().unwrap_err();
    assert_eq!(crate::errno(&e), Some(libc::EINTR));
    assert!(e.msg.contains(&format!("dump interrupted {DUMP_ATTEMPTS} times")), "{}", e.msg);
    for _ in 0..DUMP_ATTEMPTS {
        request(&kernel);
    }

    let seq = 3 + DUMP_ATTEMPTS as u32;
    kernel.send(&raw(NLMSG_DONE, NLM_F_MULTIPART, seq, &(-libc::EBUSY).to_ne_bytes())).unwrap();
    assert_eq!(crate::errno(&nl.links().unwrap_err()), Some(libc::EBUSY));
}

/// Only answers addressed to our port count (the test's socket has port 0), and a refusal carries
/// the kernel's own text (extended ack) into the error.
#[test]
fn a_refusal_carries_the_kernels_text_and_other_ports_are_not_ours() {
    let (nl, kernel) = pair();
    let mut to_other_port = raw(NLMSG_ERROR, 0, 1, &error(libc::EPERM));
    to_other_port[12..16].copy_from_slice(&4242u32.to_ne_bytes());
    kernel.send(&to_other_port).unwrap();
    // NLM_F_CAPPED | NLM_F_ACK_TLVS: the request's header only, then NLMSGERR_ATTR_MSG.
    let mut refusal = error(libc::EOPNOTSUPP);
    let text = b"Unknown device type\0";
    refusal.extend_from_slice(&(4 + text.len() as u16).to_ne_bytes());
    refusal.extend_from_slice(&1u16.to_ne_bytes());
    refusal.extend_from_slice(text);
    kernel.send(&raw(NLMSG_ERROR, 0x300, 1, &refusal)).unwrap();
    // The error names the link: its description asks the kernel.
    kernel.send(&raw(RTM_NEWLINK, 0, 2, &link(3, "eth3", None))).unwrap();
    let e = nl.run(Netlink::set_up_op(3)).unwrap_err();
    assert_eq!(crate::errno(&e), Some(libc::EOPNOTSUPP));
    assert!(e.msg.contains("eth3 (index 3) (Unknown device type): Operation not supported"), "{}", e.msg);
}

#[test]
fn an_ack_waits_for_the_kernels_verdict() {
    let (nl, kernel) = pair();
    let set = || RouteNetlinkMessage::SetLink(LinkMessage::default());
    kernel.send(&raw(NLMSG_ERROR, 0, 1, &error(0))).unwrap();
    nl.ack(set(), 0).unwrap();
    assert_eq!(request(&kernel).1, NLM_F_REQUEST | NLM_F_ACK);
    kernel.send(&raw(NLMSG_ERROR, 0, 2, &error(libc::EPERM))).unwrap();
    assert_eq!(nl.ack(set(), 0).unwrap_err().errno(), Some(libc::EPERM));
}

#[test]
fn a_batch_is_one_datagram_and_each_request_gets_its_own_outcome() {
    let (nl, kernel) = pair();
    // The answers of a batch in any grouping, a stale one among them; the second request failed.
    let mut answers = raw(NLMSG_ERROR, 0, 1, &error(0));
    answers.extend(raw(NLMSG_ERROR, 0, 9, &error(libc::EEXIST)));
    answers.extend(raw(NLMSG_ERROR, 0, 2, &error(libc::ENETUNREACH)));
    kernel.send(&answers).unwrap();
    kernel.send(&raw(NLMSG_ERROR, 0, 3, &error(0))).unwrap();
    // The error message names its link: the failed request's description asks the kernel.
    kernel.send(&raw(RTM_NEWLINK, 0, 4, &link(7, "eth0", None))).unwrap();
    let net: ipnetwork::IpNetwork = "10.1.2.3/24".parse().unwrap();
    let route = RouteSpec::default_via("10.1.2.1".parse().unwrap());
    let ops = vec![Netlink::set_up_op(7), Netlink::add_address_op(7, net, false), Netlink::add_route_op(&route)];
    let outcomes = nl.batch(ops).unwrap();
    assert!(outcomes[0].is_ok() && outcomes[2].is_ok(), "{outcomes:?}");
    let failed = outcomes[1].as_ref().unwrap_err();
    assert_eq!(crate::errno(failed), Some(libc::ENETUNREACH));
    assert!(failed.msg.contains("add address 10.1.2.3/24 to eth0 (index 7)"), "{}", failed.msg);
    // All three requests went in the first datagram, in order, each asking for an acknowledgement.
    let mut buf = [0u8; 4096];
    let n = kernel.recv(&mut buf).unwrap();
    let mut seqs = Vec::new();
    let mut rest = &buf[..n];
    while rest.len() >= 16 {
        let len = u32::from_ne_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        assert_ne!(u16::from_ne_bytes([rest[6], rest[7]]) & NLM_F_ACK, 0);
        seqs.push(u32::from_ne_bytes([rest[8], rest[9], rest[10], rest[11]]));
        rest = &rest[len.next_multiple_of(4)..];
    }
    assert_eq!(seqs, [1, 2, 3]);
    // Then the description's GET.
    assert_eq!(request(&kernel), (RTM_GETLINK, NLM_F_REQUEST, 4));
}

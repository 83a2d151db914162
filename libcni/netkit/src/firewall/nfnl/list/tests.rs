//! GETs and dumps: answers matched to their request, refusals, and listings read as nft lists them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::*;
use crate::firewall::nfnl::tests::*;
use std::time::Duration;

/// A kernel's refusal keeps its errno as data (not only as the "(os error N)" of its text),
/// through `context` too: read from an NLMSG_ERROR fed through a socket pair, no root needed.
#[test]
fn a_refusal_keeps_its_errno_as_data() {
    let (ours, kernel) = std::os::unix::net::UnixDatagram::pair().unwrap();
    let nl = Exchange::from_fd(std::os::fd::OwnedFd::from(ours));
    let mut answer = Vec::new();
    nlmsg(&mut answer, NLMSG_ERROR, 0, 1, (-libc::EEXIST).to_ne_bytes(), &[0; NLMSG_HDRLEN]);
    kernel.send(&answer).unwrap();
    let e = get_on(&nl, TableFamily::Inet, NFT_MSG_NEWTABLE, false, &Attrs::default(), "add table inet t").unwrap_err();
    assert_eq!(e.msg, "nft add table inet t: File exists (os error 17)");
    assert_eq!(e.errno, Some(libc::EEXIST));
    assert!(crate::is_exists(&e.context("ADD")));
    // A message of a batch the kernel refused, as `send` reports it.
    let mut b = Batch::new();
    b.add_table(TableFamily::Inet, "t");
    let e = b.failed(Some(0), libc::ENOENT, Some("no such table".into()));
    assert_eq!(e.msg, "nft add table inet t (no such table): No such file or directory (os error 2)");
    assert!(crate::is_not_found(&e) && !crate::is_exists(&e), "{e:?}");
}

/// A GET reads the answer with its own sequence number and port: a stale refusal (another
/// sequence number) and one to another port are skipped. No root: a socket pair plays the kernel.
#[test]
fn a_get_skips_answers_that_are_not_its_own() {
    let (ours, kernel) = std::os::unix::net::UnixDatagram::pair().unwrap();
    ours.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let nl = Exchange::from_fd(std::os::fd::OwnedFd::from(ours));
    let mut answers = Vec::new();
    nlmsg(&mut answers, NLMSG_ERROR, 0, 7, (-libc::ENOENT).to_ne_bytes(), &[0; NLMSG_HDRLEN]);
    nlmsg(&mut answers, NLMSG_ERROR, 0, 1, (-libc::EPERM).to_ne_bytes(), &[0; NLMSG_HDRLEN]);
    answers[16 + 20 + 12..16 + 20 + 16].copy_from_slice(&99u32.to_ne_bytes());
    let mut gen = Attrs::default();
    gen.u32(1, 42);
    nlmsg(&mut answers, (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWGEN, 0, 1, [0; 4], &gen.buf);
    kernel.send(&answers).unwrap();
    let got = get_on(&nl, TableFamily::Inet, NFT_MSG_GETGEN, false, &Attrs::default(), "get generation").unwrap();
    let got = got.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].0, NFT_MSG_NEWGEN);
    assert_eq!(got[0].1, gen.buf);
}

/// list_chain reads what nft lists: each rule's comment (or none), base chain or not, and None
/// for an absent chain or table.
#[test]
fn list_chain_reads_rule_comments() {
    require_root_and_nft();
    in_netns(|| {
        let (f, t, _cleanup) = inet_table();
        assert_eq!(Conn::new().list_chain(f, &t, "c").unwrap(), None);
        let text = r#"
add table inet {T}
add chain inet {T} base { type nat hook postrouting priority 100; policy accept; }
add chain inet {T} c { comment "cni-rs masquerade"; }
add chain inet {T} empty
add rule inet {T} c ip saddr 10.0.0.1 masquerade comment "masq4=10.0.0.1"
add rule inet {T} c ip saddr 10.0.0.2 masquerade
add rule inet {T} c meta nfproto ipv4 tcp dport 8080 dnat ip to 10.0.0.3:80 comment "anyports4=tcp . 8080;snat4=10.0.0.3"
add rule inet {T} base ip saddr 10.0.0.1 masquerade comment "x"
"#;
        nft(&["-f", "-"], Some(&text.replace("{T}", &t)));
        let c = Conn::new().list_chain(f, &t, "c").unwrap().unwrap();
        assert!(!c.base);
        assert_eq!(
            c.comments,
            vec![Some("masq4=10.0.0.1".to_string()), None, Some("anyports4=tcp . 8080;snat4=10.0.0.3".to_string())]
        );
        assert_eq!(
            Conn::new().list_chain(f, &t, "empty").unwrap(),
            Some(ChainListing { base: false, comments: vec![], rules: vec![] })
        );
        let base = Conn::new().list_chain(f, &t, "base").unwrap().unwrap();
        assert!(base.base);
        assert_eq!(base.comments, vec![Some("x".to_string())]);
        assert_eq!(Conn::new().list_chain(f, &t, "nosuch").unwrap(), None);
        assert_eq!(Conn::new().list_chain(TableFamily::Bridge, &t, "c").unwrap(), None);
        // A comment written by a batch reads back the same; many rules take several messages.
        let mut b = Batch::new();
        for i in 0..300u32 {
            let rule = Rule::new(f).saddr(IpAddr::V4(i.into())).masquerade();
            b.add_rule_with_comment(f, &t, "empty", rule, Some(&format!("masq4={}", std::net::Ipv4Addr::from(i))));
        }
        b.send().unwrap();
        let many = Conn::new().list_chain(f, &t, "empty").unwrap().unwrap();
        assert_eq!(many.comments.len(), 300);
        assert_eq!(many.comments[299].as_deref(), Some("masq4=0.0.1.43"));
    });
}

/// get_elements reads one element (data, comment, expiry) or dumps them all; nothing there is
/// empty; an expiry given to an existing element makes it go away by itself.
#[test]
fn get_elements_reads_data_comments_and_expiry() {
    require_root_and_nft();
    in_netns(|| {
        use KeyPart::{Addr, Port, Proto};
        let (f, t, _cleanup) = inet_table();
        let key = vec![Proto(TCP), Port(8080)];
        assert_eq!(Conn::new().get_elements(f, &t, "dnat4", Some(&key)).unwrap(), vec![]);
        let mut b = Batch::new();
        b.add_table(f, &t);
        b.add_set(
            f,
            &t,
            "dnat4",
            SetSpec {
                key: &[KeyType::InetProto, KeyType::InetService],
                data: SetData::Value(&[KeyType::Ipv4Addr, KeyType::InetService]),
                timeout: true,
            },
            false,
        );
        let mut e = Elem::new(key.clone(), ElemData::Value(vec![Addr(ip("10.0.0.5")), Port(80)]));
        e.comment = Some("owner".into());
        let many: Vec<Elem> = (1..=300u16)
            .map(|p| Elem::new(vec![Proto(UDP), Port(p)], ElemData::Value(vec![Addr(ip("10.0.0.6")), Port(p)])))
            .collect();
        b.add_elems(f, &t, "dnat4", &[e.clone()], false);
        b.add_elems(f, &t, "dnat4", &many, false);
        b.send().unwrap();
        let got = Conn::new().get_elements(f, &t, "dnat4", Some(&key)).unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].key, vec![6, 0, 0, 0, 0x1f, 0x90, 0, 0]);
        assert_eq!(got[0].data, Some(vec![10, 0, 0, 5, 0, 80, 0, 0]));
        assert_eq!(got[0].comment.as_deref(), Some("owner"));
        assert_eq!(got[0].expires_ms, None);
        assert_eq!(Conn::new().get_elements(f, &t, "dnat4", None).unwrap().len(), 301);
        assert_eq!(Conn::new().get_elements(f, &t, "dnat4", Some(&[Proto(TCP), Port(1)])).unwrap(), vec![]);
        assert_eq!(Conn::new().get_elements(f, &t, "nosuch", Some(&key)).unwrap(), vec![]);
        // Re-adding it with an expiry (same data) makes it expire: gone without a delete.
        e.expires_ms = Some(50);
        let mut b = Batch::new();
        b.add_elems(f, &t, "dnat4", &[e.clone()], false);
        b.send().unwrap();
        let soon = Conn::new().get_elements(f, &t, "dnat4", Some(&key)).unwrap();
        assert!(soon.is_empty() || soon[0].expires_ms.is_some_and(|ms| ms <= 50), "{soon:?}");
        std::thread::sleep(Duration::from_millis(80));
        assert_eq!(Conn::new().get_elements(f, &t, "dnat4", Some(&key)).unwrap(), vec![]);
        // Other data for the same key is a clash.
        let mut b = Batch::new();
        b.add_elems(
            f,
            &t,
            "dnat4",
            &[Elem::new(vec![Proto(UDP), Port(1)], ElemData::Value(vec![Addr(ip("10.0.0.7")), Port(1)]))],
            false,
        );
        let err = b.send().unwrap_err();
        assert_eq!(crate::errno(&err), Some(libc::EEXIST), "{err:?}");
    });
}

/// A rule's jump and xtables comment are read back from its expressions (as a listing holds
/// them), and a listed bitwise loses only the NFTA_BITWISE_OP of a plain mask-and-xor.
#[test]
fn a_rules_jump_comment_and_bitwise_are_read_from_its_expressions() {
    let comment = |c: &str| Expr::Match { name: "comment", rev: 0, info: c.bytes().chain([0; 8]).collect() };
    let r = Rule::new(TableFamily::Ip)
        .expr(comment("name: \"n\""))
        .expr(Expr::Counter)
        .verdict(Verdict::Jump("CNI-x".into()));
    assert_eq!(rule_jump(&r.encoded()).as_deref(), Some("CNI-x"));
    assert_eq!(rule_xt_comment(&r.encoded()).as_deref(), Some("name: \"n\""));
    let accept = Rule::new(TableFamily::Ip).verdict(Verdict::Accept);
    assert_eq!((rule_jump(&accept.encoded()), rule_xt_comment(&accept.encoded())), (None, None));

    let mask = Rule::new(TableFamily::Ip).daddr_not_in("224.0.0.0/4".parse().unwrap());
    let Some(Expr::Bitwise { .. }) = mask.exprs.get(1) else { panic!("no bitwise: {:?}", mask.exprs) };
    let mut e = Attrs::default();
    mask.exprs[1].put(&mut e);
    let listed_elem = |op: u32| {
        // The element as the kernel lists it: NFTA_BITWISE_OP after the length.
        let mut data = Attrs::default();
        let Expr::Bitwise { sreg, dreg, mask, xor } = &mask.exprs[1] else { unreachable!() };
        data.u32(1, sreg.0);
        data.u32(2, dreg.0);
        data.u32(3, mask.len() as u32);
        data.u32(6, op);
        data.nested(4, |a| a.bytes(NFTA_DATA_VALUE, mask));
        data.nested(5, |a| a.bytes(NFTA_DATA_VALUE, xor));
        let mut elem = Attrs::default();
        elem.str(NFTA_EXPR_NAME, "bitwise");
        elem.bytes(NFTA_EXPR_DATA, &unflag(&data.buf));
        elem.buf
    };
    let ours = attributes(&unflag(&e.buf)).next().unwrap().1.to_vec();
    assert_eq!(unflag(&bool_bitwise(&listed_elem(0))), ours);
    assert_ne!(unflag(&bool_bitwise(&listed_elem(1))), ours, "a shift is not a mask-and-xor");
}

//! The transaction against the kernel: all or nothing, every ack read, errors naming the message,
//! and the bytes nft sends.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::*;
use crate::firewall::nfnl::tests::*;

#[test]
fn a_failed_batch_applies_nothing() {
    require_root_and_nft();
    in_netns(|| {
        let (_, t, _cleanup) = inet_table();
        let mut b = Batch::new();
        build_flat(&mut b, &t);
        add_rule(&mut b, TableFamily::Inet, &t, "no-such-chain", Rule::new(TableFamily::Inet).masquerade());
        b.add_chain(TableFamily::Inet, &t, "after", None, None);
        let e = b.send().unwrap_err();
        assert_eq!(e.code, libcni::code::NETWORK);
        assert_eq!(
            e.msg,
            format!("nft add rule inet {t} no-such-chain: No such file or directory (os error 2)"),
            "{e:?}"
        );
        assert!(crate::is_not_found(&e));
        assert!(!table_exists(TableFamily::Inet, &t), "a failed batch left its table behind");
        // send_each tells which message failed: the rule after the table's batch.
        let failures = b.send_each().unwrap();
        assert_eq!(failures.len(), 1, "{failures:?}");
        assert_eq!((failures[0].index, failures[0].errno), (b.len() - 2, libc::ENOENT));
        assert_eq!(failures[0].error.msg, e.msg);
        assert!(!table_exists(TableFamily::Inet, &t));

        // The same batch without the bad rule applies whole.
        let mut b = Batch::new();
        build_flat(&mut b, &t);
        b.send().unwrap();
        assert!(table_exists(TableFamily::Inet, &t));
    });
}

#[test]
fn errors_name_the_object_and_keep_the_errno() {
    require_root_and_nft();
    in_netns(|| {
        let (f, t, _cleanup) = inet_table();
        let mut b = Batch::new();
        b.add_table(f, &t);
        b.add_chain(f, &t, "c", None, None);
        add_map(&mut b, f, &t, "m", &[KeyType::Ipv4Addr, KeyType::InetProto, KeyType::InetService]);
        let key = vec![KeyPart::Addr(ip("10.0.0.1")), KeyPart::Proto(TCP), KeyPart::Port(80)];
        add_elements(&mut b, f, &t, "m", &[(key.clone(), jump("c"))], true);
        b.send().unwrap();

        // add: the same element again is fine; create: EEXIST.
        let mut again = Batch::new();
        add_elements(&mut again, f, &t, "m", &[(key.clone(), jump("c"))], false);
        again.send().unwrap();
        let mut create = Batch::new();
        add_elements(&mut create, f, &t, "m", &[(key.clone(), jump("c"))], true);
        let e = create.send().unwrap_err();
        assert!(crate::is_exists(&e), "{e:?}");
        assert_eq!(
            e.msg,
            format!("nft create element inet {t} m {{ 10.0.0.1 . tcp . 80 }}: File exists (os error 17)")
        );

        // Deleting what is not there: ENOENT, naming the chain.
        let mut del = Batch::new();
        del.delete_chain(f, &t, "missing");
        let e = del.send().unwrap_err();
        assert_eq!(crate::errno(&e), Some(libc::ENOENT), "{e:?}");
        assert_eq!(e.msg, format!("nft delete chain inet {t} missing: No such file or directory (os error 2)"));
        let mut del = Batch::new();
        del.delete_elements(f, &t, "m", &[vec![KeyPart::Addr(ip("10.0.0.2")), KeyPart::Proto(TCP), KeyPart::Port(80)]]);
        assert!(crate::is_not_found(&del.send().unwrap_err()));

        // A chain in use cannot be deleted: the kernel says EBUSY, the message names it.
        let mut b = Batch::new();
        b.add_chain(f, &t, "user", None, None);
        add_rule(&mut b, f, &t, "user", Rule::new(f).verdict(jump("c")));
        b.send().unwrap();
        let mut del = Batch::new();
        del.delete_chain(f, &t, "c");
        let e = del.send().unwrap_err();
        assert_eq!(crate::errno(&e), Some(libc::EBUSY), "{e:?}");
        assert!(e.msg.starts_with(&format!("nft delete chain inet {t} c")), "{e:?}");
    });
}

#[test]
fn a_large_batch_loses_no_acks() {
    require_root_and_nft();
    in_netns(|| {
        let (f, t, _cleanup) = inet_table();
        let mut b = Batch::new();
        b.add_table(f, &t);
        add_map(&mut b, f, &t, "m", &[KeyType::Ipv4Addr]);
        let mut elems = Vec::new();
        for i in 0..1500u32 {
            let chain = format!("c{i}");
            b.add_chain(f, &t, &chain, None, None);
            add_rule(&mut b, f, &t, &chain, Rule::new(f).saddr(IpAddr::V4(i.into())).masquerade());
            elems.push((vec![KeyPart::Addr(IpAddr::V4((0x0a00_0000 + i).into()))], jump(&chain)));
        }
        add_elements(&mut b, f, &t, "m", &elems, false);
        assert!(b.len() > 3000);
        b.send().unwrap();
        let listed = nft(&["list", "map", "inet", &t, "m"], None);
        assert_eq!(listed.matches("jump c").count(), 1500);
    });
}

#[test]
fn encoding_matches_nft_bytes() {
    // `nft --debug=mnl add table inet zz_probe`: the NEWTABLE message after the batch begin.
    let mut b = Batch::new();
    b.add_table(TableFamily::Inet, "zz_probe");
    let bytes = b.encode(0).unwrap();
    let begin = &bytes[..20];
    assert_eq!(begin[..4], 20u32.to_ne_bytes());
    assert_eq!(begin[4..6], 0x10u16.to_ne_bytes());
    assert_eq!(begin[16..20], [0, 0, 0, 10]);
    let msg = &bytes[20..64];
    assert_eq!(msg[..4], 44u32.to_ne_bytes());
    assert_eq!(msg[4..6], 0x0a00u16.to_ne_bytes());
    assert_eq!(
        msg[16..],
        [
            1, 0, 0, 0, // nfgenmsg: NFPROTO_INET
            13, 0, 1, 0, b'z', b'z', b'_', b'p', b'r', b'o', b'b', b'e', 0, 0, 0, 0, // NFTA_TABLE_NAME
            8, 0, 2, 0, 0, 0, 0, 0, // NFTA_TABLE_FLAGS 0
        ]
    );
    assert_eq!(bytes.len(), 20 + 44 + 20);

    // `add rule ... fib daddr type local jump xdnat`: the expressions nft sent, attribute by attribute.
    let mut a = Attrs::default();
    for e in Rule::new(TableFamily::Inet).fib_daddr_local().verdict(jump("xdnat")).exprs {
        e.put(&mut a);
    }
    let mut want: Vec<u8> = Vec::new();
    let attr = |ty: u16, len: u16, out: &mut Vec<u8>| {
        out.extend_from_slice(&len.to_ne_bytes());
        out.extend_from_slice(&ty.to_ne_bytes());
    };
    // fib: name, data { FLAGS 2, RESULT 3, DREG 1 }
    attr(0x8001, 40, &mut want);
    attr(1, 8, &mut want);
    want.extend_from_slice(b"fib\0");
    attr(0x8002, 28, &mut want);
    for (ty, v) in [(3u16, 2u32), (2, 3), (1, 1)] {
        attr(ty, 8, &mut want);
        want.extend_from_slice(&v.to_be_bytes());
    }
    // cmp: name, data { SREG 1, OP eq, DATA { VALUE 02 00 00 00 } }
    attr(0x8001, 44, &mut want);
    attr(1, 8, &mut want);
    want.extend_from_slice(b"cmp\0");
    attr(0x8002, 32, &mut want);
    for (ty, v) in [(1u16, 1u32), (2, 0)] {
        attr(ty, 8, &mut want);
        want.extend_from_slice(&v.to_be_bytes());
    }
    attr(0x8003, 12, &mut want);
    attr(1, 8, &mut want);
    want.extend_from_slice(&2u32.to_ne_bytes());
    // immediate: name, data { DREG 0, DATA { VERDICT { CODE -3, CHAIN "xdnat" } } }
    attr(0x8001, 60, &mut want);
    attr(1, 14, &mut want);
    want.extend_from_slice(b"immediate\0\0\0");
    attr(0x8002, 40, &mut want);
    attr(1, 8, &mut want);
    want.extend_from_slice(&0u32.to_be_bytes());
    attr(0x8002, 28, &mut want);
    attr(0x8002, 24, &mut want);
    attr(1, 8, &mut want);
    want.extend_from_slice(&(-3i32).to_be_bytes());
    attr(2, 10, &mut want);
    want.extend_from_slice(b"xdnat\0\0\0");
    assert_eq!(a.buf, want);
}

#[test]
fn an_empty_batch_sends_nothing() {
    assert!(Batch::new().send().is_ok());
}

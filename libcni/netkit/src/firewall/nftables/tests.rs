//! The tables' setup as nft lists it, the localnet drop, the MAC spoof check, and the verbs that
//! must not need the `nft` binary. Privileged tests run on a thread of their own in a fresh network
//! namespace, so they touch nothing of the host's ruleset.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::super::exec::{self, run};
use super::super::PortMapping;
use super::*;
use crate::firewall::Protocol;

pub(crate) fn pm() -> PortMap {
    PortMap {
        network: "net1".into(),
        container_id: "c1".into(),
        ifname: "eth0".into(),
        mappings: vec![
            PortMapping { host_port: 8080, container_port: 80, protocol: Protocol::Tcp, host_ip: None },
            PortMapping {
                host_port: 5353,
                container_port: 53,
                protocol: Protocol::Udp,
                host_ip: Some("192.168.1.1".parse().unwrap()),
            },
        ],
        ipv4: Some("10.22.0.5/16".parse().unwrap()),
        ipv6: Some("fd00:22::5/64".parse().unwrap()),
        snat: true,
        masq_all: false,
        mark_masq_bit: 13,
        external_set_mark_chain: None,
        conditions_v4: vec!["ip saddr != 10.0.0.0/8".into()],
        conditions_v6: vec![],
    }
}

/// Privileged tests need root and nft: without them they fail (`cni_tests::require_root`), never
/// pass silently.
pub(crate) fn require_root_and_nft() {
    cni_tests::require_root();
    cni_tests::require_tools(&["nft"]);
}

/// Runs `f` on a thread of its own in a fresh network namespace (nft run from it inherits it).
pub(crate) fn in_netns<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(move || {
        // SAFETY: unshare(2) changes only this thread's network namespace.
        assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0);
        f()
    })
    .join()
    .unwrap_or_else(|p| std::panic::resume_unwind(p))
}

pub(crate) fn nft_ok(args: &[&str], stdin: Option<&str>) -> String {
    let out = run("nft", args, stdin).unwrap();
    assert!(out.success, "nft {args:?}: {}\n{}", out.stderr, stdin.unwrap_or_default());
    out.stdout
}

/// What netlink sets up lists, through nft, as the rules the module doc draws; sending it again
/// changes nothing.
#[test]
fn setup_lists_as_drawn() {
    require_root_and_nft();
    in_netns(|| {
        for t in [&PORTMAP, &MASQ, &MACSPOOF] {
            let mut b = Batch::new();
            t.setup(&mut b);
            b.send().unwrap();
        }
        let listed = |t: &Table| nft_ok(&["list", "table", t.fam.name(), t.name], None);
        let pm = listed(&PORTMAP);
        for rule in [
            "fib daddr type local jump dispatch",
            "ip daddr . meta l4proto . th dport vmap @hgate4",
            "meta nfproto ipv4 meta l4proto . th dport vmap @gate4",
            "meta nfproto ipv6 dnat ip6 to meta l4proto . th dport map @dnat6",
            "ip saddr 127.0.0.1 meta l4proto . th dport @sp4 meta mark set meta mark | 0x00002000",
            "ct status dnat meta mark & 0x00002000 == 0x00002000 masquerade",
            "ip daddr 127.0.0.0/8 ip saddr != 127.0.0.0/8 ct state ! established,related ct status ! dnat drop",
        ] {
            assert!(pm.contains(rule), "{rule} not in\n{pm}");
        }
        assert_eq!(pm.matches(" hook ").count(), 4, "{pm}");
        let masq = listed(&MASQ);
        assert!(masq.contains("ip6 saddr @pods6 ip6 daddr != ff00::/8 masquerade"), "{masq}");
        let ms = listed(&MACSPOOF);
        assert!(ms.contains("type ifname . ether_addr"), "{ms}");
        assert!(ms.contains("iifname @port_owner iifname . ether saddr != @macs drop"), "{ms}");
        let mut again = Batch::new();
        PORTMAP.setup(&mut again);
        again.send().unwrap();
        assert_eq!(listed(&PORTMAP), pm);
    });
}

/// A table whose drop of packets to 127.0.0.0/8 went missing gets it back from the next ADD that
/// has portmap turn route_localnet on (snat, IPv4); an ADD without snat leaves it as it is, and
/// CHECK of an attachment that relies on it reports it.
#[test]
fn add_puts_the_localnet_drop_back() {
    require_root_and_nft();
    in_netns(|| {
        let rules = || {
            nfnl::Conn::new()
                .list_chain(PORTMAP.fam, PORTMAP.name, LOCALNET_CHAIN)
                .unwrap()
                .map(|c| (c.base, c.comments.len()))
        };
        let plain = PortMap { conditions_v4: vec![], snat: false, ..pm() };
        NftablesBackend.add_portmap(&plain).unwrap();
        assert_eq!(rules(), Some((true, 2)), "a new table has the drop");
        nft_ok(&["delete", "chain", "inet", PORTMAP_TABLE, LOCALNET_CHAIN], None);
        let port = |host_port| vec![PortMapping { host_port, ..plain.mappings[0] }];
        let other = PortMap { container_id: "c2".into(), mappings: port(9090), ..plain.clone() };
        NftablesBackend.add_portmap(&other).unwrap();
        assert_eq!(rules(), None);
        let snat = PortMap { container_id: "c3".into(), mappings: port(9091), snat: true, ..plain.clone() };
        NftablesBackend.add_portmap(&snat).unwrap();
        assert_eq!(rules(), Some((true, 2)));
        NftablesBackend.check_portmap(&plain).unwrap();
        NftablesBackend.check_portmap(&snat).unwrap();
        nft_ok(&["delete", "chain", "inet", PORTMAP_TABLE, LOCALNET_CHAIN], None);
        NftablesBackend.check_portmap(&plain).unwrap();
        let err = NftablesBackend.check_portmap(&snat).unwrap_err();
        assert_eq!(err.code, code::CHECK_FAILED, "{err}");
        assert!(err.msg.contains("127.0.0.0/8"), "{err}");
    });
}

/// The MAC spoof check: elements only; a reused bridge port belongs to the newest ADD, whose MAC
/// alone is allowed; DEL, CHECK and GC find the attachment by its id.
#[test]
fn macspoof_elements() {
    require_root_and_nft();
    in_netns(|| {
        let elems = |set: &str| {
            nfnl::Conn::new()
                .get_elements(MACSPOOF.fam, MACSPOOF.name, set, None)
                .unwrap()
                .into_iter()
                .filter(|e| e.expires_ms.is_none())
                .count()
        };
        add_macspoof("n", "old", "eth0", "veth1234abcd", "0a:58:0a:00:00:02").unwrap();
        check_macspoof("n", "old", "eth0").unwrap();
        assert_eq!(check_macspoof("n", "other", "eth0").unwrap_err().code, code::CHECK_FAILED);
        add_macspoof("n", "new", "eth0", "veth1234abcd", "0a:58:0a:00:00:03").unwrap();
        check_macspoof("n", "new", "eth0").unwrap();
        assert_eq!(check_macspoof("n", "old", "eth0").unwrap_err().code, code::CHECK_FAILED);
        assert_eq!((elems("port_owner"), elems("macs")), (1, 1), "the old MAC is not allowed any more");
        del_macspoof("n", "old", "eth0").unwrap();
        check_macspoof("n", "new", "eth0").unwrap();
        add_macspoof("n", "gc-me", "eth0", "veth0", "0a:58:0a:00:00:04").unwrap();
        let keep = [Attachment { container_id: "new".into(), ifname: "eth0".into() }];
        gc_macspoof("n", &keep).unwrap();
        check_macspoof("n", "new", "eth0").unwrap();
        assert_eq!(check_macspoof("n", "gc-me", "eth0").unwrap_err().code, code::CHECK_FAILED);
        del_macspoof("n", "new", "eth0").unwrap();
        del_macspoof("n", "new", "eth0").unwrap();
        assert_eq!(check_macspoof("n", "new", "eth0").unwrap_err().code, code::CHECK_FAILED);
        assert!(add_macspoof("n", "c", "eth0", "veth\"x", "0a:58:0a:00:00:02").is_err());
        assert!(add_macspoof("n", "c", "eth0", "veth1", "not a mac").is_err());
    });
}

/// STATUS, DEL, CHECK and GC of the nftables backend run no `nft`: with a PATH and system
/// directories that hold no nft (a mount namespace of its own hides them), they still work; only
/// an ADD with conditions (nft text) needs it.
#[test]
fn verbs_work_without_the_nft_binary() {
    require_root_and_nft();
    in_netns(|| {
        // Rules set up while nft is there.
        let plain = PortMap { conditions_v4: vec![], ..pm() };
        NftablesBackend.add_portmap(&plain).unwrap();
        NftablesBackend
            .add_portmap(&PortMap {
                container_id: "cond".into(),
                mappings: vec![PortMapping { host_port: 7070, ..pm().mappings[0] }],
                ..pm()
            })
            .unwrap();
        // Hide every nft this process could find: an empty tmpfs over each directory that has one.
        // SAFETY: unshare(2) of the mount namespace affects only this thread.
        assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNS) }, 0);
        let private = std::ffi::CString::new("/").unwrap();
        let none = std::ffi::CString::new("none").unwrap();
        // SAFETY: valid NUL-terminated strings; makes our mounts private to this namespace.
        assert_eq!(
            unsafe {
                libc::mount(
                    none.as_ptr(),
                    private.as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                )
            },
            0
        );
        while let Some(nft) = exec::find("nft") {
            let dir = std::ffi::CString::new(nft.parent().unwrap().as_os_str().as_encoded_bytes()).unwrap();
            let fs = std::ffi::CString::new("tmpfs").unwrap();
            // SAFETY: valid NUL-terminated strings.
            assert_eq!(unsafe { libc::mount(fs.as_ptr(), dir.as_ptr(), fs.as_ptr(), 0, std::ptr::null()) }, 0);
        }
        NftablesBackend.status().unwrap();
        assert!(usable());
        NftablesBackend.check_portmap(&plain).unwrap();
        NftablesBackend
            .add_portmap(&PortMap {
                container_id: "c9".into(),
                mappings: vec![PortMapping { host_port: 9999, ..plain.mappings[0] }],
                ..plain.clone()
            })
            .unwrap();
        let err = NftablesBackend
            .add_portmap(&PortMap {
                container_id: "c8".into(),
                mappings: vec![PortMapping { host_port: 9998, ..pm().mappings[0] }],
                ..pm()
            })
            .unwrap_err();
        assert_eq!(err.code, code::NOT_AVAILABLE, "{err}");
        NftablesBackend
            .check_portmap(&PortMap {
                container_id: "cond".into(),
                mappings: vec![PortMapping { host_port: 7070, ..pm().mappings[0] }],
                ..pm()
            })
            .unwrap();
        NftablesBackend.del_portmap("net1", "cond", "eth0").unwrap();
        NftablesBackend.gc_portmap("net1", &[]).unwrap();
        NftablesBackend.del_portmap("net1", "c1", "eth0").unwrap();
        assert_eq!(NftablesBackend.check_portmap(&plain).unwrap_err().code, code::CHECK_FAILED);
    });
}

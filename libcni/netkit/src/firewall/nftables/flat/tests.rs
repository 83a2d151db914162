//! Owner records and elements, unit and privileged.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod unit {
    use super::super::*;
    use crate::firewall::PortMapping;

    /// The backend tests' pod (8080/tcp, 5353/udp on 192.168.1.1, IPv4 and IPv6) without its
    /// conditions, with a second mapping of 8080/tcp, which must lose to the first.
    fn pm(snat: bool, masq_all: bool) -> PortMap {
        let mut p = super::super::super::tests::pm();
        p.conditions_v4.clear();
        let dup = PortMapping { host_port: 8080, container_port: 81, protocol: Protocol::Tcp, host_ip: None };
        p.mappings.insert(1, dup);
        p.snat = snat;
        p.masq_all = masq_all;
        p
    }

    #[test]
    fn mappings_keep_the_first_mapping_of_a_port_and_round_trip() {
        let e = mappings(&pm(true, false));
        let texts: Vec<String> = e.iter().map(Mapping::text).collect();
        assert_eq!(
            texts,
            vec!["10.22.0.5,80,tcp,8080,-,16", "10.22.0.5,53,udp,5353,192.168.1.1,16", "fd00:22::5,80,tcp,8080,-,64"]
        );
        for x in &e {
            assert_eq!(Mapping::parse(&x.text()).as_ref(), Some(x));
        }
        assert_eq!(mappings(&pm(false, true))[0].text(), "10.22.0.5,80,tcp,8080,-,n");
        assert_eq!(mappings(&pm(true, true))[0].text(), "10.22.0.5,80,tcp,8080,-,a");
        for bad in [
            "",
            "10.22.0.5,80,tcp,8080,-",
            "10.22.0.5,80,tcp,8080,fd00::1,16",
            "10.22.0.5,80,tcp,8080,-,33",
            "x,80,tcp,1,-,n",
        ] {
            assert_eq!(Mapping::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn elements_of_an_entry() {
        let t = tag("net1", "c1", "eth0");
        let e = mappings(&pm(true, false));
        let sets = |e: &Mapping| e.elems(t).into_iter().map(|(s, _)| s).collect::<Vec<_>>();
        assert_eq!(sets(&e[0]), vec!["own4", "dnat4", "hp4-16", "sp4"]);
        assert_eq!(sets(&e[1]), vec!["hown4", "hdnat4", "hhp4-16", "hsp4"]);
        assert_eq!(sets(&e[2]), vec!["own6", "dnat6", "hp6-64"]);
        let hp = &e[0].elems(t)[2].1;
        assert_eq!(hp.key[0], KeyPart::Addr("10.22.0.0".parse().unwrap()));
        assert_eq!(sets(&mappings(&pm(true, true))[1]), vec!["hown4", "hdnat4", "hall4"]);
        assert_eq!(sets(&mappings(&pm(false, false))[2]), vec!["own6", "dnat6"]);
        assert_eq!(Mapping::on_demand("hhp6-64"), Some((Family::V6, 64)));
        assert_eq!(Mapping::on_demand("hp4-16"), Some((Family::V4, 16)));
        assert_eq!(Mapping::on_demand("hsp4"), None);
        assert_ne!(tag("net1", "c1", "eth0"), tag("net1", "c1", "eth1"));
    }

    /// A mapping with conditions holds its port like any other, with a gate to the attachment's
    /// chain in place of the dnat element; conditions apply per family.
    #[test]
    fn conditions_are_a_gate() {
        let t = tag("net1", "c1", "eth0");
        let e = mappings(&super::super::super::tests::pm());
        assert_eq!(e.iter().map(|m| m.gated).collect::<Vec<_>>(), vec![true, true, false]);
        assert_eq!(e[0].text(), "10.22.0.5,80,tcp,8080,-,16,c");
        assert_eq!(Mapping::parse(&e[0].text()).as_ref(), Some(&e[0]));
        let elems = e[1].elems(t);
        assert_eq!(
            elems.iter().map(|(s, _)| s.as_str()).collect::<Vec<_>>(),
            vec!["hown4", "hgate4", "hhp4-16", "hsp4"]
        );
        assert_eq!(elems[1].1.data, ElemData::Verdict(Verdict::Jump(chain_name(t))));
        assert_eq!(chain_name(t).len(), "pm-".len() + 16);
        assert!(e[0].chained() && !e[2].chained());
    }

    #[test]
    fn records_split_into_comments_that_fit() {
        let mut p = pm(true, false);
        p.mappings = (1..=40)
            .map(|i| PortMapping { host_port: 10000 + i, container_port: i, protocol: Protocol::Sctp, host_ip: None })
            .collect();
        let e = mappings(&p);
        assert_eq!(e.len(), 80);
        let comments = record_comments("abcdef01", &e);
        assert!(comments.len() > 1);
        let mut back = Vec::new();
        for c in &comments {
            assert!(c.len() <= 253, "{} bytes: {c}", c.len());
            let (net8, n, entries) = parse_comment::<Mapping>(c).unwrap();
            assert_eq!((net8.as_str(), n as usize), ("abcdef01", comments.len()));
            back.extend(entries);
        }
        assert_eq!(back, e);
    }
}

mod privileged {
    use super::super::super::tests::{in_netns, require_root_and_nft};
    use super::super::*;
    use crate::firewall::PortMapping;

    fn pm(id: &str, port: u16) -> PortMap {
        let mut p = super::super::super::tests::pm();
        p.conditions_v4.clear();
        p.container_id = id.into();
        p.mappings = vec![PortMapping { host_port: port, container_port: 80, protocol: Protocol::Tcp, host_ip: None }];
        p
    }

    fn count(set: &str) -> usize {
        nfnl::Conn::new()
            .get_elements(PORTMAP.fam, PORTMAP.name, set, None)
            .unwrap()
            .iter()
            .filter(|e| e.expires_ms.is_none())
            .count()
    }

    /// The removal for kernels that ignore an element's new expiry deletes the same elements.
    #[test]
    fn delete_removes_what_expire_would() {
        require_root_and_nft();
        in_netns(|| {
            let (a, b) = (pm("a", 8080), pm("b", 8081));
            add_portmap(&Conn::new(), &a, "add a").unwrap();
            add_portmap(&Conn::new(), &b, "add b").unwrap();
            let tag_a = tag("net1", "a", "eth0");
            let record = read_record::<Mapping>(&Conn::new(), tag_a).unwrap().unwrap();
            assert_eq!(record.items, mappings(&a));
            assert_eq!(record.expiring, None);
            delete(&Conn::new(), &[(tag_a, record)], "delete a").unwrap();
            assert!(read_record::<Mapping>(&Conn::new(), tag_a).unwrap().is_none());
            for (set, n) in
                [("dnat4", 1), ("dnat6", 1), ("own4", 1), ("hp4-16", 1), ("hp6-64", 1), ("sp4", 1), ("owners", 1)]
            {
                assert_eq!(count(set), n, "{set}");
            }
            check_portmap(&Conn::new(), &b, "check b").unwrap();
            // And a port taken over meanwhile by another attachment is left to it.
            let c = pm("c", 8081);
            let record = read_record::<Mapping>(&Conn::new(), tag("net1", "b", "eth0")).unwrap().unwrap();
            del_portmap(&Conn::new(), "net1", "b", "eth0", "del b").unwrap();
            add_portmap(&Conn::new(), &c, "add c").unwrap();
            delete(&Conn::new(), &[(tag("net1", "b", "eth0"), record)], "delete b late").unwrap();
            check_portmap(&Conn::new(), &c, "check c").unwrap();
        });
    }

    /// Conditions: the attachment's chain DNATs, its ports conflict with everyone's in both
    /// directions, DEL and a repeated ADD without conditions remove the chain.
    #[test]
    fn conditions_have_a_chain_and_share_the_port_checks() {
        require_root_and_nft();
        in_netns(|| {
            let cond =
                |id: &str, port| PortMap { conditions_v4: vec!["ip saddr != 10.0.0.0/8".into()], ..pm(id, port) };
            let chain = |id: &str| {
                let t = tag("net1", id, "eth0");
                nfnl::Conn::new()
                    .list_chain(PORTMAP.fam, PORTMAP.name, &chain_name(t))
                    .unwrap()
                    .map(|c| c.comments.len())
            };
            add_portmap(&Conn::new(), &cond("a", 8080), "add a").unwrap();
            assert_eq!(chain("a"), Some(1), "one rule: the IPv4 mapping (no IPv6 conditions)");
            check_portmap(&Conn::new(), &cond("a", 8080), "check a").unwrap();
            assert_eq!((count("gate4"), count("dnat4"), count("dnat6")), (1, 0, 1));
            let err = add_portmap(&Conn::new(), &pm("b", 8080), "add b").unwrap_err();
            assert!(err.msg.contains("8080/tcp"), "{err}");
            add_portmap(&Conn::new(), &pm("b", 8081), "add b").unwrap();
            let err = add_portmap(&Conn::new(), &cond("c", 8081), "add c").unwrap_err();
            assert!(err.msg.contains("8081/tcp"), "{err}");
            assert_eq!(chain("c"), None, "a conflict writes no chain");
            // CHECK sees a chain that lost its rule.
            let name = chain_name(tag("net1", "a", "eth0"));
            let mut b = Batch::new();
            b.flush_chain(PORTMAP.fam, PORTMAP.name, &name);
            b.send().unwrap();
            assert_eq!(check_portmap(&Conn::new(), &cond("a", 8080), "check a").unwrap_err().code, 103);
            add_portmap(&Conn::new(), &cond("a", 8080), "add a again").unwrap();
            check_portmap(&Conn::new(), &cond("a", 8080), "check a").unwrap();
            add_portmap(&Conn::new(), &pm("a", 8080), "add a without conditions").unwrap();
            assert_eq!(chain("a"), None);
            check_portmap(&Conn::new(), &pm("a", 8080), "check a").unwrap();
            add_portmap(&Conn::new(), &cond("d", 9090), "add d").unwrap();
            del_portmap(&Conn::new(), "net1", "d", "eth0", "del d").unwrap();
            assert_eq!((chain("d"), count("gate4")), (None, 0));
            del_portmap(&Conn::new(), "net1", "d", "eth0", "del d again").unwrap();
            add_portmap(&Conn::new(), &cond("e", 9091), "add e").unwrap();
            gc_portmap(&Conn::new(), "net1", &[], "gc").unwrap();
            assert_eq!(chain("e"), None);
            // Conditions nft cannot compile fail the ADD and leave nothing.
            let bad = PortMap { conditions_v4: vec!["ip saddr !!! 10.0.0.0/8; flush ruleset".into()], ..pm("f", 9092) };
            let err = add_portmap(&Conn::new(), &bad, "add f").unwrap_err();
            assert_eq!(err.code, 100, "{err}");
            assert_eq!(
                (chain("f"), read_record::<Mapping>(&Conn::new(), tag("net1", "f", "eth0")).unwrap().is_none()),
                (None, true)
            );
            assert!(nfnl::Conn::new().list_chain(PORTMAP.fam, PORTMAP.name, "dispatch").unwrap().is_some());
        });
    }

    /// Conditions decide, for real connections: with conditions that hold, a connection to the
    /// host port reaches the pod address; with conditions that do not, it is not DNATed.
    #[test]
    fn conditions_decide_for_real_connections() {
        require_root_and_nft();
        in_netns(|| {
            for args in [&["link", "set", "lo", "up"][..], &["addr", "add", "10.22.0.5/16", "dev", "lo"]] {
                assert!(std::process::Command::new("ip").args(args).status().unwrap().success());
            }
            let server = std::net::TcpListener::bind("10.22.0.5:80").unwrap();
            let reaches = || std::net::TcpStream::connect("127.0.0.1:8080").is_ok();
            let with = |conditions: &str| PortMap {
                conditions_v4: vec![conditions.into()],
                ipv6: None,
                snat: false,
                ..pm("cond", 8080)
            };
            assert!(!reaches());
            add_portmap(&Conn::new(), &with("ip saddr 127.0.0.1"), "add").unwrap();
            assert!(reaches(), "conditions that hold");
            add_portmap(&Conn::new(), &with("ip saddr 10.99.0.1"), "add again").unwrap();
            assert!(!reaches(), "conditions that do not hold");
            add_portmap(&Conn::new(), &PortMap { conditions_v4: vec![], ..with("") }, "add without").unwrap();
            assert!(reaches(), "no conditions");
            drop(server);
        });
    }

    /// Many mappings take several owner records; DEL finds them all from the container id.
    #[test]
    fn a_record_in_several_chunks() {
        require_root_and_nft();
        in_netns(|| {
            let mut p = pm("many", 1);
            p.mappings = (1..=30)
                .map(|i| PortMapping {
                    host_port: 20000 + i,
                    container_port: i,
                    protocol: Protocol::Udp,
                    host_ip: None,
                })
                .collect();
            add_portmap(&Conn::new(), &p, "add").unwrap();
            assert!(count("owners") > 1);
            check_portmap(&Conn::new(), &p, "check").unwrap();
            assert_eq!(count("dnat4"), 30);
            del_portmap(&Conn::new(), "net1", "many", "eth0", "del").unwrap();
            std::thread::sleep(Duration::from_millis(20));
            assert_eq!((count("dnat4"), count("dnat6"), count("owners")), (0, 0, 0));
        });
    }

    fn masq(id: &str, addrs: &[&str]) -> Masquerade {
        Masquerade {
            network: "net1".into(),
            container_id: id.into(),
            ifname: "eth0".into(),
            addresses: addrs.iter().map(|a| a.parse().unwrap()).collect(),
        }
    }

    fn masq_count(set: &str) -> usize {
        nfnl::Conn::new()
            .get_elements(MASQ.fam, MASQ.name, set, None)
            .unwrap()
            .iter()
            .filter(|e| e.expires_ms.is_none())
            .count()
    }

    /// Masquerade: an address belongs to the newest ADD; a stale attachment's DEL leaves it to
    /// the new one.
    #[test]
    fn masquerade_addresses_move_to_the_newest_add() {
        require_root_and_nft();
        in_netns(|| {
            let stale = masq("stale", &["10.22.0.5/16", "fd00:22::5/64"]);
            let fresh = masq("fresh", &["10.22.0.5/16"]);
            add_masquerade(&Conn::new(), &stale, "add stale").unwrap();
            check_masquerade(&Conn::new(), &stale, "check stale").unwrap();
            add_masquerade(&Conn::new(), &fresh, "add fresh").unwrap();
            check_masquerade(&Conn::new(), &fresh, "check fresh").unwrap();
            assert_eq!(check_masquerade(&Conn::new(), &stale, "check stale").unwrap_err().code, 103);
            del_masquerade(&Conn::new(), "net1", "stale", "eth0", "del stale").unwrap();
            check_masquerade(&Conn::new(), &fresh, "check fresh").unwrap();
            std::thread::sleep(Duration::from_millis(20));
            assert_eq!((masq_count("pods4"), masq_count("pods6"), masq_count("local4-16")), (1, 0, 1));
            // Two addresses of a family, different subnets: each its own.
            let two = masq("two", &["10.30.0.5/24", "10.31.0.5/20"]);
            add_masquerade(&Conn::new(), &two, "add two").unwrap();
            check_masquerade(&Conn::new(), &two, "check two").unwrap();
            assert_eq!((masq_count("local4-24"), masq_count("local4-20")), (1, 1));
            gc_masquerade(&Conn::new(), "net1", &[], "gc").unwrap();
            std::thread::sleep(Duration::from_millis(20));
            assert_eq!((masq_count("pods4"), masq_count("pods6"), masq_count("owners")), (0, 0, 0));
        });
    }
}

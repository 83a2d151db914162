#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::super::Protocol;
use super::*;

thread_local! {
    /// Makes [`nft_based`] false on this thread: a test's in-process iptables-legacy node.
    pub(crate) static LEGACY: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

#[test]
fn reference_chain_names() {
    // Values computed with the reference's utils.FormatChainName / MustFormatChainNameWithPrefix.
    let c = chain_name("test", "1234", "");
    assert_eq!(c.len(), 28);
    assert!(c.starts_with("CNI-"));
    assert_eq!(c, format!("CNI-{}", &sha512_hex("test1234")[..24]));
    let d = chain_name("test", "1234", "DN-");
    assert_eq!(d, format!("CNI-DN-{}", &sha512_hex("test1234")[..21]));
}

fn pm() -> PortMap {
    PortMap {
        network: "net".into(),
        container_id: "c1".into(),
        ifname: "eth0".into(),
        mappings: vec![
            PortMapping { host_port: 8080, container_port: 80, protocol: Protocol::Tcp, host_ip: None },
            PortMapping {
                host_port: 53,
                container_port: 5353,
                protocol: Protocol::Udp,
                host_ip: Some("192.168.1.1".parse().unwrap()),
            },
        ],
        ipv4: Some("10.0.0.2/24".parse().unwrap()),
        ipv6: None,
        snat: true,
        masq_all: false,
        mark_masq_bit: 13,
        external_set_mark_chain: None,
        conditions_v4: vec!["-s".into(), "1.2.3.4 ".into()],
        conditions_v6: vec![],
    }
}

#[test]
fn portmap_rules_in_save_form() {
    let p = pm();
    let addr = p.ipv4.unwrap();
    let plan = dnat_plan(&p, &addr);
    let ch = &plan.chain;
    assert_eq!(
        plan.rules,
        vec![
            format!("-A {ch} -s 10.0.0.0/24 -p tcp -m tcp --dport 8080 -j CNI-HOSTPORT-SETMARK"),
            format!("-A {ch} -s 127.0.0.1/32 -p tcp -m tcp --dport 8080 -j CNI-HOSTPORT-SETMARK"),
            format!("-A {ch} -p tcp -m tcp --dport 8080 -j DNAT --to-destination 10.0.0.2:80"),
            format!("-A {ch} -s 10.0.0.0/24 -d 192.168.1.1/32 -p udp -m udp --dport 53 -j CNI-HOSTPORT-SETMARK"),
            format!("-A {ch} -s 127.0.0.1/32 -d 192.168.1.1/32 -p udp -m udp --dport 53 -j CNI-HOSTPORT-SETMARK"),
            format!("-A {ch} -d 192.168.1.1/32 -p udp -m udp --dport 53 -j DNAT --to-destination 10.0.0.2:5353"),
        ]
    );
    assert_eq!(
        plan.entries[0],
        format!("-A CNI-HOSTPORT-DNAT -p tcp -m comment --comment \"dnat name: \\\"net\\\" id: \\\"c1\\\"\" -m multiport --dports 8080 -s \"1.2.3.4 \" -j {ch}")
    );
    let lines = portmap_add_lines(&NatTable::default(), &p, &addr);
    assert_eq!(lines[0], ":CNI-HOSTPORT-SETMARK - [0:0]");
    assert!(lines.contains(
        &"-I POSTROUTING 1 -m comment --comment \"CNI portfwd requiring masquerade\" -j CNI-HOSTPORT-MASQ".to_string()
    ));
    assert!(lines.contains(&"-A CNI-HOSTPORT-MASQ -m mark --mark 0x2000/0x2000 -j MASQUERADE".to_string()));
}

#[test]
fn many_ports_are_split() {
    let mut p = pm();
    p.mappings = (1..=20)
        .map(|i| PortMapping { host_port: i, container_port: i, protocol: Protocol::Tcp, host_ip: None })
        .collect();
    let plan = dnat_plan(&p, &p.ipv4.unwrap());
    assert_eq!(plan.entries.len(), 2);
}

#[test]
fn save_parsing_and_gc() {
    let dn = chain_name("net", "gone", "DN-");
    let keep_dn = chain_name("net", "kept", "DN-");
    let masq = chain_name("net", "gone", "");
    let save = format!(
        "# Generated\n*filter\n:FORWARD ACCEPT [0:0]\n-A FORWARD -j ACCEPT\nCOMMIT\n*nat\n:PREROUTING ACCEPT [0:0]\n:{dn} - [0:0]\n:{keep_dn} - [0:0]\n:{masq} - [0:0]\n\
         -A CNI-HOSTPORT-DNAT -p tcp -m comment --comment \"dnat name: \\\"net\\\" id: \\\"gone\\\"\" -m multiport --dports 80 -j {dn}\n\
         -A CNI-HOSTPORT-DNAT -p tcp -m comment --comment \"dnat name: \\\"net\\\" id: \\\"kept\\\"\" -m multiport --dports 81 -j {keep_dn}\n\
         -A POSTROUTING -s 10.0.0.9/32 -m comment --comment \"name: \\\"net\\\" id: \\\"gone\\\"\" -j {masq}\n\
         -A {masq} ! -d 224.0.0.0/4 -m comment --comment \"name: \\\"net\\\" id: \\\"gone\\\"\" -j MASQUERADE\nCOMMIT\n"
    );
    let t = NatTable::parse(&save, "nat");
    assert!(t.has_chain(&dn));
    assert!(!t.has_rule("-A FORWARD -j ACCEPT"));
    let keep = vec![Attachment { container_id: "kept".into(), ifname: "eth0".into() }];
    assert_eq!(stale_chains(&t, "net", &keep).into_iter().collect::<Vec<_>>(), vec![dn.clone()]);
    assert_eq!(masq::stale(&t, "net", &keep).into_iter().collect::<Vec<_>>(), vec![masq.clone()]);
    assert!(stale_chains(&t, "other", &keep).is_empty());
    let del = portmap_del_lines(&t, "net", "gone");
    assert!(del[0].starts_with("-D CNI-HOSTPORT-DNAT -p tcp"));
    assert_eq!(del[1..], [format!("-F {dn}"), format!("-X {dn}")]);
    assert!(portmap_del_lines(&t, "net", "never").is_empty());
}

#[test]
fn ports_held_by_another_container() {
    // What another container's ADD (ours or the reference's) leaves in the nat table.
    let other = PortMap { container_id: "c0".into(), ipv4: Some("10.0.0.9/24".parse().unwrap()), ..pm() };
    let addr = other.ipv4.unwrap();
    let mut save = String::from("*nat\n");
    for l in portmap_add_lines(&NatTable::default(), &other, &addr) {
        save.push_str(&format!("{}\n", l.replacen("-I POSTROUTING 1 ", "-A POSTROUTING ", 1)));
    }
    let t = NatTable::parse(&save, "nat");
    let p = pm();
    let err = held_port(&t, &p, &addr, "add c1").unwrap_err();
    assert_eq!(err.code, code::NETWORK);
    assert_eq!(
        err.msg,
        "add c1: host port 8080/tcp (any IPv4 host address) already mapped by container \"c0\" of network \"net\""
    );
    // The same container again (a repeated ADD), other ports, another host address: no conflict.
    let again = PortMap { container_id: "c0".into(), ..pm() };
    held_port(&t, &again, &addr, "add c0").unwrap();
    let elsewhere = |host_port, host_ip: Option<&str>| PortMap {
        mappings: vec![PortMapping {
            host_port,
            container_port: 80,
            protocol: Protocol::Udp,
            host_ip: host_ip.map(|h| h.parse().unwrap()),
        }],
        ..pm()
    };
    held_port(&t, &elsewhere(8080, None), &addr, "udp").unwrap();
    held_port(&t, &elsewhere(53, None), &addr, "any address").unwrap();
    held_port(&t, &elsewhere(53, Some("192.168.1.2")), &addr, "another address").unwrap();
    let err = held_port(&t, &elsewhere(53, Some("192.168.1.1")), &addr, "same").unwrap_err();
    assert!(err.msg.contains("host port 53/udp on 192.168.1.1 already mapped by container \"c0\""), "{err}");
}

#[test]
fn localnet_drop_lines() {
    let none = localnet_lines(&NatTable::default());
    assert_eq!(
        none,
        vec![":CNI-LOCALNET - [0:0]".to_string(), LOCALNET_RULE.to_string(), "-I INPUT 1 -j CNI-LOCALNET".into()]
    );
    let save = format!(
        "*filter\n:INPUT ACCEPT [0:0]\n:CNI-LOCALNET - [0:0]\n-A INPUT -j CNI-LOCALNET\n{LOCALNET_RULE}\nCOMMIT\n"
    );
    assert!(localnet_lines(&NatTable::parse(&save, "filter")).is_empty());
    assert_eq!(localnet_lines(&NatTable::parse(&save, "nat")), none, "another table's chains do not count");
    let extra = save.replace("COMMIT", "-A CNI-LOCALNET -j ACCEPT\nCOMMIT");
    assert_eq!(localnet_lines(&NatTable::parse(&extra, "filter")), none[..2]);
}

#[test]
fn comments() {
    let r = "-A X -m comment --comment \"dnat name: \\\"n\\\" id: \\\"c\\\"\" -j Y";
    assert_eq!(saved_comment(r).unwrap().0, "dnat name: \"n\" id: \"c\"");
    assert_eq!(parse_owner("dnat name: \"n\" id: \"c\""), Some(("n".into(), "c".into())));
    assert_eq!(parse_owner("CNI portfwd masquerade mark"), None);
}

/// iptables-nft or iptables-legacy, told from where `iptables` leads (through alternatives-style
/// chains of symlinks), without running it.
#[test]
fn nft_based_iptables_is_told_from_its_link_target() {
    let dir = std::env::temp_dir().join(format!("cni-rs-iptlink-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let link = |name: &str, to: &str| {
        let p = dir.join(name);
        std::os::unix::fs::symlink(to, &p).unwrap();
        p
    };
    for multi in ["xtables-nft-multi", "xtables-legacy-multi", "iptables-nft", "iptables-legacy"] {
        std::fs::write(dir.join(multi), "").unwrap();
    }
    assert!(resolves_to_nft(&link("a", &dir.join("xtables-nft-multi").display().to_string())));
    let alt = link("alt", &dir.join("iptables-nft").display().to_string());
    assert!(resolves_to_nft(&link("b", &alt.display().to_string())));
    assert!(!resolves_to_nft(&link("c", &dir.join("xtables-legacy-multi").display().to_string())));
    assert!(!resolves_to_nft(&link("d", &dir.join("iptables-legacy").display().to_string())));
    assert!(!resolves_to_nft(&dir.join("missing")));
    std::fs::remove_dir_all(&dir).unwrap();
}

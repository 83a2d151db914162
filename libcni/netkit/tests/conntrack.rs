#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The UDP conntrack flush (ctnetlink, in process) against the kernel's table, read back with
//! the `conntrack` tool: exactly the UDP entries of the family to the port go, in every zone,
//! and everything else stays.

use cni_tests::{require_root, require_tools, Netns};
use netkit::firewall::flush_udp_conntrack;
use netkit::{Family, NetNs};

/// `conntrack -L` of one family in `ns`, one sorted line per entry with what tells entries
/// apart (protocol, ports of the original tuple, zones), timers and counters left out.
fn entries(ns: &Netns, family: &str) -> Vec<String> {
    let out = ns.exec("conntrack", &["-L", "-f", family]);
    assert!(out.status.success(), "conntrack -L: {}", String::from_utf8_lossy(&out.stderr));
    let mut lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let proto = f[0];
            // The first sport=/dport= are the original tuple's.
            let first = |k: &str| f.iter().find(|w| w.starts_with(k)).map_or("", |w| &w[k.len()..]).to_string();
            let zones: Vec<&str> = f.iter().filter(|w| w.starts_with("zone")).copied().collect();
            format!("{proto} {}>{} {}", first("sport="), first("dport="), zones.join(" ")).trim().to_string()
        })
        .collect();
    lines.sort();
    lines
}

fn insert(ns: &Netns, args: &str) {
    let mut all = vec!["-I", "-t", "120"];
    all.extend(args.split_whitespace());
    let out = ns.exec("conntrack", &all);
    assert!(out.status.success(), "conntrack -I {args}: {}", String::from_utf8_lossy(&out.stderr));
}

/// Sends one datagram from `src_port` to `dst:dst_port` inside `ns`; nothing needs to listen.
fn send_udp(ns: &Netns, dst: &str, src_port: u16, dst_port: u16) {
    let family = if dst.contains(':') { "AF_INET6" } else { "AF_INET" };
    let program = format!(
        "import socket\ns = socket.socket(socket.{family}, socket.SOCK_DGRAM)\n\
         s.bind(('', {src_port}))\ns.sendto(b'ping', ('{dst}', {dst_port}))"
    );
    let out = ns.exec("python3", &["-c", &program]);
    assert!(out.status.success(), "send UDP to {dst}:{dst_port}: {}", String::from_utf8_lossy(&out.stderr));
}

fn flush_in(ns: &Netns, port: u16, family: Family) -> usize {
    let handle = NetNs::open(&ns.path).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            let _in = handle.enter().unwrap();
            flush_udp_conntrack(port, family).unwrap()
        })
        .join()
        .unwrap()
    })
}

#[test]
fn the_udp_flush_deletes_exactly_the_entries_to_the_port() {
    require_root();
    require_tools(&["conntrack", "nft", "python3"]);
    let ns = Netns::new("cnk-ct-");
    // Conntrack tracks a namespace's packets once a rule there needs it.
    let ruleset = "add table inet t; add chain inet t out { type filter hook output priority 0; }; \
                   add rule inet t out ct state new counter";
    let out = ns.exec("nft", &[ruleset]);
    assert!(out.status.success(), "nft: {}", String::from_utf8_lossy(&out.stderr));

    // Real datagrams: to the port (IPv4 and IPv6) and to another port.
    send_udp(&ns, "127.0.0.1", 40001, 5300);
    send_udp(&ns, "::1", 40002, 5300);
    send_udp(&ns, "127.0.0.1", 40003, 5301);
    // Entries traffic would hardly make: zones, a TCP one to the port, the port as the source,
    // a DNATed one (reply from elsewhere).
    insert(&ns, "-p udp -s 10.1.0.1 -d 10.1.0.2 --sport 40004 --dport 5300 --zone 7");
    insert(&ns, "-p udp -s 10.1.0.1 -d 10.1.0.2 --sport 40005 --dport 5300 --orig-zone 9");
    insert(&ns, "-p tcp -s 10.1.0.1 -d 10.1.0.2 --sport 40006 --dport 5300 --state ESTABLISHED");
    insert(&ns, "-p udp -s 10.1.0.1 -d 10.1.0.2 --sport 5300 --dport 40007");
    insert(
        &ns,
        "-p udp -s 10.1.0.1 -d 10.1.0.9 --sport 40008 --dport 5300 --reply-src 10.1.0.3 --reply-dst 10.1.0.1 \
         --reply-port-src 80 --reply-port-dst 40008",
    );
    let v4_before = entries(&ns, "ipv4");
    let v6_before = entries(&ns, "ipv6");
    assert_eq!(
        v4_before,
        [
            "tcp 40006>5300",
            "udp 40001>5300",
            "udp 40003>5301",
            "udp 40004>5300 zone=7",
            "udp 40005>5300 zone-orig=9",
            "udp 40008>5300",
            "udp 5300>40007",
        ],
        "the entries the test made"
    );
    assert_eq!(v6_before, ["udp 40002>5300"]);

    assert_eq!(flush_in(&ns, 5300, Family::V4), 4, "the IPv4 UDP entries to 5300");
    assert_eq!(entries(&ns, "ipv4"), ["tcp 40006>5300", "udp 40003>5301", "udp 5300>40007"]);
    assert_eq!(entries(&ns, "ipv6"), v6_before, "IPv6 untouched by the IPv4 flush");

    // Nothing left to delete is success; then IPv6.
    assert_eq!(flush_in(&ns, 5300, Family::V4), 0);
    assert_eq!(flush_in(&ns, 5300, Family::V6), 1);
    assert_eq!(entries(&ns, "ipv6"), Vec::<String>::new());
    assert_eq!(entries(&ns, "ipv4"), ["tcp 40006>5300", "udp 40003>5301", "udp 5300>40007"]);
}

#[test]
fn the_flush_deletes_many_entries() {
    require_root();
    require_tools(&["conntrack"]);
    let ns = Netns::new("cnk-ctn-");
    // More than one request datagram of deletes, and one entry that stays.
    let script = "for p in $(seq 20000 20599); do conntrack -I -t 120 -p udp -s 10.2.0.1 -d 10.2.0.2 \
                  --sport $p --dport 6000 2>/dev/null || exit 1; done; \
                  conntrack -I -t 120 -p udp -s 10.2.0.1 -d 10.2.0.2 --sport 1 --dport 6001 2>/dev/null";
    let out = ns.exec("sh", &["-c", script]);
    assert!(out.status.success(), "conntrack -I: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(entries(&ns, "ipv4").len(), 601);
    assert_eq!(flush_in(&ns, 6000, Family::V4), 600);
    assert_eq!(entries(&ns, "ipv4"), ["udp 1>6001"]);
}

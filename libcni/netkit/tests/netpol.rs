#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The NetworkPolicy table (`netkit::firewall::netpol`) against real TCP, UDP and SCTP traffic,
//! IPv4 and IPv6: a client namespace A, a router R that forwards and holds the table, and a
//! server namespace B that the policy isolates for ingress.
//!
//! ```text
//!   A (eth0: .1.2, .1.3) ---veth--- R (ra, rb; forwarding; table inet cni-rs-netpol) ---veth--- B (eth0: .2.2)
//! ```
//!
//! A kernel without SCTP (as on the CI machines) runs the TCP and UDP cases and prints a NOTE;
//! `vm_netkit` runs this test inside the VM, whose kernel has SCTP, and fails on that NOTE.

use cni_tests::{require_root, Netns};
use netkit::firewall::netpol::{self, Element, Elements, Peer, Ports, Rule, SetKind, SCTP, TCP, UDP};
use netkit::{sysctl, Family, NetNs};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use std::collections::BTreeSet;
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const TABLE: &str = "cni-rs-netpol";
/// The printed line that says the SCTP cases did not run (`vm_netkit` fails on it).
const NO_SCTP: &str = "NOTE: this kernel has no SCTP";

/// A's address the policy names as a peer, A's other address (no peer), B's address.
const A4: &str = "10.91.1.2";
const A4_OTHER: &str = "10.91.1.3";
const B4: &str = "10.91.2.2";
const A6: &str = "fd91:1::2";
const A6_OTHER: &str = "fd91:1::3";
const B6: &str = "fd91:2::2";

/// How long an allowed probe may take (an SCTP INIT lost once is resent after 3 s), and how long
/// a probe the policy drops is watched for an answer.
const ALLOWED_LIMIT: Duration = Duration::from_secs(20);
const DROPPED_WINDOW: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Proto {
    Tcp,
    Udp,
    Sctp,
}

impl Proto {
    fn socket(self, addr: IpAddr) -> std::io::Result<Socket> {
        let domain = if addr.is_ipv6() { Domain::IPV6 } else { Domain::IPV4 };
        match self {
            Proto::Tcp => Socket::new(domain, Type::STREAM, Some(Protocol::TCP)),
            Proto::Udp => Socket::new(domain, Type::DGRAM, Some(Protocol::UDP)),
            Proto::Sctp => Socket::new(domain, Type::STREAM, Some(Protocol::from(libc::IPPROTO_SCTP))),
        }
    }
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// Whether the calling thread's namespace can open SCTP sockets; any failure but "protocol not
/// supported" fails the test.
fn sctp_in_kernel() -> bool {
    match Proto::Sctp.socket(ip("0.0.0.0")) {
        Ok(_) => true,
        Err(e) if e.raw_os_error() == Some(libc::EPROTONOSUPPORT) => false,
        Err(e) => panic!("open an SCTP socket: {e}"),
    }
}

/// A, R and B, linked and addressed; deleted (with the table and every link) on drop.
struct Topology {
    a: Netns,
    r: Netns,
    b: Netns,
}

impl Topology {
    fn new() -> Topology {
        let t = Topology { a: Netns::new("cnk-npa-"), r: Netns::new("cnk-npr-"), b: Netns::new("cnk-npb-") };
        let sides = [("ra", &t.a, 1, &[A4, A4_OTHER][..], &[A6, A6_OTHER][..]), ("rb", &t.b, 2, &[B4], &[B6])];
        for (side, ns, net, v4, v6) in sides {
            t.r.ip(&["link", "add", side, "type", "veth", "peer", "name", "eth0", "netns", &ns.name]);
            t.r.ip(&["addr", "add", &format!("10.91.{net}.1/24"), "dev", side]);
            t.r.ip(&["addr", "add", &format!("fd91:{net}::1/64"), "dev", side, "nodad"]);
            t.r.ip(&["link", "set", side, "up"]);
            for addr in v4 {
                ns.ip(&["addr", "add", &format!("{addr}/24"), "dev", "eth0"]);
            }
            for addr in v6 {
                ns.ip(&["addr", "add", &format!("{addr}/64"), "dev", "eth0", "nodad"]);
            }
            ns.ip(&["link", "set", "eth0", "up"]);
            ns.ip(&["route", "add", "default", "via", &format!("10.91.{net}.1")]);
            ns.ip(&["-6", "route", "add", "default", "via", &format!("fd91:{net}::1")]);
        }
        let r = NetNs::open(&t.r.path).unwrap();
        sysctl::set_in(&r, "net/ipv4/ip_forward", "1").unwrap();
        sysctl::set_in(&r, "net/ipv6/conf/all/forwarding", "1").unwrap();
        t
    }

    fn in_r<T>(&self, f: impl FnOnce() -> T) -> T {
        NetNs::open(&self.r.path).unwrap().run(f).unwrap()
    }
}

/// Echo servers in B on every (protocol, port), IPv4 and IPv6; stopped and joined on drop.
struct Servers {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Servers {
    fn start(b: &Netns, services: &[(Proto, u16)]) -> Servers {
        let stop = Arc::new(AtomicBool::new(false));
        // Sockets belong to the namespace they are made in: bound and listening before any probe.
        let sockets = NetNs::open(&b.path)
            .unwrap()
            .run(|| {
                let mut sockets = Vec::new();
                for &(proto, port) in services {
                    for any in [ip("0.0.0.0"), ip("::")] {
                        let s = proto.socket(any).unwrap_or_else(|e| panic!("{proto:?} socket in B: {e}"));
                        if any.is_ipv6() {
                            s.set_only_v6(true).unwrap();
                        }
                        s.set_reuse_address(true).unwrap();
                        s.bind(&SockAddr::from(SocketAddr::new(any, port)))
                            .unwrap_or_else(|e| panic!("bind {proto:?} [{any}]:{port} in B: {e}"));
                        // Wakes the loop below to look at `stop`.
                        s.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
                        if proto != Proto::Udp {
                            s.listen(16).unwrap();
                        }
                        sockets.push((proto, s));
                    }
                }
                sockets
            })
            .unwrap();
        let threads = sockets
            .into_iter()
            .map(|(proto, s)| {
                let stop = stop.clone();
                std::thread::spawn(move || match proto {
                    Proto::Udp => serve_udp(&UdpSocket::from(s), &stop),
                    Proto::Tcp | Proto::Sctp => serve_stream(&TcpListener::from(s), &stop),
                })
            })
            .collect();
        Servers { stop, threads }
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn timed_out(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}

/// Accepts connections one after another (a TCP or an SCTP one-to-one socket: accept, read and
/// write are the same calls) and echoes what each sends first.
fn serve_stream(listener: &TcpListener, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        let mut conn = match listener.accept() {
            Ok((conn, _)) => conn,
            Err(e) if timed_out(&e) => continue,
            Err(e) => panic!("accept: {e}"),
        };
        conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = [0u8; 64];
        if let Ok(n) = conn.read(&mut buf) {
            let _ = conn.write_all(&buf[..n]);
        }
    }
}

fn serve_udp(socket: &UdpSocket, stop: &AtomicBool) {
    let mut buf = [0u8; 64];
    while !stop.load(Ordering::Relaxed) {
        match socket.recv_from(&mut buf) {
            Ok((n, from)) => {
                let _ = socket.send_to(&buf[..n], from);
            }
            Err(e) if timed_out(&e) => continue,
            Err(e) => panic!("recv_from: {e}"),
        }
    }
}

/// One connection attempt from A: from `src` to B's `dst` on `port`, which the policy should let
/// through (`allowed`) or drop.
#[derive(Debug, Clone, Copy)]
struct Probe {
    proto: Proto,
    src: &'static str,
    dst: &'static str,
    port: u16,
    allowed: bool,
}

fn probe(proto: Proto, src: &'static str, dst: &'static str, port: u16, allowed: bool) -> Probe {
    Probe { proto, src, dst, port, allowed }
}

#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    /// The echo came back: the request and its answer crossed R.
    Answered,
    /// Nothing came back within the limit.
    NoAnswer,
    /// Anything else (refused: the packet reached B but no server listens).
    Failed(String),
}

impl Probe {
    /// Runs the probe in A (its socket is made there): an allowed one gets [`ALLOWED_LIMIT`], a
    /// dropped one is watched for [`DROPPED_WINDOW`].
    fn run(&self, a: &NetNs) -> Outcome {
        let limit = if self.allowed { ALLOWED_LIMIT } else { DROPPED_WINDOW };
        let (src, dst) = (ip(self.src), SocketAddr::new(ip(self.dst), self.port));
        let socket = a
            .run(|| {
                let s = self.proto.socket(src)?;
                s.bind(&SockAddr::from(SocketAddr::new(src, 0)))?;
                Ok::<_, std::io::Error>(s)
            })
            .unwrap()
            .unwrap_or_else(|e| panic!("{self:?}: socket in A: {e}"));
        let start = Instant::now();
        let message = format!("{:?} {}", self.proto, self.port);
        let mut reply = [0u8; 64];
        match self.proto {
            Proto::Tcp | Proto::Sctp => {
                match socket.connect_timeout(&SockAddr::from(dst), limit) {
                    Ok(()) => {}
                    Err(e) if timed_out(&e) => return Outcome::NoAnswer,
                    Err(e) => return Outcome::Failed(format!("connect: {e}")),
                }
                let mut conn = TcpStream::from(socket);
                conn.set_read_timeout(Some(limit.saturating_sub(start.elapsed()).max(Duration::from_millis(1))))
                    .unwrap();
                conn.write_all(message.as_bytes()).unwrap();
                match conn.read(&mut reply) {
                    Ok(n) if reply[..n] == *message.as_bytes() => Outcome::Answered,
                    Ok(n) => Outcome::Failed(format!("connected, then got {:?}", String::from_utf8_lossy(&reply[..n]))),
                    Err(e) if timed_out(&e) => Outcome::Failed("connected, then no echo".into()),
                    Err(e) => Outcome::Failed(format!("connected, then read: {e}")),
                }
            }
            Proto::Udp => {
                // A datagram has no retransmission of its own: the client sends again until
                // answered, as a UDP client does.
                let udp = UdpSocket::from(socket);
                udp.connect(dst).unwrap();
                udp.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
                while start.elapsed() < limit {
                    udp.send(message.as_bytes()).unwrap();
                    match udp.recv(&mut reply) {
                        Ok(n) if reply[..n] == *message.as_bytes() => return Outcome::Answered,
                        Ok(n) => return Outcome::Failed(format!("got {:?}", String::from_utf8_lossy(&reply[..n]))),
                        Err(e) if timed_out(&e) => {}
                        Err(e) => return Outcome::Failed(format!("recv: {e}")),
                    }
                }
                Outcome::NoAnswer
            }
        }
    }
}

/// Runs every probe at once (a thread each) and fails with every probe whose outcome is not the
/// expected one.
fn expect(phase: &str, topology: &Topology, probes: &[Probe]) {
    let a = NetNs::open(&topology.a.path).unwrap();
    let outcomes: Vec<Outcome> = std::thread::scope(|s| {
        let threads: Vec<_> = probes.iter().map(|p| s.spawn(|| p.run(&a))).collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    let wrong: Vec<String> = probes
        .iter()
        .zip(&outcomes)
        .filter(|(p, o)| **o != if p.allowed { Outcome::Answered } else { Outcome::NoAnswer })
        .map(|(p, o)| {
            let want = if p.allowed { "allowed" } else { "dropped" };
            format!("{:?} {} -> [{}]:{} should be {want}, got {o:?}", p.proto, p.src, p.dst, p.port)
        })
        .collect();
    assert!(wrong.is_empty(), "{phase}: {} of {} probes wrong:\n{}", wrong.len(), probes.len(), wrong.join("\n"));
}

/// B isolated for ingress, per family: SCTP 80 from A's first address only; SCTP 8000-8010, TCP
/// 443 and UDP 5353 from anywhere; named ports (B's address . protocol . port: SCTP 9000 and TCP
/// 9001) from anywhere.
fn policy() -> (netpol::Ruleset, Elements) {
    let mut rules = netpol::empty_ruleset();
    let mut elements = Elements::new();
    for (family, a, b) in [(Family::V4, A4, B4), (Family::V6, A6, B6)] {
        let f = family.pick("4", "6");
        let (selected, peer, named) = (format!("s{f}-b"), format!("s{f}-a"), format!("n{f}-web"));
        rules.sets.insert(selected.clone(), SetKind::Addr(family));
        rules.sets.insert(peer.clone(), SetKind::Addr(family));
        rules.sets.insert(named.clone(), SetKind::AddrPort(family));
        let iso = family.pick(netpol::INGRESS_ISOLATED[0], netpol::INGRESS_ISOLATED[1]);
        elements.insert(iso.into(), BTreeSet::from([Element::Addr(ip(b))]));
        elements.insert(selected.clone(), BTreeSet::from([Element::Addr(ip(b))]));
        elements.insert(peer.clone(), BTreeSet::from([Element::Addr(ip(a))]));
        elements.insert(named.clone(), named_ports(b));
        let rule = |n: usize, from: Peer, ports: Ports| Rule {
            family,
            selected: selected.clone(),
            peer: from,
            ports,
            comment: format!("test/b ingress {n}"),
        };
        rules.ingress.extend([
            rule(0, Peer::Set(peer.clone()), Ports::Range { proto: SCTP, first: 80, last: 80 }),
            rule(1, Peer::Any, Ports::Range { proto: SCTP, first: 8000, last: 8010 }),
            rule(2, Peer::Any, Ports::Range { proto: TCP, first: 443, last: 443 }),
            rule(3, Peer::Any, Ports::Range { proto: UDP, first: 5353, last: 5353 }),
            rule(4, Peer::Any, Ports::Named(named.clone())),
        ]);
    }
    (rules, elements)
}

fn named_ports(b: &str) -> BTreeSet<Element> {
    BTreeSet::from([Element::AddrPort(ip(b), SCTP, 9000), Element::AddrPort(ip(b), TCP, 9001)])
}

#[test]
fn network_policy_table_filters_tcp_udp_and_sctp_traffic() {
    require_root();
    let topology = Topology::new();
    let sctp = NetNs::open(&topology.b.path).unwrap().run(sctp_in_kernel).unwrap();
    if !sctp {
        eprintln!("{NO_SCTP} (socket: protocol not supported): only the TCP and UDP cases run here");
    }
    let mut services =
        vec![(Proto::Tcp, 80), (Proto::Tcp, 443), (Proto::Tcp, 9001), (Proto::Udp, 80), (Proto::Udp, 5353)];
    if sctp {
        services.extend([80, 81, 8000, 8005, 8010, 8011, 9000].map(|port| (Proto::Sctp, port)));
    }
    let _servers = Servers::start(&topology.b, &services);
    let keep =
        |probes: Vec<Probe>| -> Vec<Probe> { probes.into_iter().filter(|p| sctp || p.proto != Proto::Sctp).collect() };

    // Without the table every service answers: the topology and the servers work.
    let open: Vec<Probe> = [(A4, B4), (A6, B6)]
        .into_iter()
        .flat_map(|(a, b)| services.iter().map(move |&(proto, port)| probe(proto, a, b, port, true)))
        .collect();
    expect("no policy", &topology, &open);

    let (rules, elements) = policy();
    topology.in_r(|| netpol::replace(TABLE, &rules, &elements)).unwrap();
    let mut enforced = Vec::new();
    let mut after_update = Vec::new();
    for (a, a_other, b) in [(A4, A4_OTHER, B4), (A6, A6_OTHER, B6)] {
        use Proto::{Sctp, Tcp, Udp};
        enforced.extend(keep(vec![
            probe(Sctp, a, b, 80, true),
            probe(Sctp, a_other, b, 80, false),
            probe(Sctp, a, b, 81, false),
            probe(Sctp, a, b, 8000, true),
            probe(Sctp, a_other, b, 8005, true),
            probe(Sctp, a, b, 8010, true),
            probe(Sctp, a, b, 8011, false),
            probe(Sctp, a, b, 9000, true),
            probe(Tcp, a, b, 80, false),
            probe(Udp, a, b, 80, false),
            probe(Tcp, a, b, 443, true),
            probe(Udp, a, b, 5353, true),
            probe(Tcp, a, b, 9001, true),
        ]));
        after_update.extend(keep(vec![
            probe(Sctp, a, b, 9000, false),
            probe(Tcp, a, b, 9001, false),
            probe(Sctp, a, b, 8005, true),
            probe(Tcp, a, b, 443, true),
        ]));
    }
    expect("policy", &topology, &enforced);

    // The named ports go (as when the pod that named them goes); the rules stay.
    let gone: Elements = [("n4-web", B4), ("n6-web", B6)].map(|(set, b)| (set.to_string(), named_ports(b))).into();
    topology.in_r(|| netpol::update(TABLE, &gone, &Elements::new())).unwrap();
    expect("named ports removed", &topology, &after_update);

    topology.in_r(|| netpol::remove(TABLE)).unwrap();
    expect("table removed", &topology, &open);
}

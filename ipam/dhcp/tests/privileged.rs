//! dhcp as the IPAM of bridge, through libcni, against a real DHCP server (Debian's dnsmasq) in a
//! namespace of its own joined to the pod's bridge by a veth: the lease (address, gateway, classless
//! routes, DNS) on every spec version, renewal at T1, release on DEL (the server's lease file loses
//! it), a pod that vanishes without DEL, a daemon restarted under its pods, STATUS and GC.
//! Privileged; subnets 10.236.x.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use cni_tests::exec::{exec_call, Call, Out};
use cni_tests::{bin_dir, pings, require_root, require_tools, unique, wait_for, LinkGuard, Netns, TempDir};
use libcni::conf::Attachment;
use libcni::conflist::NetworkConfigList;
use libcni::runtime::{CniConfig, RuntimeConf};
use serde_json::{json, Map};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const VERSIONS: [&str; 7] = ["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

/// A bridge, a server namespace on it (10.236.<n>.1/24) and dnsmasq serving 10.236.<n>.10-200 with
/// a router, DNS server, domain and classless routes; `t1` shortens the renewal time (dnsmasq's
/// shortest lease is two minutes, its T1 can be seconds). Or busybox udhcpd ([`Lab::udhcpd`]).
struct Lab {
    n: u8,
    bridge: LinkGuard,
    dir: TempDir,
    server_process: Child,
    server: Netns,
}

/// The bridge, the server's namespace joined to it by a veth (`srv0`, 10.236.<n>.1/24 on the
/// server's side), and a directory for the server's files.
fn lab_network(n: u8) -> (LinkGuard, Netns, TempDir) {
    require_root();
    let bridge = LinkGuard(unique("dhb"));
    cni_tests::sh("ip", &["link", "add", &bridge.0, "type", "bridge"]);
    cni_tests::sh("ip", &["link", "set", &bridge.0, "up"]);
    let server = Netns::new("dhs");
    let veth = unique("dhv");
    cni_tests::sh("ip", &["link", "add", &veth, "type", "veth", "peer", "name", "srv0", "netns", &server.name]);
    cni_tests::sh("ip", &["link", "set", &veth, "master", &bridge.0, "up"]);
    server.ip(&["addr", "add", &format!("10.236.{n}.1/24"), "dev", "srv0"]);
    server.ip(&["link", "set", "srv0", "up"]);
    (bridge, server, TempDir::new("dhcp-lab"))
}

impl Lab {
    fn new(n: u8, t1: Option<u32>) -> Lab {
        require_tools(&["dnsmasq"]);
        let (bridge, server, dir) = lab_network(n);
        let leases = dir.path().join("leases");
        let mut args = vec![
            "netns".to_string(),
            "exec".into(),
            server.name.clone(),
            "dnsmasq".into(),
            "--keep-in-foreground".into(),
            "--conf-file=/dev/null".into(),
            "--port=0".into(),
            "--interface=srv0".into(),
            "--bind-interfaces".into(),
            "--no-ping".into(),
            "--log-dhcp".into(),
            format!("--log-facility={}", dir.path().join("dnsmasq.log").display()),
            format!("--pid-file={}", dir.path().join("dnsmasq.pid").display()),
            format!("--dhcp-leasefile={}", leases.display()),
            format!("--dhcp-range=10.236.{n}.10,10.236.{n}.200,255.255.255.0,2m"),
            format!("--dhcp-option=option:router,10.236.{n}.1"),
            format!("--dhcp-option=option:dns-server,10.236.{n}.53"),
            "--dhcp-option=option:domain-name,dhcp.test".into(),
            format!("--dhcp-option=121,10.99.0.0/16,10.236.{n}.254,0.0.0.0/0,10.236.{n}.1"),
        ];
        if let Some(t1) = t1 {
            args.push(format!("--dhcp-option=option:T1,{t1}"));
        }
        let dnsmasq = Command::new("ip").args(&args).stdin(Stdio::null()).spawn().expect("start dnsmasq");
        assert!(wait_for(Duration::from_secs(5), || leases.exists()), "dnsmasq did not start (no lease file)");
        Lab { n, bridge, dir, server_process: dnsmasq, server }
    }

    /// busybox udhcpd serving 10.236.<n>.10-20 with a router, leases of one second and T1 zero
    /// (renew at once), which dnsmasq will not send; it logs each ACK to `server.log`.
    fn udhcpd(n: u8) -> Lab {
        require_tools(&["busybox"]);
        let (bridge, server, dir) = lab_network(n);
        let conf = dir.path().join("udhcpd.conf");
        let leases = dir.path().join("leases");
        std::fs::write(&leases, "").unwrap();
        std::fs::write(
            &conf,
            format!(
                "start 10.236.{n}.10\nend 10.236.{n}.20\ninterface srv0\nlease_file {}\nmin_lease 1\n\
                 opt subnet 255.255.255.0\nopt router 10.236.{n}.1\nopt lease 1\nopt 0x3a 00000000\n",
                leases.display()
            ),
        )
        .unwrap();
        let log = std::fs::File::create(dir.path().join("server.log")).unwrap();
        let udhcpd = Command::new("ip")
            .args(["netns", "exec", &server.name, "busybox", "udhcpd", "-f"])
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start udhcpd");
        let lab = Lab { n, bridge, dir, server_process: udhcpd, server };
        assert!(wait_for(Duration::from_secs(5), || lab.server_log().contains("started")), "udhcpd did not start");
        lab
    }

    /// The server drops the first DHCP message it gets (~330 bytes), as on a link that has just
    /// come up.
    fn drop_first_message(&self) {
        self.server.sh("nft", &["add", "table", "inet", "dhcplab"]);
        self.server.sh("nft", &["add chain inet dhcplab input { type filter hook input priority 0; }"]);
        self.server.sh("nft", &["add rule inet dhcplab input udp dport 67 quota until 400 bytes drop"]);
    }

    /// The server's leases: (expiry, address, client id as text).
    fn leases(&self) -> Vec<(u64, String, String)> {
        let text = std::fs::read_to_string(self.dir.path().join("leases")).unwrap_or_default();
        text.lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                let id: Vec<u8> = f.get(4)?.split(':').filter_map(|b| u8::from_str_radix(b, 16).ok()).collect();
                // The client id option: type 0, then the text.
                let id = String::from_utf8_lossy(id.get(1..).unwrap_or_default()).into_owned();
                Some((f[0].parse().ok()?, f[2].to_string(), id))
            })
            .collect()
    }

    fn server_log(&self) -> String {
        let dnsmasq = std::fs::read_to_string(self.dir.path().join("dnsmasq.log"));
        dnsmasq.or_else(|_| std::fs::read_to_string(self.dir.path().join("server.log"))).unwrap_or_default()
    }

    fn lease_of(&self, ip: &str) -> Option<(u64, String, String)> {
        self.leases().into_iter().find(|l| l.1 == ip)
    }

    fn list(&self, version: &str, network: &str, daemon: &Daemon) -> NetworkConfigList {
        let v = json!({"cniVersion": version, "name": network, "plugins": [{
            "type": "bridge", "bridge": self.bridge.0,
            "ipam": {"type": "dhcp", "daemonSocketPath": daemon.socket}}]});
        NetworkConfigList::from_bytes(v.to_string().as_bytes()).unwrap()
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        // `ip netns exec` execs the server, so the child is the server itself.
        let _ = self.server_process.kill();
        let _ = self.server_process.wait();
    }
}

/// `dhcp daemon -socketpath <dir>/dhcp.sock`, stderr into <dir>/daemon.log.
struct Daemon {
    child: Child,
    socket: PathBuf,
    log: PathBuf,
}

impl Daemon {
    fn start(dir: &Path, extra: &[&str]) -> Daemon {
        let socket = dir.join("dhcp.sock");
        let log = dir.join("daemon.log");
        let stderr = std::fs::OpenOptions::new().create(true).append(true).open(&log).unwrap();
        let child = Command::new(bin_dir().join("dhcp"))
            .arg("daemon")
            .arg("-socketpath")
            .arg(&socket)
            .args(extra)
            .stdin(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("start dhcp daemon");
        let d = Daemon { child, socket, log };
        assert!(
            wait_for(Duration::from_secs(5), || UnixStream::connect(&d.socket).is_ok()),
            "the daemon does not listen: {}",
            d.log()
        );
        d
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn signal(&mut self, sig: i32) {
        // SAFETY: kill(2) on our own child's pid.
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, sig) }, 0);
        let _ = self.child.wait();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn rt(ns: &Netns) -> RuntimeConf {
    RuntimeConf {
        container_id: unique("dhc"),
        netns: ns.path.clone(),
        ifname: "eth0".into(),
        args: vec![],
        capability_args: Map::new(),
    }
}

/// A libcni client on target/debug with a result cache of its own (the directory, which must live
/// as long as the client).
fn client() -> (TempDir, CniConfig) {
    let cache = TempDir::new("dhcp-cache");
    let cni = CniConfig::with_cache_dir(vec![bin_dir()], cache.path().to_path_buf());
    (cache, cni)
}

/// Server `n`'s lab ([`Lab::new`]) and a daemon beside it: what most tests start from.
fn lab_and_daemon(n: u8, t1: Option<u32>) -> (Lab, Daemon) {
    let lab = Lab::new(n, t1);
    let daemon = Daemon::start(lab.dir.path(), &[]);
    (lab, daemon)
}

fn pod_addrs(ns: &Netns) -> String {
    ns.sh("ip", &["-4", "-o", "addr", "show", "dev", "eth0", "scope", "global"])
}

/// A pod on bridge+dhcp gets the server's address, gateway, classless routes and DNS, reaches the
/// server, and holds a lease under the client id `<containerID>/<network>/eth0`; CHECK passes; DEL
/// releases the lease at the server; a second DEL succeeds. Every version.
#[test]
fn lease_routes_dns_and_release_on_every_version() {
    let (lab, daemon) = lab_and_daemon(1, None);
    let (_cache, cni) = client();
    let n = lab.n;
    for version in VERSIONS {
        let pod = Netns::new("dhp");
        let network = unique("dhn");
        let l = lab.list(version, &network, &daemon);
        let r = rt(&pod);
        let result = cni.add_network_list(&l, &r).unwrap_or_else(|e| panic!("{version}: ADD: {e}\n{}", daemon.log()));
        let ip = &result.ips[0];
        let addr = ip.address.ip().to_string();
        assert!(addr.starts_with(&format!("10.236.{n}.")) && ip.address.prefix() == 24, "{version}: {result:?}");
        assert_eq!(ip.gateway.map(|g| g.to_string()), Some(format!("10.236.{n}.1")), "{version}");
        let routes: Vec<String> = result
            .routes
            .iter()
            .map(|r| format!("{} {}", r.dst, r.gw.map(|g| g.to_string()).unwrap_or_default()))
            .collect();
        assert!(routes.contains(&format!("10.99.0.0/16 10.236.{n}.254")), "{version}: {routes:?}");
        assert!(routes.contains(&format!("0.0.0.0/0 10.236.{n}.1")), "{version}: {routes:?}");
        assert_eq!(result.dns.nameservers, [format!("10.236.{n}.53")], "{version}");
        if version >= "0.3.0" {
            assert_eq!(result.dns.domain.as_deref(), Some("dhcp.test"), "{version}");
        }

        assert!(pod_addrs(&pod).contains(&format!("{addr}/24")), "{version}: {}", pod_addrs(&pod));
        let table = pod.sh("ip", &["-4", "route", "show", "dev", "eth0"]);
        assert!(table.contains(&format!("10.99.0.0/16 via 10.236.{n}.254")), "{version}: {table}");
        assert!(table.contains(&format!("default via 10.236.{n}.1")), "{version}: {table}");
        assert!(pings(&pod, &format!("10.236.{n}.1")), "{version}: the pod cannot reach the DHCP server");
        let lease = lab.lease_of(&addr).unwrap_or_else(|| panic!("{version}: no lease for {addr}: {:?}", lab.leases()));
        assert_eq!(lease.2, format!("{}/{network}/eth0", r.container_id), "{version}");

        if version >= "0.4.0" {
            cni.check_network_list(&l, &r).unwrap_or_else(|e| panic!("{version}: CHECK: {e}"));
        }
        cni.del_network_list(&l, &r).unwrap_or_else(|e| panic!("{version}: DEL: {e}"));
        assert!(
            wait_for(Duration::from_secs(3), || lab.lease_of(&addr).is_none()),
            "{version}: the server still holds {addr} after DEL: {:?}\n{}",
            lab.leases(),
            daemon.log()
        );
        assert!(!pod.exec("ip", &["link", "show", "eth0"]).status.success(), "{version}: eth0 left after DEL");
        cni.del_network_list(&l, &r).unwrap_or_else(|e| panic!("{version}: second DEL: {e}"));
    }
}

/// With T1 at 10 s (the daemon's floor), the daemon renews: the server's lease expiry moves
/// forward while the pod keeps its address.
#[test]
fn renewal_at_t1_keeps_the_address() {
    let (lab, daemon) = lab_and_daemon(2, Some(10));
    let (_cache, cni) = client();
    let pod = Netns::new("dhp");
    let l = lab.list("1.0.0", &unique("dhn"), &daemon);
    let r = rt(&pod);
    let result = cni.add_network_list(&l, &r).unwrap();
    let addr = result.ips[0].address.ip().to_string();
    let first = lab.lease_of(&addr).unwrap().0;
    assert!(
        wait_for(Duration::from_secs(20), || lab.lease_of(&addr).is_some_and(|l| l.0 > first)),
        "no renewal within 20 s (T1 10 s): {:?}\n{}\n{}",
        lab.leases(),
        daemon.log(),
        lab.server_log()
    );
    // dnsmasq writes its lease file before the daemon has read the ACK.
    assert!(wait_for(Duration::from_secs(3), || daemon.log().contains(&format!("renewed {addr}"))), "{}", daemon.log());
    assert!(pod_addrs(&pod).contains(&format!("{addr}/24")));
    assert!(pings(&pod, &format!("10.236.{}.1", lab.n)));
    cni.del_network_list(&l, &r).unwrap();
}

/// A pod whose namespace vanishes without DEL: its lease is dropped at the next renewal, the daemon
/// keeps renewing the other pod's lease and serves new ADDs, and the late DEL succeeds.
#[test]
fn pod_vanishing_without_del_leaves_the_daemon_serving() {
    let (lab, daemon) = lab_and_daemon(3, Some(10));
    let (_cache, cni) = client();
    let l = lab.list("1.1.0", &unique("dhn"), &daemon);
    let mut gone = Netns::new("dhp");
    let kept = Netns::new("dhp");
    let r_gone = rt(&gone);
    let r_kept = rt(&kept);
    cni.add_network_list(&l, &r_gone).unwrap();
    let kept_addr = cni.add_network_list(&l, &r_kept).unwrap().ips[0].address.ip().to_string();
    gone.delete();
    assert!(
        wait_for(Duration::from_secs(20), || daemon.log().contains("the pod is gone")),
        "the daemon did not notice the vanished pod: {}",
        daemon.log()
    );
    let before = lab.lease_of(&kept_addr).unwrap().0;
    assert!(
        wait_for(Duration::from_secs(20), || lab.lease_of(&kept_addr).is_some_and(|l| l.0 > before)),
        "the other pod's lease is no longer renewed: {}",
        daemon.log()
    );
    let third = Netns::new("dhp");
    let r_third = rt(&third);
    cni.add_network_list(&l, &r_third).unwrap();
    cni.del_network_list(&l, &r_gone).unwrap();
    cni.del_network_list(&l, &r_third).unwrap();
    cni.del_network_list(&l, &r_kept).unwrap();
}

/// A daemon killed under its pods leaves its socket behind; a new one starts on it anyway, fails
/// CHECK (103) and answers DEL (twice, success) for the leases it never knew, and serves ADD.
#[test]
fn restarted_daemon_answers_del_for_unknown_leases() {
    let (lab, mut daemon) = lab_and_daemon(4, None);
    let (_cache, cni) = client();
    let l = lab.list("1.0.0", &unique("dhn"), &daemon);
    let pod = Netns::new("dhp");
    let r = rt(&pod);
    cni.add_network_list(&l, &r).unwrap();
    daemon.signal(libc::SIGKILL);
    assert!(daemon.socket.exists(), "SIGKILL leaves the socket file");
    let daemon = Daemon::start(lab.dir.path(), &[]);
    assert!(daemon.log().contains("removed the stale socket"), "{}", daemon.log());
    let e = cni.check_network_list(&l, &r).unwrap_err();
    assert_eq!(e.code, 103, "CHECK of a lease the new daemon does not hold: {e}");
    assert!(e.msg.contains("holds no lease") && e.msg.contains(&r.container_id), "{}", e.msg);
    cni.del_network_list(&l, &r).unwrap();
    cni.del_network_list(&l, &r).unwrap();
    let again = Netns::new("dhp");
    let r2 = rt(&again);
    cni.add_network_list(&l, &r2).unwrap();
    cni.del_network_list(&l, &r2).unwrap();
}

/// STATUS is code 50 naming the socket when no daemon listens, and succeeds when one does; GC
/// releases the leases of attachments that are not valid any more and keeps the others.
#[test]
fn status_needs_the_daemon_and_gc_releases_stale_leases() {
    let lab = Lab::new(5, None);
    let (_cache, cni) = client();
    let network = unique("dhn");
    let socket = lab.dir.path().join("dhcp.sock");
    let v = json!({"cniVersion": "1.1.0", "name": network, "plugins": [{
        "type": "bridge", "bridge": lab.bridge.0, "ipam": {"type": "dhcp", "daemonSocketPath": socket}}]});
    let l = NetworkConfigList::from_bytes(v.to_string().as_bytes()).unwrap();
    let e = cni.status_network_list(&l).unwrap_err();
    assert_eq!(e.code, 50, "{e}");
    assert!(e.msg.contains(&socket.display().to_string()) && e.msg.contains("dhcp daemon"), "{}", e.msg);

    let early = Netns::new("dhp");
    let e = cni.add_network_list(&l, &rt(&early)).unwrap_err();
    assert_eq!(e.code, 11, "ADD without a daemon: {e}");
    assert!(!early.exec("ip", &["link", "show", "eth0"]).status.success(), "the failed ADD left eth0");

    let daemon = Daemon::start(lab.dir.path(), &[]);
    cni.status_network_list(&l).unwrap();
    let (a, b) = (Netns::new("dhp"), Netns::new("dhp"));
    let (ra, rb) = (rt(&a), rt(&b));
    let addr_a = cni.add_network_list(&l, &ra).unwrap().ips[0].address.ip().to_string();
    let addr_b = cni.add_network_list(&l, &rb).unwrap().ips[0].address.ip().to_string();
    let valid = [Attachment { container_id: ra.container_id.clone(), ifname: "eth0".into() }];
    cni.gc_network_list(&l, Some(&valid)).unwrap();
    assert!(
        wait_for(Duration::from_secs(3), || lab.lease_of(&addr_b).is_none()),
        "GC left the stale lease of {addr_b}: {:?}\n{}",
        lab.leases(),
        daemon.log()
    );
    assert!(lab.lease_of(&addr_a).is_some(), "GC released a valid attachment's lease");
    cni.del_network_list(&l, &ra).unwrap();
    cni.del_network_list(&l, &rb).unwrap();
}

/// No server answers: after the retries (-timeout 1s -resendmax 1s) ADD fails with code 100 naming
/// the interface, and bridge undoes the pod's interface and port.
#[test]
fn no_server_fails_add_with_code_100_and_leaves_nothing() {
    require_root();
    let bridge = LinkGuard(unique("dhb"));
    cni_tests::sh("ip", &["link", "add", &bridge.0, "type", "bridge"]);
    cni_tests::sh("ip", &["link", "set", &bridge.0, "up"]);
    let dir = TempDir::new("dhcp-lab");
    let daemon = Daemon::start(dir.path(), &["-timeout", "1s", "-resendmax", "1s"]);
    let (_cache, cni) = client();
    let v = json!({"cniVersion": "1.0.0", "name": unique("dhn"), "plugins": [{
        "type": "bridge", "bridge": bridge.0, "ipam": {"type": "dhcp", "daemonSocketPath": daemon.socket}}]});
    let l = NetworkConfigList::from_bytes(v.to_string().as_bytes()).unwrap();
    let pod = Netns::new("dhp");
    let e = cni.add_network_list(&l, &rt(&pod)).unwrap_err();
    assert_eq!(e.code, 100, "{e}");
    assert!(e.msg.contains("no DHCP lease") && e.msg.contains("eth0"), "{}", e.msg);
    assert!(!pod.exec("ip", &["link", "show", "eth0"]).status.success(), "the failed ADD left eth0");
    assert!(cni_tests::bridge_ports(&bridge.0).is_empty(), "the failed ADD left a port");
}

/// The first DISCOVER is lost: the client sends it again after a second, within the same attempt,
/// instead of waiting out the whole -timeout and retrying.
#[test]
fn a_lost_first_message_is_sent_again_within_the_attempt() {
    let (lab, daemon) = lab_and_daemon(6, None);
    lab.drop_first_message();
    let (_cache, cni) = client();
    let l = lab.list("1.0.0", &unique("dhn"), &daemon);
    let pod = Netns::new("dhp");
    let r = rt(&pod);
    cni.add_network_list(&l, &r).unwrap();
    let log = daemon.log();
    assert!(!log.contains("retrying"), "the lost message cost a whole attempt: {log}");
    let counters = lab.server.sh("nft", &["list", "table", "inet", "dhcplab"]);
    assert!(counters.contains("used"), "the server's drop rule saw nothing: {counters}");
    cni.del_network_list(&l, &r).unwrap();
}

/// Runs the dhcp plugin itself (no interface plugin in front) on an interface the test made.
fn dhcp_plugin(command: &str, conf: &serde_json::Value, pod: &Netns, cid: &str) -> Out {
    exec_call(bin_dir().join("dhcp"), &Call::new(command, cid, &pod.path).path(bin_dir()), conf)
}

/// Two ADDs for one attachment at once (a runtime retrying a slow ADD): one gets the lease, the
/// other is told to try again (11); after DEL nothing renews the address behind the daemon's back.
#[test]
fn concurrent_adds_for_one_attachment_make_one_lease() {
    let (lab, daemon) = lab_and_daemon(7, Some(10));
    lab.drop_first_message();
    let pod = Netns::new("dhp");
    let host = unique("dhv");
    cni_tests::sh("ip", &["link", "add", &host, "type", "veth", "peer", "name", "eth0", "netns", &pod.name]);
    cni_tests::sh("ip", &["link", "set", &host, "master", &lab.bridge.0, "up"]);
    let conf = json!({"cniVersion": "1.0.0", "name": unique("dhn"), "type": "bridge",
        "ipam": {"type": "dhcp", "daemonSocketPath": daemon.socket}});
    let cid = unique("dhc");
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| dhcp_plugin("ADD", &conf, &pod, &cid));
        std::thread::sleep(Duration::from_millis(300));
        let b = s.spawn(|| dhcp_plugin("ADD", &conf, &pod, &cid));
        (a.join().unwrap(), b.join().unwrap())
    });
    let addr = a.ok()["ips"][0]["address"].as_str().unwrap().to_string();
    assert_eq!(b.err_code(), 11, "{}", b.stdout);
    // As an interface plugin would: renewals leave from this address.
    pod.ip(&["addr", "add", &addr, "dev", "eth0"]);
    let ip = addr.split('/').next().unwrap().to_string();
    dhcp_plugin("DEL", &conf, &pod, &cid).ok();
    assert!(wait_for(Duration::from_secs(3), || lab.lease_of(&ip).is_none()), "{:?}", lab.leases());
    // Past T1 (10 s): a second lease's thread would have renewed the address by now.
    std::thread::sleep(Duration::from_secs(12));
    assert!(lab.lease_of(&ip).is_none(), "the address was renewed after DEL: {}", daemon.log());
    let _ = cni_tests::run("ip", &["link", "del", &host]);
}

/// ACKs udhcpd has logged.
fn acks(lab: &Lab) -> usize {
    lab.server_log().matches("sending ACK").count()
}

/// A server sending T1 zero and a lease of one second (busybox udhcpd) gets no renewal storm: the
/// daemon logs what the server sent and the timers it uses instead, sends no renewal for 10 s (the
/// server has answered only the lease's REQUEST), and then renews.
#[test]
fn a_zero_renewal_time_is_raised_to_the_floor() {
    let lab = Lab::udhcpd(8);
    let daemon = Daemon::start(lab.dir.path(), &[]);
    let (_cache, cni) = client();
    let l = lab.list("1.0.0", &unique("dhn"), &daemon);
    let pod = Netns::new("dhp");
    let r = rt(&pod);
    let result = cni.add_network_list(&l, &r).unwrap_or_else(|e| panic!("ADD: {e}\n{}", daemon.log()));
    let leased = std::time::Instant::now();
    let addr = result.ips[0].address.ip().to_string();
    std::thread::sleep(Duration::from_secs(8));
    assert_eq!(acks(&lab), 1, "renewals before the floor:\n{}\n{}", daemon.log(), lab.server_log());
    let log = daemon.log();
    assert!(
        log.contains(&format!(
            "gave {addr} renewal (T1) 0 s, rebinding (T2) 0 s, lease 1 s; renewing no sooner than 10 s"
        )),
        "{log}"
    );
    assert!(
        wait_for(Duration::from_secs(10), || daemon.log().contains(&format!("renewed {addr}"))),
        "no renewal after the floor: {}\n{}",
        daemon.log(),
        lab.server_log()
    );
    assert!(leased.elapsed() >= Duration::from_secs(9), "renewed after {:?}", leased.elapsed());
    assert_eq!(acks(&lab), 2, "{}", lab.server_log());
    assert!(pod_addrs(&pod).contains(&format!("{addr}/24")));
    cni.del_network_list(&l, &r).unwrap();
}

/// A caller that connects and sends nothing, and one that sends a byte a second, hold neither the
/// daemon nor a thread: a real ADD meanwhile succeeds, and each is answered with code 5 and closed
/// once the call's 10 s have passed.
#[test]
fn a_silent_caller_is_cut_off_while_add_goes_on() {
    use std::io::{Read, Write};
    let (lab, daemon) = lab_and_daemon(9, None);
    let silent = UnixStream::connect(&daemon.socket).unwrap();
    let trickle = UnixStream::connect(&daemon.socket).unwrap();
    let started = std::time::Instant::now();
    let dripping = {
        let mut t = trickle.try_clone().unwrap();
        std::thread::spawn(move || {
            for b in b"{\"method\":\"status\"".iter().cycle().take(30) {
                if t.write_all(&[*b]).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_secs(1));
            }
        })
    };
    let (_cache, cni) = client();
    let l = lab.list("1.0.0", &unique("dhn"), &daemon);
    let pod = Netns::new("dhp");
    let r = rt(&pod);
    let result = cni.add_network_list(&l, &r).unwrap_or_else(|e| panic!("ADD beside the silent callers: {e}"));
    assert!(pod_addrs(&pod).contains(&format!("{}/24", result.ips[0].address.ip())));
    for (what, mut stream) in [("silent", silent), ("trickling", trickle)] {
        stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut answer = String::new();
        stream
            .read_to_string(&mut answer)
            .unwrap_or_else(|e| panic!("{what}: the daemon still holds the connection after 20 s: {e}"));
        let elapsed = started.elapsed();
        assert!(elapsed >= Duration::from_secs(9), "{what}: closed after {elapsed:?}");
        assert!(answer.contains("\"code\":5") && answer.contains("no complete call within 10 s"), "{what}: {answer:?}");
    }
    dripping.join().unwrap();
    assert!(daemon.log().contains("closing its connection"), "{}", daemon.log());
    cni.del_network_list(&l, &r).unwrap();
}

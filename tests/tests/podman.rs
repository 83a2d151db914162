//! A real container runtime end to end: podman (its CNI backend, runc) runs busybox httpd on the
//! network of the shipped conf/podman.conflist with a published port, through our bridge,
//! host-local, portmap and loopback; the page must answer from the host, and `podman rm` must leave
//! no address, port, veth or rule behind.
//!
//! Nothing global is touched: podman gets its own containers.conf (CONTAINERS_CONF), storage.conf
//! (CONTAINERS_STORAGE_CONF) and --root/--runroot/--tmpdir in a temp dir; its network_config_dir is
//! a temp dir holding conf/podman.conflist read from the repository, with one change: the IPAM
//! `dataDir` (/run/cni-rs-podman/ipam as shipped) is pointed into the temp dir, so the test neither
//! leaves reservations in /run nor trips over a human's. The bridge (cnirs-pod0) is removed at the
//! end only if this test made it. The one thing podman itself writes outside is its libcni result
//! cache, /var/lib/cni/results/cnirs-podman-<id>-eth0 (not configurable in podman 4), which DEL
//! removes; the test checks that too.
//!
//! The second test runs podman's default chain (conf/podman-firewall.conflist: bridge, portmap,
//! firewall, tuning) the same way, but with podman inside a network namespace of its own (the
//! node: `nsenter --net`, podman's mount namespace stays the host's) whose FORWARD policy is DROP:
//! the published port answers from the node, the container reaches a server beyond the node only
//! through the firewall plugin's rules, and `podman rm` leaves no link, element or rule. The
//! policy, the bridge and every rule live and die with that namespace, so nothing can leak.
//!
//! CI (CI=true, root): a missing podman, runc, busybox or CNI backend fails the test. Locally
//! without them it prints a note and passes.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod e2e;

use cni_tests::{bin_dir, prerequisite, require_root, run, unique, Netns, TempDir};
use e2e::*;
use serde_json::Value;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

const BUSYBOX: &str = "/bin/busybox";
const PAGE: &str = "hello from a podman container on cni-rs\n";

/// A podman confined to one temp dir; its Drop removes the container, the netns, mounts, the
/// bridge (if this test made it) and the dir, whatever state the test stopped in.
struct Podman {
    dir: TempDir,
    /// The network namespace podman runs in (its name under /run/netns), None for the host's.
    netns: Option<String>,
    bridge: String,
    bridge_was_there: bool,
    network: String,
    ctr_name: String,
    ctr_id: Option<String>,
    sandbox: Option<String>,
}

impl Podman {
    fn path(&self, sub: &str) -> PathBuf {
        self.dir.path().join(sub)
    }

    fn cmd(&self, args: &[&str]) -> Output {
        let p = |s: &str| self.path(s).to_string_lossy().into_owned();
        let mut podman = match &self.netns {
            Some(ns) => {
                let mut c = Command::new("nsenter");
                c.arg(format!("--net=/run/netns/{ns}")).arg("podman");
                c
            }
            None => Command::new("podman"),
        };
        podman
            .env("CONTAINERS_CONF", p("containers.conf"))
            .env("CONTAINERS_STORAGE_CONF", p("storage.conf"))
            .args(["--root", &p("root"), "--runroot", &p("runroot"), "--tmpdir", &p("tmp")])
            .args(["--storage-driver", "vfs", "--network-config-dir", &p("net")])
            // runc, not crun (crun fails on this kernel's cgroup layout); no systemd, no journald.
            .args(["--runtime", "runc", "--cgroup-manager", "cgroupfs", "--events-backend", "file"])
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("run podman: {e}"))
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.cmd(args);
        assert!(
            out.status.success(),
            "podman {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn cleanup(&mut self) {
        // `-t 0`: httpd as pid 1 ignores SIGTERM, so the default would wait 10 s for SIGKILL.
        let _ = self.cmd(&["rm", "-f", "-t", "0", &self.ctr_name]);
        let all = self.cmd(&["ps", "-aq"]);
        for id in String::from_utf8_lossy(&all.stdout).split_whitespace() {
            let _ = self.cmd(&["rm", "-f", "-t", "0", id]);
        }
        if let Some(sb) = self.sandbox.take() {
            if Path::new(&sb).exists() {
                if let Some(name) = Path::new(&sb).file_name() {
                    let _ = run("ip", &["netns", "del", &name.to_string_lossy()]);
                }
            }
        }
        if let Some(id) = &self.ctr_id {
            let _ = std::fs::remove_file(format!("/var/lib/cni/results/{}-{id}-eth0", self.network));
        }
        unmount_all_under(self.dir.path());
        if !self.bridge_was_there {
            match &self.netns {
                Some(ns) => drop(run("ip", &["-n", ns, "link", "del", &self.bridge])),
                None => drop(run("ip", &["link", "del", &self.bridge])),
            }
        }
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        self.cleanup();
        // the TempDir field is removed after this
    }
}

/// What the test needs installed; false (locally) or a failure (CI) when something is missing.
fn prerequisites() -> bool {
    prerequisite(runs("podman", &["--version"]), "podman is not installed (apt-get install podman)")
        && prerequisite(runs("runc", &["--version"]), "runc is not installed (apt-get install runc)")
        && prerequisite(Path::new(BUSYBOX).is_file(), "/bin/busybox is missing (apt-get install busybox-static)")
}

/// A rootfs with nothing but a static busybox (and its applet links) and /www/index.html.
fn busybox_rootfs(root: &Path) {
    std::fs::create_dir_all(root.join("bin")).unwrap();
    std::fs::create_dir_all(root.join("www")).unwrap();
    std::fs::copy(BUSYBOX, root.join("bin/busybox")).unwrap();
    for applet in ["sh", "httpd", "ip", "ls", "cat", "nc"] {
        std::os::unix::fs::symlink("busybox", root.join("bin").join(applet)).unwrap();
    }
    std::fs::write(root.join("www/index.html"), PAGE).unwrap();
}

/// conf/<name> from the repo, with the IPAM dataDir moved to `data_dir`.
fn shipped_conflist(name: &str, data_dir: &Path) -> Value {
    let file = repo_root().join("conf").join(name);
    let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let mut conf: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let ipam = &mut conf["plugins"][0]["ipam"];
    assert_eq!(ipam["type"], "host-local", "conf/{name}: expected bridge with host-local first");
    ipam["dataDir"] = Value::String(data_dir.to_string_lossy().into_owned());
    conf
}

/// A container of `Podman::start`: its id and address, the network's subnet and gateway, and
/// where host-local keeps its reservations.
struct Started {
    id: String,
    ip: Ipv4Addr,
    port: u16,
    gateway: Ipv4Addr,
    data_dir: PathBuf,
}

impl Podman {
    /// A podman confined to a temp dir (see the module doc) whose only network is conf/`conflist`,
    /// running in `netns` (None: the host's). None when podman's backend is not CNI (locally).
    fn new(conflist: &str, netns: Option<String>) -> Option<(Podman, Value)> {
        let dir = TempDir::new("cnirs-podman-");
        let conf = shipped_conflist(conflist, &dir.path().join("ipam"));
        let bridge = conf["plugins"][0]["bridge"].as_str().expect("bridge").to_string();
        let pm = Podman {
            bridge_was_there: netns.is_none() && link_exists(&bridge),
            netns,
            dir,
            bridge,
            network: conf["name"].as_str().expect("name").to_string(),
            ctr_name: unique("cnirs-web-"),
            ctr_id: None,
            sandbox: None,
        };
        for sub in ["net", "root", "runroot", "tmp", "rootfs"] {
            std::fs::create_dir_all(pm.path(sub)).unwrap();
        }
        std::fs::write(pm.path("net").join(conflist), serde_json::to_string_pretty(&conf).unwrap()).unwrap();
        busybox_rootfs(&pm.path("rootfs"));
        let containers_conf = format!(
            "[network]\nnetwork_backend = \"cni\"\ncni_plugin_dirs = [{:?}]\nnetwork_config_dir = {:?}\n\n\
             [engine]\nruntime = \"runc\"\ncgroup_manager = \"cgroupfs\"\nevents_logger = \"file\"\ntmp_dir = {:?}\n",
            bin_dir().to_string_lossy(),
            pm.path("net").to_string_lossy(),
            pm.path("tmp").to_string_lossy(),
        );
        std::fs::write(pm.path("containers.conf"), containers_conf).unwrap();
        let storage_conf = format!(
            "[storage]\ndriver = \"vfs\"\ngraphroot = {:?}\nrunroot = {:?}\n",
            pm.path("root").to_string_lossy(),
            pm.path("runroot").to_string_lossy()
        );
        std::fs::write(pm.path("storage.conf"), storage_conf).unwrap();

        // Podman 5 dropped the CNI backend; this one must still have it, and see our network.
        let backend = pm.ok(&["info", "--format", "{{.Host.NetworkBackend}}"]);
        if !prerequisite(backend.trim() == "cni", &format!("podman's network backend is {:?}, not cni", backend.trim()))
        {
            return None;
        }
        let nets = pm.ok(&["network", "ls", "--format", "{{.Name}}"]);
        assert!(nets.lines().any(|l| l == pm.network), "podman does not see {}: {nets}", pm.network);
        Some((pm, conf))
    }

    /// Runs busybox httpd with a published port on the network; checks what podman inspect says
    /// (an address in the subnet, the gateway, running) and host-local's reservation.
    fn start(&mut self, conf: &Value) -> Started {
        let network = self.network.clone();
        let ipam = &conf["plugins"][0]["ipam"];
        let subnet = ipam["ranges"][0][0]["subnet"].as_str().expect("subnet").to_string();
        let gateway: Ipv4Addr = ipam["ranges"][0][0]["gateway"].as_str().expect("gateway").parse().expect("gateway");
        let port = free_port();
        let rootfs = self.path("rootfs").to_string_lossy().into_owned();
        let publish = format!("{port}:80");
        let ctr_name = self.ctr_name.clone();
        // podman asks runc for nofile=1048576 by default; without CAP_SYS_RESOURCE (this host's root
        // lacks it) runc cannot raise the hard limit and fails ("error setting rlimit type 7").
        let limits = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"];
        let httpd = ["/bin/busybox", "httpd", "-f", "-p", "80", "-h", "/www"];
        let mut args = vec!["run", "-d", "--name", &ctr_name, "--network", &network, "-p", &publish];
        args.extend(limits);
        // `--rootfs` is a boolean: the first positional argument is then the rootfs instead of an
        // image, and everything after it is the command, so every option must come before it.
        args.extend(["--rootfs", &rootfs]);
        args.extend(httpd);
        let id = self.ok(&args).trim().to_string();
        self.ctr_id = Some(id.clone());
        let inspect: Value = serde_json::from_str(&self.ok(&["inspect", &id])).expect("podman inspect JSON");
        let ctr = &inspect[0];
        self.sandbox = ctr["NetworkSettings"]["SandboxKey"].as_str().map(String::from);
        let net = &ctr["NetworkSettings"]["Networks"][&network];
        let ip_text = net["IPAddress"].as_str().unwrap_or_default().to_string();
        let ip: Ipv4Addr =
            ip_text.parse().unwrap_or_else(|_| panic!("no address for {network} in podman inspect: {ctr}"));
        assert!(in_v4_subnet(ip, &subnet), "container address {ip} is not in {subnet}");
        assert_eq!(net["Gateway"], gateway.to_string());
        assert_eq!(ctr["State"]["Running"], true, "container not running: {}", ctr["State"]);

        // host-local's reservation, owned by the container.
        let data_dir = self.path("ipam");
        let res = reservation_owners(&data_dir, &network);
        assert_eq!(res, vec![(ip.to_string(), id.clone())], "reservations in {}", data_dir.join(&network).display());
        Started { id, ip, port, gateway, data_dir }
    }

    /// After `podman rm`: no container, reservation, netns, or CNI result cache of it is left.
    fn assert_removed(&self, s: &Started) {
        assert!(self.ok(&["ps", "-aq"]).trim().is_empty(), "containers left after rm");
        let left = reservation_owners(&s.data_dir, &self.network);
        assert!(left.is_empty(), "reservations left: {left:?}");
        if let Some(sb) = &self.sandbox {
            assert!(!Path::new(sb).exists(), "netns {sb} left after rm");
        }
        let cached = format!("/var/lib/cni/results/{}-{}-eth0", self.network, s.id);
        assert!(!Path::new(&cached).exists(), "podman's CNI cache {cached} left after rm");
    }

    /// The guard's cleanup leaves no mount and nothing in the temp dir's place.
    fn finish(mut self) {
        let tmp = self.dir.path().to_path_buf();
        self.cleanup();
        let left = mounts_under(&tmp);
        assert!(left.is_empty(), "mounts left under {}: {left:?}", tmp.display());
        drop(self);
        assert!(!tmp.exists(), "{} not removed", tmp.display());
    }
}

#[test]
fn podman_runs_httpd_on_the_shipped_conflist_and_rm_leaves_nothing() {
    if !prerequisites() {
        return;
    }
    require_root();
    let started = Instant::now();
    let Some((mut pm, conf)) = Podman::new("podman.conflist", None) else { return };
    let bridge = pm.bridge.clone();
    let s = pm.start(&conf);
    let (id, ip, port, gateway) = (s.id.clone(), s.ip, s.port, s.gateway);

    assert_attached(&s.data_dir, &pm.network, &bridge, &ip.to_string(), &id, "container");

    // The page, from the host: loopback and the bridge's gateway address.
    let logs = || String::from_utf8_lossy(&pm.cmd(&["logs", &id]).stderr).into_owned();
    for addr in [IpAddr::V4(Ipv4Addr::LOCALHOST), IpAddr::V4(gateway)] {
        let body = http_get_retry(addr, port, Duration::from_secs(10));
        assert_eq!(body.as_deref(), Some(PAGE), "GET http://{addr}:{port}/ (container logs: {})", logs());
    }

    // rm: nothing of the container may be left.
    pm.ok(&["rm", "-f", "-t", "0", &id]);
    pm.assert_removed(&s);
    assert_detached(&s.data_dir, &pm.network, &bridge, &ip.to_string(), &id);
    for addr in [IpAddr::V4(Ipv4Addr::LOCALHOST), IpAddr::V4(gateway)] {
        assert_eq!(http_get(addr, port), None, "http://{addr}:{port}/ still answers after rm");
    }
    let bridge_was_there = pm.bridge_was_there;
    pm.finish();
    assert!(bridge_was_there || !link_exists(&bridge), "{bridge} (made by this test) not removed");
    eprintln!("podman end-to-end took {:.1}s", started.elapsed().as_secs_f64());
}

/// A child process killed (and reaped) on drop.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `curl` of `url` inside `ns`: the body on a 2xx answer, None otherwise (2 s per try), retried
/// until `within` has passed.
fn curl_in(ns: &Netns, url: &str, within: Duration) -> Option<String> {
    let start = Instant::now();
    loop {
        let out = ns.exec("curl", &["-s", "-f", "-m", "2", url]);
        if out.status.success() {
            return Some(String::from_utf8_lossy(&out.stdout).into_owned());
        }
        if start.elapsed() >= within {
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Every rule and element in `ns`: `nft list ruleset`, `iptables-save`, `ip6tables-save`.
fn firewall_dump_in(ns: &Netns) -> String {
    let tools = [("nft", &["list", "ruleset"][..]), ("iptables-save", &[][..]), ("ip6tables-save", &[][..])];
    tools.iter().map(|(cmd, args)| ns.sh(cmd, args)).collect::<Vec<_>>().join("\n")
}

/// The names of the links in `ns`.
fn links_in(ns: &Netns) -> Vec<String> {
    let out = ns.ip(&["-o", "link", "show"]);
    let mut names: Vec<String> =
        out.lines().filter_map(|l| Some(l.split(": ").nth(1)?.split('@').next()?.to_string())).collect();
    names.sort();
    names
}

/// podman's default chain (conf/podman-firewall.conflist: bridge with ipMasq, portmap, firewall,
/// tuning) under podman, on a node (its own netns) whose FORWARD policy is DROP. The published
/// port answers from the node; the container reaches a server on another network through the
/// node, and without the firewall plugin's `-s <ip>/32 -j ACCEPT` the DROP policy stops it; after
/// `podman rm` the node has exactly the links it had besides the bridge, and no rule or element
/// names the container.
#[test]
fn podman_firewall_chain_under_a_forward_drop_policy_and_rm_leaves_nothing() {
    if !prerequisites() {
        return;
    }
    require_root();
    if !prerequisite(runs("nsenter", &["--version"]), "nsenter is not installed (apt-get install util-linux)") {
        return;
    }
    let started = Instant::now();
    let node = Netns::new("cnirs-pfw-node");
    let outside = Netns::new("cnirs-pfw-out");
    node.ip(&["link", "add", "fwn0", "type", "veth", "peer", "name", "fwo0", "netns", &outside.name]);
    node.ip(&["addr", "add", "10.89.78.1/24", "dev", "fwn0"]);
    node.ip(&["link", "set", "fwn0", "up"]);
    outside.ip(&["addr", "add", "10.89.78.2/24", "dev", "fwo0"]);
    outside.ip(&["link", "set", "fwo0", "up"]);
    let www = TempDir::new("cnirs-pfw-www");
    std::fs::write(www.path().join("index.html"), "outside\n").unwrap();
    let server = Command::new("ip")
        .args(["netns", "exec", &outside.name, BUSYBOX, "httpd", "-f", "-p", "8080", "-h"])
        .arg(www.path())
        .spawn()
        .expect("start httpd in the outside netns");
    let _server = Killed(server);
    assert_eq!(curl_in(&node, "http://10.89.78.2:8080/", Duration::from_secs(10)).as_deref(), Some("outside\n"));
    node.sh("iptables", &["-P", "FORWARD", "DROP"]);
    let policy = node.sh("iptables", &["-S", "FORWARD"]);
    assert!(policy.lines().any(|l| l == "-P FORWARD DROP"), "FORWARD policy in the node: {policy}");
    let links_before = links_in(&node);

    let Some((mut pm, conf)) = Podman::new("podman-firewall.conflist", Some(node.name.clone())) else { return };
    assert_eq!(
        conf["plugins"].as_array().unwrap().iter().map(|p| p["type"].as_str().unwrap()).collect::<Vec<_>>(),
        ["bridge", "portmap", "firewall", "tuning"],
        "conf/podman-firewall.conflist"
    );
    let bridge = pm.bridge.clone();
    let s = pm.start(&conf);
    let (id, ip) = (s.id.clone(), s.ip.to_string());
    let ports = node.sh("ip", &["-o", "link", "show", "master", &bridge]);
    assert_eq!(ports.lines().count(), 1, "ports of {bridge} in the node: {ports}");
    let forward = node.sh("iptables", &["-S", "CNI-FORWARD"]);
    assert!(forward.lines().any(|l| l == format!("-A CNI-FORWARD -s {ip}/32 -j ACCEPT")), "CNI-FORWARD: {forward}");

    // The page, from the node: loopback and the bridge's gateway address.
    let logs = || String::from_utf8_lossy(&pm.cmd(&["logs", &id]).stderr).into_owned();
    for addr in [Ipv4Addr::LOCALHOST, s.gateway] {
        let url = format!("http://{addr}:{}/", s.port);
        let body = curl_in(&node, &url, Duration::from_secs(10));
        assert_eq!(body.as_deref(), Some(PAGE), "GET {url} in the node (container logs: {})", logs());
    }

    // The container's own traffic is forwarded under the DROP policy by the firewall plugin's
    // rules, and by nothing else: without its accept, the same request fails.
    // busybox nc, not wget: the static busybox's wget crashes in a rootfs without glibc's NSS.
    let get = "printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 3 10.89.78.2 8080";
    let request = ["exec", &id, "/bin/sh", "-c", get];
    let page =
        |out: &str| out.lines().next().is_some_and(|l| l.contains(" 200 ")) && out.ends_with("\r\n\r\noutside\n");
    let out = pm.ok(&request);
    assert!(page(&out), "the container cannot reach the server beyond the node: {out:?}");
    let accept = ["CNI-FORWARD", "-s", &format!("{ip}/32"), "-j", "ACCEPT"];
    node.sh("iptables", &[&["-D"][..], &accept[..]].concat());
    let out = String::from_utf8_lossy(&pm.cmd(&request).stdout).into_owned();
    assert!(!page(&out), "the FORWARD DROP policy does not apply to the container's traffic: {out:?}");
    node.sh("iptables", &[&["-A"][..], &accept[..]].concat());
    let out = pm.ok(&request);
    assert!(page(&out), "the container cannot reach the server with the accept back: {out:?}");

    // rm: nothing of the container may be left in the node.
    pm.ok(&["rm", "-f", "-t", "0", &id]);
    pm.assert_removed(&s);
    let mut expected = links_before.clone();
    expected.push(bridge.clone());
    expected.sort();
    assert_eq!(links_in(&node), expected, "links of the node after rm (before the container: {links_before:?})");
    let rules = firewall_dump_in(&node);
    for needle in [ip.clone(), id.clone()] {
        assert!(!mentions(&rules, &needle), "rules still name {needle}:\n{}", lines_mentioning(&rules, &needle));
    }
    for addr in [Ipv4Addr::LOCALHOST, s.gateway] {
        let url = format!("http://{addr}:{}/", s.port);
        assert_eq!(curl_in(&node, &url, Duration::ZERO), None, "{url} still answers in the node after rm");
    }
    pm.finish();
    eprintln!("podman firewall chain end-to-end took {:.1}s", started.elapsed().as_secs_f64());
}

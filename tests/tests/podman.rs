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
//! CI (CI=true, root): a missing podman, runc, busybox or CNI backend fails the test. Locally
//! without them it prints a note and passes.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod e2e;

use cni_tests::{bin_dir, prerequisite, require_root, run, unique, TempDir};
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
        Command::new("podman")
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
            let _ = run("ip", &["link", "del", &self.bridge]);
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
    for applet in ["sh", "httpd", "ip", "ls", "cat"] {
        std::os::unix::fs::symlink("busybox", root.join("bin").join(applet)).unwrap();
    }
    std::fs::write(root.join("www/index.html"), PAGE).unwrap();
}

/// conf/podman.conflist from the repo, with the IPAM dataDir moved to `data_dir`.
fn shipped_conflist(data_dir: &Path) -> Value {
    let file = repo_root().join("conf/podman.conflist");
    let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let mut conf: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let ipam = &mut conf["plugins"][0]["ipam"];
    assert_eq!(ipam["type"], "host-local", "conf/podman.conflist: expected bridge with host-local first");
    ipam["dataDir"] = Value::String(data_dir.to_string_lossy().into_owned());
    conf
}

#[test]
fn podman_runs_httpd_on_the_shipped_conflist_and_rm_leaves_nothing() {
    if !prerequisites() {
        return;
    }
    require_root();
    let started = Instant::now();
    let bins = bin_dir();

    let dir = TempDir::new("cnirs-podman-");
    let data_dir = dir.path().join("ipam");
    let conf = shipped_conflist(&data_dir);
    let network = conf["name"].as_str().expect("name").to_string();
    let bridge = conf["plugins"][0]["bridge"].as_str().expect("bridge").to_string();
    let ipam = &conf["plugins"][0]["ipam"];
    let subnet = ipam["ranges"][0][0]["subnet"].as_str().expect("subnet").to_string();
    let gateway: Ipv4Addr = ipam["ranges"][0][0]["gateway"].as_str().expect("gateway").parse().expect("gateway");

    let mut pm = Podman {
        bridge_was_there: link_exists(&bridge),
        dir,
        bridge: bridge.clone(),
        network: network.clone(),
        ctr_name: unique("cnirs-web-"),
        ctr_id: None,
        sandbox: None,
    };
    for sub in ["net", "root", "runroot", "tmp", "rootfs"] {
        std::fs::create_dir_all(pm.path(sub)).unwrap();
    }
    std::fs::write(pm.path("net/podman.conflist"), serde_json::to_string_pretty(&conf).unwrap()).unwrap();
    busybox_rootfs(&pm.path("rootfs"));
    let containers_conf = format!(
        "[network]\nnetwork_backend = \"cni\"\ncni_plugin_dirs = [{:?}]\nnetwork_config_dir = {:?}\n\n\
         [engine]\nruntime = \"runc\"\ncgroup_manager = \"cgroupfs\"\nevents_logger = \"file\"\ntmp_dir = {:?}\n",
        bins.to_string_lossy(),
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
    if !prerequisite(backend.trim() == "cni", &format!("podman's network backend is {:?}, not cni", backend.trim())) {
        return;
    }
    let nets = pm.ok(&["network", "ls", "--format", "{{.Name}}"]);
    assert!(nets.lines().any(|l| l == network), "podman does not see {network}: {nets}");

    // Run httpd with a published port.
    let port = free_port();
    let rootfs = pm.path("rootfs").to_string_lossy().into_owned();
    let publish = format!("{port}:80");
    let ctr_name = pm.ctr_name.clone();
    // podman asks runc for nofile=1048576 by default; without CAP_SYS_RESOURCE (this host's root
    // lacks it) runc cannot raise the hard limit and fails ("error setting rlimit type 7").
    let limits = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"];
    let httpd = ["/bin/busybox", "httpd", "-f", "-p", "80", "-h", "/www"];
    let mut args = vec!["run", "-d", "--name", &ctr_name, "--network", &network, "-p", &publish];
    args.extend(limits);
    // `--rootfs` is a boolean: the first positional argument is then the rootfs instead of an image,
    // and everything after it is the command, so every option must come before it.
    args.extend(["--rootfs", &rootfs]);
    args.extend(httpd);
    let id = pm.ok(&args).trim().to_string();
    pm.ctr_id = Some(id.clone());
    let inspect: Value = serde_json::from_str(&pm.ok(&["inspect", &id])).expect("podman inspect JSON");
    let ctr = &inspect[0];
    pm.sandbox = ctr["NetworkSettings"]["SandboxKey"].as_str().map(String::from);
    let ip_text = ctr["NetworkSettings"]["Networks"][&network]["IPAddress"].as_str().unwrap_or_default().to_string();
    let ip: Ipv4Addr = ip_text.parse().unwrap_or_else(|_| panic!("no address for {network} in podman inspect: {ctr}"));
    assert!(in_v4_subnet(ip, &subnet), "container address {ip} is not in {subnet}");
    assert_eq!(ctr["NetworkSettings"]["Networks"][&network]["Gateway"], gateway.to_string());
    assert_eq!(ctr["State"]["Running"], true, "container not running: {}", ctr["State"]);

    // host-local's reservation, owned by the container.
    assert_attached(&data_dir, &network, &bridge, &ip.to_string(), &id, "container");

    // The page, from the host: loopback and the bridge's gateway address.
    let logs = || String::from_utf8_lossy(&pm.cmd(&["logs", &id]).stderr).into_owned();
    for addr in [IpAddr::V4(Ipv4Addr::LOCALHOST), IpAddr::V4(gateway)] {
        let body = http_get_retry(addr, port, Duration::from_secs(10));
        assert_eq!(body.as_deref(), Some(PAGE), "GET http://{addr}:{port}/ (container logs: {})", logs());
    }

    // rm: nothing of the container may be left.
    pm.ok(&["rm", "-f", "-t", "0", &id]);
    assert!(pm.ok(&["ps", "-aq"]).trim().is_empty(), "containers left after rm");
    assert_detached(&data_dir, &network, &bridge, &ip.to_string(), &id);
    for addr in [IpAddr::V4(Ipv4Addr::LOCALHOST), IpAddr::V4(gateway)] {
        assert_eq!(http_get(addr, port), None, "http://{addr}:{port}/ still answers after rm");
    }
    if let Some(sb) = &pm.sandbox {
        assert!(!Path::new(sb).exists(), "netns {sb} left after rm");
    }
    let cached = format!("/var/lib/cni/results/{network}-{id}-eth0");
    assert!(!Path::new(&cached).exists(), "podman's CNI cache {cached} left after rm");

    // The guard's cleanup leaves no mount and nothing in the temp dir's place.
    let tmp = pm.dir.path().to_path_buf();
    let bridge_was_there = pm.bridge_was_there;
    pm.cleanup();
    let left = mounts_under(&tmp);
    assert!(left.is_empty(), "mounts left under {}: {left:?}", tmp.display());
    drop(pm);
    assert!(!tmp.exists(), "{} not removed", tmp.display());
    assert!(bridge_was_there || !link_exists(&bridge), "{bridge} (made by this test) not removed");
    eprintln!("podman end-to-end took {:.1}s", started.elapsed().as_secs_f64());
}

//! The test-support crate: fixtures shared by every crate's integration tests (a dev-dependency
//! of each) and by the end-to-end tests in `tests/tests`. Network namespaces and links that clean
//! up after themselves even when a test fails, unique names, the path of the built plugins, the
//! root requirement of privileged tests, a plugin exec as a runtime does it ([`exec`]), a libcni
//! fixture around the cni-noop plugin ([`noop`]) and upstream Go libcni's printing of results
//! ([`gojson`]).
//!
//! One policy for privileged tests: they call [`require_root`] (and [`require_tools`]) first, which
//! fail the test when the privilege or a tool is missing. They never pass silently: CI runs as root
//! and must run them.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod exec;
pub mod gojson;
mod host_firewall;
pub mod hostile;
pub mod noop;
pub mod vm;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

/// The plugins that have fault points (bridge, host-local, host-device), built once per test
/// process with the `fault-injection` feature into a target directory of their own, so the
/// binaries every other test runs never contain them; one build serves every test that injects
/// faults. Returns the directory holding the binaries.
pub fn fault_injection_bin_dir() -> &'static Path {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf();
        let target = match std::env::var_os("CARGO_TARGET_DIR") {
            Some(dir) => PathBuf::from(dir).join("fault-injection"),
            None => root.join("target").join("fault-injection"),
        };
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let out = Command::new(cargo)
            .current_dir(&root)
            .args(["build", "--features", "fault-injection", "-p", "bridge", "-p", "host-local", "-p", "host-device"])
            .arg("--target-dir")
            .arg(&target)
            .output()
            .expect("run cargo");
        assert!(
            out.status.success(),
            "building the plugins with fault points failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        target.join("debug")
    })
}

/// Where `cargo build` left the plugin binaries (the profile directory of this test binary).
pub fn bin_dir() -> PathBuf {
    if let Ok(dir) = std::env::var("CNI_RS_BIN_DIR") {
        return PathBuf::from(dir);
    }
    let exe = std::env::current_exe().expect("current_exe");
    // target/<profile>/deps/<test> -> target/<profile>
    let dir = exe.parent().and_then(|d| d.parent()).expect("target dir").to_path_buf();
    for plugin in [
        "bridge",
        "host-local",
        "loopback",
        "portmap",
        "tuning",
        "bandwidth",
        "firewall",
        "cnitool",
        "cni-noop",
        "dhcp",
    ] {
        assert!(
            dir.join(plugin).is_file(),
            "{} is missing: run `cargo build --workspace --bins` before the tests (tests/run.sh does)",
            dir.join(plugin).display()
        );
    }
    dir
}

/// Set in the run [`holds_for_the_shipped_binary`] makes of a test binary.
const SHIPPED_RUN: &str = "CNI_RS_TESTS_SHIPPED_RUN";

/// Whether this process is the run [`holds_for_the_shipped_binary`] made: the test calling it must
/// return at once there.
pub fn in_shipped_run() -> bool {
    std::env::var_os(SHIPPED_RUN).is_some()
}

/// What a node runs is the static multi-call binary (musl, install/static-target.sh), not the
/// per-plugin debug builds the tests run: its libc and allocator differ. Runs every other test of the
/// calling test binary again, in a process of its own, with `CNI_RS_BIN_DIR` a directory where each
/// of `plugins` is that binary and each of `helpers` the debug build from [`bin_dir`], and fails
/// unless all pass and at least `min_passed` of them ran.
pub fn holds_for_the_shipped_binary(plugins: &[&str], helpers: &[&str], min_passed: usize) {
    require_root();
    let links = shipped_bin_dir(plugins, helpers);
    let shipped = vm::static_cni_rs();
    let out = Command::new(std::env::current_exe().expect("this test binary"))
        .env("CNI_RS_BIN_DIR", links.path())
        .env(SHIPPED_RUN, "1")
        .args(["--test-threads", "4"])
        .output()
        .expect("run this test binary again");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "with {} as every plugin:\n{stdout}\n{}",
        shipped.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let passed = stdout.lines().filter(|l| l.starts_with("test ") && l.ends_with(" ok")).count();
    assert!(passed >= min_passed, "only {passed} tests passed with the shipped binary:\n{stdout}");
}

/// A directory where each of `plugins` is the static multi-call binary (a link to it) and each of
/// `helpers` the debug build from [`bin_dir`]: what a node runs, under every plugin name.
pub fn shipped_bin_dir(plugins: &[&str], helpers: &[&str]) -> TempDir {
    let links = TempDir::new("cnts");
    let shipped = vm::static_cni_rs();
    for plugin in plugins {
        std::os::unix::fs::symlink(&shipped, links.path().join(plugin)).expect("link the static cni-rs");
    }
    for helper in helpers {
        std::os::unix::fs::symlink(bin_dir().join(helper), links.path().join(helper)).expect("link a helper");
    }
    links
}

/// Fails the test unless we are root; privileged tests never skip silently.
pub fn require_root() {
    assert!(nix_is_root(), "this test needs root (network namespaces); run it through tests/run.sh as root");
    host_firewall::guard();
}

/// Fails the test unless every tool is on PATH (tests/setup.sh installs them).
pub fn require_tools(tools: &[&str]) {
    let missing: Vec<&str> = tools.iter().copied().filter(|t| !on_path(t)).collect();
    assert!(missing.is_empty(), "this test needs {} on PATH; tests/setup.sh installs them", missing.join(", "));
}

/// As [`require_tools`], for `(tool, how to install it)` pairs: the failure names, for each
/// missing tool, what installs it (`apt-get install etcd-server`).
pub fn require_tools_from(tools: &[(&str, &str)]) {
    let missing: Vec<String> =
        tools.iter().filter(|(t, _)| !on_path(t)).map(|(t, install)| format!("{t} ({install})")).collect();
    assert!(missing.is_empty(), "this test needs {} on PATH; tests/setup.sh installs them", missing.join(", "));
}

fn on_path(tool: &str) -> bool {
    Command::new("sh").arg("-c").arg(format!("command -v {tool}")).output().is_ok_and(|o| o.status.success())
}

/// True when running in CI (`CI` set to anything but "", "0" or "false").
pub fn in_ci() -> bool {
    std::env::var("CI").map(|v| !v.is_empty() && v != "0" && v != "false").unwrap_or(false)
}

/// A prerequisite that is not a privilege (a reference plugin, a container runtime). In CI a missing one fails the test (it must not skip);
/// locally it prints a note and the caller returns.
pub fn prerequisite(ok: bool, what: &str) -> bool {
    if ok {
        return true;
    }
    assert!(!in_ci(), "{what} (CI=true: this test must not skip; tests/setup.sh installs what it needs)");
    eprintln!("note: skipping this test: {what} (it would fail under CI=true)");
    false
}

/// Checks a Kubernetes manifest with `kubernetes-validate --strict` (every document against the
/// API schemas, unknown fields refused): every document must pass; returns how many did. A missing
/// tool fails the test ([`require_tools_from`]).
pub fn kubernetes_validates(manifest: &Path) -> usize {
    assert!(manifest.is_file(), "{} is missing", manifest.display());
    require_tools_from(&[("kubernetes-validate", "pip install kubernetes-validate")]);
    let out = Command::new("kubernetes-validate").arg("--strict").arg(manifest).output().unwrap();
    let report = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    eprintln!("{report}");
    assert!(out.status.success(), "kubernetes-validate --strict failed:\n{report}");
    // It exits 0 with a warning for kinds it has no schema for; every document must really pass.
    let passed: Vec<&str> = report.lines().filter(|line| !line.trim().is_empty()).collect();
    for line in &passed {
        assert!(line.starts_with("INFO") && line.contains("passed"), "unexpected kubernetes-validate output: {line}");
    }
    passed.len()
}

fn nix_is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// A name unique to this process and call, short enough for an interface (<= 15 bytes with prefix).
pub fn unique(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}{:x}{n:x}", std::process::id() % 0xffff)
}

/// Runs a command, returning its output; panics with stderr when it fails.
pub fn sh(cmd: &str, args: &[&str]) -> String {
    let out = run(cmd, args);
    assert!(
        out.status.success(),
        "{cmd} {}: {}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn run(cmd: &str, args: &[&str]) -> Output {
    Command::new(cmd).args(args).output().unwrap_or_else(|e| panic!("run {cmd}: {e}"))
}

/// The names of the links attached to `bridge` (`ip -o link show master <bridge>`); none when the
/// bridge does not exist. Any other failure of `ip` panics.
pub fn bridge_ports(bridge: &str) -> Vec<String> {
    let out = run("ip", &["-o", "link", "show", "master", bridge]);
    if !out.status.success() {
        let missing = !run("ip", &["link", "show", bridge]).status.success();
        assert!(missing, "ip link show master {bridge}: {}", String::from_utf8_lossy(&out.stderr));
        return Vec::new();
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| Some(l.split(": ").nth(1)?.split('@').next()?.to_string()))
        .collect()
}

/// The reservation files host-local keeps for `network` under `data_dir`: (address, content:
/// the owner's container id, then `\r\n` and its interface), sorted by address.
pub fn reservations(data_dir: &Path, network: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(data_dir.join(network)) else { return out };
    for e in entries {
        let e = e.unwrap();
        let name = e.file_name().into_string().unwrap();
        if name.parse::<std::net::IpAddr>().is_ok() {
            out.push((name, std::fs::read_to_string(e.path()).unwrap()));
        }
    }
    out.sort();
    out
}

/// A named network namespace (`ip netns add`), deleted on drop.
pub struct Netns {
    pub name: String,
    pub path: String,
}

impl Netns {
    pub fn new(prefix: &str) -> Netns {
        require_root();
        let name = unique(prefix);
        sh("ip", &["netns", "add", &name]);
        sh("ip", &["-n", &name, "link", "set", "lo", "up"]);
        Netns { path: format!("/run/netns/{name}"), name }
    }
    /// Runs a command inside the namespace.
    pub fn exec(&self, cmd: &str, args: &[&str]) -> Output {
        let mut all = vec!["netns", "exec", &self.name, cmd];
        all.extend_from_slice(args);
        run("ip", &all)
    }
    pub fn sh(&self, cmd: &str, args: &[&str]) -> String {
        let mut all = vec!["netns", "exec", &self.name, cmd];
        all.extend_from_slice(args);
        sh("ip", &all)
    }
    /// `ip -n <ns> <args>`, panicking with stderr when it fails; returns stdout.
    pub fn ip(&self, args: &[&str]) -> String {
        let mut all = vec!["-n", self.name.as_str()];
        all.extend_from_slice(args);
        sh("ip", &all)
    }
    /// Deletes it now (for DEL-after-netns-is-gone tests); drop is then a no-op.
    pub fn delete(&mut self) {
        let _ = run("ip", &["netns", "del", &self.name]);
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = run("ip", &["netns", "del", &self.name]);
    }
}

/// A host link (a bridge the plugin made, say), deleted on drop.
pub struct LinkGuard(pub String);

impl Drop for LinkGuard {
    fn drop(&mut self) {
        let _ = run("ip", &["link", "del", &self.0]);
    }
}

/// The attachments of one network a test ADDs, each DELed again (with our plugins) when this
/// drops, passed or failed: a failed assertion between ADD and DEL leaves no masquerade rule, nft
/// element or reservation on the host. DEL is idempotent, so an attachment the test DELed itself
/// costs one more DEL. Declare it before (drop it before) the data directory IPAM uses.
pub struct Attachments {
    cni: libcni::runtime::CniConfig,
    list: libcni::conflist::NetworkConfigList,
    added: std::cell::RefCell<Vec<libcni::runtime::RuntimeConf>>,
}

impl Attachments {
    pub fn new(cni: &libcni::runtime::CniConfig, list: &libcni::conflist::NetworkConfigList) -> Attachments {
        Attachments { cni: cni.clone(), list: list.clone(), added: Default::default() }
    }

    /// ADD through `cni` (ours, or the reference's plugins), the attachment recorded first (a
    /// failed ADD may leave a part its own undo missed).
    pub fn add_with(
        &self,
        cni: &libcni::runtime::CniConfig,
        rt: &libcni::runtime::RuntimeConf,
    ) -> libcni::Result<libcni::CniResult> {
        self.added.borrow_mut().push(rt.clone());
        cni.add_network_list(&self.list, rt)
    }

    /// ADD with our plugins.
    pub fn add(&self, rt: &libcni::runtime::RuntimeConf) -> libcni::Result<libcni::CniResult> {
        self.add_with(&self.cni, rt)
    }
}

impl Drop for Attachments {
    fn drop(&mut self) {
        for rt in self.added.take() {
            if let Err(e) = self.cni.del_network_list(&self.list, &rt) {
                eprintln!("cleanup DEL of {} on {}: {e}", rt.container_id, self.list.name);
            }
        }
    }
}

/// A directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(prefix: &str) -> TempDir {
        let p = std::env::temp_dir().join(unique(prefix));
        std::fs::create_dir_all(&p).expect("create temp dir");
        TempDir(p)
    }
    pub fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A tmpfs mounted over a directory, lazily unmounted on drop.
pub struct Mount(pub PathBuf);

impl Mount {
    /// Mounts a tmpfs of `size` (`16k`, `1m`) over `dir`, which must exist.
    pub fn tmpfs(dir: &Path, size: &str) -> Mount {
        sh("mount", &["-t", "tmpfs", "-o", &format!("size={size}"), "cni-rs-test", &dir.display().to_string()]);
        Mount(dir.to_path_buf())
    }

    /// Fills the file system with `<dir>/filler` until a write fails with ENOSPC.
    pub fn fill(&self) {
        use std::io::Write;
        let mut file = std::fs::File::create(self.0.join("filler")).expect("filler");
        let chunk = vec![b'x'; 4096];
        let full = loop {
            if let Err(e) = file.write_all(&chunk).and_then(|()| file.sync_data()) {
                break e;
            }
        };
        assert_eq!(full.raw_os_error(), Some(libc::ENOSPC), "filling the tmpfs at {}: {full}", self.0.display());
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = run("umount", &["-l", &self.0.display().to_string()]);
    }
}

/// A "remote host" in a namespace of its own, linked to this host by a veth on 203.0.113.0/24
/// (this host .1, the remote [`RemoteHost::ADDR`]) and with no route back to any pod subnet, so
/// only a pod's masqueraded packets are answered. Panics when this host already routes that subnet.
pub struct RemoteHost {
    pub ns: Netns,
    _host_end: LinkGuard,
}

impl RemoteHost {
    pub const ADDR: &'static str = "203.0.113.2";

    pub fn up() -> RemoteHost {
        let routes = sh("ip", &["route"]);
        assert!(!routes.contains("203.0.113."), "this host already routes 203.0.113.0/24; the test needs it free");
        let ns = Netns::new("cnrm");
        let (host_end, remote_end) = (unique("cnrh"), unique("cnrx"));
        let guard = LinkGuard(host_end.clone());
        sh("ip", &["link", "add", &host_end, "type", "veth", "peer", "name", &remote_end, "netns", &ns.name]);
        sh("ip", &["addr", "add", "203.0.113.1/24", "dev", &host_end]);
        sh("ip", &["link", "set", &host_end, "up"]);
        ns.sh("ip", &["addr", "add", &format!("{}/24", Self::ADDR), "dev", &remote_end]);
        ns.sh("ip", &["link", "set", &remote_end, "up"]);
        RemoteHost { ns, _host_end: guard }
    }
}

/// A node on a LAN, for tests of what a plugin may put on the node: namespace `node` with `lan0`
/// (192.168.77.10/24, fd77::10/64) and its peer `lan0` in namespace `neighbour` (192.168.77.20/24,
/// fd77::20/64). No host holds the LAN's router address, 192.168.77.1: only a node that took it
/// answers the neighbour's ARP for it ([`arp_answered`]).
pub fn node_on_lan(node_prefix: &str, neighbour_prefix: &str) -> (Netns, Netns) {
    require_tools(&["busybox"]);
    let node = Netns::new(node_prefix);
    let neighbour = Netns::new(neighbour_prefix);
    node.ip(&["link", "add", "lan0", "type", "veth", "peer", "name", "lan0", "netns", &neighbour.name]);
    for (ns, v4, v6) in [(&node, "192.168.77.10/24", "fd77::10/64"), (&neighbour, "192.168.77.20/24", "fd77::20/64")] {
        ns.ip(&["addr", "add", v4, "dev", "lan0"]);
        ns.ip(&["addr", "add", v6, "dev", "lan0", "nodad"]);
        ns.ip(&["link", "set", "lan0", "up"]);
    }
    (node, neighbour)
}

/// Whether anything on the LAN answers `neighbour`'s ARP request for `ip` on its `lan0`.
pub fn arp_answered(neighbour: &Netns, ip: &str) -> bool {
    neighbour.exec("busybox", &["arping", "-f", "-c", "2", "-w", "1", "-I", "lan0", ip]).status.success()
}

/// True if `ping` from inside `ns` reaches `addr` (one packet, short timeout).
pub fn pings(ns: &Netns, addr: &str) -> bool {
    ns.exec("busybox", &["ping", "-c", "1", "-W", "2", addr]).status.success()
}

/// A small deterministic xorshift generator, so randomized tests replay exactly from their seed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// A number below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next_u64() % n as u64) as usize
        }
    }
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// Sets the keys of the object `extra` in `into`, a null removing its key: one case's variation of
/// a test's base configuration.
pub fn merge(into: &mut serde_json::Value, extra: serde_json::Value) {
    let serde_json::Value::Object(keys) = extra else { return };
    for (k, v) in keys {
        match into.as_object_mut() {
            Some(obj) if v.is_null() => {
                obj.remove(&k);
            }
            _ => into[k] = v,
        }
    }
}

/// The request skel would build for an ADD of `conf` with `CNI_ARGS` `cni_args` (container `c1`,
/// ifname `eth0`, no netns): for unit tests of a plugin's configuration parsing.
pub fn add_request(conf: &serde_json::Value, cni_args: &str) -> libcni::Request {
    let stdin = conf.to_string().into_bytes();
    let (conf, raw) = libcni::conf::parse_netconf(&stdin).expect("a valid netconf");
    libcni::Request {
        command: libcni::Command::Add,
        container_id: "c1".into(),
        netns: None,
        ifname: "eth0".into(),
        args: libcni::args::CniArgs::parse(cni_args).expect("valid CNI_ARGS"),
        netns_override: false,
        cni_path: Vec::new(),
        conf,
        raw,
        stdin,
    }
}

/// Polls `f` every 50 ms until it is true or `limit` has passed; its last answer.
pub fn wait_for(limit: std::time::Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = std::time::Instant::now() + limit;
    while std::time::Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    f()
}

/// Puts the veth `dev` in namespace `ns` in NAPI mode (GRO on, TSO and GSO off), so the frames it
/// sends are queued on its peer's own ring. A plain veth hands every frame to the sending CPU's
/// input backlog, which all namespaces on the host share (`net.core.netdev_max_backlog`): another
/// test's burst of traffic fills it and drops this test's frames (counted in the second column of
/// /proc/net/softnet_stat), so a one-packet probe fails without any fault in the path it probes.
/// Call it for both ends of each veth a probe crosses.
pub fn veth_off_shared_backlog(ns: &Netns, dev: &str) {
    require_tools(&["ethtool"]);
    ns.sh("ethtool", &["-K", dev, "gro", "on", "tso", "off", "gso", "off"]);
}

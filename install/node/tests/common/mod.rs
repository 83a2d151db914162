//! A cluster of "nodes" on one machine: network namespaces joined by a bridge in a segment
//! namespace (one L2 segment), an etcd running in that segment namespace, and a `cni-rs-node`
//! agent per node namespace. Everything is removed on drop, also when a test fails.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod k8s;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub const AGENT: &str = env!("CARGO_BIN_EXE_cni-rs-node");

static SEQ: AtomicU32 = AtomicU32::new(0);

/// A short unique tag: namespace and file names of concurrent tests never collide.
pub fn tag() -> String {
    format!("{}{}", std::process::id() % 100000, SEQ.fetch_add(1, Ordering::SeqCst))
}

/// What installs each tool these tests run (Debian packages, and pip for kubernetes-validate).
const INSTALL: &[(&str, &str)] = &[
    ("ip", "apt-get install iproute2"),
    ("etcd", "apt-get install etcd-server"),
    ("etcdctl", "apt-get install etcd-client"),
    ("curl", "apt-get install curl"),
    ("socat", "apt-get install socat"),
    ("busybox", "apt-get install busybox-static"),
    ("openssl", "apt-get install openssl"),
    ("python3", "apt-get install python3"),
    ("strace", "apt-get install strace"),
    ("kubernetes-validate", "pip install kubernetes-validate"),
    ("setpriv", "apt-get install util-linux"),
    ("unshare", "apt-get install util-linux"),
    ("nft", "apt-get install nftables"),
];

/// The privileged-test policy of the cni-tests crate: fails the test unless it runs as root and
/// `tools` (plus iproute2) are on PATH, naming what installs each missing one. Never a skip.
pub fn require(tools: &[&str]) {
    cni_tests::require_root();
    let wanted: Vec<(&str, &str)> = std::iter::once("ip")
        .chain(tools.iter().copied())
        .map(|tool| {
            let install = INSTALL.iter().find(|(t, _)| *t == tool).map_or("see tests/setup.sh", |(_, how)| *how);
            (tool, install)
        })
        .collect();
    cni_tests::require_tools_from(&wanted);
}

/// Runs a command and panics with its output if it fails.
pub fn run(args: &[&str]) -> String {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap_or_else(|e| panic!("{args:?}: {e}"));
    if !out.status.success() {
        panic!("{args:?} failed: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    }
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs a command in a namespace and returns (success, stdout+stderr).
pub fn try_in(ns: &str, args: &[&str]) -> (bool, String) {
    let out = Command::new("ip").args(["netns", "exec", ns]).args(args).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

pub fn run_in(ns: &str, args: &[&str]) -> String {
    let (ok, text) = try_in(ns, args);
    assert!(ok, "in {ns}: {args:?} failed: {text}");
    text
}

pub fn wait_for<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        if start.elapsed() > timeout {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(label: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("cni-rs-node-{label}-{}", tag()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// A child process killed (and reaped) on drop.
pub struct Proc {
    pub child: Option<Child>,
    pub log: PathBuf,
}

impl Proc {
    pub fn spawn(ns: &str, args: &[String], log: PathBuf) -> Proc {
        let file = fs::File::create(&log).unwrap();
        let child = Command::new("ip")
            .args(["netns", "exec", ns])
            .args(args)
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .unwrap();
        Proc { child: Some(child), log }
    }

    pub fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Sends `signal` and waits up to `timeout` for the exit; returns the exit status.
    pub fn stop(&mut self, signal: i32, timeout: Duration) -> Option<std::process::ExitStatus> {
        let mut child = self.child.take()?;
        // SAFETY: kill has no memory preconditions; the pid is our own unreaped child.
        unsafe { libc::kill(child.id() as i32, signal) };
        let start = Instant::now();
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return Some(status);
            }
            if start.elapsed() > timeout {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn running(&mut self) -> bool {
        self.child.as_mut().map(|c| matches!(c.try_wait(), Ok(None))).unwrap_or(false)
    }
}

pub const SIGTERM: i32 = 15;

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A network namespace deleted on drop (its links go with it).
pub struct Netns(pub String);

impl Netns {
    pub fn new(name: String) -> Netns {
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        run(&["ip", "netns", "add", &name]);
        run(&["ip", "-n", &name, "link", "set", "lo", "up"]);
        Netns(name)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
    }
}

/// etcd listening on `addr` inside namespace `ns`.
pub struct Etcd {
    pub proc: Proc,
    pub url: String,
    pub ns: String,
    _data: TempDir,
}

impl Etcd {
    pub fn start(ns: &str, addr: &str) -> Etcd {
        let data = TempDir::new("etcd");
        let client = format!("http://{addr}:2379");
        let peer = format!("http://{addr}:2380");
        let args: Vec<String> = [
            "etcd",
            "--name",
            "test",
            "--data-dir",
            data.0.join("data").to_str().unwrap(),
            "--listen-client-urls",
            &client,
            "--advertise-client-urls",
            &client,
            "--listen-peer-urls",
            &peer,
            "--initial-advertise-peer-urls",
            &peer,
            "--initial-cluster",
            &format!("test={peer}"),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let proc = Proc::spawn(ns, &args, data.0.join("etcd.log"));
        let etcd = Etcd { proc, url: client, ns: ns.to_string(), _data: data };
        wait_for("etcd to answer", Duration::from_secs(20), || {
            let (ok, _) = try_in(ns, &["etcdctl", "--endpoints", &etcd.url, "endpoint", "health"]);
            ok.then_some(())
        });
        etcd
    }

    /// `key value` pairs under `prefix`.
    pub fn get_prefix(&self, prefix: &str) -> Vec<(String, String)> {
        let out = run_in(&self.ns, &["etcdctl", "--endpoints", &self.url, "get", "--prefix", prefix]);
        let lines: Vec<&str> = out.lines().collect();
        lines.chunks(2).filter(|c| c.len() == 2).map(|c| (c[0].to_string(), c[1].to_string())).collect()
    }

    pub fn etcdctl(&self, args: &[&str]) -> String {
        let mut all = vec!["etcdctl", "--endpoints", &self.url];
        all.extend_from_slice(args);
        run_in(&self.ns, &all)
    }
}

/// One L2 segment: a namespace holding bridge `br0` with `gateway/prefix`, and etcd on it.
pub struct Segment {
    pub ns: Netns,
}

impl Segment {
    pub fn new(name: String, cidr: &str) -> Segment {
        let ns = Netns::new(name);
        run(&["ip", "-n", &ns.0, "link", "add", "br0", "type", "bridge"]);
        run(&["ip", "-n", &ns.0, "addr", "add", cidr, "dev", "br0"]);
        run(&["ip", "-n", &ns.0, "link", "set", "br0", "up"]);
        Segment { ns }
    }

    /// Connects namespace `node` to the segment: `eth0` in `node` with `addr` (CIDR form),
    /// `port` on the bridge.
    pub fn attach(&self, node: &Netns, port: &str, addr: &str) {
        self.attach_to("br0", node, port, addr)
    }

    /// A second bridge `name` with `cidr` in the segment namespace, which then routes between
    /// its bridges.
    pub fn add_bridge(&self, name: &str, cidr: &str) {
        run(&["ip", "-n", &self.ns.0, "link", "add", name, "type", "bridge"]);
        run(&["ip", "-n", &self.ns.0, "addr", "add", cidr, "dev", name]);
        run(&["ip", "-n", &self.ns.0, "link", "set", name, "up"]);
        run(&["ip", "netns", "exec", &self.ns.0, "sysctl", "-qw", "net.ipv4.ip_forward=1"]);
    }

    pub fn attach_to(&self, bridge: &str, node: &Netns, port: &str, addr: &str) {
        run(&["ip", "-n", &node.0, "link", "add", "eth0", "type", "veth", "peer", "name", port, "netns", &self.ns.0]);
        run(&["ip", "-n", &self.ns.0, "link", "set", port, "master", bridge, "up"]);
        run(&["ip", "-n", &node.0, "addr", "add", addr, "dev", "eth0"]);
        run(&["ip", "-n", &node.0, "link", "set", "eth0", "up"]);
    }
}

/// Waits until no IPv6 address in `namespaces` is tentative. A node forwards IPv6 to a next hop
/// it has not resolved yet only once the outgoing link's link-local address has passed duplicate
/// address detection: the kernel solicits a forwarded packet's next hop from that address and,
/// while it is tentative (up to ~2 s after the link comes up), sends no solicitation at all. A
/// real node's uplink has been up far longer than a test's first packet waits.
pub fn wait_for_dad(namespaces: &[&str]) {
    for ns in namespaces {
        wait_for("IPv6 duplicate address detection", Duration::from_secs(10), || {
            run_in(ns, &["ip", "-6", "addr", "show", "tentative"]).trim().is_empty().then_some(())
        });
    }
}

/// A running agent in a node namespace, with its own conf and bin directories.
pub struct Agent {
    pub proc: Proc,
    pub args: Vec<String>,
    pub ns: String,
    pub dir: PathBuf,
}

impl Agent {
    pub fn start(ns: &str, dir: &Path, args: Vec<String>) -> Agent {
        let mut all = vec![AGENT.to_string()];
        all.extend(args.iter().cloned());
        let log = dir.join(format!("agent-{}.log", SEQ.fetch_add(1, Ordering::SeqCst)));
        Agent { proc: Proc::spawn(ns, &all, log), args, ns: ns.to_string(), dir: dir.to_path_buf() }
    }

    pub fn restart(&mut self) {
        self.proc.stop(SIGTERM, Duration::from_secs(10));
        let mut all = vec![AGENT.to_string()];
        all.extend(self.args.iter().cloned());
        let log = self.dir.join(format!("agent-{}.log", SEQ.fetch_add(1, Ordering::SeqCst)));
        self.proc = Proc::spawn(&self.ns, &all, log);
    }
}

/// GET `path` from the agent's /healthz and /metrics listener (the address its log names, so
/// `--metrics-addr 127.0.0.1:0` works): (HTTP status, body).
pub fn agent_http(agent: &Agent, path: &str) -> (u16, String) {
    let log = agent.proc.log();
    let base = log
        .lines()
        .find_map(|l| l.strip_prefix("serving /healthz and /metrics on "))
        .unwrap_or_else(|| panic!("the agent names no metrics address yet:\n{log}"))
        .to_string();
    let out = run_in(&agent.ns, &["curl", "-sS", "-w", "\n%{http_code}", &format!("{base}{path}")]);
    let (body, code) = out.trim_end().rsplit_once('\n').unwrap_or(("", out.trim()));
    (code.parse().unwrap_or(0), body.to_string())
}

/// The value of one metric line (`name` with its labels, e.g. `x_total{reason="a"}`).
pub fn metric(metrics: &str, name: &str) -> Option<f64> {
    metrics.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

/// install/daemonset.yaml, one JSON value per document, read with PyYAML (which
/// kubernetes-validate installs).
pub fn manifest_documents() -> Vec<serde_json::Value> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../daemonset.yaml");
    let script = "import json, sys, yaml; print(json.dumps(list(yaml.safe_load_all(open(sys.argv[1])))))";
    let out = Command::new("python3")
        .args(["-c", script, path.to_str().unwrap()])
        .output()
        .unwrap_or_else(|e| panic!("python3: {e} (apt-get install python3)"));
    assert!(
        out.status.success(),
        "python3 could not read {} as YAML (PyYAML comes with `pip install kubernetes-validate`): {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The document of `kind` in `documents`.
pub fn manifest_kind<'a>(documents: &'a [serde_json::Value], kind: &str) -> &'a serde_json::Value {
    documents.iter().find(|d| d["kind"] == kind).unwrap_or_else(|| panic!("no {kind} in install/daemonset.yaml"))
}

/// The capabilities install/daemonset.yaml gives the agent container (`add`; it drops ALL).
pub fn manifest_agent_capabilities(documents: &[serde_json::Value]) -> Vec<String> {
    let pod = &manifest_kind(documents, "DaemonSet")["spec"]["template"]["spec"];
    let agent = pod["containers"].as_array().unwrap().iter().find(|c| c["name"] == "agent").expect("container agent");
    let caps = &agent["securityContext"]["capabilities"];
    assert_eq!(caps["drop"], serde_json::json!(["ALL"]), "the agent container drops ALL capabilities");
    caps["add"].as_array().unwrap().iter().map(|c| c.as_str().unwrap().to_string()).collect()
}

/// The capability numbers of linux/capability.h a manifest might name.
const CAPS: &[(&str, u32)] = &[
    ("CHOWN", 0),
    ("DAC_OVERRIDE", 1),
    ("FOWNER", 3),
    ("SETGID", 6),
    ("SETUID", 7),
    ("NET_BIND_SERVICE", 10),
    ("NET_BROADCAST", 11),
    ("NET_ADMIN", 12),
    ("NET_RAW", 13),
    ("SYS_MODULE", 16),
    ("SYS_ADMIN", 21),
];

/// The capability set of `names` as /proc/PID/status shows it (`CapEff:` and the others).
pub fn cap_mask(names: &[String]) -> String {
    let mask = names.iter().fold(0u64, |mask, name| {
        let bit = CAPS.iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("add {name} to CAPS")).1;
        mask | 1 << bit
    });
    format!("{mask:016x}")
}

/// `setpriv --bounding-set` for exactly `names`. Run as uid 0, a program gets its bounding set as
/// its permitted and effective sets on exec (with no inheritable ones: `--inh-caps -all`), which
/// is what a container runtime gives a uid-0 container with these capabilities.
pub fn setpriv_bounding(names: &[String]) -> String {
    std::iter::once("-all".to_string())
        .chain(names.iter().map(|c| format!("+{}", c.to_lowercase())))
        .collect::<Vec<_>>()
        .join(",")
}

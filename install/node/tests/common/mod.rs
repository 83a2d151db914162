//! A cluster of "nodes" on one machine: network namespaces joined by a bridge in a segment
//! namespace (one L2 segment), an etcd running in that segment namespace, and a `cni-rs-node`
//! agent per node namespace. Everything is removed on drop, also when a test fails.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

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
    ("nft", "apt-get install nftables"),
    ("kubernetes-validate", "pip install kubernetes-validate"),
    ("setpriv", "apt-get install util-linux"),
    ("unshare", "apt-get install util-linux"),
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
    /// `args` run in namespace `ns`, output to `log`.
    pub fn spawn(ns: &str, args: &[String], log: PathBuf) -> Proc {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", ns]).args(args);
        Proc::start(cmd, log)
    }

    /// `cmd` with no input, its output to `log`.
    pub fn start(mut cmd: Command, log: PathBuf) -> Proc {
        let file = fs::File::create(&log).unwrap();
        let child = cmd.stdin(Stdio::null()).stdout(file.try_clone().unwrap()).stderr(file).spawn().unwrap();
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
    /// What etcdctl needs besides `--endpoints` (TLS files, a user); tests may add to it.
    pub ctl: Vec<String>,
    _data: TempDir,
}

impl Etcd {
    pub fn start(ns: &str, addr: &str) -> Etcd {
        Etcd::launch(ns, &format!("http://{addr}:2379"), &[], Vec::new())
    }

    /// etcd serving clients over TLS only, with a server certificate from `pki` for `addr`;
    /// with `client_cert_auth`, only clients with a certificate `pki` signed get in. etcdctl
    /// then uses a client certificate with CN `root` (etcd's root user once auth is enabled).
    /// `extra` goes to etcd as it is.
    pub fn start_tls(ns: &str, addr: &str, pki: &Pki, client_cert_auth: bool, extra: &[&str]) -> Etcd {
        let (cert, key) = pki.server("etcd-server", addr);
        let mut args = vec!["--cert-file".to_string(), cert, "--key-file".into(), key];
        let mut ctl = vec!["--cacert".to_string(), pki.ca()];
        if client_cert_auth {
            args.extend(["--client-cert-auth".to_string(), "--trusted-ca-file".into(), pki.ca()]);
            let (cert, key) = pki.client("root");
            ctl.extend(["--cert".to_string(), cert, "--key".into(), key]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).chain(extra.iter().copied()).collect();
        Etcd::launch(ns, &format!("https://{addr}:2379"), &args, ctl)
    }

    fn launch(ns: &str, client: &str, extra: &[&str], ctl: Vec<String>) -> Etcd {
        let data = TempDir::new("etcd");
        let peer = client.replace("https://", "http://").replace(":2379", ":2380");
        let mut args: Vec<String> = [
            "etcd",
            "--name",
            "test",
            "--data-dir",
            data.0.join("data").to_str().unwrap(),
            "--listen-client-urls",
            client,
            "--advertise-client-urls",
            client,
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
        args.extend(extra.iter().map(|s| s.to_string()));
        let proc = Proc::spawn(ns, &args, data.0.join("etcd.log"));
        let etcd = Etcd { proc, url: client.to_string(), ns: ns.to_string(), ctl, _data: data };
        wait_for("etcd to answer", Duration::from_secs(20), || {
            let (ok, _) = etcd.try_etcdctl(&["endpoint", "health"]);
            ok.then_some(())
        });
        etcd
    }

    /// `key value` pairs under `prefix`.
    pub fn get_prefix(&self, prefix: &str) -> Vec<(String, String)> {
        let out = self.etcdctl(&["get", "--prefix", prefix]);
        let lines: Vec<&str> = out.lines().collect();
        lines.chunks(2).filter(|c| c.len() == 2).map(|c| (c[0].to_string(), c[1].to_string())).collect()
    }

    pub fn etcdctl(&self, args: &[&str]) -> String {
        let (ok, text) = self.try_etcdctl(args);
        assert!(ok, "in {}: etcdctl {args:?} failed: {text}", self.ns);
        text
    }

    pub fn try_etcdctl(&self, args: &[&str]) -> (bool, String) {
        let mut all = vec!["etcdctl", "--endpoints", &self.url];
        all.extend(self.ctl.iter().map(String::as_str));
        all.extend_from_slice(args);
        try_in(&self.ns, &all)
    }
}

/// A certificate authority made with openssl in a directory of its own, and the certificates it
/// signs (EC P-256, valid for a day).
pub struct Pki {
    pub dir: TempDir,
    name: String,
}

impl Pki {
    /// A self-signed CA with CN `name`: `<name>.crt` and `<name>.key`.
    pub fn new(name: &str) -> Pki {
        let dir = TempDir::new(&format!("pki-{name}"));
        let pki = Pki { dir, name: name.to_string() };
        let (crt, key) = (pki.path(&format!("{name}.crt")), pki.path(&format!("{name}.key")));
        new_key(&["-x509", "-days", "1"], &key, &crt, name);
        pki
    }

    pub fn path(&self, file: &str) -> String {
        self.dir.0.join(file).to_str().unwrap().to_string()
    }

    /// The CA's certificate file.
    pub fn ca(&self) -> String {
        self.path(&format!("{}.crt", self.name))
    }

    /// A server certificate for IP address `ip` (its subjectAltName): (certificate, key) files.
    pub fn server(&self, cn: &str, ip: &str) -> (String, String) {
        self.sign(cn, &format!("subjectAltName=IP:{ip}\nextendedKeyUsage=serverAuth\n"))
    }

    /// A client certificate with CN `cn` (etcd's user, when auth is on): (certificate, key) files.
    pub fn client(&self, cn: &str) -> (String, String) {
        self.sign(cn, "extendedKeyUsage=clientAuth\n")
    }

    fn sign(&self, cn: &str, extensions: &str) -> (String, String) {
        let (crt, key, csr, ext) = (
            self.path(&format!("{cn}.crt")),
            self.path(&format!("{cn}.key")),
            self.path(&format!("{cn}.csr")),
            self.path(&format!("{cn}.ext")),
        );
        fs::write(&ext, extensions).unwrap();
        new_key(&[], &key, &csr, cn);
        let ca_key = self.path(&format!("{}.key", self.name));
        run(&[
            "openssl",
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            &self.ca(),
            "-CAkey",
            &ca_key,
            "-CAcreateserial",
            "-out",
            &crt,
            "-days",
            "1",
            "-extfile",
            &ext,
        ]);
        (crt, key)
    }
}

/// `openssl req [extra] -newkey ec (P-256)`: a new key in `key`, and in `out` a request (or with
/// `-x509`, a self-signed certificate) for CN `cn`.
fn new_key(extra: &[&str], key: &str, out: &str, cn: &str) {
    let subject = format!("/CN={cn}");
    let mut args = vec!["openssl", "req"];
    args.extend(extra);
    args.extend(["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", key, "-out", out]);
    args.extend(["-subj", &subject]);
    run(&args);
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

/// The bearer token the Kubernetes API stand-in (tests/k8s_standin.py) accepts.
pub const TOKEN: &str = "standin-token-0123456789";

/// A Node as `kubectl get node -o json` shows one on a kubeadm cluster.
pub fn k8s_node(name: &str, v4: &str, v6: &str, cidr4: &str, cidr6: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": format!("5b0e3c1a-0000-4000-8000-{:012}", name.len()),
            "creationTimestamp": "2026-11-01T10:00:00Z",
            "labels": {
                "beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64", "kubernetes.io/hostname": name, "kubernetes.io/os": "linux"
            },
            "annotations": {
                "kubeadm.alpha.kubernetes.io/cri-socket": "unix:///var/run/containerd/containerd.sock",
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true"
            },
            "managedFields": [{"manager": "kubelet", "operation": "Update", "apiVersion": "v1",
                               "time": "2026-11-01T10:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {}}}]
        },
        "spec": {
            "podCIDR": cidr4,
            "podCIDRs": [cidr4, cidr6],
            "taints": [{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]
        },
        "status": {
            "addresses": [
                {"type": "InternalIP", "address": v4},
                {"type": "InternalIP", "address": v6},
                {"type": "Hostname", "address": name}
            ],
            "allocatable": {"cpu": "2", "ephemeral-storage": "28Gi", "memory": "3913Mi", "pods": "110"},
            "capacity": {"cpu": "2", "ephemeral-storage": "30Gi", "memory": "4013Mi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "False", "reason": "KubeletNotReady",
                            "message": "container runtime network not ready: NetworkReady=false",
                            "lastHeartbeatTime": "2026-11-01T10:05:00Z", "lastTransitionTime": "2026-11-01T10:00:00Z"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"architecture": "amd64", "bootID": "b", "containerRuntimeVersion": "containerd://1.6.20",
                         "kernelVersion": "6.1.0-27-amd64", "kubeProxyVersion": "v1.31.2", "kubeletVersion": "v1.31.2",
                         "machineID": "m", "operatingSystem": "linux", "osImage": "Debian GNU/Linux 12 (bookworm)",
                         "systemUUID": "s"}
        }
    })
}

/// An agent of node `name` at `ip` leasing from etcd at `endpoints` (host-gw, no plugins, its
/// conflist in `conf`, metrics on any free port).
pub fn etcd_agent_args(endpoints: &str, name: &str, cluster: &str, ip: &str, ttl: u32, conf: &Path) -> Vec<String> {
    let (ttl, conf) = (ttl.to_string(), conf.to_str().unwrap());
    let args = [
        "--node-name",
        name,
        "--datastore",
        "etcd",
        "--etcd-endpoints",
        endpoints,
        "--cluster-cidr",
        cluster,
        "--node-ip",
        ip,
        "--lease-ttl",
        &ttl,
        "--backend",
        "host-gw",
        "--no-plugins",
        "--conf-dir",
        conf,
        "--bin-dir",
        conf,
        "--metrics-addr",
        "127.0.0.1:0",
    ];
    args.iter().map(|s| s.to_string()).collect()
}

/// The Kubernetes API stand-in (tests/k8s_standin.py) in namespace `ns`, serving HTTPS on
/// `ip`:6443 and its control port on 127.0.0.1:6444 there, and a kubeconfig for it.
pub struct Standin {
    pub proc: Proc,
    pub kubeconfig: PathBuf,
    pub ns: String,
    /// Its CA and server certificate (kept while it runs).
    pub pki: Pki,
}

impl Standin {
    /// Starts it with `objects` (a JSON list of API objects, each with its kind) already stored.
    pub fn start(ns: &str, dir: &Path, ip: &str, objects: &serde_json::Value) -> Standin {
        use base64::Engine;
        let pki = Pki::new("standin-ca");
        let (crt, key) = pki.server("standin", ip);
        let ca = base64::engine::general_purpose::STANDARD.encode(fs::read(pki.ca()).unwrap());
        fs::write(dir.join("objects.json"), objects.to_string()).unwrap();
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/k8s_standin.py");
        let api = format!("{ip}:6443");
        let args: Vec<String> = [
            "python3",
            script.to_str().unwrap(),
            &crt,
            &key,
            TOKEN,
            &api,
            "6444",
            dir.join("objects.json").to_str().unwrap(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let proc = Proc::spawn(ns, &args, dir.join("standin.log"));
        wait_for("the stand-in", Duration::from_secs(10), || proc.log().contains("serving").then_some(()));
        let kubeconfig = dir.join("kubeconfig");
        let server = if ip.contains(':') { format!("[{ip}]") } else { ip.to_string() };
        fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: standin\n  cluster:\n    server: https://{server}:6443\n    certificate-authority-data: {ca}\nusers:\n- name: agent\n  user:\n    token: {TOKEN}\ncontexts:\n- name: standin\n  context:\n    cluster: standin\n    user: agent\ncurrent-context: standin\n"
            ),
        )
        .unwrap();
        Standin { proc, kubeconfig, ns: ns.to_string(), pki }
    }

    /// POSTs `body` to the control port's `path` (see tests/k8s_standin.py).
    pub fn control(&self, path: &str, body: &str) {
        let url = format!("http://127.0.0.1:6444{path}");
        run_in(&self.ns, &["curl", "-sSf", "-X", "POST", "--data-binary", body, &url]);
    }

    /// Creates or replaces an object (ADDED or MODIFIED event).
    pub fn apply(&self, obj: &serde_json::Value) {
        self.control("/apply", &obj.to_string());
    }

    /// Deletes an object of `kind` (DELETED event); `namespace` is "" for cluster-scoped kinds.
    pub fn delete(&self, kind: &str, namespace: &str, name: &str) {
        self.control(&format!("/delete?kind={kind}&namespace={namespace}&name={name}"), "");
    }

    /// The requests the stand-in has seen, one a line (`LIST nodes`, `WATCH pods 12`, `PATCH n0`).
    pub fn requests(&self) -> String {
        run_in(&self.ns, &["curl", "-sSf", "http://127.0.0.1:6444/log"])
    }
}

/// The directory holding the agent and the plugins cnitool runs (target/debug).
pub fn plugin_dir() -> PathBuf {
    let dir = Path::new(AGENT).parent().unwrap().to_path_buf();
    for name in ["bridge", "host-local", "loopback", "cnitool"] {
        assert!(dir.join(name).is_file(), "{} missing: run cargo build --workspace --bins", dir.join(name).display());
    }
    dir
}

/// A conflist template like the agent's built-in one, with host-local's data kept in `data`.
pub fn pod_template(data: &Path) -> String {
    let t = serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "cni-rs",
        "plugins": [
            {
                "type": "bridge", "bridge": "cni0", "isGateway": true, "isDefaultGateway": true,
                "ipMasq": false, "hairpinMode": true, "mtu": "__MTU__",
                "ipam": { "type": "host-local", "ranges": "__POD_CIDR_RANGES__",
                          "routes": "__DEFAULT_ROUTES__", "dataDir": data.to_str().unwrap() }
            },
            { "type": "loopback" }
        ]
    });
    t.to_string()
}

/// A node of a test cluster: its namespace, its addresses on the segment, and its directory
/// (the agent's conf dir `net.d`, its template, host-local's data, cnitool's cache).
pub struct ClusterNode {
    pub ns: Netns,
    pub ip: &'static str,
    pub ip6: &'static str,
    pub dir: PathBuf,
}

/// Three nodes on one machine, the segment namespace routing between their two subnets:
///
/// ```text
///   n0 10.95.0.11 ─┐                     ┌─ n2 10.96.0.13
///   n1 10.95.0.12 ─┴─ br0 [router] br1 ──┘
///                   10.95.0.1  10.96.0.1
/// ```
/// (and fd00:95::/64, fd00:96::/64 the same way). Each node's directory is under `dir`.
pub fn three_node_network(t: &str, dir: &Path) -> (Segment, Vec<ClusterNode>) {
    let seg = Segment::new(format!("cnseg{t}"), "10.95.0.1/24");
    seg.add_bridge("br1", "10.96.0.1/24");
    run(&["ip", "-n", &seg.ns.0, "addr", "add", "fd00:95::1/64", "dev", "br0", "nodad"]);
    run(&["ip", "-n", &seg.ns.0, "addr", "add", "fd00:96::1/64", "dev", "br1", "nodad"]);
    run(&["ip", "netns", "exec", &seg.ns.0, "sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"]);
    let mut nodes = Vec::new();
    let ips = [("10.95.0.11", "fd00:95::11"), ("10.95.0.12", "fd00:95::12"), ("10.96.0.13", "fd00:96::13")];
    for (i, (ip, ip6)) in ips.into_iter().enumerate() {
        let ns = Netns::new(format!("cnn{t}-{i}"));
        let bridge = if i < 2 { "br0" } else { "br1" };
        seg.attach_to(bridge, &ns, &format!("p{i}"), &format!("{ip}/24"));
        let gw = if i < 2 { "10.95.0.1" } else { "10.96.0.1" };
        run(&["ip", "-n", &ns.0, "route", "add", "default", "via", gw]);
        run(&["ip", "-n", &ns.0, "addr", "add", &format!("{ip6}/64"), "dev", "eth0", "nodad"]);
        let gw6 = if i < 2 { "fd00:95::1" } else { "fd00:96::1" };
        run(&["ip", "-n", &ns.0, "-6", "route", "add", "default", "via", gw6]);
        let ndir = dir.join(format!("n{i}"));
        fs::create_dir_all(ndir.join("ipam")).unwrap();
        fs::write(ndir.join("template"), pod_template(&ndir.join("ipam"))).unwrap();
        nodes.push(ClusterNode { ns, ip, ip6, dir: ndir });
    }
    (seg, nodes)
}

impl ClusterNode {
    /// The agent of this node, `n<i>`: `datastore`'s flags, dual-stack, `backend`, its conflist,
    /// plugin directory and template in the node's directory.
    pub fn agent_args(&self, i: usize, datastore: &[&str], backend: &str) -> Vec<String> {
        let (name, ips) = (format!("n{i}"), format!("{},{}", self.ip, self.ip6));
        let path = |sub: &str| self.dir.join(sub).to_str().unwrap().to_string();
        let (conf, bin, template) = (path("net.d"), path("bin"), path("template"));
        let mut args = vec!["--node-name", &name];
        args.extend(datastore);
        args.extend(["--cluster-cidr", "10.244.0.0/16,fd00:10:244::/56", "--node-ip", &ips, "--backend", backend]);
        args.extend(["--no-plugins", "--conf-dir", &conf, "--bin-dir", &bin, "--template", &template]);
        args.iter().map(|s| s.to_string()).collect()
    }
}

/// Adds pod namespace `pod` on `node` with cnitool and the conflist the node's agent wrote;
/// returns the CNI result.
pub fn cni_add(node: &ClusterNode, plugins: &Path, pod: &str) -> serde_json::Value {
    let out = Command::new("ip")
        .args(["netns", "exec", &node.ns.0, plugins.join("cnitool").to_str().unwrap()])
        .args(["add", "cni-rs", &format!("/var/run/netns/{pod}"), "--json"])
        .env("NETCONFPATH", node.dir.join("net.d"))
        .env("CNI_PATH", plugins)
        .env("CNI_CACHE_DIR", node.dir.join("cache"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "cnitool add {pod} on {}: {text}{}", node.ns.0, String::from_utf8_lossy(&out.stderr));
    serde_json::from_str(&text).unwrap()
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

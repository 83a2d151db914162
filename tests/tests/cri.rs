//! Kubernetes' own path to the plugins, end to end: containerd's CRI (Debian's containerd 1.6, its
//! go-cni, runc) runs a pod sandbox on a conflist of our bridge + host-local + portmap
//! (`capabilities: {portMappings: true}`) + loopback, the way kubelet does: RunPodSandbox with three
//! port mappings (tcp, udp, and one bound to a host address), traffic through every mapping from
//! the host to servers in the pod's network namespace, StopPodSandbox twice, RemovePodSandbox, and
//! then nothing of the pod may be left: no veth on the bridge, no host-local reservation, no
//! firewall element naming the pod, no netns, no libcni cache entry.
//!
//! go-cni sends `runtimeConfig.portMappings` as Go structs without JSON tags
//! (`{"HostPort":..,"ContainerPort":..,"Protocol":"tcp","HostIP":""}`), so this is the test of our
//! plugins decoding keys as Go's encoding/json does.
//!
//! The CRI client is tests/cri/cri.py (grpcio, with the messages of tests/cri/api.proto); the
//! sandbox ("pause") image is built by tests/cri/pause-image.sh from the host's static busybox and
//! imported with `ctr` (there is no registry). containerd gets its own root, state, sockets, opt
//! dir, runc root and CNI conf dir in a temp dir, and the pod a cgroup parent of its own; the CNI
//! bin_dir is target/debug. What containerd 1.6 writes outside regardless: the pod's netns under
//! /var/run/netns (removed by RemovePodSandbox), the go-cni result cache in /var/lib/cni/results
//! (removed by DEL; checked), and its shim's socket under /run/containerd/s (removed when the shim
//! exits; the directories, when this test made them, by the cleanup).
//!
//! Cleanup runs whatever state the test stopped in (the guard's Drop): the sandboxes are stopped and
//! removed through the CRI, the chain's DEL is run directly for every pod seen (a failed CRI call
//! may have stranded a pod), then containerd, its shims and runc containers are killed by pid,
//! mounts under the temp dir, the pods' netns, the bridge and the cgroup parent are removed.
//!
//! CI (CI=true, root): a missing containerd, runc, busybox or grpcio fails the test. Locally without
//! them it prints a note and passes.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod e2e;

use cni_tests::{bin_dir, prerequisite, require_root, run, unique, TempDir};
use e2e::*;
use serde_json::{json, Value};
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BUSYBOX: &str = "/bin/busybox";
const PAUSE_IMAGE: &str = "localhost/cnirs-pause:test";
const CNI_VERSION: &str = "1.0.0";
const PAGE: &str = "hello from a CRI pod on cni-rs\n";
const PAGE_BOUND: &str = "hello through the hostIP-bound mapping\n";

/// containerd confined to one temp dir, and what the test made around it; Drop cleans up.
struct Cri {
    dir: TempDir,
    containerd: Option<Child>,
    servers: Vec<Child>,
    conflist: Value,
    bridge: String,
    cgroup_parent: String,
    /// Every sandbox id seen, with its netns path once known.
    pods: Vec<(String, Option<String>)>,
    /// containerd's fixed shim socket dirs (/run/containerd/s) that did not exist before the test.
    run_dirs: Vec<PathBuf>,
}

impl Cri {
    fn path(&self, sub: &str) -> PathBuf {
        self.dir.path().join(sub)
    }

    fn socket(&self) -> PathBuf {
        self.path("containerd.sock")
    }

    fn network(&self) -> String {
        self.conflist["name"].as_str().unwrap().to_string()
    }

    /// The last lines of containerd's log, for failure messages.
    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.path("containerd.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }

    /// One CRI call (runtime.v1.RuntimeService/`method`); the response, or the gRPC error.
    fn call(&self, method: &str, request: &Value) -> Result<Value, String> {
        let client = repo_root().join("tests/cri/cri.py");
        let mut child = Command::new("python3")
            .arg(&client)
            .arg(self.socket())
            .arg(method)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("run python3 {}: {e}", client.display()));
        child.stdin.take().unwrap().write_all(request.to_string().as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
        }
        serde_json::from_slice(&out.stdout).map_err(|e| format!("{method}: response is not JSON: {e}"))
    }

    fn ok(&self, method: &str, request: &Value) -> Value {
        self.call(method, request).unwrap_or_else(|e| {
            panic!("CRI {method} {request} failed: {e}\n--- containerd log (tail):\n{}", self.log_tail())
        })
    }

    /// The sandbox's network namespace path, from PodSandboxStatus's verbose info (the OCI spec of
    /// the sandbox container).
    fn netns_of(&self, id: &str) -> Option<String> {
        let status = self.call("PodSandboxStatus", &json!({"pod_sandbox_id": id, "verbose": true})).ok()?;
        let info: Value = serde_json::from_str(status["info"]["info"].as_str()?).ok()?;
        let namespaces = info["runtimeSpec"]["linux"]["namespaces"].as_array()?;
        let net = namespaces.iter().find(|n| n["type"] == "network")?;
        net["path"].as_str().map(String::from)
    }

    fn remember(&mut self, id: &str, netns: Option<String>) {
        match self.pods.iter_mut().find(|(i, _)| i == id) {
            Some(p) => p.1 = p.1.take().or(netns),
            None => self.pods.push((id.to_string(), netns)),
        }
    }

    /// Starts containerd and waits until its CRI answers Version.
    fn start(&mut self) {
        let log = std::fs::File::create(self.path("containerd.log")).unwrap();
        let child = Command::new("containerd")
            .arg("--config")
            .arg(self.path("config.toml"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start containerd: {e}"));
        self.containerd = Some(child);
        let start = Instant::now();
        loop {
            match self.call("Version", &json!({})) {
                Ok(v) => {
                    assert_eq!(v["runtime_name"], "containerd", "Version: {v}");
                    return;
                }
                Err(e) if start.elapsed() > Duration::from_secs(15) => {
                    panic!("containerd's CRI did not answer within 15 s: {e}\n--- log:\n{}", self.log_tail())
                }
                Err(_) => std::thread::sleep(Duration::from_millis(200)),
            }
        }
    }

    /// A server in the pod's network namespace (`nsenter --net`), killed by the cleanup.
    fn serve(&mut self, netns: &str, args: &[&str]) {
        let child = Command::new("nsenter")
            .arg(format!("--net={netns}"))
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("nsenter {args:?}: {e}"));
        self.servers.push(child);
    }

    fn stop_servers(&mut self) {
        for mut c in self.servers.drain(..) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The chain's DEL run directly, plugin by plugin in reverse, as libcni would: what a CRI call
    /// that failed may have left of the pod.
    fn del_directly(&self, id: &str, netns: Option<&str>) {
        let bins = bin_dir();
        let plugins = self.conflist["plugins"].as_array().unwrap();
        for plugin in plugins.iter().rev() {
            let mut conf = plugin.clone();
            conf["name"] = self.conflist["name"].clone();
            conf["cniVersion"] = self.conflist["cniVersion"].clone();
            let Some(kind) = plugin["type"].as_str() else { continue };
            let Ok(mut child) = Command::new(bins.join(kind))
                .env("CNI_COMMAND", "DEL")
                .env("CNI_CONTAINERID", id)
                .env("CNI_NETNS", netns.unwrap_or(""))
                .env("CNI_IFNAME", "eth0")
                .env("CNI_PATH", &bins)
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
            else {
                continue;
            };
            if let Some(mut stdin) = child.stdin.take() {
                let _ = stdin.write_all(conf.to_string().as_bytes());
            }
            let _ = child.wait();
        }
        let _ = std::fs::remove_file(format!("/var/lib/cni/results/{}-{id}-eth0", self.network()));
    }

    /// Pids of the processes whose command line names this containerd's socket (its shims).
    fn shim_pids(&self) -> Vec<i32> {
        let socket = self.socket().to_string_lossy().into_owned();
        let Ok(entries) = std::fs::read_dir("/proc") else { return vec![] };
        entries
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
            .filter(|pid| {
                let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                cmdline.split(|b| *b == 0).any(|arg| arg == socket.as_bytes())
            })
            .collect()
    }

    fn cleanup(&mut self) {
        self.stop_servers();
        if self.containerd.is_some() {
            if let Ok(list) = self.call("ListPodSandbox", &json!({})) {
                for item in list["items"].as_array().cloned().unwrap_or_default() {
                    let Some(id) = item["id"].as_str() else { continue };
                    let netns = self.netns_of(id);
                    self.remember(id, netns);
                    let _ = self.call("StopPodSandbox", &json!({"pod_sandbox_id": id}));
                    let _ = self.call("RemovePodSandbox", &json!({"pod_sandbox_id": id}));
                }
            }
        }
        // Idempotent when the CRI calls did their job; the only way out when they did not.
        for (id, netns) in self.pods.clone() {
            self.del_directly(&id, netns.as_deref());
        }
        if let Some(mut child) = self.containerd.take() {
            // SAFETY: kill(2) on the pid of our own child, which has not been waited for yet.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let start = Instant::now();
            while child.try_wait().ok().flatten().is_none() && start.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        // runc containers the shims left (the pause processes), then the shims themselves.
        let runc_root = self.path("runc/k8s.io").to_string_lossy().into_owned();
        let out = run("runc", &["--root", &runc_root, "list", "-q"]);
        for id in String::from_utf8_lossy(&out.stdout).split_whitespace() {
            let _ = run("runc", &["--root", &runc_root, "kill", id, "KILL"]);
            let _ = run("runc", &["--root", &runc_root, "delete", "-f", id]);
        }
        for pid in self.shim_pids() {
            // SAFETY: kill(2) with a pid read from /proc; a shim of the containerd this test started.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        unmount_all_under(self.dir.path());
        // The pods' netns: known from their status, or from the veths still on our bridge.
        let mut netns: Vec<String> = self.pods.iter().filter_map(|(_, n)| n.clone()).collect();
        let ports = run("ip", &["-o", "link", "show", "master", &self.bridge]);
        for line in String::from_utf8_lossy(&ports.stdout).lines() {
            if let Some(name) = line.split("link-netns ").nth(1).and_then(|s| s.split_whitespace().next()) {
                netns.push(format!("/var/run/netns/{name}"));
            }
        }
        for ns in netns {
            if let Some(name) = Path::new(&ns).file_name() {
                let _ = run("ip", &["netns", "del", &name.to_string_lossy()]);
            }
        }
        let _ = run("ip", &["link", "del", &self.bridge]);
        for d in &self.run_dirs {
            let _ = std::fs::remove_dir(d);
        }
        // The pod's cgroup parent in every hierarchy (rmdir: only when empty, deepest first).
        if let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") {
            for h in hierarchies.filter_map(|e| e.ok()) {
                let parent = h.path().join(self.cgroup_parent.trim_start_matches('/'));
                remove_empty_dirs(&parent);
            }
        }
    }
}

impl Drop for Cri {
    fn drop(&mut self) {
        self.cleanup();
        // the TempDir field is removed after this
    }
}

/// Removes `dir` and the directories under it, deepest first; a cgroup directory can only be
/// removed with rmdir, once empty of processes and children.
fn remove_empty_dirs(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.filter_map(|e| e.ok()) {
        if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            remove_empty_dirs(&e.path());
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// What the test needs installed; false (locally) or a failure (CI) when something is missing.
fn prerequisites() -> bool {
    prerequisite(runs("containerd", &["--version"]), "containerd is not installed (apt-get install containerd)")
        && prerequisite(runs("ctr", &["--version"]), "ctr is not installed (apt-get install containerd)")
        && prerequisite(runs("runc", &["--version"]), "runc is not installed (apt-get install runc)")
        && prerequisite(Path::new(BUSYBOX).is_file(), "/bin/busybox is missing (apt-get install busybox-static)")
        && prerequisite(runs("socat", &["-V"]), "socat is not installed (apt-get install socat)")
        && prerequisite(
            runs("python3", &["-c", "import grpc, grpc_tools"]),
            "python3 has no grpcio/grpcio-tools (pip install grpcio grpcio-tools; tests/setup.sh does)",
        )
}

/// A port free for both TCP and UDP on the host right now (the kernel's pick, then released).
fn free_port_both() -> u16 {
    for _ in 0..50 {
        let tcp = TcpListener::bind("0.0.0.0:0").expect("bind an ephemeral TCP port");
        let port = tcp.local_addr().expect("local_addr").port();
        if UdpSocket::bind(("0.0.0.0", port)).is_ok() {
            return port;
        }
    }
    panic!("no port free for both TCP and UDP");
}

/// One UDP datagram to `addr:port` from the host (socat); the answer, or None.
fn udp_echo(addr: IpAddr, port: u16, msg: &str) -> Option<String> {
    let mut child = Command::new("socat")
        .args(["-t", "1", "-T", "2", "-", &format!("UDP4:{addr}:{port}")])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("run socat");
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(format!("{msg}\n").as_bytes());
    }
    let out = child.wait_with_output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (!text.is_empty()).then_some(text)
}

fn udp_echo_retry(addr: IpAddr, port: u16, msg: &str, within: Duration) -> Option<String> {
    let start = Instant::now();
    loop {
        if let Some(answer) = udp_echo(addr, port, msg) {
            return Some(answer);
        }
        if start.elapsed() > within {
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The test's network: bridge + host-local (dataDir in the temp dir) + portmap + loopback.
fn test_conflist(network: &str, bridge: &str, subnet: &str, data_dir: &Path) -> Value {
    json!({
        "cniVersion": CNI_VERSION,
        "name": network,
        "plugins": [
            {
                "type": "bridge",
                "bridge": bridge,
                "isGateway": true,
                "ipMasq": true,
                "ipam": {
                    "type": "host-local",
                    "dataDir": data_dir,
                    "ranges": [[{"subnet": subnet}]],
                    "routes": [{"dst": "0.0.0.0/0"}]
                }
            },
            {"type": "portmap", "capabilities": {"portMappings": true}},
            {"type": "loopback"}
        ]
    })
}

/// containerd's config: everything under `dir`, the CRI plugin on our plugins and conf dir.
fn containerd_config(dir: &Path, bins: &Path) -> String {
    let d = |s: &str| dir.join(s).to_string_lossy().into_owned();
    format!(
        r#"version = 2
root = {root:?}
state = {state:?}
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs", "io.containerd.internal.v1.tracing"]

[grpc]
  address = {sock:?}

[ttrpc]
  address = {ttrpc:?}

[plugins."io.containerd.internal.v1.opt"]
  path = {opt:?}

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = {image:?}
  # Without it runc fails to create the sandbox here ("can't get final child's PID from pipe"):
  # containerd asks for an oom_score_adj below its own, which root on this host may not set.
  restrict_oom_score_adj = true
  enable_selinux = false
  disable_apparmor = true

  [plugins."io.containerd.grpc.v1.cri".containerd]
    # The native snapshotter copies; no overlay mount of an image needed for a 2 MB busybox.
    snapshotter = "native"
    default_runtime_name = "runc"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        # runc, not crun (crun fails on this kernel's cgroup layout); its state in our dir.
        BinaryName = "runc"
        Root = {runc:?}
        SystemdCgroup = false

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = {bins:?}
    conf_dir = {net:?}
    max_conf_num = 1
"#,
        root = d("root"),
        state = d("state"),
        sock = d("containerd.sock"),
        ttrpc = d("containerd.sock.ttrpc"),
        opt = d("opt"),
        image = PAUSE_IMAGE,
        runc = d("runc"),
        bins = bins.to_string_lossy(),
        net = d("net.d"),
    )
}

#[test]
fn cri_pod_with_hostports_serves_every_mapping_and_leaves_nothing() {
    if !prerequisites() {
        return;
    }
    require_root();
    let started = Instant::now();
    let bins = bin_dir();

    let dir = TempDir::new("cnirs-cri-");
    let bridge = unique("cnirscri");
    let network = unique("cnirs-cri-");
    // A /24 of its own per run (10.252.0.0/16 is used by no other test).
    let third = std::process::id() % 250 + 2;
    let subnet = format!("10.252.{third}.0/24");
    let gateway = Ipv4Addr::new(10, 252, third as u8, 1);
    let data_dir = dir.path().join("ipam");
    let conflist = test_conflist(&network, &bridge, &subnet, &data_dir);
    let mut cri = Cri {
        dir,
        containerd: None,
        servers: Vec::new(),
        conflist,
        bridge: bridge.clone(),
        cgroup_parent: format!("/{}", unique("cnirs-cri-")),
        pods: Vec::new(),
        // Deepest first, for rmdir.
        run_dirs: ["/run/containerd/s", "/run/containerd"].iter().map(PathBuf::from).filter(|d| !d.exists()).collect(),
    };
    assert!(!link_exists(&bridge), "{bridge} already exists");
    for sub in ["net.d", "root", "state", "opt", "runc", "logs", "www", "www-bound"] {
        std::fs::create_dir_all(cri.path(sub)).unwrap();
    }
    std::fs::write(cri.path("net.d/10-cnirs.conflist"), serde_json::to_string_pretty(&cri.conflist).unwrap()).unwrap();
    std::fs::write(cri.path("config.toml"), containerd_config(cri.dir.path(), &bins)).unwrap();
    std::fs::write(cri.path("www/index.html"), PAGE).unwrap();
    std::fs::write(cri.path("www-bound/index.html"), PAGE_BOUND).unwrap();

    // The sandbox image, built here and imported into containerd's k8s.io namespace.
    let image = cri.path("pause.tar");
    let script = repo_root().join("tests/cri/pause-image.sh");
    let out = Command::new(&script).arg(&image).arg(PAUSE_IMAGE).output().unwrap();
    assert!(out.status.success(), "{}: {}", script.display(), String::from_utf8_lossy(&out.stderr));

    cri.start();
    let sock = cri.socket().to_string_lossy().into_owned();
    let image_arg = image.to_string_lossy().into_owned();
    let out = run("ctr", &["-a", &sock, "-n", "k8s.io", "images", "import", "--snapshotter", "native", &image_arg]);
    assert!(out.status.success(), "ctr images import: {}", String::from_utf8_lossy(&out.stderr));

    // RunPodSandbox with three hostPorts: tcp and udp on every host address, tcp on the gateway only.
    let tcp_port = free_port_both();
    let udp_port = free_port_both();
    let bound_port = free_port_both();
    let config = json!({
        "metadata": {"name": "web", "uid": unique("uid-"), "namespace": "cnirs-cri", "attempt": 0},
        "hostname": "web",
        "log_directory": cri.path("logs"),
        "port_mappings": [
            {"protocol": "TCP", "container_port": 80, "host_port": tcp_port},
            {"protocol": "UDP", "container_port": 5353, "host_port": udp_port},
            {"protocol": "TCP", "container_port": 81, "host_port": bound_port, "host_ip": gateway.to_string()}
        ],
        "linux": {"cgroup_parent": cri.cgroup_parent}
    });
    let ran = cri.call("RunPodSandbox", &json!({"config": config}));
    // A failed RunPodSandbox may still have left a sandbox: remember it for the cleanup.
    if let Ok(list) = cri.call("ListPodSandbox", &json!({})) {
        for item in list["items"].as_array().cloned().unwrap_or_default() {
            if let Some(id) = item["id"].as_str() {
                let netns = cri.netns_of(id);
                cri.remember(id, netns);
            }
        }
    }
    let ran =
        ran.unwrap_or_else(|e| panic!("RunPodSandbox failed: {e}\n--- containerd log (tail):\n{}", cri.log_tail()));
    let id = ran["pod_sandbox_id"].as_str().expect("pod_sandbox_id").to_string();

    // The pod: ready, its address in the subnet, in its own netns.
    let status = cri.ok("PodSandboxStatus", &json!({"pod_sandbox_id": id, "verbose": true}));
    assert_eq!(status["status"]["state"].as_str().unwrap_or("SANDBOX_READY"), "SANDBOX_READY", "{status}");
    let ip_text = status["status"]["network"]["ip"].as_str().unwrap_or_default();
    let ip: Ipv4Addr = ip_text.parse().unwrap_or_else(|_| panic!("no pod address in PodSandboxStatus: {status}"));
    assert!(in_v4_subnet(ip, &subnet), "pod address {ip} is not in {subnet}");
    let netns = cri.netns_of(&id).unwrap_or_else(|| panic!("no network namespace in PodSandboxStatus: {status}"));
    cri.remember(&id, Some(netns.clone()));
    let addrs = run("nsenter", &[&format!("--net={netns}"), "ip", "-4", "-o", "addr", "show", "eth0"]);
    let addrs = String::from_utf8_lossy(&addrs.stdout).into_owned();
    assert!(addrs.contains(&format!("inet {ip}/24")), "eth0 in {netns} does not hold {ip}/24: {addrs}");

    // host-local's reservation, owned by the sandbox; a veth on the bridge; rules naming the pod.
    assert_attached(&data_dir, &network, &bridge, &ip.to_string(), &id, "pod");

    // Servers inside the pod's netns, reached from the host through every mapping.
    let www = cri.path("www").to_string_lossy().into_owned();
    let www_bound = cri.path("www-bound").to_string_lossy().into_owned();
    cri.serve(&netns, &[BUSYBOX, "httpd", "-f", "-p", "80", "-h", &www]);
    cri.serve(&netns, &[BUSYBOX, "httpd", "-f", "-p", "81", "-h", &www_bound]);
    cri.serve(&netns, &["socat", "UDP4-RECVFROM:5353,fork", "EXEC:cat"]);
    let within = Duration::from_secs(10);
    for addr in [IpAddr::V4(Ipv4Addr::LOCALHOST), IpAddr::V4(gateway)] {
        let body = http_get_retry(addr, tcp_port, within);
        assert_eq!(body.as_deref(), Some(PAGE), "GET http://{addr}:{tcp_port}/ (tcp mapping to 80)");
    }
    let echo = udp_echo_retry(IpAddr::V4(gateway), udp_port, "ping-cri", within);
    assert_eq!(echo.as_deref(), Some("ping-cri"), "udp {gateway}:{udp_port} (udp mapping to 5353)");
    let body = http_get_retry(IpAddr::V4(gateway), bound_port, within);
    assert_eq!(body.as_deref(), Some(PAGE_BOUND), "GET http://{gateway}:{bound_port}/ (mapping bound to {gateway})");
    // Bound to the gateway address: the same port on another host address is not mapped.
    assert_eq!(
        http_get(IpAddr::V4(Ipv4Addr::LOCALHOST), bound_port),
        None,
        "127.0.0.1:{bound_port} answers, but the mapping is bound to {gateway}"
    );

    // The containers go first (as kubelet stops them), then the sandbox: stop twice, remove.
    cri.stop_servers();
    cri.ok("StopPodSandbox", &json!({"pod_sandbox_id": id}));
    cri.ok("StopPodSandbox", &json!({"pod_sandbox_id": id}));
    cri.ok("RemovePodSandbox", &json!({"pod_sandbox_id": id}));

    // Nothing of the pod is left.
    let list = cri.ok("ListPodSandbox", &json!({}));
    assert!(list["items"].as_array().is_none_or(|v| v.is_empty()), "sandboxes left: {list}");
    assert_detached(&data_dir, &network, &bridge, &ip.to_string(), &id);
    for port in [tcp_port, bound_port] {
        for addr in [IpAddr::V4(Ipv4Addr::LOCALHOST), IpAddr::V4(gateway)] {
            assert_eq!(http_get(addr, port), None, "http://{addr}:{port}/ still answers after RemovePodSandbox");
        }
    }
    assert!(!Path::new(&netns).exists(), "netns {netns} left after RemovePodSandbox");
    let cached = format!("/var/lib/cni/results/{network}-{id}-eth0");
    assert!(!Path::new(&cached).exists(), "go-cni's result cache {cached} left after RemovePodSandbox");

    // The guard's cleanup leaves no process, mount or directory of ours.
    let tmp = cri.dir.path().to_path_buf();
    cri.cleanup();
    assert!(cri.shim_pids().is_empty(), "shims left: {:?}", cri.shim_pids());
    let left = mounts_under(&tmp);
    assert!(left.is_empty(), "mounts left under {}: {left:?}", tmp.display());
    drop(cri);
    assert!(!tmp.exists(), "{} not removed", tmp.display());
    assert!(!link_exists(&bridge), "{bridge} (made by this test) not removed");
    eprintln!("CRI end-to-end took {:.1}s", started.elapsed().as_secs_f64());
}

//! The DaemonSet's pod run as a kubelet runs it, from install/daemonset.yaml itself: the agent
//! container's command, args and NODE_NAME, uid 0 with exactly the capabilities the manifest adds
//! (bounding, permitted and effective sets; nothing inheritable or ambient; no_new_privs as
//! `allowPrivilegeEscalation: false` gives), a read-only root with only its volumes writable,
//! `/proc/sys` read-only as in any unprivileged container, and the service account as the kubelet
//! mounts it (token, ca.crt and namespace under /var/run/secrets/kubernetes.io/serviceaccount,
//! KUBERNETES_SERVICE_HOST/PORT), against the stand-in API server. It must do its whole job so;
//! with NET_ADMIN taken away too it must fail and say so, so the capability drop is real. The
//! init container's `--sysctls-only` sets the node's sysctls; without it the agent warns about
//! each wrong one.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

/// What install/daemonset.yaml says about its pod.
struct PodSpec {
    /// The agent container's command and args.
    agent: Vec<String>,
    node_name_from_spec: bool,
    caps: Vec<String>,
    metrics_port: u64,
    /// The init container's command and args, and whether it is privileged.
    init: Vec<String>,
    init_privileged: bool,
}

fn strings(value: &Value) -> Vec<String> {
    value.as_array().map(|l| l.iter().map(|v| v.as_str().unwrap().to_string()).collect()).unwrap_or_default()
}

fn pod_spec() -> PodSpec {
    let docs = manifest_documents();
    let pod = &manifest_kind(&docs, "DaemonSet")["spec"]["template"]["spec"];
    assert_eq!(pod["hostNetwork"], true);
    let containers = pod["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 1, "one container, the agent");
    let agent = &containers[0];
    let security = &agent["securityContext"];
    // What the test reproduces below; a manifest that changes these needs the test changed too.
    assert_eq!(security["runAsUser"], 0);
    assert_eq!(security["privileged"], false);
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(security["readOnlyRootFilesystem"], true);
    let caps = manifest_agent_capabilities(&docs);
    let node_name_from_spec = agent["env"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["name"] == "NODE_NAME" && e["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName");
    let probe = &agent["livenessProbe"]["httpGet"];
    assert_eq!((probe["host"].as_str(), probe["path"].as_str()), (Some("127.0.0.1"), Some("/healthz")));
    let init = pod["initContainers"].as_array().unwrap();
    assert_eq!(init.len(), 1, "one init container, sysctls");
    PodSpec {
        agent: [strings(&agent["command"]), strings(&agent["args"])].concat(),
        node_name_from_spec,
        caps,
        metrics_port: probe["port"].as_u64().unwrap(),
        init: [strings(&init[0]["command"]), strings(&init[0]["args"])].concat(),
        init_privileged: init[0]["securityContext"]["privileged"] == true,
    }
}

/// The image's paths in `argv[0]` and the volumes' mount points become the test's: the agent
/// binary this build made, and directories of the test (the DaemonSet's hostPath volumes).
fn localize(argv: &[String], extra: &[String]) -> Vec<String> {
    assert_eq!(argv[0], "/cni-rs-node", "the image's agent");
    let mut out = vec![AGENT.to_string()];
    out.extend(argv[1..].iter().cloned());
    out.extend(extra.iter().cloned());
    out
}

const SYSCTLS: [&str; 4] = [
    "net/ipv4/ip_forward",
    "net/bridge/bridge-nf-call-iptables",
    "net/bridge/bridge-nf-call-ip6tables",
    "net/ipv6/conf/all/forwarding",
];

fn sysctl(ns: &str, key: &str) -> String {
    run_in(ns, &["cat", &format!("/proc/sys/{key}")]).trim().to_string()
}

fn set_sysctl(ns: &str, key: &str, value: &str) {
    run_in(ns, &["sh", "-c", &format!("echo {value} > /proc/sys/{key}")]);
}

/// A node: namespace with eth0 10.95.0.11/24 on a segment whose 10.95.0.1 is its default gateway.
fn node_ns() -> (Segment, Netns) {
    let t = tag();
    let seg = Segment::new(format!("cpseg{t}"), "10.95.0.1/24");
    let node = Netns::new(format!("cpn{t}"));
    seg.attach(&node, "p0", "10.95.0.11/24");
    run_in(&node.0, &["ip", "route", "add", "default", "via", "10.95.0.1"]);
    (seg, node)
}

/// The cluster the stand-in serves: this node n0, n1 on its subnet (host-gw), n2 on another
/// subnet with its VTEP MAC annotated (VXLAN). Single-stack, as the manifest's --cluster-cidr.
fn nodes() -> Value {
    let single = |mut n: Value, cidr: &str, ip: &str| {
        n["spec"]["podCIDRs"] = json!([cidr]);
        n["status"]["addresses"] = json!([{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": "x"}]);
        n
    };
    let mut n2 =
        single(k8s_node("n2", "10.97.0.13", "fd00:97::13", "10.244.2.0/24", ""), "10.244.2.0/24", "10.97.0.13");
    n2["metadata"]["annotations"]["cni-rs.io/vtep-mac"] = json!("02:00:00:00:00:13");
    json!([
        single(k8s_node("n0", "10.95.0.11", "fd00:95::11", "10.244.0.0/24", ""), "10.244.0.0/24", "10.95.0.11"),
        single(k8s_node("n1", "10.95.0.12", "fd00:95::12", "10.244.1.0/24", ""), "10.244.1.0/24", "10.95.0.12"),
        n2,
    ])
}

/// The pod's filesystem: the service account files, the volumes, a plugin source like the image's.
struct PodFiles {
    dir: TempDir,
}

impl PodFiles {
    fn new() -> PodFiles {
        let dir = TempDir::new("pod");
        let sa = dir.0.join("serviceaccount");
        std::fs::create_dir_all(&sa).unwrap();
        std::fs::write(sa.join("token"), TOKEN).unwrap();
        std::fs::write(sa.join("namespace"), "kube-system").unwrap();
        // The stand-in's CA replaces it where an API server is needed.
        std::fs::write(sa.join("ca.crt"), "").unwrap();
        for volume in ["bin", "net.d", "state"] {
            std::fs::create_dir_all(dir.0.join(volume)).unwrap();
        }
        let src = dir.0.join("src");
        std::fs::create_dir_all(&src).unwrap();
        std::fs::write(src.join("cni-rs"), b"\x7fELF stand-in for the multi-call plugin binary").unwrap();
        std::fs::write(src.join(".plugins"), "bridge\nhost-local\nloopback\n").unwrap();
        PodFiles { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.0.join(name)
    }

    /// Flags that point the agent's volume paths at the test's directories.
    fn volume_flags(&self) -> Vec<String> {
        let p = |name: &str| self.path(name).to_str().unwrap().to_string();
        ["--src", &p("src"), "--bin-dir", &p("bin"), "--conf-dir", &p("net.d"), "--state-dir", &p("state")]
            .iter()
            .map(|s| s.to_string())
            .collect()
    }
}

/// Starts `argv` in `ns` as the kubelet starts the agent container: in its own mount namespace
/// with `/proc/sys` read-only, the service account under /var/run/secrets, every mount read-only
/// but `writable`, then uid 0 with only `caps` (bounding set; so permitted and effective, since
/// uid 0 gets its bounding set on exec), no inheritable or ambient ones, and no_new_privs.
fn start_container(ns: &str, files: &PodFiles, caps: &[String], writable: &[PathBuf], argv: &[String]) -> Proc {
    let bounding: String = std::iter::once("-all".to_string())
        .chain(caps.iter().map(|c| format!("+{}", c.to_lowercase())))
        .collect::<Vec<_>>()
        .join(",");
    let mut script = String::from("set -e\nmount --bind /proc/sys /proc/sys\nmount -o remount,bind,ro /proc/sys\n");
    script.push_str("mount -t tmpfs -o mode=0755,size=1m tmpfs /run\n");
    script.push_str("mkdir -p /run/secrets/kubernetes.io/serviceaccount\n");
    script.push_str(&format!(
        "cp '{0}/token' '{0}/namespace' '{0}/ca.crt' /run/secrets/kubernetes.io/serviceaccount/\n",
        files.path("serviceaccount").display()
    ));
    script.push_str("mount -o remount,ro /run\n");
    for dir in writable {
        script.push_str(&format!("mount --bind '{0}' '{0}'\n", dir.display()));
    }
    script.push_str("mount -o remount,bind,ro /\n");
    script.push_str(&format!("exec setpriv --no-new-privs --bounding-set {bounding} --inh-caps -all -- \"$@\"\n"));
    let log = files.path(&format!("container-{}.log", tag()));
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", ns, "unshare", "--mount", "--propagation", "private", "sh", "-c", &script, "sh"])
        .args(argv)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("NODE_NAME", "n0")
        .env("KUBERNETES_SERVICE_HOST", "127.0.0.1")
        .env("KUBERNETES_SERVICE_PORT", "6443");
    Proc::start(cmd, log)
}

/// The Cap* and NoNewPrivs lines of the agent's /proc/PID/status once the exec chain reached it.
fn process_caps(proc: &mut Proc) -> std::collections::BTreeMap<String, String> {
    let pid = proc.child.as_ref().unwrap().id();
    wait_for("the agent to be exec'd", Duration::from_secs(10), || {
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        (comm.trim() == "cni-rs-node").then_some(())
    });
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .filter(|l| l.starts_with("Cap") || l.starts_with("NoNewPrivs"))
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.to_string(), v.trim().to_string()))
        .collect()
}

fn wait_exit(proc: &mut Proc, what: &str) -> std::process::ExitStatus {
    let mut child = proc.child.take().unwrap();
    wait_for(what, Duration::from_secs(20), || child.try_wait().unwrap())
}

#[test]
fn the_pod_runs_with_only_the_manifests_capabilities_and_fails_without_net_admin() {
    require(&["openssl", "python3", "curl", "setpriv", "unshare", "nft"]);
    let spec = pod_spec();
    assert!(spec.node_name_from_spec, "NODE_NAME comes from spec.nodeName");
    assert_eq!(spec.caps, ["NET_ADMIN"], "the manifest's capabilities (change the test with them)");
    let (_seg, node) = node_ns();
    let ns = node.0.as_str();
    let files = PodFiles::new();
    for key in &SYSCTLS[..3] {
        set_sysctl(ns, key, "0");
    }
    set_sysctl(ns, SYSCTLS[3], "0");

    // The init container, privileged: /proc/sys writable, every capability.
    assert!(spec.init_privileged, "the init container must be privileged to write /proc/sys");
    let mut init = Proc::spawn(ns, &localize(&spec.init, &[]), files.path("init.log"));
    let status = wait_exit(&mut init, "the init container to exit");
    assert!(status.success(), "init container: {status}\n{}", init.log());
    for key in &SYSCTLS[..3] {
        assert_eq!(sysctl(ns, key), "1", "{key} after the init container:\n{}", init.log());
    }
    assert_eq!(sysctl(ns, SYSCTLS[3]), "0", "an IPv4-only cluster leaves IPv6 forwarding alone");
    assert!(init.log().contains("set net.ipv4.ip_forward to 1 (it was 0)"), "{}", init.log());

    let standin = Standin::start(ns, &files.dir.0, "127.0.0.1", &nodes());
    std::fs::copy(standin.pki.ca(), files.path("serviceaccount/ca.crt")).unwrap();
    let writable: Vec<PathBuf> = ["bin", "net.d", "state"].iter().map(|v| files.path(v)).collect();
    let argv = localize(&spec.agent, &files.volume_flags());
    let mut agent = start_container(ns, &files, &spec.caps, &writable, &argv);

    let caps = process_caps(&mut agent);
    let want = cap_mask(&spec.caps);
    for set in ["CapPrm", "CapEff", "CapBnd"] {
        assert_eq!(caps[set], want, "{set} of the agent: {caps:?}");
    }
    assert_eq!((caps["CapInh"].as_str(), caps["CapAmb"].as_str()), ("0000000000000000", "0000000000000000"));
    assert_eq!(caps["NoNewPrivs"], "1");

    let agent = Agent { proc: agent, args: argv, ns: ns.to_string(), dir: files.dir.0.clone() };
    let log = || format!("agent:\n{}\nstand-in:\n{}", agent.proc.log(), standin.proc.log());
    let routes = || run_in(ns, &["ip", "-4", "route", "show", "proto", "210"]);
    wait_for("routes to n1 (host-gw) and n2 (VXLAN)", Duration::from_secs(30), || {
        let r = routes();
        (r.contains("10.244.1.0/24 via 10.95.0.12 dev eth0")
            && r.contains("10.244.2.0/24 via 10.244.2.0 dev cni-rs.1 onlink"))
        .then_some(())
    });
    let fdb = run_in(ns, &["bridge", "fdb", "show", "dev", "cni-rs.1"]);
    assert!(fdb.contains("02:00:00:00:00:13 dst 10.97.0.13"), "{fdb}");
    let conflist = std::fs::read_to_string(files.path("net.d/10-cni-rs.conflist")).unwrap();
    assert!(conflist.contains("\"10.244.0.0/24\""), "{conflist}");
    for plugin in ["bridge", "host-local", "loopback"] {
        let meta = std::fs::metadata(files.path("bin").join(plugin)).unwrap();
        assert_eq!(std::os::unix::fs::MetadataExt::nlink(&meta), 4, "{plugin} is a hard link to cni-rs");
    }
    let table = run_in(ns, &["nft", "list", "table", "inet", "cni-rs-node"]);
    assert!(table.contains("ip saddr 10.244.0.0/24 ip daddr != 10.244.0.0/16 masquerade"), "{table}");
    let (status, _) = wait_for("/healthz 200", Duration::from_secs(10), || {
        Some(agent_http(&agent, "/healthz")).filter(|r| r.0 == 200)
    });
    assert_eq!(status, 200);
    let (_, metrics) = agent_http(&agent, "/metrics");
    assert_eq!(metric(&metrics, "cni_rs_node_reconcile_errors_total"), Some(0.0), "{metrics}");
    assert_eq!(metric(&metrics, "cni_rs_node_routes_programmed"), Some(2.0), "{metrics}");
    let serving = format!("serving /healthz and /metrics on http://127.0.0.1:{}", spec.metrics_port);
    assert!(agent.proc.log().contains(&serving), "the liveness probe's port: {}", log());
    let seen = run_in(ns, &["curl", "-sSf", "http://127.0.0.1:6444/log"]);
    assert!(seen.lines().any(|l| l == "PATCH n0"), "{seen}\n{}", log());
    assert!(!seen.contains("401"), "every request carried the service account token: {seen}");
    let text = agent.proc.log();
    let complaints = text.lines().filter(|l| l.starts_with("warning:") || l.starts_with("error:")).count();
    assert_eq!(complaints, 0, "sysctls right, nothing failed:\n{}", log());
    drop(agent);

    // Negative control: without NET_ADMIN too, the same pod cannot make its VXLAN device and says
    // which capability it lacks.
    run_in(ns, &["ip", "link", "del", "cni-rs.1"]);
    let fewer: Vec<String> = spec.caps.iter().filter(|c| *c != "NET_ADMIN").cloned().collect();
    let mut weak = start_container(ns, &files, &fewer, &writable, &localize(&spec.agent, &files.volume_flags()));
    let status = wait_exit(&mut weak, "the agent without NET_ADMIN to exit");
    let text = weak.log();
    assert!(!status.success(), "{text}");
    assert!(
        text.contains("error: create VXLAN device cni-rs.1: ")
            && text.contains("(the agent needs CAP_NET_ADMIN: capabilities.add [NET_ADMIN] in install/daemonset.yaml)"),
        "{text}"
    );
    drop(standin);
}

/// Without the init container, on a node whose sysctls are off: one warning per sysctl, naming it,
/// the value it needs, what breaks and the fix; the values stay as they were and the agent runs on.
#[test]
fn a_read_only_proc_sys_with_the_sysctls_off_gives_one_warning_each() {
    require(&["openssl", "python3", "setpriv", "unshare"]);
    let spec = pod_spec();
    let (_seg, node) = node_ns();
    let ns = node.0.as_str();
    let files = PodFiles::new();
    for key in &SYSCTLS[..3] {
        set_sysctl(ns, key, "0");
    }
    let standin = Standin::start(ns, &files.dir.0, "127.0.0.1", &nodes());
    std::fs::copy(standin.pki.ca(), files.path("serviceaccount/ca.crt")).unwrap();
    let writable: Vec<PathBuf> = ["bin", "net.d", "state"].iter().map(|v| files.path(v)).collect();
    let mut agent = start_container(ns, &files, &spec.caps, &writable, &localize(&spec.agent, &files.volume_flags()));
    wait_for("the route to n1", Duration::from_secs(30), || {
        run_in(ns, &["ip", "-4", "route", "show", "proto", "210"])
            .contains("10.244.1.0/24 via 10.95.0.12")
            .then_some(())
    });
    assert!(agent.running(), "{}", agent.log());
    let text = agent.log();
    let warnings: Vec<&str> = text.lines().filter(|l| l.starts_with("warning: net.")).collect();
    assert_eq!(warnings.len(), 3, "one warning per sysctl:\n{text}\nstand-in:\n{}", standin.proc.log());
    for (name, file, effect) in [
        ("net.ipv4.ip_forward", "/proc/sys/net/ipv4/ip_forward", "its pods cannot reach other nodes' pods"),
        (
            "net.bridge.bridge-nf-call-iptables",
            "/proc/sys/net/bridge/bridge-nf-call-iptables",
            "NetworkPolicy is not enforced between pods of this node",
        ),
        (
            "net.bridge.bridge-nf-call-ip6tables",
            "/proc/sys/net/bridge/bridge-nf-call-ip6tables",
            "NetworkPolicy is not enforced between pods of this node",
        ),
    ] {
        let line = warnings.iter().find(|l| l.starts_with(&format!("warning: {name} "))).unwrap_or_else(|| {
            panic!("no warning for {name}:\n{text}");
        });
        let expected = format!("warning: {name} is 0 and cannot be set to 1 here (write {file}: Read-only file system");
        assert!(line.starts_with(&expected), "{line}");
        assert!(line.contains(effect), "{line}");
        assert!(
            line.contains("the DaemonSet's privileged init container `sysctls`")
                && line.contains(&format!("`{name} = 1` in a file in /etc/sysctl.d/")),
            "{line}"
        );
    }
    assert!(!text.contains("net.ipv6.conf.all.forwarding"), "an IPv4-only cluster needs no IPv6 forwarding:\n{text}");
    for key in &SYSCTLS[..3] {
        assert_eq!(sysctl(ns, key), "0", "{key} is the node's to set");
    }
    drop(agent);
    drop(standin);
}

/// `--sysctls-only` with a dual-stack --cluster-cidr sets IPv6 forwarding too, says nothing of
/// values already right, and fails naming forwarding when /proc/sys is read-only (not privileged).
#[test]
fn the_init_container_sets_the_sysctls_and_fails_when_it_cannot() {
    require(&["setpriv", "unshare"]);
    let spec = pod_spec();
    let (_seg, node) = node_ns();
    let ns = node.0.as_str();
    let files = PodFiles::new();
    for key in SYSCTLS {
        set_sysctl(ns, key, "0");
    }
    let dual = localize(&spec.init, &["--cluster-cidr=10.244.0.0/16,fd00:10:244::/56".to_string()]);
    let mut init = Proc::spawn(ns, &dual, files.path("init.log"));
    assert!(wait_exit(&mut init, "the init container").success(), "{}", init.log());
    for key in SYSCTLS {
        assert_eq!(sysctl(ns, key), "1", "{key}:\n{}", init.log());
    }
    assert_eq!(init.log().matches("set net.").count(), 4, "{}", init.log());
    let mut again = Proc::spawn(ns, &dual, files.path("again.log"));
    assert!(wait_exit(&mut again, "the init container again").success(), "{}", again.log());
    assert!(!again.log().contains("set net.") && !again.log().contains("warning"), "{}", again.log());

    // Not privileged: /proc/sys read-only.
    for key in SYSCTLS {
        set_sysctl(ns, key, "0");
    }
    let mut unprivileged = start_container(ns, &files, &spec.caps, &[], &dual);
    let status = wait_exit(&mut unprivileged, "the unprivileged init container");
    let text = unprivileged.log();
    assert!(!status.success(), "{text}");
    assert_eq!(text.matches("warning: net.").count(), 4, "{text}");
    assert!(
        text.contains(
            "error: could not set net.ipv4.ip_forward, net.ipv6.conf.all.forwarding (see above): run this init \
             container privileged"
        ),
        "{text}"
    );
    for key in SYSCTLS {
        assert_eq!(sysctl(ns, key), "0", "{key}");
    }
}

/// The harness itself: inside `start_container` the root and /proc/sys are read-only, a volume is
/// writable and the service account token is where the kubelet puts it.
#[test]
fn the_container_is_as_strict_as_the_kubelets() {
    require(&["setpriv", "unshare"]);
    let (_seg, node) = node_ns();
    let files = PodFiles::new();
    let volume = files.path("state");
    let outside = files.path("outside");
    let script = format!(
        "touch '{}/ok' && cat /var/run/secrets/kubernetes.io/serviceaccount/token && echo && \
         ! touch '{}' && ! touch /etc/cni-rs-probe && ! sh -c 'echo 1 > /proc/sys/net/ipv4/ip_forward' && echo strict",
        volume.display(),
        outside.display()
    );
    let argv: Vec<String> = ["sh", "-c", &script].iter().map(|s| s.to_string()).collect();
    let mut probe = start_container(&node.0, &files, &["NET_ADMIN".to_string()], std::slice::from_ref(&volume), &argv);
    let status = wait_exit(&mut probe, "the probe");
    let text = probe.log();
    assert!(status.success() && text.contains(TOKEN) && text.ends_with("strict\n"), "{text}");
    assert_eq!(text.matches("Read-only file system").count(), 3, "{text}");
    assert!(volume.join("ok").exists() && !outside.exists(), "{text}");
}

#[test]
fn the_init_container_is_given_the_agents_cluster_range() {
    let spec = pod_spec();
    let range = |argv: &[String]| argv.iter().find(|a| a.starts_with("--cluster-cidr=")).cloned();
    assert!(range(&spec.agent).is_some());
    assert_eq!(range(&spec.init), range(&spec.agent), "the init container decides on IPv6 forwarding from it");
    assert_eq!(spec.init[..2], ["/cni-rs-node", "--sysctls-only"]);
}

//! cni-bench: the cni-rs plugins against the reference Go plugins, through the same client (our
//! libcni runtime API) and the same conflist (bridge with ipMasq + host-local + portmap with one
//! mapped port + loopback), each on its default firewall backend. Run it with `tests/bench.sh`.
//!
//! Everything it creates is named `cnib-*` (namespaces, bridges, container ids) or lives under
//! /run/cni-bench; leftovers of an interrupted run are removed first, and everything is removed at
//! the end, on error, on panic and on Ctrl-C.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod meta_chains;
mod report;

use libcni::conflist::NetworkConfigList;
use libcni::runtime::{plugin_stdin, CniConfig, RuntimeConf};
use serde_json::{json, Map, Value};
use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub const PREFIX: &str = "cnib-";
const STATE: &str = "/run/cni-bench";
const IFNAME: &str = "eth0";
/// The plugins of the conflist, in ADD order.
pub const PLUGINS: [&str; 4] = ["bridge", "host-local", "portmap", "loopback"];

/// Another chain measured for per-pod latency: `main` with host-local, the same conflist on both
/// sides (ours on 10.<octet>.0.0/16, the reference on the next /16).
pub struct Chain {
    pub name: &'static str,
    /// The sides' keys (network and state directory names), ours first.
    keys: [&'static str; 2],
    /// The sides' pod name tags.
    tags: [char; 2],
    /// The main plugin's config, given the side's host link `cnib-<tag>0` (which the side's cleanup
    /// deletes: the bridge, or the master made for the run when `master` is set).
    main: fn(&str) -> Value,
    octet: u8,
    /// Whether the run makes the host link first: a veth with both ends up, so a macvlan master
    /// has a carrier.
    master: bool,
    /// What `cni-floor` builds for the chain's floor, in the same rotation.
    floor: FloorKind,
}

pub const CHAINS: [Chain; 2] = [
    Chain {
        name: "ptp",
        keys: ["ptp-ours", "ptp-reference"],
        tags: ['p', 'q'],
        main: |_| json!({"type": "ptp", "ipMasq": true}),
        octet: 232,
        master: false,
        floor: FloorKind::Ptp,
    },
    // IPv4 only, as every chain here: an IPv6 address adds both sides' DAD wait, the kernel's.
    Chain {
        name: "macvlan",
        keys: ["macvlan-ours", "macvlan-reference"],
        tags: ['m', 'n'],
        main: |link| json!({"type": "macvlan", "master": link, "mode": "bridge"}),
        octet: 234,
        master: true,
        floor: FloorKind::Macvlan,
    },
];

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

type Res<T> = Result<T, String>;

fn check_stop() -> Res<()> {
    if STOP.load(Ordering::SeqCst) {
        Err("interrupted".into())
    } else {
        Ok(())
    }
}

#[derive(Debug, Clone)]
pub struct Opts {
    pub quick: bool,
    /// `--probe`: cni-rs only, latency and scaling printed to stderr, no files written (for profiling).
    pub probe: bool,
    pub samples: usize,
    pub levels: Vec<usize>,
    pub scale_samples: usize,
    pub parallel: usize,
    pub churn: usize,
    pub breakdown: usize,
    pub out: PathBuf,
    pub ours: PathBuf,
    pub reference: PathBuf,
    pub command: String,
    /// `--chain`: only the per-pod latency of these chains, printed, no files written.
    pub chains: Vec<String>,
}

fn parse_opts() -> Res<Opts> {
    let exe_dir = std::env::current_exe().map_err(|e| e.to_string())?.parent().unwrap().to_path_buf();
    let repo = exe_dir.ancestors().find(|d| d.join("Cargo.lock").exists()).map(Path::to_path_buf);
    let mut o = Opts {
        quick: false,
        probe: false,
        samples: 40,
        levels: vec![10, 100, 500, 1000],
        scale_samples: 20,
        parallel: 8,
        churn: 40,
        breakdown: 8,
        out: repo.clone().unwrap_or_else(|| PathBuf::from(".")).join("docs/bench"),
        // tests/bench.sh points this at the static multi-call build, as the installer ships it.
        ours: std::env::var_os("CNI_BENCH_OURS").map(PathBuf::from).unwrap_or(exe_dir),
        reference: PathBuf::from("/usr/lib/cni"),
        command: "tests/bench.sh".into(),
        chains: vec![],
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut levels_set = false;
    let mut i = 0;
    let val = |i: &mut usize| -> Res<String> {
        *i += 1;
        args.get(*i).cloned().ok_or_else(|| format!("{} needs a value", args[*i - 1]))
    };
    let num = |s: String| s.parse::<usize>().map_err(|e| format!("{s}: {e}"));
    while i < args.len() {
        match args[i].as_str() {
            "--quick" => o.quick = true,
            "--probe" => o.probe = true,
            "--samples" => o.samples = num(val(&mut i)?)?,
            "--levels" => {
                let v = val(&mut i)?;
                o.levels = if v.is_empty() || v == "none" {
                    vec![]
                } else {
                    v.split(',').map(|s| num(s.trim().to_string())).collect::<Res<_>>()?
                };
                levels_set = true;
            }
            "--scale-samples" => o.scale_samples = num(val(&mut i)?)?,
            "--parallel" => o.parallel = num(val(&mut i)?)?.max(1),
            "--churn" => o.churn = num(val(&mut i)?)?.max(1),
            "--out" => o.out = PathBuf::from(val(&mut i)?),
            "--ours" => o.ours = PathBuf::from(val(&mut i)?),
            "--reference" => o.reference = PathBuf::from(val(&mut i)?),
            "--chain" => o.chains.extend(val(&mut i)?.split(',').map(|c| c.trim().to_string())),
            "-h" | "--help" => {
                println!(
                    "usage: cni-bench [--quick] [--probe] [--samples N] [--levels 10,100,500,1000|none] [--scale-samples N]\n\
                     \x20                [--parallel N] [--churn N] [--out DIR] [--ours DIR] [--reference DIR]\n\
                     \x20                [--chain bridge,ptp,macvlan,bandwidth,podman]\n\
                     Needs root. Writes DIR/results.csv, latency.svg, scaling.svg and the results block of DIR/README.md.\n\
                     --chain: only the per-pod latency of the named chains (ours, reference and the chain's floor\n\
                     interleaved, --samples each), printed with the load average; writes nothing."
                );
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?} (try --help)")),
        }
        i += 1;
    }
    if o.quick {
        if !levels_set {
            o.levels = vec![10, 100];
        }
        o.samples = o.samples.min(20);
        o.scale_samples = o.scale_samples.min(10);
        o.churn = o.churn.min(24);
        o.breakdown = 4;
    }
    let mut cmd = vec!["tests/bench.sh".to_string()];
    cmd.extend(args);
    o.command = cmd.join(" ");
    Ok(o)
}

/// One plugin set under test.
pub struct Side {
    pub key: &'static str,
    pub label: &'static str,
    pub tag: char,
    pub bin: PathBuf,
    pub list: NetworkConfigList,
    pub cni: CniConfig,
    pub bridge: String,
    /// Its pods' subnet is 10.<octet>.0.0/16, the bridge's address 10.<octet>.0.1.
    octet: u8,
    port_base: u16,
    next: AtomicUsize,
    live: Mutex<BTreeSet<String>>,
    /// Capability arguments every pod gets besides its port mapping (`bandwidth` for the chains).
    caps: Map<String, Value>,
}

/// Who a side is: its key (network and state directory names), label, pod name tag, plugin
/// directory, the second octet of its pods' 10.<octet>.0.0/16, and its first mapped host port.
#[derive(Clone, Copy)]
pub struct SideSpec<'a> {
    pub key: &'static str,
    label: &'static str,
    pub tag: char,
    bin: &'a Path,
    octet: u8,
    port_base: u16,
}

impl<'a> SideSpec<'a> {
    /// The two sides of a comparison, ours first: ours from `ours` on 10.<octet>.0.0/16 with host
    /// ports from 20000, the reference's from `reference` on the next /16 with host ports from 40000.
    pub fn pair(keys: [&'static str; 2], tags: [char; 2], ours: &'a Path, reference: &'a Path, octet: u8) -> [Self; 2] {
        let side = |i: usize, label, bin| SideSpec {
            key: keys[i],
            label,
            tag: tags[i],
            bin,
            octet: octet + i as u8,
            port_base: 20000 * (i as u16 + 1),
        };
        [side(0, "cni-rs", ours), side(1, "reference (Go)", reference)]
    }
}

impl Side {
    /// A side running the base conflist: bridge (with masquerade), portmap, loopback.
    fn new(spec: SideSpec) -> Res<Side> {
        let main = json!({"type": "bridge", "bridge": Side::bridge_name(spec.tag), "isGateway": true, "ipMasq": true});
        let rest = [
            json!({"type": "portmap", "capabilities": {"portMappings": true}, "snat": true}),
            json!({"type": "loopback"}),
        ];
        Side::with_chain(spec, main, &rest)
    }

    /// A side whose conflist is `main` with host-local on 10.<octet>.0.0/16 and a default route,
    /// then `rest`.
    fn with_chain(spec: SideSpec, mut main: Value, rest: &[Value]) -> Res<Side> {
        let (key, octet) = (spec.key, spec.octet);
        let dir = Side::state_dir(key);
        main["ipam"] = json!({"type": "host-local", "ranges": [[{"subnet": format!("10.{octet}.0.0/16")}]],
                              "routes": [{"dst": "0.0.0.0/0"}], "dataDir": dir.join("ipam")});
        let mut plugins = vec![main];
        plugins.extend_from_slice(rest);
        let conf = json!({"cniVersion": "1.0.0", "name": format!("{PREFIX}{key}"), "plugins": plugins});
        Side::with_conf(spec, &conf, Map::new())
    }

    /// A side running `conf`, a conflist whose host link (bridge or master) is
    /// [`Side::bridge_name`] with its IPAM state under [`Side::state_dir`]; every pod gets `caps`
    /// besides its port mapping.
    fn with_conf(spec: SideSpec, conf: &Value, caps: Map<String, Value>) -> Res<Side> {
        let SideSpec { key, label, tag, bin, octet, port_base } = spec;
        let list = NetworkConfigList::from_bytes(conf.to_string().as_bytes()).map_err(|e| format!("{key}: {e}"))?;
        Ok(Side {
            key,
            label,
            tag,
            bin: bin.to_path_buf(),
            list,
            cni: CniConfig::with_cache_dir(vec![bin.to_path_buf()], Side::state_dir(key).join("cache")),
            bridge: Side::bridge_name(tag),
            octet,
            port_base,
            next: AtomicUsize::new(0),
            live: Mutex::new(BTreeSet::new()),
            caps,
        })
    }

    fn state_dir(key: &str) -> PathBuf {
        PathBuf::from(STATE).join(key)
    }

    fn bridge_name(tag: char) -> String {
        format!("{PREFIX}{tag}0")
    }

    fn pod_prefix(&self) -> String {
        format!("{PREFIX}{}-", self.tag)
    }

    fn rt(&self, pod: &str) -> RuntimeConf {
        let n: usize = pod.rsplit('-').next().and_then(|s| s.parse().ok()).unwrap_or(0);
        let port = self.port_base + (n % 20000) as u16;
        let mut caps = Map::new();
        caps.insert("portMappings".into(), json!([{"hostPort": port, "containerPort": 80, "protocol": "tcp"}]));
        caps.extend(self.caps.clone());
        RuntimeConf {
            container_id: pod.to_string(),
            netns: netns_path(pod),
            ifname: IFNAME.into(),
            args: vec![],
            capability_args: caps,
        }
    }

    /// A new pod name with its network namespace.
    fn new_pod(&self) -> Res<String> {
        check_stop()?;
        let pod = format!("{}{}", self.pod_prefix(), self.next.fetch_add(1, Ordering::Relaxed));
        self.live.lock().unwrap().insert(pod.clone());
        netns_add(&pod)?;
        Ok(pod)
    }

    fn add(&self, pod: &str) -> Res<Duration> {
        check_stop()?;
        let t = Instant::now();
        self.cni.add_network_list(&self.list, &self.rt(pod)).map_err(|e| format!("{} ADD {pod}: {e}", self.key))?;
        Ok(t.elapsed())
    }

    fn del(&self, pod: &str) -> Res<Duration> {
        let t = Instant::now();
        self.cni.del_network_list(&self.list, &self.rt(pod)).map_err(|e| format!("{} DEL {pod}: {e}", self.key))?;
        Ok(t.elapsed())
    }

    /// ADD and DEL of a new pod, each timed after the settle pause; the pod is removed after.
    fn sample(&self) -> Res<(Duration, Duration)> {
        let pod = self.new_pod()?;
        settle();
        let a = self.add(&pod);
        settle();
        let d = if a.is_ok() { self.del(&pod) } else { Err(String::new()) };
        self.drop_pod(&pod);
        Ok((a?, d?))
    }

    /// DEL (ignoring errors) and remove the namespace.
    fn drop_pod(&self, pod: &str) {
        let _ = self.del(pod);
        netns_del(pod);
        self.live.lock().unwrap().remove(pod);
    }

    /// Removes every pod this side has, or an earlier run left behind.
    fn cleanup(&self) {
        let mut pods: BTreeSet<String> = self.live.lock().unwrap().clone();
        if let Ok(rd) = std::fs::read_dir("/run/netns") {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.starts_with(&self.pod_prefix()) {
                    pods.insert(name);
                }
            }
        }
        for e in self.cni.get_cached_attachments("").unwrap_or_default() {
            if e.network_name == self.list.name {
                pods.insert(e.container_id);
            }
        }
        let pods: Vec<String> = pods.into_iter().collect();
        parallel(&pods, 4, |p| {
            self.drop_pod(p);
            Ok(())
        })
        .ok();
        let _ = Command::new("ip").args(["link", "del", &self.bridge]).stderr(Stdio::null()).status();
        let _ = std::fs::remove_dir_all(PathBuf::from(STATE).join(self.key));
    }
}

pub fn netns_path(name: &str) -> String {
    format!("/run/netns/{name}")
}

fn netns_add(name: &str) -> Res<()> {
    let out = Command::new("ip").args(["netns", "add", name]).output().map_err(|e| format!("ip netns add: {e}"))?;
    if !out.status.success() {
        return Err(format!("ip netns add {name}: {}", String::from_utf8_lossy(&out.stderr).trim()));
    }
    Ok(())
}

fn netns_del(name: &str) {
    let path = std::ffi::CString::new(netns_path(name)).unwrap();
    // SAFETY: a valid C string; failure (not mounted) is fine.
    unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) };
    let _ = std::fs::remove_file(netns_path(name));
}

/// Runs `f` on every item with `n` threads; the first error stops the others.
fn parallel<T: Sync>(items: &[T], n: usize, f: impl Fn(&T) -> Res<()> + Sync) -> Res<()> {
    let next = AtomicUsize::new(0);
    let err: Mutex<Option<String>> = Mutex::new(None);
    std::thread::scope(|s| {
        for _ in 0..n.max(1).min(items.len().max(1)) {
            s.spawn(|| loop {
                if err.lock().unwrap().is_some() {
                    return;
                }
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(item) = items.get(i) else { return };
                if let Err(e) = f(item) {
                    err.lock().unwrap().get_or_insert(e);
                    return;
                }
            });
        }
    });
    match err.into_inner().unwrap() {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Latency statistics of a set of samples, in milliseconds.
#[derive(Debug, Clone, Copy, Default)]
pub struct Stats {
    pub n: usize,
    pub median: f64,
    pub p99: f64,
    pub mean: f64,
    pub min: f64,
}

impl Stats {
    pub fn of(samples: &[Duration]) -> Stats {
        let mut ms: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e3).collect();
        ms.sort_by(|a, b| a.total_cmp(b));
        if ms.is_empty() {
            return Stats::default();
        }
        // Nearest rank: with fewer than 100 samples p99 is the largest.
        let rank = |p: f64| ms[((p * ms.len() as f64).ceil() as usize).clamp(1, ms.len()) - 1];
        let median = if ms.len() % 2 == 1 { ms[ms.len() / 2] } else { (ms[ms.len() / 2 - 1] + ms[ms.len() / 2]) / 2.0 };
        Stats { n: ms.len(), median, p99: rank(0.99), mean: ms.iter().sum::<f64>() / ms.len() as f64, min: ms[0] }
    }
}

/// Per-pod ADD and DEL latency of one side (and the floor).
#[derive(Debug, Clone, Default)]
pub struct Latency {
    pub add: Stats,
    pub del: Stats,
}

/// One plugin's share of a pod's ADD or DEL when run by hand (wall time and peak RSS of its
/// process tree: the plugin and whatever it ran, like host-local, nft or iptables).
#[derive(Debug, Clone, Default)]
pub struct PluginCost {
    pub plugin: String,
    pub add_ms: f64,
    pub del_ms: f64,
    pub add_rss_kb: i64,
    pub del_rss_kb: i64,
}

#[derive(Debug, Clone, Default)]
pub struct SideResults {
    pub latency: Latency,
    /// (workers, pods per second)
    pub churn: Vec<(usize, f64)>,
    /// (pods attached, ADD stats, DEL stats)
    pub scaling: Vec<(usize, Stats, Stats)>,
    /// Tearing down the largest level, in parallel: (pods, seconds)
    pub teardown: Option<(usize, f64)>,
    /// Per level: each plugin's share of the next pod (run by hand, as in `plugins`).
    pub level_plugins: Vec<(usize, Vec<PluginCost>)>,
    /// Per level, on this side's bridge with its pods attached: the netlink floor.
    pub level_floor: Vec<(usize, Latency)>,
    pub plugins: Vec<PluginCost>,
    /// bytes on disk of the plugin set (distinct inodes), and of the 4 plugins used
    pub disk_all: (usize, u64),
    pub disk_used: u64,
}

#[derive(Debug, Clone, Default)]
pub struct Floor {
    pub netlink: Latency,
    pub with_nft: Latency,
}

pub struct Machine {
    pub date: String,
    pub nproc: usize,
    pub kernel: String,
    pub cpu: String,
    pub reference_version: String,
    pub ours_rev: String,
}

fn sh_out(cmd: &str, args: &[&str]) -> String {
    Command::new(cmd)
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

fn machine(ours: &Path) -> Machine {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    let cwd = std::env::current_dir().unwrap_or_default();
    let repo = ours
        .ancestors()
        .chain(cwd.ancestors())
        .find(|d| d.join(".git").exists())
        .map(|d| d.display().to_string())
        .unwrap_or_default();
    Machine {
        date: sh_out("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
        nproc: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_string(),
        cpu,
        reference_version: sh_out("dpkg-query", &["-W", "-f", "${Version}", "containernetworking-plugins"]),
        ours_rev: if repo.is_empty() {
            String::new()
        } else {
            sh_out("git", &["-C", &repo, "rev-parse", "--short", "HEAD"])
        },
    }
}

/// Sum of sizes of distinct inodes.
fn disk_bytes(paths: &[PathBuf]) -> u64 {
    let mut seen = BTreeSet::new();
    let mut total = 0;
    for p in paths {
        if let Ok(m) = std::fs::metadata(p) {
            if m.is_file() && seen.insert((m.dev(), m.ino())) {
                total += m.len();
            }
        }
    }
    total
}

/// What is installed of a plugin directory: for ours, the multi-call binary and its links if
/// built, else the per-plugin binaries; for the reference, every file of the package.
fn footprint(side: &Side, is_ours: bool) -> ((usize, u64), u64) {
    let used: Vec<PathBuf> = PLUGINS.iter().map(|p| side.bin.join(p)).collect();
    if is_ours {
        let multi = side.bin.join("cni-rs");
        if multi.is_file() {
            let b = disk_bytes(&[multi]);
            return ((PLUGINS.len(), b), b);
        }
        let b = disk_bytes(&used);
        return ((PLUGINS.len(), b), b);
    }
    let mut all: Vec<PathBuf> =
        std::fs::read_dir(&side.bin).map(|rd| rd.flatten().map(|e| e.path()).collect()).unwrap_or_default();
    all.retain(|p| p.is_file());
    ((all.len(), disk_bytes(&all)), disk_bytes(&used))
}

/// Runs one plugin by hand, under `cni-peak` (see src/bin/peak.rs: measured from cni-bench itself,
/// the peak RSS would be cni-bench's own); returns stdout, wall time and the peak RSS (KiB) of the
/// plugin's process tree.
fn exec_plugin(side: &Side, plugin: &str, command: &str, pod: &str, stdin: &[u8]) -> Res<(Vec<u8>, Duration, i64)> {
    let path = side.bin.join(plugin);
    let peak = std::env::current_exe().map_err(|e| e.to_string())?.with_file_name("cni-peak");
    let report = std::env::temp_dir().join(format!("cni-bench-peak.{}", std::process::id()));
    let mut child = Command::new(&peak)
        .arg(&report)
        .arg(&path)
        .env("CNI_COMMAND", command)
        .env("CNI_CONTAINERID", pod)
        .env("CNI_NETNS", netns_path(pod))
        .env("CNI_IFNAME", IFNAME)
        .env("CNI_ARGS", "")
        .env("CNI_PATH", &side.bin)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("spawn {} {}: {e}", peak.display(), path.display()))?;
    let _ = child.stdin.take().unwrap().write_all(stdin);
    let mut err = child.stderr.take().unwrap();
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let mut out = Vec::new();
    let _ = child.stdout.take().unwrap().read_to_end(&mut out);
    let status = child.wait().map_err(|e| format!("wait for {}: {e}", peak.display()))?;
    let stderr = err_reader.join().unwrap_or_default();
    if !status.success() {
        return Err(format!("{} {command} {pod} failed: {}{stderr}", path.display(), String::from_utf8_lossy(&out)));
    }
    let text = std::fs::read_to_string(&report).map_err(|e| format!("read {}: {e}", report.display()))?;
    let _ = std::fs::remove_file(&report);
    let mut fields = text.split_whitespace().map(|f| f.parse::<u64>());
    match (fields.next(), fields.next()) {
        (Some(Ok(rss)), Some(Ok(ns))) => Ok((out, Duration::from_nanos(ns), rss as i64)),
        _ => Err(format!("{}: unreadable report {text:?}", peak.display())),
    }
}

/// ADD and DEL of one pod, one plugin at a time, timing each (host-local runs under bridge, so
/// it is also run once on its own with the same config to give its share).
fn breakdown_once(side: &Side, pod: &str, acc: &mut [PluginCost]) -> Res<()> {
    let rt = side.rt(pod);
    let mut prev: Option<Value> = None;
    let list = &side.list;
    let order = [("bridge", 0usize), ("portmap", 1), ("loopback", 2)];
    settle();
    for (name, idx) in order {
        let stdin = plugin_stdin(list, &list.plugins[idx], prev.clone(), &rt).map_err(|e| e.to_string())?;
        let (out, t, rss) = exec_plugin(side, name, "ADD", pod, &stdin)?;
        let c = acc.iter_mut().find(|c| c.plugin == name).unwrap();
        c.add_ms += t.as_secs_f64() * 1e3;
        c.add_rss_kb = c.add_rss_kb.max(rss);
        prev = Some(serde_json::from_slice(&out).map_err(|e| format!("{name} result: {e}"))?);
    }
    // host-local alone, on a second container id: its own cost and footprint.
    let ipam_pod = format!("{pod}-ipam");
    let bridge_conf = &list.plugins[0].raw;
    let mut ipam_conf = bridge_conf.clone();
    ipam_conf.insert("name".into(), json!(list.name));
    ipam_conf.insert("cniVersion".into(), json!(list.cni_version));
    let ipam_stdin = serde_json::to_vec(&ipam_conf).unwrap();
    let (_, t, rss) = exec_plugin(side, "host-local", "ADD", &ipam_pod, &ipam_stdin)?;
    let c = acc.iter_mut().find(|c| c.plugin == "host-local").unwrap();
    c.add_ms += t.as_secs_f64() * 1e3;
    c.add_rss_kb = c.add_rss_kb.max(rss);
    let (_, t, rss) = exec_plugin(side, "host-local", "DEL", &ipam_pod, &ipam_stdin)?;
    c.del_ms += t.as_secs_f64() * 1e3;
    c.del_rss_kb = c.del_rss_kb.max(rss);

    settle();
    for (name, idx) in order.iter().rev() {
        let stdin = plugin_stdin(list, &list.plugins[*idx], prev.clone(), &rt).map_err(|e| e.to_string())?;
        let (_, t, rss) = exec_plugin(side, name, "DEL", pod, &stdin)?;
        let c = acc.iter_mut().find(|c| c.plugin == *name).unwrap();
        c.del_ms += t.as_secs_f64() * 1e3;
        c.del_rss_kb = c.del_rss_kb.max(rss);
    }
    Ok(())
}

fn breakdown(side: &Side, n: usize) -> Res<Vec<PluginCost>> {
    let mut acc: Vec<PluginCost> =
        PLUGINS.iter().map(|p| PluginCost { plugin: p.to_string(), ..Default::default() }).collect();
    for _ in 0..n {
        let pod = side.new_pod()?;
        let r = breakdown_once(side, &pod, &mut acc);
        side.drop_pod(&pod);
        r?;
    }
    for c in &mut acc {
        c.add_ms /= n as f64;
        c.del_ms /= n as f64;
    }
    Ok(acc)
}

/// A pause before each timed ADD and DEL of the latency and scaling samples. Removing a network
/// namespace, deleting links and nf_tables deletions leave work to the kernel's workers (RCU
/// callbacks, namespace cleanup) that goes on for tens of milliseconds after the command returned;
/// without a pause that work of one sample (or of the other side, as they alternate) lands in the
/// next measurement. A node does not ADD and DEL the same pod within a millisecond either.
const SETTLE: Duration = Duration::from_millis(100);

fn settle() {
    std::thread::sleep(SETTLE);
}

/// Per-pod latency, sides interleaved sample by sample so that noise hits both alike.
/// Each of `floors` (`cni-floor` on a network, with or without its firewall batch) takes part in
/// the same rotation; their results follow the sides'.
fn latency(sides: &[&Side], samples: usize, floors: &[(&Path, &FloorNet, bool)]) -> Res<Vec<Latency>> {
    let n = sides.len() + floors.len();
    let mut add: Vec<Vec<Duration>> = vec![vec![]; n];
    let mut del: Vec<Vec<Duration>> = vec![vec![]; n];
    for i in 0..samples + 2 {
        let mut round = Vec::with_capacity(n);
        for side in sides {
            round.push(side.sample()?);
        }
        for (bin, net, with_nft) in floors {
            round.push(floor_sample(bin, net, i, *with_nft)?);
        }
        if i >= 2 {
            // The first two are warm-up (page cache, first table creation).
            for (k, (a, d)) in round.into_iter().enumerate() {
                add[k].push(a);
                del[k].push(d);
            }
        }
        eprint!(".");
    }
    eprintln!();
    Ok(add.iter().zip(&del).map(|(a, d)| Latency { add: Stats::of(a), del: Stats::of(d) }).collect())
}

/// How many pods a churn measurement with `workers` in flight cycles: at least four per worker.
fn churn_pods(opts: &Opts, workers: usize) -> usize {
    if workers == 1 {
        opts.churn
    } else {
        opts.churn.max(workers * 4)
    }
}

/// Pods per second of ADD+DEL cycles with `workers` in parallel (namespaces made beforehand).
fn churn(side: &Side, workers: usize, pods: usize) -> Res<f64> {
    let mut names = Vec::new();
    let made = (|| -> Res<()> {
        for _ in 0..pods {
            names.push(side.new_pod()?);
        }
        Ok(())
    })();
    let result = made.and_then(|()| {
        let t = Instant::now();
        parallel(&names, workers, |p| {
            side.add(p)?;
            side.del(p)?;
            Ok(())
        })?;
        Ok(pods as f64 / t.elapsed().as_secs_f64())
    });
    parallel(&names, 4, |p| {
        netns_del(p);
        side.live.lock().unwrap().remove(p);
        Ok(())
    })?;
    if result.is_err() {
        for p in &names {
            side.drop_pod(p);
        }
    }
    result
}

/// What the scaling section gives per side.
#[derive(Default)]
struct Scaling {
    /// (level, ADD, DEL) of the next pod.
    next: Vec<(usize, Stats, Stats)>,
    /// (pods, seconds) of the final teardown.
    teardown: Option<(usize, f64)>,
    plugins: Vec<(usize, Vec<PluginCost>)>,
    floor: Vec<(usize, Latency)>,
}

/// ADD and DEL of the next pod with `levels` pods attached; at each level also each plugin's share
/// (`breakdown` pods) and, with `floor`, the netlink floor on the same bridge.
fn scaling(
    side: &Side,
    levels: &[usize],
    samples: usize,
    workers: usize,
    breakdown_pods: usize,
    floor_bin: Option<&Path>,
) -> Res<Scaling> {
    let attached: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let mut res = Scaling::default();
    let out = &mut res.next;
    let mut levels = levels.to_vec();
    levels.sort_unstable();
    let run = (|| -> Res<()> {
        for &level in &levels {
            let have = attached.lock().unwrap().len();
            let todo: Vec<usize> = (have..level).collect();
            let t = Instant::now();
            parallel(&todo, workers, |_| {
                let pod = side.new_pod()?;
                side.add(&pod)?;
                attached.lock().unwrap().push(pod);
                Ok(())
            })?;
            eprintln!("  {}: {level} pods attached (+{} in {:.1} s)", side.key, todo.len(), t.elapsed().as_secs_f64());
            if let Some(hold) = std::env::var_os("CNI_BENCH_HOLD") {
                std::fs::write(&hold, format!("{level}\n")).map_err(|e| e.to_string())?;
                eprintln!("  holding until {} is removed", Path::new(&hold).display());
                while Path::new(&hold).exists() {
                    check_stop()?;
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
            let (mut a, mut d) = (vec![], vec![]);
            for _ in 0..samples {
                let (ta, td) = side.sample()?;
                a.push(ta);
                d.push(td);
            }
            let (sa, sd) = (Stats::of(&a), Stats::of(&d));
            eprintln!(
                "  {}: next pod at {level}: ADD {:.1} ms, DEL {:.1} ms (medians)",
                side.key, sa.median, sd.median
            );
            out.push((level, sa, sd));
            if breakdown_pods > 0 {
                res.plugins.push((level, breakdown(side, breakdown_pods)?));
            }
            if let Some(bin) = floor_bin {
                let f = floor_run(bin, &side.floor_net(), samples, false)?;
                eprintln!(
                    "  floor at {level} on {}: ADD {:.1} ms, DEL {:.1} ms (medians)",
                    side.bridge, f.add.median, f.del.median
                );
                res.floor.push((level, f));
            }
        }
        Ok(())
    })();
    let pods = attached.into_inner().unwrap();
    let t = Instant::now();
    let teardown = parallel(&pods, workers, |p| {
        side.del(p)?;
        netns_del(p);
        side.live.lock().unwrap().remove(p);
        Ok(())
    });
    let secs = t.elapsed().as_secs_f64();
    run?;
    teardown?;
    res.teardown = (!pods.is_empty()).then_some((pods.len(), secs));
    Ok(res)
}

/// What `cni-floor` builds for a pod: the kernel work of one of the benchmark's conflists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FloorKind {
    /// bridge: a veth pair on a bridge (the base conflist's link work, and the podman chain's).
    Bridge,
    /// ptp: a veth pair routed at layer 3, the gateway on the host end.
    Ptp,
    /// macvlan: a bridge-mode macvlan on a master, made in the pod's netns.
    Macvlan,
    /// bridge's veth plus bandwidth's tbf qdiscs, ingress redirect and ifb.
    Bandwidth,
}

/// Where `cni-floor` attaches its pods: a host link (bridge or macvlan master; none for ptp), its
/// gateway, and the address of sample `i`.
pub struct FloorNet {
    kind: FloorKind,
    bridge: String,
    gateway: String,
    /// The first two octets (`10.232.`) of every sample's address.
    first_octets: String,
    /// The third octet of the first samples' addresses (250 samples per third octet).
    third: usize,
}

impl FloorNet {
    fn addr(&self, i: usize) -> String {
        format!("{}{}.{}/16", self.first_octets, self.third + i / 250, 2 + i % 250)
    }

    /// The floor network of `kind`, with its host link made: `cnib-f0` on 10.232.0.0/16 for
    /// bridge, `cnib-e0` on 10.238.0.0/16 for bandwidth, the master `cnib-g0` with addresses from
    /// 10.237.0.0/16 for macvlan, no host link and 10.236.0.0/16 for ptp.
    fn make(kind: FloorKind) -> Res<FloorNet> {
        let (tag, octet) = match kind {
            FloorKind::Bridge => ('f', 232),
            FloorKind::Ptp => ('d', 236),
            FloorKind::Macvlan => ('g', 237),
            FloorKind::Bandwidth => ('e', 238),
        };
        let bridge = Side::bridge_name(tag);
        let gateway = format!("10.{octet}.0.1");
        match kind {
            FloorKind::Bridge | FloorKind::Bandwidth => {
                let cidr = format!("{gateway}/16");
                for args in [
                    vec!["link", "add", &bridge, "type", "bridge"],
                    vec!["addr", "add", &cidr, "dev", &bridge],
                    vec!["link", "set", &bridge, "up"],
                ] {
                    ip(&args)?;
                }
            }
            FloorKind::Macvlan => veth_master(&bridge)?,
            FloorKind::Ptp => {}
        }
        Ok(FloorNet { kind, bridge, gateway, first_octets: format!("10.{octet}."), third: 1 })
    }
}

impl Side {
    /// The floor on this side's bridge, with addresses host-local does not reach at our levels
    /// (the top of the /16).
    fn floor_net(&self) -> FloorNet {
        let octet = self.octet;
        FloorNet {
            kind: FloorKind::Bridge,
            bridge: self.bridge.clone(),
            gateway: format!("10.{octet}.0.1"),
            first_octets: format!("10.{octet}."),
            third: 240,
        }
    }
}

/// Runs `ip args`.
fn ip(args: &[&str]) -> Res<()> {
    let st = Command::new("ip").args(args).status().map_err(|e| format!("ip: {e}"))?;
    if !st.success() {
        return Err(format!("ip {}: failed", args.join(" ")));
    }
    Ok(())
}

/// `samples` ADD and DEL of `cni-floor` (two more, untimed, first), each in a fresh namespace.
fn floor_run(bin: &Path, net: &FloorNet, samples: usize, with_nft: bool) -> Res<Latency> {
    let (mut a, mut d) = (vec![], vec![]);
    for i in 0..samples + 2 {
        let (ta, td) = floor_sample(bin, net, i, with_nft)?;
        if i >= 2 {
            a.push(ta);
            d.push(td);
        }
    }
    Ok(Latency { add: Stats::of(&a), del: Stats::of(&d) })
}

/// One ADD and DEL of `cni-floor` in a fresh namespace (sample `i` picks the address), each after
/// the settle pause the plugins get.
fn floor_sample(bin: &Path, net: &FloorNet, i: usize, with_nft: bool) -> Res<(Duration, Duration)> {
    check_stop()?;
    let pod = format!("{PREFIX}f-{i}");
    netns_add(&pod)?;
    let host = format!("cnibf{i}");
    let ifb = format!("cnibi{i}");
    let addr = net.addr(i);
    let nft = if with_nft { "nft" } else { "" };
    let run = |args: &[&str]| -> Res<Duration> {
        let t = Instant::now();
        let st = Command::new(bin).args(args).stderr(Stdio::piped()).output().map_err(|e| e.to_string())?;
        if !st.status.success() {
            return Err(format!("cni-floor {}: {}", args.join(" "), String::from_utf8_lossy(&st.stderr)));
        }
        Ok(t.elapsed())
    };
    let ns = netns_path(&pod);
    let (gw, link) = (net.gateway.as_str(), net.bridge.as_str());
    let (add, del): (Vec<&str>, Vec<&str>) = match net.kind {
        FloorKind::Bridge => {
            (vec!["add", &ns, IFNAME, &host, link, &addr, gw, nft], vec!["del", &ns, IFNAME, &host, nft])
        }
        FloorKind::Ptp => (vec!["ptp-add", &ns, IFNAME, &host, &addr, gw], vec!["del-links", &ns, IFNAME]),
        FloorKind::Macvlan => (vec!["macvlan-add", &ns, IFNAME, link, &addr, gw], vec!["del-links", &ns, IFNAME]),
        FloorKind::Bandwidth => {
            (vec!["bw-add", &ns, IFNAME, &host, link, &addr, gw, &ifb], vec!["del-links", &ns, IFNAME, &ifb])
        }
    };
    settle();
    let ta = run(&add);
    settle();
    let td = if ta.is_ok() { run(&del) } else { Err(String::new()) };
    netns_del(&pod);
    if net.kind == FloorKind::Bandwidth && td.is_err() {
        let _ = Command::new("ip").args(["link", "del", &ifb]).stderr(Stdio::null()).status();
    }
    Ok((ta?, td?))
}

fn floor_cleanup() {
    if let Ok(rd) = std::fs::read_dir("/run/netns") {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with(&format!("{PREFIX}f-")) {
                netns_del(&name);
            }
        }
    }
    for tag in ['f', 'e', 'g'] {
        let _ = Command::new("ip").args(["link", "del", &Side::bridge_name(tag)]).stderr(Stdio::null()).status();
    }
    // The bandwidth floor's ifbs (`cnibi<N>`) outlive their pods' namespaces.
    let ifbs = Command::new("ip").args(["-o", "link", "show", "type", "ifb"]).output();
    let ifbs = ifbs.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default();
    for name in ifbs.lines().filter_map(|l| l.split(": ").nth(1)).filter(|n| n.starts_with("cnibi")) {
        let _ = Command::new("ip").args(["link", "del", name]).stderr(Stdio::null()).status();
    }
    let _ = Command::new("nft").args(["delete", "table", "inet", "cni_bench_floor"]).stderr(Stdio::null()).status();
}

/// Ours as installed: with the multi-call binary `cni-rs` built, a directory of hard links to it
/// under each plugin name (as the installer lays it out); else the per-plugin binaries.
fn installed_shape(ours: &Path) -> Res<PathBuf> {
    let multi = ours.join("cni-rs");
    if !multi.is_file() {
        return Ok(ours.to_path_buf());
    }
    let dir = fresh_dir("bin")?;
    let first = dir.join("cni-rs");
    // A copy (the target dir may be on another filesystem), then links to it.
    std::fs::copy(&multi, &first).map_err(|e| format!("copy {}: {e}", multi.display()))?;
    for p in PLUGINS.into_iter().chain(CHAINS.iter().map(|c| c.name)).chain(meta_chains::PLUGINS) {
        std::fs::hard_link(&first, dir.join(p)).map_err(|e| format!("link {p}: {e}"))?;
    }
    Ok(dir)
}

/// `{STATE}-<suffix>`, emptied (an interrupted run's leftovers go) and created.
fn fresh_dir(suffix: &str) -> Res<PathBuf> {
    let dir = PathBuf::from(format!("{STATE}-{suffix}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(dir)
}

/// The reference as this run's copy: every file of its directory written afresh, as ours is by
/// [`installed_shape`]. An executable's page-cache pages age on this kind of host (DAMON reclaim
/// pages cold ones out), and an hours-old copy of the same bytes started measurably slower than a
/// fresh one (docs/bench/README.md, "The two sides"): both sides' files are the same age.
fn fresh_reference(reference: &Path) -> Res<PathBuf> {
    let dir = fresh_dir("ref")?;
    let entries = std::fs::read_dir(reference).map_err(|e| format!("{}: {e}", reference.display()))?;
    for entry in entries.flatten() {
        let from = entry.path();
        if from.is_file() {
            std::fs::copy(&from, dir.join(entry.file_name())).map_err(|e| format!("copy {}: {e}", from.display()))?;
        }
    }
    Ok(dir)
}

/// Removes everything on drop (panics included).
struct Cleanup<'a>(&'a [&'a Side]);

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        eprintln!("cni-bench: cleaning up");
        for s in self.0 {
            s.cleanup();
        }
        floor_cleanup();
        let _ = std::fs::remove_dir_all(STATE);
        let _ = std::fs::remove_dir_all(format!("{STATE}-bin"));
        let _ = std::fs::remove_dir_all(format!("{STATE}-ref"));
        let _ = std::fs::remove_file(format!("{STATE}-floor"));
    }
}

pub struct Run {
    pub opts: Opts,
    pub machine: Machine,
    pub ours: SideResults,
    pub reference: SideResults,
    pub floor: Floor,
    /// Per-pod latency of the other chains.
    pub chains: Vec<ChainRow>,
    /// The meta plugins' chains, measured in the latency rotation.
    pub meta_chains: Vec<meta_chains::ChainLatency>,
    pub elapsed: f64,
}

fn main() {
    let mut opts = match parse_opts() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("cni-bench: {e}");
            std::process::exit(2);
        }
    };
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("cni-bench: needs root (network namespaces, links, firewall rules)");
        std::process::exit(2);
    }
    for (dir, what) in [(&opts.ours, "ours"), (&opts.reference, "reference")] {
        for p in PLUGINS.into_iter().chain(CHAINS.iter().map(|c| c.name)).chain(meta_chains::PLUGINS) {
            if !dir.join(p).is_file() {
                eprintln!("cni-bench: {} has no {p} ({what}); build with cargo build --release / install containernetworking-plugins", dir.display());
                std::process::exit(2);
            }
        }
    }
    // tests/bench.sh builds the floor as ours is built (static musl, not PIE), so the floor's own
    // start-up is no heavier than the plugins' (a glibc-dynamic build started 1.0-1.4 ms slower here).
    let floor_bin = std::env::var_os("CNI_BENCH_FLOOR")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::current_exe().unwrap().with_file_name("cni-floor"));
    // SAFETY: the handler only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
    let started = Instant::now();
    let ours_bin = match installed_shape(&opts.ours) {
        Ok(dir) => dir,
        Err(e) => {
            eprintln!("cni-bench: {e}");
            std::process::exit(1);
        }
    };
    match fresh_reference(&opts.reference) {
        Ok(dir) => opts.reference = dir,
        Err(e) => {
            eprintln!("cni-bench: {e}");
            std::process::exit(1);
        }
    }
    // The floor's file is this run's copy too.
    let fresh_floor = PathBuf::from(format!("{STATE}-floor"));
    if let Err(e) = std::fs::copy(&floor_bin, &fresh_floor) {
        eprintln!("cni-bench: copy {}: {e}", floor_bin.display());
        std::process::exit(1);
    }
    let floor_bin = fresh_floor;
    let [o, r] = SideSpec::pair(["ours", "reference"], ['o', 'r'], &ours_bin, &opts.reference, 230);
    let ours = Side::new(o).unwrap();
    let reference = Side::new(r).unwrap();
    let meta = if opts.probe { Ok(vec![]) } else { meta_chains::chains(&ours_bin, &opts.reference) };
    let meta = meta.unwrap_or_else(|e| {
        eprintln!("cni-bench: {e}");
        std::process::exit(2);
    });
    let mut sides = vec![&ours, &reference];
    sides.extend(meta.iter().flat_map(|c| [&c.ours, &c.reference]));
    let guard = Cleanup(&sides);
    for s in &sides {
        s.cleanup();
    }
    floor_cleanup();
    if opts.probe {
        let r = probe(&opts, &ours, &floor_bin);
        drop(guard);
        if let Err(e) = r {
            eprintln!("cni-bench: {e}");
            std::process::exit(1);
        }
        return;
    }
    if !opts.chains.is_empty() {
        let r = chain_only(&opts, &ours, &reference, &meta, &ours_bin, &floor_bin);
        drop(guard);
        if let Err(e) = r {
            eprintln!("cni-bench: {e}");
            std::process::exit(1);
        }
        return;
    }
    let all = run_all(&opts, &ours, &reference, &meta, &floor_bin);
    match all.and_then(|res| Ok((res, chains(&opts, &ours_bin, &floor_bin, &[])?))) {
        Ok(((o, r, f, meta_chains), chains)) => {
            drop(guard);
            let run = Run {
                machine: machine(&opts.ours),
                opts: opts.clone(),
                ours: o,
                reference: r,
                floor: f,
                chains,
                meta_chains,
                elapsed: started.elapsed().as_secs_f64(),
            };
            match report::write(&run) {
                Ok(files) => {
                    print!("{}", report::summary(&run));
                    for f in files {
                        eprintln!("cni-bench: wrote {}", f.display());
                    }
                }
                Err(e) => {
                    eprintln!("cni-bench: writing the report: {e}");
                    std::process::exit(1);
                }
            }
        }
        Err(e) => {
            drop(guard);
            eprintln!("cni-bench: {e}");
            std::process::exit(1);
        }
    }
}

fn run_all(
    opts: &Opts,
    ours: &Side,
    reference: &Side,
    meta: &[meta_chains::Chain],
    floor_bin: &Path,
) -> Res<(SideResults, SideResults, Floor, Vec<meta_chains::ChainLatency>)> {
    let mut o = SideResults::default();
    let mut r = SideResults::default();
    (o.disk_all, o.disk_used) = footprint(ours, true);
    (r.disk_all, r.disk_used) = footprint(reference, false);

    eprintln!("cni-bench: per-plugin cost and peak RSS ({} pods each)", opts.breakdown);
    o.plugins = breakdown(ours, opts.breakdown)?;
    r.plugins = breakdown(reference, opts.breakdown)?;

    eprintln!(
        "cni-bench: per-pod latency ({} samples per side, per meta chain and for the floor, interleaved)",
        opts.samples
    );
    let net = FloorNet::make(FloorKind::Bridge)?;
    let mut sides = vec![ours, reference];
    sides.extend(meta.iter().flat_map(|c| [&c.ours, &c.reference]));
    let mut floors = vec![(floor_bin, &net, false), (floor_bin, &net, true)];
    // The bandwidth chain's floor (its own bridge); podman's does the base floor's link work.
    let bw_net =
        if meta.iter().any(|c| c.key == "bandwidth") { Some(FloorNet::make(FloorKind::Bandwidth)?) } else { None };
    floors.extend(bw_net.as_ref().map(|n| (floor_bin, n, false)));
    let lat = latency(&sides, opts.samples, &floors)?;
    floor_cleanup();
    o.latency = lat[0].clone();
    r.latency = lat[1].clone();
    let n = sides.len();
    let meta_lat = meta
        .iter()
        .enumerate()
        .map(|(i, c)| meta_chains::ChainLatency {
            key: c.key,
            title: c.title,
            file: c.file,
            ours: lat[2 + 2 * i].clone(),
            reference: lat[3 + 2 * i].clone(),
            // The bandwidth floor is the last in the rotation; the others do the base floor's link work.
            floor: lat[if c.key == "bandwidth" { n + 2 } else { n }].clone(),
        })
        .collect();
    let fl = Floor { netlink: lat[n].clone(), with_nft: lat[n + 1].clone() };

    for workers in [1, opts.parallel] {
        let pods = churn_pods(opts, workers);
        for (side, res) in [(ours, &mut o), (reference, &mut r)] {
            let pps = churn(side, workers, pods)?;
            eprintln!("cni-bench: churn {} x{workers}: {pps:.1} pods/s", side.key);
            res.churn.push((workers, pps));
        }
    }

    if !opts.levels.is_empty() {
        for (side, res) in [(ours, &mut o), (reference, &mut r)] {
            eprintln!("cni-bench: scaling {} ({:?})", side.key, opts.levels);
            // The floor only on ours: the kernel's own growth, to compare ours with.
            let floor = (side.key == "ours").then_some(floor_bin);
            let sc = scaling(side, &opts.levels, opts.scale_samples, opts.parallel, opts.breakdown, floor)?;
            (res.scaling, res.teardown, res.level_plugins, res.level_floor) =
                (sc.next, sc.teardown, sc.plugins, sc.floor);
        }
    }
    Ok((o, r, fl, meta_lat))
}

/// A chain's per-pod latency: its name, ours, the reference's and its floor's.
pub type ChainRow = (&'static str, Latency, Latency, Latency);

/// Per-pod latency of each of [`CHAINS`] (those named in `only`, all when it is empty), ours, the
/// reference and the chain's floor interleaved as for bridge.
fn chains(opts: &Opts, ours_bin: &Path, floor_bin: &Path, only: &[String]) -> Res<Vec<ChainRow>> {
    /// Removes a side's pods, also on error, panic and Ctrl-C.
    struct Removed<'a>(&'a Side);
    impl Drop for Removed<'_> {
        fn drop(&mut self) {
            self.0.cleanup();
        }
    }
    let mut out = Vec::new();
    for c in CHAINS.iter().filter(|c| only.is_empty() || only.iter().any(|o| o == c.name)) {
        let name = c.name;
        let [o, r] = SideSpec::pair(c.keys, c.tags, ours_bin, &opts.reference, c.octet);
        let ours = Side::with_chain(o, (c.main)(&Side::bridge_name(o.tag)), &[])?;
        let reference = Side::with_chain(r, (c.main)(&Side::bridge_name(r.tag)), &[])?;
        let sides = [&ours, &reference];
        let _removed = (Removed(&ours), Removed(&reference));
        for s in sides {
            s.cleanup();
            if c.master {
                veth_master(&s.bridge)?;
            }
        }
        floor_cleanup();
        let net = FloorNet::make(c.floor)?;
        eprintln!("cni-bench: per-pod latency of {name} + host-local ({} samples per side, interleaved)", opts.samples);
        let lat = latency(&sides, opts.samples, &[(floor_bin, &net, false)]);
        floor_cleanup();
        let lat = lat?;
        eprintln!(
            "cni-bench: {name}: ADD median {:.1} / {:.1} / {:.1} ms, DEL median {:.1} / {:.1} / {:.1} ms (cni-rs / reference / floor)",
            lat[0].add.median, lat[1].add.median, lat[2].add.median, lat[0].del.median, lat[1].del.median, lat[2].del.median
        );
        out.push((name, lat[0].clone(), lat[1].clone(), lat[2].clone()));
    }
    Ok(out)
}

/// `--chain`: the per-pod latency of the named chains only (`bridge` is the base conflist), each
/// with its floor in the rotation, printed to stdout with the load average before and after.
fn chain_only(
    opts: &Opts,
    ours: &Side,
    reference: &Side,
    meta: &[meta_chains::Chain],
    ours_bin: &Path,
    floor_bin: &Path,
) -> Res<()> {
    let load = || std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim().to_string();
    println!("load average before: {}", load());
    let mut rows: Vec<ChainRow> = Vec::new();
    for name in &opts.chains {
        if CHAINS.iter().any(|c| c.name == name) {
            rows.extend(chains(opts, ours_bin, floor_bin, std::slice::from_ref(name))?);
            continue;
        }
        let (sides, kind): ([&Side; 2], FloorKind) = match meta.iter().find(|c| c.key == name) {
            Some(c) if c.key == "bandwidth" => ([&c.ours, &c.reference], FloorKind::Bandwidth),
            Some(c) => ([&c.ours, &c.reference], FloorKind::Bridge),
            None if name == "bridge" => ([ours, reference], FloorKind::Bridge),
            None => return Err(format!("--chain {name}: no such chain (bridge, ptp, macvlan, bandwidth, podman)")),
        };
        floor_cleanup();
        let net = FloorNet::make(kind)?;
        eprintln!("cni-bench: per-pod latency of {name} ({} samples per side, interleaved)", opts.samples);
        let lat = latency(&sides, opts.samples, &[(floor_bin, &net, false)]);
        floor_cleanup();
        let lat = lat?;
        sides.iter().for_each(|s| s.cleanup());
        let key = meta.iter().find(|c| c.key == name).map_or("bridge", |c| c.key);
        rows.push((key, lat[0].clone(), lat[1].clone(), lat[2].clone()));
    }
    println!("load average after: {}", load());
    println!(
        "| chain | verb | cni-rs median / p99 | reference median / p99 | speedup | floor median | reference / 5 |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|");
    for (name, o, r, f) in &rows {
        for (verb, o, r, f) in [("ADD", &o.add, &r.add, &f.add), ("DEL", &o.del, &r.del, &f.del)] {
            println!(
                "| {name} | {verb} | {:.1} / {:.1} ms | {:.1} / {:.1} ms | {:.1}x | {:.1} ms | {:.1} ms |",
                o.median,
                o.p99,
                r.median,
                r.p99,
                r.median / o.median,
                f.median,
                r.median / 5.0
            );
        }
    }
    Ok(())
}

/// A veth pair `name` / `<name>p`, both ends up: a master with a carrier for a macvlan chain.
fn veth_master(name: &str) -> Res<()> {
    let peer = format!("{name}p");
    for args in [
        vec!["link", "add", name, "type", "veth", "peer", "name", &peer],
        vec!["link", "set", &peer, "up"],
        vec!["link", "set", name, "up"],
    ] {
        ip(&args)?;
    }
    Ok(())
}

/// `--probe`: cni-rs alone, for profiling between full runs. With CNI_BENCH_HOLD=FILE set, each
/// scaling level waits (pods attached) until FILE is removed, so a single ADD can be traced by hand.
fn probe(opts: &Opts, ours: &Side, floor_bin: &Path) -> Res<()> {
    let lat = latency(&[ours], opts.samples, &[])?;
    eprintln!(
        "probe: ADD median {:.2} p99 {:.2} ms; DEL median {:.2} p99 {:.2} ms ({} samples)",
        lat[0].add.median, lat[0].add.p99, lat[0].del.median, lat[0].del.p99, opts.samples
    );
    for workers in [1, opts.parallel] {
        let pods = churn_pods(opts, workers);
        eprintln!("probe: churn x{workers}: {:.1} pods/s", churn(ours, workers, pods)?);
    }
    if !opts.levels.is_empty() {
        let sc = scaling(ours, &opts.levels, opts.scale_samples, opts.parallel, opts.breakdown, Some(floor_bin))?;
        for (n, a, d) in &sc.next {
            eprintln!(
                "probe: {n} attached: ADD {:.2} / {:.2} ms, DEL {:.2} / {:.2} ms",
                a.median, a.p99, d.median, d.p99
            );
        }
        for ((n, plugins), (_, f)) in sc.plugins.iter().zip(&sc.floor) {
            let each: Vec<String> =
                plugins.iter().map(|c| format!("{} {:.2}/{:.2}", c.plugin, c.add_ms, c.del_ms)).collect();
            eprintln!(
                "probe: {n} attached: floor ADD {:.2} DEL {:.2} ms; plugins ADD/DEL ms: {}",
                f.add.median,
                f.del.median,
                each.join(", ")
            );
        }
    }
    Ok(())
}

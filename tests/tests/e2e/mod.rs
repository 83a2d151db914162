//! Helpers shared by the end-to-end tests that drive the shipped configurations and runtimes
//! (podman.rs, cri.rs, conf.rs): plain HTTP from the host, free ports, firewall dumps, the repository's conf/ dir.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use cni_tests::run;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The repository root (tests/ is a workspace member one level down).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("repo root").to_path_buf()
}

/// True if `cmd args` runs and exits 0.
pub fn runs(cmd: &str, args: &[&str]) -> bool {
    std::process::Command::new(cmd).args(args).output().map(|o| o.status.success()).unwrap_or(false)
}

/// A TCP port nothing on the host listens on right now (the kernel's pick, then released).
pub fn free_port() -> u16 {
    let l = TcpListener::bind("0.0.0.0:0").expect("bind an ephemeral port");
    l.local_addr().expect("local_addr").port()
}

/// One HTTP/1.0 GET of `/`; the body on a 200, None when it cannot connect or the answer is not 200.
pub fn http_get(addr: IpAddr, port: u16) -> Option<String> {
    let sa = SocketAddr::new(addr, port);
    let mut s = TcpStream::connect_timeout(&sa, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(3))).ok()?;
    s.set_write_timeout(Some(Duration::from_secs(3))).ok()?;
    s.write_all(format!("GET / HTTP/1.0\r\nHost: {sa}\r\n\r\n").as_bytes()).ok()?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).ok()?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text.split_once("\r\n\r\n")?;
    head.lines().next()?.contains(" 200 ").then(|| body.to_string())
}

/// GETs `/` until it answers 200 or `within` has passed; the last body, or None.
pub fn http_get_retry(addr: IpAddr, port: u16, within: Duration) -> Option<String> {
    let start = Instant::now();
    loop {
        if let Some(body) = http_get(addr, port) {
            return Some(body);
        }
        if start.elapsed() > within {
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Every firewall rule on the host, as text: `nft list ruleset`, `iptables-save`, `ip6tables-save`
/// (whichever exist; the iptables tools show the legacy or the nft-compat tables, whichever is the
/// system's default).
pub fn firewall_dump() -> String {
    let mut all = String::new();
    for (cmd, args) in [("nft", &["list", "ruleset"][..]), ("iptables-save", &[][..]), ("ip6tables-save", &[][..])] {
        if let Ok(out) = std::process::Command::new(cmd).args(args).output() {
            all.push_str(&String::from_utf8_lossy(&out.stdout));
            all.push('\n');
        }
    }
    all
}

/// True if `needle` (an address or an id) occurs in `text` as a whole token: `10.0.0.2` does not
/// match inside `10.0.0.23` or `110.0.0.2`, but does in `10.0.0.2:80` and `10.0.0.2/32`.
pub fn mentions(text: &str, needle: &str) -> bool {
    let inside = |c: char| c.is_ascii_hexdigit() || c == '.' || c == ':';
    text.match_indices(needle).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        let after = text[i + needle.len()..].chars().next();
        !before.is_some_and(inside) && !after.is_some_and(|c| c.is_ascii_hexdigit() || c == '.')
    })
}

/// The lines of `text` that mention `needle` (for failure messages).
pub fn lines_mentioning(text: &str, needle: &str) -> String {
    text.lines().filter(|l| mentions(l, needle)).collect::<Vec<_>>().join("\n")
}

/// True if `ip` is in `cidr` ("10.89.66.0/24").
pub fn in_v4_subnet(ip: Ipv4Addr, cidr: &str) -> bool {
    let (net, len) = cidr.split_once('/').expect("cidr");
    let net: Ipv4Addr = net.parse().expect("subnet address");
    let len: u32 = len.parse().expect("prefix length");
    let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
    u32::from(ip) & mask == u32::from(net) & mask
}

/// host-local's reservations of `network` under `data_dir`: (address, the container id holding it).
pub fn reservation_owners(data_dir: &Path, network: &str) -> Vec<(String, String)> {
    cni_tests::reservations(data_dir, network)
        .into_iter()
        .map(|(addr, content)| (addr, content.lines().next().unwrap_or_default().trim().to_string()))
        .collect()
}

/// While the pod `id` holding `ip` runs (`what` names it in messages: "pod", "container"):
/// host-local's only reservation of `network` is `ip` for `id`, `bridge` has a port and a rule names
/// `ip`.
pub fn assert_attached(data_dir: &Path, network: &str, bridge: &str, ip: &str, id: &str, what: &str) {
    let res_dir = data_dir.join(network);
    let res = reservation_owners(data_dir, network);
    assert_eq!(res, vec![(ip.to_string(), id.to_string())], "reservations in {}", res_dir.display());
    assert!(!cni_tests::bridge_ports(bridge).is_empty(), "no port on {bridge}");
    let rules = firewall_dump();
    assert!(mentions(&rules, ip), "no rule names {ip} while the {what} runs:\n{rules}");
}

/// After the pod `id` that held `ip` is gone: no reservation of `network`, no port on `bridge`, no
/// rule naming `ip` or `id`.
pub fn assert_detached(data_dir: &Path, network: &str, bridge: &str, ip: &str, id: &str) {
    assert!(
        reservation_owners(data_dir, network).is_empty(),
        "reservations left: {:?}",
        reservation_owners(data_dir, network)
    );
    let ports = cni_tests::bridge_ports(bridge);
    assert!(ports.is_empty(), "ports left on {bridge}: {ports:?}");
    let rules = firewall_dump();
    for needle in [ip, id] {
        assert!(!mentions(&rules, needle), "rules still name {needle}:\n{}", lines_mentioning(&rules, needle));
    }
}

/// Mount points at or under `dir` (from /proc/self/mountinfo), deepest first.
pub fn mounts_under(dir: &Path) -> Vec<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let prefix = dir.to_string_lossy().into_owned();
    let mut v: Vec<String> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| p.replace("\\040", " "))
        .filter(|p| p == &prefix || p.starts_with(&format!("{prefix}/")))
        .collect();
    v.sort_by_key(|p| std::cmp::Reverse(p.len()));
    v.dedup();
    v
}

/// Lazily unmounts everything at or under `dir`.
pub fn unmount_all_under(dir: &Path) {
    for _ in 0..3 {
        let mounts = mounts_under(dir);
        if mounts.is_empty() {
            return;
        }
        for m in mounts {
            let _ = run("umount", &["-l", &m]);
        }
    }
}

/// True if the link exists on the host.
pub fn link_exists(name: &str) -> bool {
    Path::new("/sys/class/net").join(name).exists()
}

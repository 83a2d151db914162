//! tuning: sets sysctls and link attributes (MAC, MTU, promiscuous, all-multicast, transmit queue
//! length) on the pod's interface, chained after an interface plugin.
//!
//! The original link attributes are saved on ADD in `<dataDir>/<containerID>_<ifname>.json`, in the
//! reference's format (so a node can switch between the two plugins with pods running), and put
//! back on DEL. Sysctls are not restored, as in the reference: they live in the pod's namespace
//! and go with it. No process is spawned: link attributes go through rtnetlink, sysctls are
//! written under /proc/sys/net by a thread inside the pod's namespace.

pub mod config;

use config::{Config, Sysctl, ALLOWLIST};
use libcni::types::CniResult;
use libcni::{code, Error, Plugin, Request, Result};
use netkit::netlink::LinkTuning;
use netkit::{NetNs, Netlink};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

pub struct Tuning;

/// The saved originals, field for field the reference's `configToRestore` (same names, order,
/// omitted-when-empty rules), written with Go's `json.MarshalIndent(v, "", " ")` layout.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Saved {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mac: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub promisc: Option<bool>,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub mtu: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allmulti: Option<bool>,
    #[serde(rename = "txQLen", default, skip_serializing_if = "Option::is_none")]
    pub txqlen: Option<u32>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl Saved {
    /// The current values of the attributes `conf` changes.
    fn capture(conf: &Config, link: &LinkTuning) -> Saved {
        Saved {
            mac: if conf.mac.is_some() { link.mac.map(|m| m.to_string()).unwrap_or_default() } else { String::new() },
            promisc: conf.promisc.then_some(link.promisc),
            mtu: if conf.mtu.is_some() { link.mtu } else { 0 },
            allmulti: conf.allmulti.map(|_| link.allmulti),
            txqlen: conf.txqlen.map(|_| link.txqlen),
        }
    }

    /// Takes each value `earlier` holds in place of this one's.
    fn keep_originals(&mut self, earlier: &Saved) {
        if !earlier.mac.is_empty() && !self.mac.is_empty() {
            self.mac.clone_from(&earlier.mac);
        }
        if earlier.mtu != 0 && self.mtu != 0 {
            self.mtu = earlier.mtu;
        }
        self.promisc = self.promisc.and(earlier.promisc.or(self.promisc));
        self.allmulti = self.allmulti.and(earlier.allmulti.or(self.allmulti));
        self.txqlen = self.txqlen.and(earlier.txqlen.or(self.txqlen));
    }

    fn to_json(&self) -> Result<Vec<u8>> {
        let mut buf = Vec::new();
        let fmt = serde_json::ser::PrettyFormatter::with_indent(b" ");
        let mut ser = serde_json::Serializer::with_formatter(&mut buf, fmt);
        self.serialize(&mut ser)
            .map_err(|e| Error::new(code::INTERNAL, format!("encode saved link attributes: {e}")))?;
        Ok(buf)
    }
}

/// `<dataDir>/<containerID>_<ifname>.json`, the reference's layout.
pub fn saved_path(data_dir: &Path, container_id: &str, ifname: &str) -> PathBuf {
    netkit::saved::path(data_dir, container_id, ifname)
}

fn save(path: &Path, saved: &Saved) -> Result<()> {
    netkit::saved::write(path, &saved.to_json()?, "tuning: save original link attributes")
}

fn remove(path: &Path) -> Result<()> {
    netkit::saved::remove(path, "tuning")
}

/// The allowlist's patterns, or `None` when the file does not exist (then any `net.` key goes).
fn read_allowlist(path: &Path) -> Result<Option<Vec<regex_lite::Regex>>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(format_args!("tuning: read sysctl allowlist {}", path.display()), &e)),
    };
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        out.push(regex_lite::Regex::new(line).map_err(|e| {
            Error::config(format!(
                "tuning: sysctl allowlist {} line {}: invalid regexp {line:?}: {e}",
                path.display(),
                n + 1
            ))
        })?);
    }
    Ok(Some(out))
}

/// Refuses a sysctl that matches no allowlist pattern. Patterns match the key as written in the
/// configuration (before `IFNAME` is replaced), unanchored, as Go's `regexp.MatchString` does.
fn check_allowlist(path: &Path, sysctls: &[Sysctl]) -> Result<()> {
    let Some(allow) = read_allowlist(path)? else { return Ok(()) };
    for s in sysctls {
        if !allow.iter().any(|r| r.is_match(&s.key)) {
            return Err(Error::config(format!(
                "tuning: sysctl {:?} is not allowed: it matches no pattern of {} (allowed: {})",
                s.key,
                path.display(),
                allow.iter().map(|r| r.as_str()).collect::<Vec<_>>().join(", ")
            )));
        }
    }
    Ok(())
}

/// The allowlist path: fixed, as in the reference. Unit tests (`cfg(test)`) cannot change the
/// binary's path; the privileged tests put a file there inside a private mount namespace.
fn allowlist_path() -> &'static Path {
    Path::new(ALLOWLIST)
}

fn link(nl: &Netlink, ifname: &str) -> Result<LinkTuning> {
    nl.link_tuning(ifname)?.ok_or_else(|| {
        Error::network(format!(
            "tuning: the container has no interface {ifname:?} (chain tuning after the plugin that creates it)"
        ))
    })
}

/// Sets the link attributes of `saved` (the originals, or the configured values) on `index`, in
/// the reference's order; every failure is reported, none stops the others.
fn apply(nl: &Netlink, index: u32, want: &Saved) -> Vec<Error> {
    let mut errs = Vec::new();
    let mut rec = |r: Result<()>| {
        if let Err(e) = r {
            errs.push(e);
        }
    };
    if want.mtu != 0 {
        rec(nl.set_mtu(index, want.mtu));
    }
    if !want.mac.is_empty() {
        match config::parse_mac(&want.mac) {
            Ok(m) => rec(nl.set_mac(index, m)),
            Err(why) => rec(Err(Error::config(format!("MAC {:?}: {why}", want.mac)))),
        }
    }
    if let Some(p) = want.promisc {
        rec(nl.set_promisc(index, p));
    }
    if let Some(a) = want.allmulti {
        rec(nl.set_allmulti(index, a));
    }
    if let Some(q) = want.txqlen {
        rec(nl.set_txqlen(index, q));
    }
    errs
}

fn join(errs: Vec<Error>, what: &str) -> Result<()> {
    match errs.into_iter().reduce(|a, b| Error::new(a.code, format!("{}; {}", a.msg, b.msg))) {
        None => Ok(()),
        Some(e) => Err(e.context(what)),
    }
}

/// Writes the sysctls inside `ns`, returning the values they had so a failed ADD can put them back.
fn write_sysctls(ns: &NetNs, sysctls: &[Sysctl]) -> (Vec<(String, String)>, Result<()>) {
    let mut old = Vec::new();
    let result = ns.run(|| -> Result<()> {
        for s in sysctls {
            let before =
                netkit::sysctl::get(&s.path).map_err(|e| e.context(format_args!("tuning: sysctl {}", s.key)))?;
            netkit::sysctl::set(&s.path, &s.value).map_err(|e| e.context(format_args!("tuning: sysctl {}", s.key)))?;
            old.push((s.path.clone(), before));
        }
        Ok(())
    });
    let result = result.and_then(|r| r);
    (old, result)
}

fn restore_sysctls(ns: &NetNs, old: &[(String, String)]) {
    let _ = ns.run(|| {
        for (path, value) in old.iter().rev() {
            let _ = netkit::sysctl::set(path, value);
        }
    });
}

/// Sysctl values compare with runs of whitespace as one space: the kernel prints multi-value
/// sysctls (`tcp_rmem`) with tabs, people write them with spaces.
fn same_value(a: &str, b: &str) -> bool {
    a.split_whitespace().eq(b.split_whitespace())
}

impl Tuning {
    fn add_in(&self, req: &Request, conf: &Config, ns: &NetNs, saved_file: &Path) -> Result<()> {
        let nl = Netlink::open_in(ns)?;
        // The interface is looked up before any sysctl is written: a chain without it fails with
        // nothing changed.
        let before = match conf.touches_link() {
            true => Some(link(&nl, &req.ifname)?),
            false => None,
        };
        let (old_sysctls, r) = write_sysctls(ns, &conf.sysctls);
        let undo_sysctls = || restore_sysctls(ns, &old_sysctls);
        if let Err(e) = r {
            undo_sysctls();
            return Err(e);
        }
        let Some(before) = before else { return Ok(()) };
        let result = (|| -> Result<()> {
            let mut saved = Saved::capture(conf, &before);
            // A repeated ADD for the same attachment keeps the originals an earlier one saved,
            // not the values that ADD set.
            if let Some(earlier) = std::fs::read(saved_file).ok().and_then(|t| serde_json::from_slice::<Saved>(&t).ok())
            {
                saved.keep_originals(&earlier);
            }
            save(saved_file, &saved)?;
            let want = Saved {
                mac: conf.mac.map(|m| m.to_string()).unwrap_or_default(),
                promisc: conf.promisc.then_some(true),
                mtu: conf.mtu.unwrap_or(0),
                allmulti: conf.allmulti,
                txqlen: conf.txqlen,
            };
            let errs = apply(&nl, before.index, &want);
            if !errs.is_empty() {
                // Put back what was changed before the failure.
                let _ = apply(&nl, before.index, &saved);
                let _ = remove(saved_file);
                return join(errs, format!("tuning ADD on {}", req.ifname).as_str());
            }
            Ok(())
        })();
        if result.is_err() {
            undo_sysctls();
        }
        result
    }
}

impl Plugin for Tuning {
    fn known_args(&self) -> &'static [&'static str] {
        &["MAC"]
    }

    fn add(&self, req: &Request) -> Result<CniResult> {
        let conf = Config::parse(req)?;
        check_allowlist(allowlist_path(), &conf.sysctls)?;
        let prev = req.prev_result("tuning")?.clone();
        let ns = netkit::container_netns(req)?;
        let saved_file = config_saved_path(&conf.data_dir, req);
        self.add_in(req, &conf, &ns, &saved_file)?;
        let mut result = prev;
        result.cni_version.clone_from(&req.conf.cni_version);
        for iface in result.interfaces.iter_mut().filter(|i| i.name == req.ifname) {
            if let Some(m) = conf.mac {
                iface.mac = Some(m.to_string());
            }
            if let (Some(mtu), Some(_)) = (conf.mtu, iface.mtu) {
                iface.mtu = Some(mtu);
            }
        }
        Ok(result)
    }

    fn del(&self, req: &Request) -> Result<()> {
        let data_dir = Config::data_dir_for_del(req)?;
        let saved_file = config_saved_path(&data_dir, req);
        let Some(text) = netkit::saved::read(&saved_file, "tuning")? else { return Ok(()) };
        // Namespace gone (with its interface): there is nothing left to restore.
        let Some(ns) = netkit::container_netns_for_del(req)? else { return remove(&saved_file) };
        let saved: Saved = match serde_json::from_slice(&text) {
            Ok(s) => s,
            Err(e) => {
                eprintln!(
                    "tuning: {} is not a saved-attributes file ({e}); removed without restoring",
                    saved_file.display()
                );
                return remove(&saved_file);
            }
        };
        let nl = Netlink::open_in(&ns)?;
        let Some(l) = nl.link_tuning(&req.ifname)? else { return remove(&saved_file) };
        // The file stays when a restore fails, so a retried DEL can finish it.
        join(apply(&nl, l.index, &saved), &format!("tuning DEL: restore the original attributes of {}", req.ifname))?;
        remove(&saved_file)
    }

    fn check(&self, req: &Request) -> Result<()> {
        let conf = Config::parse(req)?;
        req.prev_result("tuning")?;
        let ns = netkit::container_netns(req)?;
        let failed = |msg: String| Error::new(code::CHECK_FAILED, format!("tuning CHECK: {msg}"));
        let sysctls = ns.run(|| -> Result<Vec<(String, String)>> {
            conf.sysctls.iter().map(|s| Ok((s.key.clone(), netkit::sysctl::get(&s.path)?))).collect()
        })??;
        for (s, (_, now)) in conf.sysctls.iter().zip(&sysctls) {
            if !same_value(&s.value, now) {
                return Err(failed(format!("sysctl {} is {now:?}, configured {:?}", s.key, s.value)));
            }
        }
        let nl = Netlink::open_in(&ns)?;
        let l = nl
            .link_tuning(&req.ifname)?
            .ok_or_else(|| failed(format!("the container has no interface {:?}", req.ifname)))?;
        if let Some(m) = conf.mac {
            if l.mac != Some(m) {
                let now = l.mac.map(|m| m.to_string()).unwrap_or_default();
                return Err(failed(format!("{} has MAC {now}, configured {m}", req.ifname)));
            }
        }
        if conf.promisc && !l.promisc {
            return Err(failed(format!("{} is not promiscuous, configured promisc true", req.ifname)));
        }
        if let Some(mtu) = conf.mtu {
            if l.mtu != mtu {
                return Err(failed(format!("{} has MTU {}, configured {mtu}", req.ifname, l.mtu)));
            }
        }
        if let Some(a) = conf.allmulti {
            if l.allmulti != a {
                return Err(failed(format!("{} has allmulticast {}, configured {a}", req.ifname, l.allmulti)));
            }
        }
        if let Some(q) = conf.txqlen {
            if l.txqlen != q {
                return Err(failed(format!("{} has txqueuelen {}, configured {q}", req.ifname, l.txqlen)));
            }
        }
        Ok(())
    }

    /// Not available when the allowlist exists but cannot be read or parsed: every ADD with a
    /// sysctl would fail.
    fn status(&self, _req: &Request) -> Result<()> {
        read_allowlist(allowlist_path()).map(|_| ()).map_err(|e| Error::new(code::NOT_AVAILABLE, e.msg))
    }
}

fn config_saved_path(data_dir: &Path, req: &Request) -> PathBuf {
    saved_path(data_dir, &req.container_id, &req.ifname)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn saved_file_is_the_references_layout() {
        let s = Saved {
            mac: "0a:58:0a:f4:01:02".into(),
            promisc: Some(false),
            mtu: 1500,
            allmulti: Some(true),
            txqlen: Some(1000),
        };
        let text = String::from_utf8(s.to_json().unwrap()).unwrap();
        assert_eq!(
            text,
            "{\n \"mac\": \"0a:58:0a:f4:01:02\",\n \"promisc\": false,\n \"mtu\": 1500,\n \"allmulti\": true,\n \"txQLen\": 1000\n}"
        );
        assert_eq!(String::from_utf8(Saved::default().to_json().unwrap()).unwrap(), "{}");
        let only_mtu: Saved = serde_json::from_str("{\n \"mtu\": 9000\n}").unwrap();
        assert_eq!(only_mtu, Saved { mtu: 9000, ..Default::default() });
        assert_eq!(
            saved_path(Path::new("/run/cni/tuning"), "abc", "eth0"),
            PathBuf::from("/run/cni/tuning/abc_eth0.json")
        );
    }

    #[test]
    fn allowlist_semantics() {
        let dir = std::env::temp_dir().join(format!("tuning-allow-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("allowlist.conf");
        let s = |k: &str| Sysctl { key: k.into(), path: String::new(), value: "1".into() };
        // No file: everything under net goes.
        check_allowlist(&file, &[s("net.core.somaxconn")]).unwrap();
        std::fs::write(&file, "  ^net\\.ipv4\\.conf\\.IFNAME\\.rp_filter$ \n\nsomaxconn\n").unwrap();
        check_allowlist(&file, &[s("net.ipv4.conf.IFNAME.rp_filter"), s("net.core.somaxconn")]).unwrap();
        let e = check_allowlist(&file, &[s("net.ipv4.ip_forward")]).unwrap_err();
        assert_eq!(e.code, 7);
        assert!(e.msg.contains("net.ipv4.ip_forward") && e.msg.contains("allowlist.conf"), "{}", e.msg);
        // Matched against the key as written, not after IFNAME is replaced.
        assert!(check_allowlist(&file, &[s("net.ipv4.conf.eth0.rp_filter")]).is_err());
        std::fs::write(&file, "net\\.(\n").unwrap();
        let e = check_allowlist(&file, &[s("net.core.somaxconn")]).unwrap_err();
        assert!(e.msg.contains("line 1"), "{}", e.msg);
        // Go's RE2 semantics: `\w`, `\d` are ASCII, so a pattern does not admit a key with a letter
        // outside ASCII; upstream's style of lines (classes, `*`, alternation, `(?i)`) works.
        std::fs::write(
            &file,
            "^net\\.ipv4\\.conf\\.\\w+\\.rp_filter$\n^net\\.ipv6\\.conf\\.IFNAME\\.[a-z_]*$\n(?i)^NET\\.core\\.(somaxconn|rmem_\\d+)$\n",
        )
        .unwrap();
        check_allowlist(
            &file,
            &[s("net.ipv4.conf.eth0.rp_filter"), s("net.ipv6.conf.IFNAME.accept_ra"), s("net.core.somaxconn")],
        )
        .unwrap();
        check_allowlist(&file, &[s("net.core.rmem_1")]).unwrap();
        assert!(check_allowlist(&file, &[s("net.ipv4.conf.\u{e9}th0.rp_filter")]).is_err());
        assert!(check_allowlist(&file, &[s("net.core.rmem_\u{0663}")]).is_err());
        assert!(check_allowlist(&file, &[s("net.ipv6.conf.IFNAME.accept_ra.x")]).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn whitespace_in_values() {
        assert!(same_value("4096 87380 6291456", "4096\t87380\t6291456"));
        assert!(!same_value("1", "0"));
    }
}

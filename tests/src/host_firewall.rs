//! A test process leaves the host's firewall as it found it. The plugins keep some objects for the
//! next pod on the node they run on (cni-rs: the nftables tables `cni_rs_*`; the reference and
//! cni-rs's iptables backends: the chains `CNI-*` and the jumps to them), so a test that runs a
//! plugin in the host's network namespace (a pod's host side lives there) leaves them behind.
//! Tests of one binary run in parallel and share those objects, so no single test may remove them;
//! the process does, at exit: [`guard`] (called by [`crate::require_root`], before any test of the
//! process makes anything) notes what the host has, and an `atexit` handler removes what appeared
//! since, in the namespace of the process's main thread (the host's, whatever namespace the thread
//! that called `guard` was in).

use std::process::{Command, Output};
use std::sync::OnceLock;

/// iptables tables that plugins add chains to.
const TABLES: [&str; 2] = ["filter", "nat"];
const TOOLS: [&str; 2] = ["iptables", "ip6tables"];

#[derive(Debug, Default)]
struct Objects {
    /// `<family> <name>` of the `cni_rs_*` nftables tables.
    tables: Vec<String>,
    /// (tool, table, chain) of the `CNI-*` iptables chains.
    chains: Vec<(&'static str, &'static str, String)>,
}

static BEFORE: OnceLock<Objects> = OnceLock::new();

/// Notes the host's objects once per process and removes at exit the ones that appeared since.
pub fn guard() {
    BEFORE.get_or_init(|| {
        let before = read();
        // SAFETY: atexit only registers a function pointer; `remove_new` takes no arguments and
        // never unwinds (every failure in it is ignored).
        unsafe { libc::atexit(remove_new) };
        before
    });
}

/// Runs `cmd` in the namespace of this process's main thread.
fn in_host(cmd: &str, args: &[&str]) -> Option<Output> {
    let net = format!("--net=/proc/{}/ns/net", std::process::id());
    Command::new("nsenter").arg(net).arg(cmd).args(args).output().ok().filter(|o| o.status.success())
}

fn text(out: Option<Output>) -> String {
    out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default()
}

fn read() -> Objects {
    let tables = text(in_host("nft", &["list", "tables"]))
        .lines()
        .filter_map(|l| l.strip_prefix("table "))
        .filter(|t| t.split(' ').nth(1).is_some_and(|name| name.starts_with("cni_rs_")))
        .map(str::to_string)
        .collect();
    let mut chains = Vec::new();
    for tool in TOOLS {
        for table in TABLES {
            for line in text(in_host(tool, &["-t", table, "-S"])).lines() {
                if let Some(chain) = line.strip_prefix("-N ").filter(|c| c.starts_with("CNI-")) {
                    chains.push((tool, table, chain.to_string()));
                }
            }
        }
    }
    Objects { tables, chains }
}

/// The words of an `iptables -S` line (double quotes group, as iptables prints comments).
fn words(line: &str) -> Vec<String> {
    let (mut out, mut word, mut quoted, mut any) = (Vec::new(), String::new(), false, false);
    for c in line.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                any = true;
            }
            ' ' if !quoted => {
                if any {
                    out.push(std::mem::take(&mut word));
                }
                any = false;
            }
            _ => {
                word.push(c);
                any = true;
            }
        }
    }
    if any {
        out.push(word);
    }
    out
}

extern "C" fn remove_new() {
    let Some(before) = BEFORE.get() else { return };
    let now = read();
    for table in now.tables.iter().filter(|t| !before.tables.contains(t)) {
        let mut args = vec!["delete", "table"];
        args.extend(table.split(' '));
        in_host("nft", &args);
    }
    let new: Vec<&(&str, &str, String)> = now.chains.iter().filter(|c| !before.chains.contains(c)).collect();
    for tool in TOOLS {
        for table in TABLES {
            let mine: Vec<&str> =
                new.iter().filter(|(t, tb, _)| *t == tool && *tb == table).map(|(_, _, c)| c.as_str()).collect();
            if mine.is_empty() {
                continue;
            }
            // The jumps to them from chains that stay, then their rules, then the chains.
            for line in text(in_host(tool, &["-t", table, "-S"])).lines() {
                let w = words(line);
                let jumps_to_new = w.windows(2).any(|p| p[0] == "-j" && mine.contains(&p[1].as_str()));
                if w.first().map(String::as_str) == Some("-A") && jumps_to_new && !mine.contains(&w[1].as_str()) {
                    let mut args: Vec<&str> = vec!["-t", table, "-D"];
                    args.extend(w[1..].iter().map(String::as_str));
                    in_host(tool, &args);
                }
            }
            for chain in &mine {
                in_host(tool, &["-t", table, "-F", chain]);
            }
            for chain in &mine {
                in_host(tool, &["-t", table, "-X", chain]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::words;

    #[test]
    fn words_keep_quoted_comments_whole() {
        let line = r#"-A POSTROUTING -m comment --comment "CNI portfwd requiring masquerade" -j CNI-HOSTPORT-MASQ"#;
        assert_eq!(
            words(line),
            [
                "-A",
                "POSTROUTING",
                "-m",
                "comment",
                "--comment",
                "CNI portfwd requiring masquerade",
                "-j",
                "CNI-HOSTPORT-MASQ"
            ]
        );
    }
}

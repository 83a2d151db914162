//! cnitool: run a network configuration's plugins by hand, as upstream's cnitool does, plus `list`
//! (what is configured, what is broken and why) and `--json` output.
//!
//! Kept as a library so the pieces (argument and environment parsing, the container id) are unit
//! tested; `main.rs` only hands over the process's arguments and environment.

use libcni::conf::Attachment;
use libcni::conflist::{self, NetworkConfigList};
use libcni::runtime::{CniConfig, RuntimeConf};
use libcni::{code, Error};
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha512};
use std::io::Write;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

pub const DEFAULT_NETCONFPATH: &str = "/etc/cni/net.d";
pub const DEFAULT_IFNAME: &str = "eth0";

pub const USAGE: &str = "\
usage: cnitool <command> [options]

commands:
  add    <network> <netns>   attach the network to the netns and print the result
  check  <network> <netns>   check an attachment against its cached result
  del    <network> <netns>   detach the network
  gc     <network> [<netns>] DEL every cached attachment of the network (all of them, or all but
                             those given with --keep CID:IFNAME,...), then GC each plugin (1.1.0)
  status <network> [<netns>] ask every plugin whether it can serve ADD (1.1.0)
  list                       show the networks in NETCONFPATH, their plugins and files that fail to load
  version                    cnitool's version and the spec versions it speaks (also --version)

options:
  -i, --ifname NAME          interface name in the netns (default: $CNI_IFNAME, else eth0)
      --keep CID:IFNAME,...  gc: attachments to keep
      --json                 machine-readable output (errors as CNI error JSON on stdout)
  -h, --help                 this help

Arguments after those a command uses are ignored, as upstream's cnitool does.

environment:
  NETCONFPATH    configuration directory (default /etc/cni/net.d)
  CNI_PATH       plugin directories, ':'-separated (required except for list)
  CNI_ARGS       K=V pairs separated by ';'
  CAP_ARGS       capability arguments as a JSON object, e.g. {\"portMappings\":[...]}
  CNI_IFNAME     interface name when -i is not given
  CNI_CACHE_DIR  result cache directory (default /var/lib/cni)

The container id is \"cnitool-\" plus the first 10 bytes (hex) of the SHA-512 of the netns path.";

/// A cnitool failure: the CNI error, plus a hint that says what to change.
#[derive(Debug)]
pub struct CliError {
    pub error: Error,
    pub hint: Option<String>,
    pub show_usage: bool,
}

impl From<Error> for CliError {
    fn from(error: Error) -> Self {
        CliError { error, hint: None, show_usage: false }
    }
}

fn usage_error(msg: impl Into<String>) -> CliError {
    CliError { error: Error::new(code::INVALID_ENV, msg), hint: None, show_usage: true }
}

fn with_hint(error: Error, hint: impl Into<String>) -> CliError {
    CliError { error, hint: Some(hint.into()), show_usage: false }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    Add,
    Check,
    Del,
    Gc,
    Status,
    List,
    Help,
    Version,
}

/// The command line, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cli {
    pub verb: Verb,
    pub positional: Vec<String>,
    pub ifname: Option<String>,
    pub keep: Option<Vec<Attachment>>,
    pub json: bool,
}

fn take_value(args: &[String], i: &mut usize, flag: &str, inline: Option<&str>) -> Result<String, CliError> {
    if let Some(v) = inline {
        return Ok(v.to_string());
    }
    *i += 1;
    args.get(*i).cloned().ok_or_else(|| usage_error(format!("{flag} needs a value")))
}

/// `CID:IFNAME,CID2:IFNAME2`.
pub fn parse_keep(s: &str) -> Result<Vec<Attachment>, CliError> {
    s.split(',')
        .filter(|p| !p.is_empty())
        .map(|pair| match pair.split_once(':') {
            Some((cid, ifname)) if !cid.is_empty() && !ifname.is_empty() => {
                Ok(Attachment { container_id: cid.to_string(), ifname: ifname.to_string() })
            }
            _ => Err(usage_error(format!("--keep: {pair:?} is not CONTAINERID:IFNAME"))),
        })
        .collect()
}

/// Parse the arguments (without the program name). Flags may come anywhere.
pub fn parse_cli(args: &[String]) -> Result<Cli, CliError> {
    let mut positional = Vec::new();
    let mut ifname = None;
    let mut keep = None;
    let mut json = false;
    let mut help = false;
    let mut version = false;
    let mut i = 0;
    while i < args.len() {
        let arg = args[i].as_str();
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v)),
            _ => (arg, None),
        };
        match flag {
            "-i" | "--ifname" => ifname = Some(take_value(args, &mut i, flag, inline)?),
            "--keep" => keep = Some(parse_keep(&take_value(args, &mut i, flag, inline)?)?),
            "--json" => json = true,
            "-h" | "--help" => help = true,
            "--version" => version = true,
            "--" => {
                positional.extend(args[i + 1..].iter().cloned());
                break;
            }
            f if f.starts_with('-') && f.len() > 1 => return Err(usage_error(format!("unknown option {f:?}"))),
            _ => positional.push(arg.to_string()),
        }
        i += 1;
    }
    if version && !help {
        return Ok(Cli { verb: Verb::Version, positional, ifname, keep, json });
    }
    if help || positional.is_empty() {
        return Ok(Cli { verb: Verb::Help, positional, ifname, keep, json });
    }
    let verb = match positional.remove(0).as_str() {
        "add" => Verb::Add,
        "check" => Verb::Check,
        "del" => Verb::Del,
        "gc" => Verb::Gc,
        "status" => Verb::Status,
        "list" => Verb::List,
        "help" => Verb::Help,
        "version" => Verb::Version,
        other => return Err(usage_error(format!("unknown command {other:?}"))),
    };
    // Arguments after the ones a command uses are ignored, as upstream's cnitool does (its commands
    // take a minimum number of arguments only).
    let (min, max) = match verb {
        Verb::Add | Verb::Check | Verb::Del => (2, usize::MAX),
        Verb::Gc | Verb::Status => (1, usize::MAX),
        Verb::List | Verb::Help | Verb::Version => (0, 0),
    };
    if positional.len() < min || positional.len() > max {
        let want = match verb {
            Verb::Add | Verb::Check | Verb::Del => "at least <network> <netns>",
            Verb::Gc | Verb::Status => "at least <network>",
            Verb::List | Verb::Help | Verb::Version => "no arguments",
        };
        return Err(usage_error(format!("{verb:?} takes {want}, got {} argument(s)", positional.len()).to_lowercase()));
    }
    if keep.is_some() && verb != Verb::Gc {
        return Err(usage_error("--keep only applies to gc"));
    }
    Ok(Cli { verb, positional, ifname, keep, json })
}

/// CNI_ARGS as cnitool accepts them: `K=V` pairs, both sides non-empty; a trailing `;` is an error.
pub fn parse_cni_args(s: &str) -> Result<Vec<(String, String)>, CliError> {
    if s.is_empty() {
        return Ok(Vec::new());
    }
    s.split(';')
        .map(|pair| {
            let mut kv = pair.split('=');
            match (kv.next(), kv.next(), kv.next()) {
                (Some(k), Some(v), None) if !k.is_empty() && !v.is_empty() => Ok((k.to_string(), v.to_string())),
                _ => Err(with_hint(
                    Error::env(format!("CNI_ARGS: invalid pair {pair:?}")),
                    "CNI_ARGS must be KEY=VALUE pairs separated by ';', with no empty key, value or trailing ';'",
                )),
            }
        })
        .collect()
}

/// CAP_ARGS: a JSON object.
pub fn parse_cap_args(s: &str) -> Result<Map<String, Value>, CliError> {
    if s.trim().is_empty() {
        return Ok(Map::new());
    }
    match serde_json::from_str::<Value>(s) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(with_hint(
            Error::env("CAP_ARGS is not a JSON object"),
            "set CAP_ARGS to an object keyed by capability, e.g. CAP_ARGS='{\"portMappings\":[{\"hostPort\":8080,\"containerPort\":80,\"protocol\":\"tcp\"}]}'",
        )),
        Err(e) => Err(with_hint(
            Error::env(format!("CAP_ARGS is not valid JSON: {e}")),
            "CAP_ARGS must be a JSON object, quoted for the shell",
        )),
    }
}

/// upstream: `cnitool-` + hex of the first 10 bytes of SHA-512(netns path).
pub fn container_id(netns: &str) -> String {
    let digest = Sha512::digest(netns.as_bytes());
    let hex: String = digest.iter().take(10).map(|b| format!("{b:02x}")).collect();
    format!("cnitool-{hex}")
}

/// `filepath.Abs`: joined to the working directory and cleaned lexically.
pub fn absolute(path: &str, cwd: &Path) -> String {
    let joined = if Path::new(path).is_absolute() { PathBuf::from(path) } else { cwd.join(path) };
    let mut parts: Vec<&std::ffi::OsStr> = Vec::new();
    for c in joined.components() {
        match c {
            Component::Normal(p) => parts.push(p),
            Component::ParentDir => {
                parts.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    let mut out = PathBuf::from("/");
    out.extend(parts);
    out.to_string_lossy().into_owned()
}

/// The process environment, abstracted so tests can pass their own.
pub trait Env {
    fn var(&self, key: &str) -> Option<String>;
    fn cwd(&self) -> PathBuf;
}

pub struct ProcessEnv;

impl Env for ProcessEnv {
    fn var(&self, key: &str) -> Option<String> {
        std::env::var(key).ok()
    }
    fn cwd(&self) -> PathBuf {
        std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"))
    }
}

fn nonempty(env: &dyn Env, key: &str) -> Option<String> {
    env.var(key).filter(|v| !v.is_empty())
}

fn conf_dir(env: &dyn Env) -> PathBuf {
    PathBuf::from(nonempty(env, "NETCONFPATH").unwrap_or_else(|| DEFAULT_NETCONFPATH.to_string()))
}

fn cni_path(env: &dyn Env) -> Vec<PathBuf> {
    env.var("CNI_PATH").unwrap_or_default().split(':').filter(|s| !s.is_empty()).map(PathBuf::from).collect()
}

fn runtime_config(env: &dyn Env) -> Result<CniConfig, CliError> {
    let path = cni_path(env);
    if path.is_empty() {
        return Err(with_hint(
            Error::env("CNI_PATH is not set"),
            "set CNI_PATH to the directories holding the plugin binaries, e.g. CNI_PATH=/opt/cni/bin",
        ));
    }
    let cache_dir = nonempty(env, "CNI_CACHE_DIR").unwrap_or_else(|| libcni::cache::DEFAULT_CACHE_DIR.to_string());
    Ok(CniConfig::with_cache_dir(path, PathBuf::from(cache_dir)))
}

fn load(env: &dyn Env, name: &str) -> Result<NetworkConfigList, CliError> {
    let dir = conf_dir(env);
    conflist::load_network_conf(&dir, name).map_err(|e| {
        let hint = match &e {
            conflist::LoadError::NotFound(_) | conflist::LoadError::NoConfigsFound(_) => format!(
                "run `cnitool list` to see the networks in {} (set NETCONFPATH to look elsewhere)",
                dir.display()
            ),
            conflist::LoadError::Other(_) => format!("fix the configuration file in {}", dir.display()),
        };
        with_hint(e.into(), hint)
    })
}

/// Explain the failures whose fix is not obvious from the message.
fn hint_for(e: &Error, env: &dyn Env) -> Option<String> {
    if e.msg.contains("failed to find plugin") {
        return Some(format!(
            "install the plugin into one of the CNI_PATH directories (CNI_PATH={})",
            env.var("CNI_PATH").unwrap_or_default()
        ));
    }
    if e.msg.contains("Permission denied") || e.msg.contains("permission denied") {
        return Some("run as root, or set CNI_CACHE_DIR to a directory you can write".to_string());
    }
    if e.code == code::INCOMPATIBLE_VERSION && e.msg.contains("does not support the") {
        return Some("raise the configuration's cniVersion, or skip this command for it".to_string());
    }
    None
}

/// A failed ADD of the list: when a plugin before the failing one ran, the hint says how to undo
/// what it set up (libcni, as upstream's, runs no DEL after a failed ADD; a failing plugin undoes
/// its own part). The message names the plugin as upstream's does ("plugin type=... failed (add)").
fn add_failure(e: Error, list: &NetworkConfigList) -> CliError {
    let failed = |p: &libcni::conflist::PluginConf| e.msg.starts_with(&format!("{} failed (add)", p.description()));
    let first_failed =
        list.plugins.first().is_some_and(failed) && list.plugins.iter().filter(|p| failed(p)).count() == 1;
    if first_failed {
        return e.into();
    }
    with_hint(e, "the plugins before the failing one ran and may have set things up: run `cnitool del` with the same arguments to undo them")
}

/// Run cnitool; returns the exit code. Results go to `out`, diagnostics to `err`.
pub fn run(args: &[String], env: &dyn Env, out: &mut dyn Write, err: &mut dyn Write) -> i32 {
    let json_requested = args.iter().any(|a| a == "--json");
    match run_inner(args, env, out) {
        Ok(()) => 0,
        Err(mut failure) => {
            if failure.hint.is_none() {
                failure.hint = hint_for(&failure.error, env);
            }
            report(&failure, json_requested, out, err);
            1
        }
    }
}

fn report(failure: &CliError, json: bool, out: &mut dyn Write, err: &mut dyn Write) {
    let e = &failure.error;
    if json {
        let mut v = json!({"code": e.code, "msg": e.msg});
        if !e.details.is_empty() {
            v["details"] = Value::String(e.details.clone());
        }
        if let Some(h) = &failure.hint {
            v["hint"] = Value::String(h.clone());
        }
        let _ = writeln!(out, "{v}");
    }
    let _ = writeln!(err, "cnitool: error: {e} (CNI error code {})", e.code);
    if let Some(h) = &failure.hint {
        let _ = writeln!(err, "hint: {h}");
    }
    if failure.show_usage {
        let _ = writeln!(err, "\n{USAGE}");
    }
}

fn run_inner(args: &[String], env: &dyn Env, out: &mut dyn Write) -> Result<(), CliError> {
    let cli = parse_cli(args)?;
    let write_err = |e: std::io::Error| CliError::from(Error::io("write output", &e));
    match cli.verb {
        Verb::Help => writeln!(out, "{USAGE}").map_err(write_err),
        Verb::Version => writeln!(
            out,
            "cnitool (cni-rs) v{}\nCNI protocol versions supported: {}",
            env!("CARGO_PKG_VERSION"),
            libcni::version::SUPPORTED.join(", ")
        )
        .map_err(write_err),
        Verb::List => list(env, cli.json, out),
        Verb::Add | Verb::Check | Verb::Del | Verb::Gc | Verb::Status => {
            let network = &cli.positional[0];
            let list = load(env, network)?;
            let cfg = runtime_config(env)?;
            match cli.verb {
                Verb::Gc => return Ok(cfg.gc_network_list(&list, cli.keep.as_deref())?),
                Verb::Status => return Ok(cfg.status_network_list(&list)?),
                _ => {}
            }
            let netns = absolute(&cli.positional[1], &env.cwd());
            let ifname = cli
                .ifname
                .clone()
                .or_else(|| nonempty(env, "CNI_IFNAME"))
                .unwrap_or_else(|| DEFAULT_IFNAME.to_string());
            let rt = RuntimeConf {
                container_id: container_id(&netns),
                netns,
                ifname,
                args: parse_cni_args(&env.var("CNI_ARGS").unwrap_or_default())?,
                capability_args: parse_cap_args(&env.var("CAP_ARGS").unwrap_or_default())?,
            };
            match cli.verb {
                Verb::Add => {
                    let result = cfg.add_network_list(&list, &rt).map_err(|e| add_failure(e, &list))?;
                    if cli.json {
                        writeln!(out, "{}", result.to_value(&result.cni_version)?).map_err(write_err)
                    } else {
                        // Upstream's Print(), byte for byte: no trailing newline.
                        write!(out, "{}", result.to_pretty(&result.cni_version)?).map_err(write_err)
                    }
                }
                Verb::Check => Ok(cfg.check_network_list(&list, &rt)?),
                _ => Ok(cfg.del_network_list(&list, &rt)?),
            }
        }
    }
}

/// Describe one plugin binary: where it is and which versions it speaks (or why not).
fn probe_plugin(cfg: Option<&CniConfig>, plugin_type: &str, list_version: &str) -> Value {
    let mut v = json!({"type": plugin_type});
    let Some(cfg) = cfg else { return v };
    match cfg.find_plugin(plugin_type) {
        Err(e) => v["error"] = Value::String(e.msg),
        Ok(path) => {
            v["path"] = Value::String(path.display().to_string());
            match libcni::invoke::get_version_info(&path, Some(Duration::from_secs(10))) {
                Ok(info) => {
                    if !info.supports(list_version) {
                        v["error"] = Value::String(format!("does not support cniVersion {list_version:?}"));
                    }
                    v["supportedVersions"] = json!(info.supported_versions);
                }
                Err(e) => v["error"] = Value::String(format!("VERSION failed: {}", e.msg)),
            }
        }
    }
    v
}

/// `<indent><type>  <path>  [versions]  ERROR: ...` for `cnitool list`.
fn plugin_line(indent: &str, p: &Value) -> String {
    let mut line = format!("{indent}{}", p["type"].as_str().unwrap_or_default());
    if let Some(path) = p["path"].as_str() {
        line.push_str(&format!("  {path}"));
    }
    if let Some(vs) = p["supportedVersions"].as_array() {
        let vs: Vec<&str> = vs.iter().filter_map(Value::as_str).collect();
        line.push_str(&format!("  [{}]", vs.join(" ")));
    }
    if let Some(e) = p["error"].as_str() {
        line.push_str(&format!("  ERROR: {e}"));
    }
    line.push('\n');
    line
}

fn list(env: &dyn Env, json_out: bool, out: &mut dyn Write) -> Result<(), CliError> {
    let dir = conf_dir(env);
    let scan = conflist::scan_dir(&dir)?;
    let path = cni_path(env);
    let cfg = (!path.is_empty()).then(|| CniConfig::new(path));
    let networks: Vec<Value> = scan
        .networks
        .iter()
        .map(|n| {
            let l = &n.list;
            json!({
                "name": l.name,
                "cniVersion": l.cni_version,
                "file": n.file.display().to_string(),
                "disableCheck": l.disable_check,
                "disableGC": l.disable_gc,
                "plugins": l.plugins.iter().map(|p| {
                    let mut v = probe_plugin(cfg.as_ref(), &p.plugin_type, &l.cni_version);
                    // The IPAM plugin is run by the plugin, not by the runtime: show it too.
                    if let Some(ipam) = p.raw.get("ipam").and_then(|i| i.get("type")).and_then(Value::as_str) {
                        v["ipam"] = probe_plugin(cfg.as_ref(), ipam, &l.cni_version);
                    }
                    v
                }).collect::<Vec<_>>(),
            })
        })
        .collect();
    let failures: Vec<Value> = scan
        .failures
        .iter()
        .map(|(f, e)| json!({"file": f.display().to_string(), "code": e.code, "msg": e.msg}))
        .collect();
    let shadowed: Vec<Value> =
        scan.shadowed.iter().map(|(f, n)| json!({"file": f.display().to_string(), "name": n})).collect();
    let write_err = |e: std::io::Error| CliError::from(Error::io("write output", &e));
    if json_out {
        let v = json!({"netconfPath": dir.display().to_string(), "networks": networks, "failures": failures, "shadowed": shadowed});
        return writeln!(out, "{v}").map_err(write_err);
    }
    let mut text = String::new();
    if networks.is_empty() {
        text.push_str(&format!("no networks in {}\n", dir.display()));
    }
    for n in &networks {
        text.push_str(&format!(
            "{}  cniVersion {}  ({})\n",
            n["name"].as_str().unwrap_or_default(),
            n["cniVersion"].as_str().filter(|v| !v.is_empty()).unwrap_or("(none)"),
            n["file"].as_str().unwrap_or_default()
        ));
        for p in n["plugins"].as_array().into_iter().flatten() {
            text.push_str(&plugin_line("    ", p));
            if p["ipam"].is_object() {
                text.push_str(&plugin_line("        ipam ", &p["ipam"]));
            }
        }
    }
    if cfg.is_none() && !networks.is_empty() {
        text.push_str("(set CNI_PATH to also check that the plugins are installed and which versions they speak)\n");
    }
    if !failures.is_empty() {
        text.push_str("\nfiles that failed to load:\n");
        for f in &failures {
            text.push_str(&format!(
                "    {}: {}\n",
                f["file"].as_str().unwrap_or_default(),
                f["msg"].as_str().unwrap_or_default()
            ));
        }
    }
    if !shadowed.is_empty() {
        text.push_str("\nignored (an earlier file defines the same network):\n");
        for s in &shadowed {
            text.push_str(&format!(
                "    {}: network {:?}\n",
                s["file"].as_str().unwrap_or_default(),
                s["name"].as_str().unwrap_or_default()
            ));
        }
    }
    out.write_all(text.as_bytes()).map_err(write_err)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn container_id_matches_upstream() {
        // hashlib.sha512(b"/var/run/netns/test").digest()[:10].hex(), as Go's "%x" prints it.
        assert_eq!(container_id("/var/run/netns/test"), "cnitool-7b8a61d5d8e94d07cbe4");
        assert!(libcni::conf::valid_name(&container_id("/x")));
    }

    #[test]
    fn cni_args_rules() {
        assert_eq!(parse_cni_args("A=1;B=2").unwrap(), vec![("A".into(), "1".into()), ("B".into(), "2".into())]);
        assert!(parse_cni_args("").unwrap().is_empty());
        for bad in ["A=1;", "A=", "=1", "A", "A=1=2", ";"] {
            assert!(parse_cni_args(bad).is_err(), "{bad}");
        }
        assert!(parse_cap_args("[1]").is_err());
        assert!(parse_cap_args("{").is_err());
        assert_eq!(parse_cap_args(r#"{"ips":["10.0.0.1/24"]}"#).unwrap()["ips"][0], "10.0.0.1/24");
    }

    #[test]
    fn command_lines() {
        let c = parse_cli(&args("add mynet /run/netns/x -i net1 --json")).unwrap();
        assert_eq!((c.verb, c.ifname.as_deref(), c.json), (Verb::Add, Some("net1"), true));
        assert_eq!(c.positional, ["mynet", "/run/netns/x"]);
        let c = parse_cli(&args("gc mynet --keep=c1:eth0,c2:net1")).unwrap();
        assert_eq!(c.keep.unwrap()[1], Attachment { container_id: "c2".into(), ifname: "net1".into() });
        assert_eq!(parse_cli(&args("--ifname=e1 del n ns")).unwrap().ifname.as_deref(), Some("e1"));
        assert_eq!(parse_cli(&[]).unwrap().verb, Verb::Help);
        // Trailing arguments are ignored, as upstream.
        let c = parse_cli(&args("del n ns extra more -i e2")).unwrap();
        assert_eq!(
            (c.verb, &c.positional[..2], c.ifname.as_deref()),
            (Verb::Del, &["n".to_string(), "ns".to_string()][..], Some("e2"))
        );
        assert_eq!(parse_cli(&args("status n ns x")).unwrap().verb, Verb::Status);
        for bad in [
            "add n",
            "list extra",
            "bogus n ns",
            "add n ns -x",
            "add n ns -i",
            "gc",
            "del n ns --keep c:e",
            "gc n --keep c",
        ] {
            assert!(parse_cli(&args(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn absolute_paths() {
        let cwd = Path::new("/home/u");
        assert_eq!(absolute("ns", cwd), "/home/u/ns");
        assert_eq!(absolute("../x/./y", cwd), "/home/x/y");
        assert_eq!(absolute("/var/run/netns/a/", cwd), "/var/run/netns/a");
    }
}

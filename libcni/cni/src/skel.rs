//! The plugin entry point: reads the environment and stdin, validates them per verb, negotiates the
//! version, dispatches to a [`Plugin`], and is the only code that writes stdout or picks the exit code.

use crate::args::CniArgs;
use crate::conf::{self, Attachment, NetConf};
use crate::error::{code, Error, Result};
use crate::types::CniResult;
use crate::version;
use serde_json::Value;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Add,
    Del,
    Check,
    Status,
    Gc,
    Version,
}

impl Command {
    pub fn parse(s: &str) -> Option<Command> {
        Some(match s {
            "ADD" => Command::Add,
            "DEL" => Command::Del,
            "CHECK" => Command::Check,
            "STATUS" => Command::Status,
            "GC" => Command::Gc,
            "VERSION" => Command::Version,
            _ => return None,
        })
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Command::Add => "ADD",
            Command::Del => "DEL",
            Command::Check => "CHECK",
            Command::Status => "STATUS",
            Command::Gc => "GC",
            Command::Version => "VERSION",
        }
    }
    /// The variables skel requires for this verb: the spec's list, plus CNI_PATH on ADD, CHECK and
    /// DEL as Go skel does (a plugin may delegate). STATUS needs none (the spec makes CNI_PATH optional).
    fn required_env(self) -> &'static [&'static str] {
        match self {
            Command::Add | Command::Check => &["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"],
            Command::Del => &["CNI_CONTAINERID", "CNI_IFNAME", "CNI_PATH"],
            Command::Gc => &["CNI_PATH"],
            Command::Status | Command::Version => &[],
        }
    }
}

/// One invocation, validated: what every verb of a plugin gets.
#[derive(Debug, Clone)]
pub struct Request {
    pub command: Command,
    /// Empty for GC and STATUS.
    pub container_id: String,
    /// None when CNI_NETNS is unset or empty (allowed for DEL).
    pub netns: Option<PathBuf>,
    /// Empty for GC and STATUS.
    pub ifname: String,
    pub args: CniArgs,
    /// `CNI_NETNS_OVERRIDE` is `1` or `true` (any case), as Go skel reads it: the runtime means
    /// CNI_NETNS to be the plugin's own namespace, so plugins do not refuse it.
    pub netns_override: bool,
    pub cni_path: Vec<PathBuf>,
    pub conf: NetConf,
    /// The whole netconf, for the plugin's own typed keys.
    pub raw: Value,
    /// The netconf bytes as received, handed unchanged to delegated plugins.
    pub stdin: Vec<u8>,
}

impl Request {
    /// The attachments GC must keep (empty when the runtime sent none).
    pub fn valid_attachments(&self) -> &[Attachment] {
        self.conf.valid_attachments.as_deref().unwrap_or(&[])
    }
    /// prevResult, which `plugin` needs on this verb: code 7 without it, worded for the verb as the
    /// fix differs. On CHECK the runtime did not send ADD's result (the reference: "Required
    /// prevResult missing"); on ADD the plugin is not chained after the one that made the pod's
    /// interface (the reference: "must be called as chained plugin").
    pub fn prev_result(&self, plugin: &str) -> Result<&CniResult> {
        self.conf.prev_result.as_ref().ok_or_else(|| {
            Error::config(match self.command {
                Command::Check => format!("{plugin} CHECK needs prevResult: the runtime must send the result of ADD"),
                _ => format!(
                    "{plugin} must be called as a chained plugin, after the plugin that made the pod's interface: \
                     the configuration has no prevResult"
                ),
            })
        })
    }
    /// Decode the plugin's own keys; a wrong type is code 7.
    pub fn plugin_conf<'a, T: serde::Deserialize<'a>>(&'a self) -> Result<T> {
        conf::plugin_conf(&self.raw, &self.conf.plugin_type)
    }
}

/// What a plugin implements. Defaults: STATUS ready, GC nothing to collect.
pub trait Plugin {
    /// Versions this plugin speaks; VERSION reports them and other versions are refused with code 1.
    fn supported_versions(&self) -> &'static [&'static str] {
        &version::SUPPORTED
    }
    /// CNI_ARGS keys this plugin reads (the Kubernetes keys are always accepted). Other keys are
    /// refused on ADD and CHECK unless `IgnoreUnknown` is set; DEL never refuses them.
    fn known_args(&self) -> &'static [&'static str] {
        &[]
    }
    /// Whether the plugin (or a plugin it delegates to) reads CNI_ARGS at all. One that does not
    /// ignores CNI_ARGS on every verb, unknown keys and malformed pairs alike, as the reference
    /// plugins that never load it (portmap, loopback) do.
    fn reads_cni_args(&self) -> bool {
        true
    }
    fn add(&self, req: &Request) -> Result<CniResult>;
    fn del(&self, req: &Request) -> Result<()>;
    fn check(&self, req: &Request) -> Result<()>;
    fn status(&self, _req: &Request) -> Result<()> {
        Ok(())
    }
    fn gc(&self, _req: &Request) -> Result<()> {
        Ok(())
    }
}

/// What skel prints and the exit code it picks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginOutput {
    pub stdout: String,
    pub exit_code: i32,
}

/// Run a plugin as a process: environment and stdin in, stdout and exit code out. Never returns.
pub fn run<P: Plugin + ?Sized>(plugin: &P) -> ! {
    let env = process_env();
    let argv0 = std::env::args_os().next().unwrap_or_default();
    let name = std::path::Path::new(&argv0).file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let args: Vec<String> = std::env::args_os().skip(1).map(|a| a.to_string_lossy().into_owned()).collect();
    if let Some(text) = about_for_a_person(&name, plugin, &args, &env) {
        eprint!("{text}");
        std::process::exit(0);
    }
    let stdin = std::io::stdin();
    // VERSION reads stdin for the cniVersion to answer with; someone typing the command at a
    // terminal sends none, and waiting for it would hang.
    if get(&env, "CNI_COMMAND") == "VERSION" && std::io::IsTerminal::is_terminal(&stdin) {
        finish(execute(plugin, &env, &mut std::io::empty()));
    }
    finish(execute(plugin, &env, &mut stdin.lock()))
}

/// What a plugin tells a person who runs it by hand, on stderr, as the reference plugins do: its
/// name, its version and the spec versions it speaks. A runtime always sets CNI_COMMAND and passes
/// no arguments, so no CNI_COMMAND (or an empty one), `--help`, `-h` or `--version` means a person;
/// anything else is a CNI call (None), and a bad one gets its error JSON.
pub fn about_for_a_person<P: Plugin + ?Sized>(
    name: &str,
    plugin: &P,
    args: &[String],
    env: &HashMap<String, String>,
) -> Option<String> {
    let asked = matches!(args.first().map(String::as_str), Some("--help" | "-h" | "--version"));
    if !asked && !get(env, "CNI_COMMAND").is_empty() {
        return None;
    }
    Some(format!(
        "CNI {name} plugin, cni-rs v{}\nCNI protocol versions supported: {}\nRun by a container runtime, with CNI_COMMAND and the other CNI_* variables set and the network configuration on stdin.\n",
        env!("CARGO_PKG_VERSION"),
        plugin.supported_versions().join(", ")
    ))
}

/// This process's CNI environment (the `CNI_*` variables), as [`execute`] takes it.
pub fn process_env() -> HashMap<String, String> {
    std::env::vars_os()
        .filter_map(|(k, v)| {
            let k = k.into_string().ok()?;
            if !k.starts_with("CNI_") {
                return None;
            }
            // A non-UTF-8 value is kept as an invalid marker so validation can name it.
            Some((k, v.into_string().unwrap_or_else(|_| "\u{fffd}".to_string())))
        })
        .collect()
}

/// Print an outcome on stdout and exit with its code.
pub fn finish(outcome: PluginOutput) -> ! {
    let mut out = std::io::stdout().lock();
    // Nothing useful can be done if stdout is gone; the exit code still tells.
    let _ = out.write_all(outcome.stdout.as_bytes());
    let _ = out.flush();
    std::process::exit(outcome.exit_code)
}

/// The whole of skel without process globals, so it can be tested in-process.
pub fn execute<P: Plugin + ?Sized>(plugin: &P, env: &HashMap<String, String>, stdin: &mut dyn Read) -> PluginOutput {
    let mut cni_version = String::new();
    let result = catch_unwind(AssertUnwindSafe(|| dispatch(plugin, env, stdin, &mut cni_version)));
    let result = result.unwrap_or_else(|panic| {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        Err(Error::new(code::INTERNAL, format!("internal error (a bug, please report it): {what}")))
    });
    match result {
        Ok(stdout) => PluginOutput { stdout, exit_code: 0 },
        Err(e) => {
            let v = if cni_version.is_empty() { version::CURRENT } else { &cni_version };
            PluginOutput { stdout: pretty(&e.to_json(v)), exit_code: 1 }
        }
    }
}

/// ADD's result as the configuration's version prints it. A plugin builds its result in the native
/// (newest) shape whatever version it is labelled with, as the reference's plugins build a current
/// result and convert it when printing: so one without addresses cannot be printed as 0.1.0 or
/// 0.2.0 (`cannot convert: no valid IP addresses`, code 999 as the reference's plugins print it),
/// whether it has interfaces or not. The plugin's DEL then undoes the ADD, so the failure leaves
/// nothing behind (the reference's leave the attachment in place).
fn add_output<P: Plugin + ?Sized>(plugin: &P, req: &Request, result: CniResult) -> Result<String> {
    let native = CniResult { cni_version: String::new(), ..result };
    native.to_pretty(&req.conf.cni_version).inspect_err(|_| {
        if let Err(e) = plugin.del(req) {
            eprintln!("undo of an ADD whose result cannot be printed: DEL failed: {e}");
        }
    })
}

fn pretty(v: &Value) -> String {
    let mut buf = Vec::new();
    let fmt = serde_json::ser::PrettyFormatter::with_indent(b"    ");
    let mut ser = serde_json::Serializer::with_formatter(&mut buf, fmt);
    if serde::Serialize::serialize(v, &mut ser).is_err() {
        return v.to_string();
    }
    String::from_utf8(buf).unwrap_or_else(|_| v.to_string())
}

fn get<'a>(env: &'a HashMap<String, String>, k: &str) -> &'a str {
    env.get(k).map(String::as_str).unwrap_or("")
}

/// A container id as libcni accepts it (it also never forms a path by itself).
pub fn valid_container_id(id: &str) -> bool {
    conf::valid_name(id)
}

/// An interface name the kernel accepts: 1-15 bytes, not "." or "..", no '/', ':', whitespace or
/// control character. The one check of an interface name in the project (netkit's `valid_ifname`
/// is this, as a bool).
pub fn validate_ifname(name: &str) -> Result<()> {
    let why = if name.is_empty() {
        "is empty"
    } else if name.len() > 15 {
        "is longer than 15 bytes"
    } else if name == "." || name == ".." {
        "is \".\" or \"..\""
    } else if name.chars().any(|c| c == '/' || c == ':' || c.is_whitespace() || c.is_control()) {
        "contains '/', ':', whitespace or a control character"
    } else {
        return Ok(());
    };
    Err(Error::env(format!("interface name {name:?} {why}")))
}

fn dispatch<P: Plugin + ?Sized>(
    plugin: &P,
    env: &HashMap<String, String>,
    stdin: &mut dyn Read,
    cni_version: &mut String,
) -> Result<String> {
    let command_str = get(env, "CNI_COMMAND");
    if command_str.is_empty() {
        return Err(Error::env("required env variables [CNI_COMMAND] missing"));
    }
    let command = Command::parse(command_str).ok_or_else(|| {
        Error::env(format!("unknown CNI_COMMAND {command_str:?}: expected ADD, DEL, CHECK, STATUS, GC or VERSION"))
    })?;
    if command == Command::Version {
        return Ok(version_reply(plugin, stdin));
    }
    let missing: Vec<&str> = command.required_env().iter().copied().filter(|k| get(env, k).is_empty()).collect();
    if !missing.is_empty() {
        return Err(Error::env(format!("required env variables [{}] missing", missing.join(","))));
    }
    let container_id = get(env, "CNI_CONTAINERID").to_string();
    let ifname = get(env, "CNI_IFNAME").to_string();
    if matches!(command, Command::Add | Command::Check | Command::Del) {
        if !valid_container_id(&container_id) {
            return Err(Error::env(format!(
                "invalid CNI_CONTAINERID {container_id:?}: use letters, digits, '_', '.' and '-', starting with a letter or digit"
            )));
        }
        validate_ifname(&ifname).map_err(|e| e.context("CNI_IFNAME"))?;
    }

    let stdin_bytes = crate::limits::read_config(stdin, "network configuration on stdin")?;
    // Learn the version first so even a later error speaks it.
    if let Ok(Value::Object(m)) = serde_json::from_slice::<Value>(&stdin_bytes) {
        if let Some((_, Value::String(v))) = crate::gojson::get(&m, "cniVersion") {
            if version::check_supported(v).is_ok() {
                cni_version.clone_from(v);
            }
        }
    }
    let (conf, raw) = match conf::parse_netconf(&stdin_bytes) {
        Err(e) if command == Command::Del && e.code != code::DECODE => netconf_for_del(&stdin_bytes, e)?,
        parsed => parsed?,
    };
    *cni_version = conf.cni_version.clone();
    if !plugin.supported_versions().contains(&conf.cni_version.as_str()) {
        return Err(Error::version(format!(
            "incompatible CNI versions: config is {:?}, this plugin supports [{}]",
            conf.cni_version,
            plugin.supported_versions().join(", ")
        )));
    }
    let gate = match command {
        Command::Check => Some("0.4.0"),
        Command::Status | Command::Gc => Some("1.1.0"),
        _ => None,
    };
    if let Some(min) = gate {
        if !version::at_least(&conf.cni_version, min) {
            return Err(Error::version(format!(
                "configuration version {:?} does not support the {} command (needs {min} or later)",
                conf.cni_version,
                command.as_str()
            )));
        }
    }
    let args = cni_args(plugin, command, get(env, "CNI_ARGS"))?;
    let netns = Some(get(env, "CNI_NETNS")).filter(|s| !s.is_empty()).map(PathBuf::from);
    let override_value = get(env, "CNI_NETNS_OVERRIDE");
    let netns_override = override_value == "1" || override_value.eq_ignore_ascii_case("true");
    let cni_path = get(env, "CNI_PATH").split(':').filter(|s| !s.is_empty()).map(PathBuf::from).collect();
    let req =
        Request { command, container_id, netns, ifname, args, netns_override, cni_path, conf, raw, stdin: stdin_bytes };
    match command {
        Command::Add => {
            let result = plugin.add(&req)?;
            add_output(plugin, &req, result)
        }
        Command::Del => plugin.del(&req).map(|()| String::new()),
        Command::Check => plugin.check(&req).map(|()| String::new()),
        Command::Status => plugin.status(&req).map(|()| String::new()),
        Command::Gc => plugin.gc(&req).map(|()| String::new()),
        Command::Version => Ok(String::new()),
    }
}

/// Netconf keys DEL does without: none of them says which attachment to remove (the container id,
/// ifname, network name and plugin keys do). The runtime fills them in, and one it sent broken
/// must not keep DEL from cleaning up.
const DEL_OPTIONAL_KEYS: [&str; 7] =
    ["prevResult", "runtimeConfig", "args", "capabilities", "dns", "cni.dev/valid-attachments", "cni.dev/attachments"];

/// The netconf of a DEL whose netconf did not validate: again without [`DEL_OPTIONAL_KEYS`]. What
/// still fails (the version, the name, `type`, `ipam`) is the error.
fn netconf_for_del(stdin: &[u8], invalid: Error) -> Result<(NetConf, Value)> {
    let Ok(Value::Object(mut obj)) = serde_json::from_slice::<Value>(stdin) else { return Err(invalid) };
    let dropped: Vec<&str> = DEL_OPTIONAL_KEYS.into_iter().filter(|k| obj.remove(*k).is_some()).collect();
    if dropped.is_empty() {
        return Err(invalid);
    }
    let raw = Value::Object(obj);
    let conf = conf::netconf_from_value(&raw)?;
    eprintln!("DEL goes on without [{}]: {invalid}", dropped.join(", "));
    Ok((conf, raw))
}

/// CNI_ARGS as the plugin gets them. ADD, CHECK, STATUS and GC of a plugin that reads them refuse a
/// malformed pair or an unknown key (code 4). DEL never fails on them: it removes what the attachment
/// holds, which no CNI_ARGS key names, so a malformed pair is skipped and unknown keys are ignored.
/// A plugin that reads no CNI_ARGS skips malformed pairs on every verb.
fn cni_args<P: Plugin + ?Sized>(plugin: &P, command: Command, text: &str) -> Result<CniArgs> {
    if command == Command::Del || !plugin.reads_cni_args() {
        return Ok(CniArgs::parse_lenient(text));
    }
    let args = CniArgs::parse(text)?;
    args.check_known(plugin.known_args())?;
    Ok(args)
}

/// The VERSION answer: the plugin's versions, under the request's `cniVersion` when stdin carries
/// a supported one (the spec's rule), else under the newest version. Never an error: stdin is
/// optional here, and a runtime probing versions must get the list whatever it sent.
fn version_reply<P: Plugin + ?Sized>(plugin: &P, stdin: &mut dyn Read) -> String {
    let supported = plugin.supported_versions();
    let mut bytes = Vec::new();
    // Only a small object is expected; more than that is not a version request worth reading.
    let _ = stdin.take(64 * 1024).read_to_end(&mut bytes);
    let requested = match serde_json::from_slice::<Value>(&bytes) {
        Ok(Value::Object(m)) => m.get("cniVersion").and_then(Value::as_str).map(str::to_string),
        _ => None,
    };
    let answer = requested.filter(|v| supported.contains(&v.as_str())).unwrap_or_else(|| version::CURRENT.to_string());
    let v = serde_json::json!({ "cniVersion": answer, "supportedVersions": supported });
    format!("{v}\n")
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    struct Fake;
    impl Plugin for Fake {
        fn known_args(&self) -> &'static [&'static str] {
            &["IP"]
        }
        fn add(&self, req: &Request) -> Result<CniResult> {
            if req.conf.name == "boom" {
                panic!("kaboom");
            }
            Ok(CniResult { cni_version: req.conf.cni_version.clone(), ..Default::default() })
        }
        fn del(&self, _: &Request) -> Result<()> {
            Ok(())
        }
        fn check(&self, _: &Request) -> Result<()> {
            Ok(())
        }
    }

    fn env(cmd: &str) -> HashMap<String, String> {
        [
            ("CNI_COMMAND", cmd),
            ("CNI_CONTAINERID", "abc"),
            ("CNI_NETNS", "/run/netns/x"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", "/opt/cni/bin"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    }

    fn run_with(env: &HashMap<String, String>, stdin: &str) -> (i32, Value) {
        let out = execute(&Fake, env, &mut stdin.as_bytes());
        let v = if out.stdout.is_empty() { Value::Null } else { serde_json::from_str(&out.stdout).unwrap() };
        (out.exit_code, v)
    }

    const CONF: &str = r#"{"cniVersion":"1.0.0","name":"net","type":"fake"}"#;

    #[test]
    fn version_lists_all_seven() {
        let (rc, v) = run_with(&env("VERSION"), "");
        assert_eq!(rc, 0);
        assert_eq!(v["supportedVersions"].as_array().unwrap().len(), 7);
    }

    #[test]
    fn error_codes() {
        assert_eq!(run_with(&env("ADD"), "{\"cniVersion\":\"1.0.0\",").1["code"], 6);
        let mut e = env("ADD");
        e.remove("CNI_CONTAINERID");
        let (rc, v) = run_with(&e, CONF);
        assert_eq!((rc, v["code"].as_u64()), (1, Some(4)));
        assert!(v["msg"].as_str().unwrap().contains("CNI_CONTAINERID"));
        assert_eq!(run_with(&env("ADD"), r#"{"cniVersion":"9.9.9","name":"n"}"#).1["code"], 1);
        assert_eq!(run_with(&env("CHECK"), r#"{"cniVersion":"0.3.1","name":"n"}"#).1["code"], 1);
        assert_eq!(run_with(&env("GC"), r#"{"cniVersion":"1.0.0","name":"n"}"#).1["code"], 1);
        assert_eq!(run_with(&env("BOGUS"), CONF).1["code"], 4);
        let mut e = env("ADD");
        e.insert("CNI_IFNAME".into(), "a-very-long-interface".into());
        assert_eq!(run_with(&e, CONF).1["code"], 4);
        e.insert("CNI_IFNAME".into(), "eth0".into());
        e.insert("CNI_CONTAINERID".into(), "../../etc".into());
        assert_eq!(run_with(&e, CONF).1["code"], 4);
        let mut e = env("ADD");
        e.insert("CNI_ARGS".into(), "FOO=1".into());
        assert_eq!(run_with(&e, CONF).1["code"], 4);
        e.insert("CNI_ARGS".into(), "FOO=1;IgnoreUnknown=true".into());
        assert_eq!(run_with(&e, CONF).0, 0);
    }

    #[test]
    fn panic_becomes_error_json() {
        let (rc, v) = run_with(&env("ADD"), r#"{"cniVersion":"1.0.0","name":"boom"}"#);
        assert_eq!((rc, v["code"].as_u64()), (1, Some(code::INTERNAL as u64)));
        assert_eq!(v["cniVersion"], "1.0.0");
    }

    #[test]
    fn version_answers_in_the_requested_version() {
        let reply = |stdin: &str| run_with(&env("VERSION"), stdin).1["cniVersion"].clone();
        assert_eq!(reply(r#"{"cniVersion":"0.4.0"}"#), "0.4.0");
        assert_eq!(reply(r#"{"cniVersion":"1.0.0","name":"n"}"#), "1.0.0");
        // Not given, not supported, or not readable: the newest version, and still no error.
        for stdin in ["", r#"{"cniVersion":"9.9.9"}"#, r#"{"cniVersion":5}"#, "not json", "[1]"] {
            let (rc, v) = run_with(&env("VERSION"), stdin);
            assert_eq!((rc, v["cniVersion"].as_str()), (0, Some(version::CURRENT)), "{stdin}");
            assert_eq!(v["supportedVersions"].as_array().unwrap().len(), 7);
        }
    }

    #[test]
    fn status_does_not_need_cni_path() {
        let mut e = env("STATUS");
        for k in ["CNI_PATH", "CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME"] {
            e.remove(k);
        }
        assert_eq!(run_with(&e, r#"{"cniVersion":"1.1.0","name":"net"}"#), (0, Value::Null));
        let mut e = env("GC");
        e.remove("CNI_PATH");
        assert_eq!(run_with(&e, r#"{"cniVersion":"1.1.0","name":"net"}"#).1["code"], 4);
    }

    #[test]
    fn del_never_fails_on_cni_args() {
        for args in ["FOO=1", "a=b=c", "justtext", "IP=10.0.0.5;", "IgnoreUnknown=0;FOO=1"] {
            let mut e = env("DEL");
            e.insert("CNI_ARGS".into(), args.into());
            assert_eq!(run_with(&e, CONF).0, 0, "DEL with CNI_ARGS {args:?}");
            e.insert("CNI_COMMAND".into(), "ADD".into());
            assert_eq!(run_with(&e, CONF).1["code"], 4, "ADD with CNI_ARGS {args:?}");
        }
    }

    /// A plugin that reads no CNI_ARGS and remembers the request it got.
    #[derive(Default)]
    struct NoArgs(std::cell::RefCell<Option<Request>>);
    impl Plugin for NoArgs {
        fn reads_cni_args(&self) -> bool {
            false
        }
        fn add(&self, req: &Request) -> Result<CniResult> {
            *self.0.borrow_mut() = Some(req.clone());
            Ok(CniResult { cni_version: req.conf.cni_version.clone(), ..Default::default() })
        }
        fn del(&self, req: &Request) -> Result<()> {
            *self.0.borrow_mut() = Some(req.clone());
            Ok(())
        }
        fn check(&self, req: &Request) -> Result<()> {
            *self.0.borrow_mut() = Some(req.clone());
            Ok(())
        }
    }

    #[test]
    fn a_plugin_that_reads_no_cni_args_ignores_them_on_every_verb() {
        for command in ["ADD", "CHECK", "DEL"] {
            for args in ["FOO=1", "a=b=c;K8S_POD_NAME=web", "justtext"] {
                let mut e = env(command);
                e.insert("CNI_ARGS".into(), args.into());
                let out = execute(&NoArgs::default(), &e, &mut CONF.as_bytes());
                assert_eq!(out.exit_code, 0, "{command} with CNI_ARGS {args:?}: {}", out.stdout);
            }
        }
    }

    #[test]
    fn netns_override_is_read_as_go_skel_reads_it() {
        for (value, want) in [
            (None, false),
            (Some("1"), true),
            (Some("true"), true),
            (Some("TRUE"), true),
            (Some("True"), true),
            (Some("0"), false),
            (Some("false"), false),
            (Some("yes"), false),
            (Some(""), false),
        ] {
            let mut e = env("DEL");
            if let Some(v) = value {
                e.insert("CNI_NETNS_OVERRIDE".into(), v.into());
            }
            let plugin = NoArgs::default();
            assert_eq!(execute(&plugin, &e, &mut CONF.as_bytes()).exit_code, 0);
            assert_eq!(plugin.0.borrow().as_ref().unwrap().netns_override, want, "{value:?}");
        }
    }

    #[test]
    fn del_goes_on_without_broken_optional_keys() {
        for (key, bad) in [
            ("prevResult", r#""garbage""#),
            ("prevResult", r#"{"cniVersion":"0.0.7"}"#),
            ("runtimeConfig", "5"),
            ("args", r#""x""#),
            ("capabilities", "[]"),
            ("dns", "5"),
            ("cni.dev/valid-attachments", r#""x""#),
        ] {
            let conf = format!(r#"{{"cniVersion":"1.0.0","name":"net","type":"fake","{key}":{bad}}}"#);
            assert_eq!(run_with(&env("DEL"), &conf).0, 0, "DEL with {key} {bad}");
            assert_ne!(run_with(&env("ADD"), &conf).0, 0, "ADD with {key} {bad}");
        }
        // What identifies the attachment or the plugin still fails DEL.
        for (conf, code) in [
            (r#"{"cniVersion":"1.0.0","name":"net","#, 6),
            (r#"{"cniVersion":"9.9.9","name":"net","prevResult":5}"#, 1),
            (r#"{"cniVersion":"1.0.0","prevResult":5}"#, 7),
            (r#"{"cniVersion":"1.0.0","name":"../x"}"#, 7),
            (r#"{"cniVersion":"1.0.0","name":"net","type":5,"dns":5}"#, 7),
            (r#"{"cniVersion":"1.0.0","name":"net","ipam":"host-local"}"#, 7),
        ] {
            assert_eq!(run_with(&env("DEL"), conf).1["code"], code, "DEL with {conf}");
        }
    }

    #[test]
    fn del_without_netns_is_allowed() {
        let mut e = env("DEL");
        e.remove("CNI_NETNS");
        assert_eq!(run_with(&e, CONF).0, 0);
    }

    /// A plugin whose ADD makes an interface but no address, and which counts its DELs.
    #[derive(Default)]
    struct NoAddress {
        with_interface: bool,
        dels: std::cell::Cell<u32>,
    }
    impl Plugin for NoAddress {
        fn add(&self, req: &Request) -> Result<CniResult> {
            let interfaces = if self.with_interface {
                vec![crate::types::Interface { name: req.ifname.clone(), ..Default::default() }]
            } else {
                Vec::new()
            };
            Ok(CniResult { cni_version: req.conf.cni_version.clone(), interfaces, ..Default::default() })
        }
        fn del(&self, _: &Request) -> Result<()> {
            self.dels.set(self.dels.get() + 1);
            Ok(())
        }
        fn check(&self, _: &Request) -> Result<()> {
            Ok(())
        }
    }

    /// A result without addresses has no 0.1.0/0.2.0 form: upstream's error, code and message as
    /// its plugins print it, and DEL undoes the ADD; from 0.3.0 on it prints, with its interface.
    #[test]
    fn add_without_addresses_fails_on_0_1_and_0_2_and_is_undone() {
        for with_interface in [false, true] {
            for version in version::SUPPORTED {
                let plugin = NoAddress { with_interface, ..Default::default() };
                let conf = format!(r#"{{"cniVersion":"{version}","name":"net","type":"fake"}}"#);
                let out = execute(&plugin, &env("ADD"), &mut conf.as_bytes());
                let v: Value = serde_json::from_str(&out.stdout).unwrap();
                let what = format!("{version}, interface: {with_interface}: {v}");
                if version::at_least(version, "0.3.0") {
                    assert_eq!(out.exit_code, 0, "{what}");
                    assert_eq!(v["cniVersion"], version, "{what}");
                    assert_eq!(v["interfaces"][0]["name"].as_str(), with_interface.then_some("eth0"), "{what}");
                    assert_eq!(plugin.dels.get(), 0, "{what}");
                } else {
                    assert_eq!(out.exit_code, 1, "{what}");
                    assert_eq!(v["code"], 999, "{what}: the reference's plugins answer 999");
                    assert_eq!(v["msg"], "cannot convert: no valid IP addresses", "{what}");
                    assert_eq!(plugin.dels.get(), 1, "{what}: the ADD was not undone");
                }
            }
        }
    }
}

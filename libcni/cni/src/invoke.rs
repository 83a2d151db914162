//! Running plugins: find the binary on CNI_PATH, exec it with the CNI environment and the config on
//! stdin, and turn what it says into a result or an error. Used by the runtime API and by plugins that
//! delegate to IPAM.

use crate::error::{code, Error, Result};
use crate::skel::{Command, Request};
use crate::types::CniResult;
use crate::version;
use serde_json::Value;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

/// More than this on stdout is refused: no honest result or error is that large.
pub const MAX_STDOUT: usize = 16 << 20;
/// stderr beyond this is dropped (only used in messages and copied through).
const MAX_STDERR: usize = 64 << 10;
/// How often exec is tried when the binary is still being written ("text file busy").
const TEXT_BUSY_TRIES: u32 = 6;
const TEXT_BUSY_BACKOFF: Duration = Duration::from_millis(100);

/// The six CNI_* variables one invocation gets. All six are always set, empty or not, over the
/// inherited environment, so a stale value from our own environment never leaks into the plugin.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CniEnv {
    pub command: String,
    pub container_id: String,
    pub netns: String,
    pub ifname: String,
    pub args: Vec<(String, String)>,
    pub path: Vec<PathBuf>,
}

impl CniEnv {
    pub fn new(command: Command) -> CniEnv {
        CniEnv { command: command.as_str().to_string(), ..CniEnv::default() }
    }

    /// `K=V;K2=V2`, no escaping, as upstream.
    pub fn args_string(&self) -> String {
        self.args.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(";")
    }

    pub fn path_string(&self) -> String {
        self.path.iter().map(|p| p.to_string_lossy().into_owned()).collect::<Vec<_>>().join(":")
    }

    pub fn vars(&self) -> [(&'static str, String); 6] {
        [
            ("CNI_COMMAND", self.command.clone()),
            ("CNI_CONTAINERID", self.container_id.clone()),
            ("CNI_NETNS", self.netns.clone()),
            ("CNI_IFNAME", self.ifname.clone()),
            ("CNI_ARGS", self.args_string()),
            ("CNI_PATH", self.path_string()),
        ]
    }
}

/// The first regular file `dir/<plugin_type>` in path order. A type that could name another
/// directory (a path separator, `..`) is refused with code 7; not found is code 7 too (it is the
/// configuration that names a plugin we do not have).
pub fn find_plugin(plugin_type: &str, path: &[PathBuf]) -> Result<PathBuf> {
    if plugin_type.is_empty() {
        return Err(Error::config("plugin type is empty: every plugin in a configuration needs a \"type\""));
    }
    if plugin_type.contains('/') || plugin_type.contains('\\') || plugin_type == "." || plugin_type == ".." {
        return Err(Error::config(format!(
            "invalid plugin type {plugin_type:?}: a type names a binary in CNI_PATH, not a path"
        )));
    }
    for dir in path {
        let candidate = dir.join(plugin_type);
        if std::fs::metadata(&candidate).map(|m| m.is_file()).unwrap_or(false) {
            return Ok(candidate);
        }
    }
    let dirs: Vec<String> = path.iter().map(|p| p.display().to_string()).collect();
    Err(Error::config(format!("failed to find plugin {plugin_type:?} in path [{}]", dirs.join(" "))))
}

/// What one plugin run produced, before interpretation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawOutput {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// The exit code; None when the plugin died from a signal.
    pub exit_code: Option<i32>,
}

fn plugin_name(plugin: &Path) -> String {
    plugin.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| plugin.display().to_string())
}

fn exec_error(msg: String) -> Error {
    Error::new(code::PLUGIN_EXEC, msg)
}

/// Read everything from `r`, keeping at most `cap` bytes but draining the rest so the writer
/// never blocks; the flag says whether anything was dropped.
fn read_capped(mut r: impl Read, cap: usize) -> (Vec<u8>, bool) {
    let mut kept = Vec::new();
    let mut truncated = false;
    let mut buf = [0u8; 64 << 10];
    loop {
        match r.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                let room = cap.saturating_sub(kept.len());
                if n > room {
                    truncated = true;
                }
                kept.extend_from_slice(&buf[..n.min(room)]);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    (kept, truncated)
}

fn spawn(plugin: &Path, env: &CniEnv) -> Result<Child> {
    let mut tries = 0;
    loop {
        let mut cmd = std::process::Command::new(plugin);
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        for (k, v) in env.vars() {
            cmd.env(k, v);
        }
        match cmd.spawn() {
            Ok(child) => return Ok(child),
            // The binary is still open for writing (being installed, or copied by a test while
            // another thread forked): wait for the writer to finish, as upstream does.
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && tries + 1 < TEXT_BUSY_TRIES => {
                tries += 1;
                thread::sleep(TEXT_BUSY_BACKOFF * tries);
            }
            Err(e) => {
                return Err(exec_error(format!("failed to execute plugin {}: {e}", plugin.display())));
            }
        }
    }
}

/// Run `plugin` with `stdin` and the CNI environment; return whatever it printed and its exit code.
/// Only a failure to run it at all, an oversized stdout or the timeout is an error here (code 102).
pub fn exec_raw(plugin: &Path, stdin: &[u8], env: &CniEnv, timeout: Option<Duration>) -> Result<RawOutput> {
    let name = plugin_name(plugin);
    let started = Instant::now();
    let mut child = spawn(plugin, env)?;
    let (Some(mut child_stdin), Some(child_stdout), Some(child_stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        let _ = child.kill();
        let _ = child.wait();
        return Err(exec_error(format!("plugin {name}: could not open its stdio pipes")));
    };
    let input = stdin.to_vec();
    // A plugin that never reads stdin (VERSION) closes the pipe: a write error is not ours to report.
    let writer = thread::spawn(move || {
        let _ = child_stdin.write_all(&input);
    });
    let (done_tx, done_rx) = mpsc::channel();
    let stderr_tx = done_tx.clone();
    let out_reader = thread::spawn(move || {
        let r = read_capped(child_stdout, MAX_STDOUT);
        let _ = done_tx.send(());
        r
    });
    let err_reader = thread::spawn(move || {
        let r = read_capped(child_stderr, MAX_STDERR);
        let _ = stderr_tx.send(());
        r
    });

    let deadline = timeout.map(|t| started + t);
    let remaining = || deadline.map(|d| d.saturating_duration_since(Instant::now()));
    let mut timed_out = false;
    // Both pipes closing is the usual sign of exit; then reap the process.
    for _ in 0..2 {
        let got = match remaining() {
            Some(left) => done_rx.recv_timeout(left).is_ok(),
            None => done_rx.recv().is_ok(),
        };
        if !got {
            timed_out = true;
            break;
        }
    }
    let status = loop {
        if timed_out {
            break None;
        }
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) => {}
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(exec_error(format!("plugin {name}: wait failed: {e}")));
            }
        }
        if remaining().is_some_and(|left| left.is_zero()) {
            timed_out = true;
            break None;
        }
        thread::sleep(Duration::from_millis(2));
    };
    if timed_out {
        let _ = child.kill();
        let _ = child.wait();
        // Readers finish once the pipes close; a grandchild holding them open must not hang us,
        // so they are left to end on their own.
        drop(writer);
        let secs = timeout.map(|t| t.as_secs_f64()).unwrap_or_default();
        return Err(exec_error(format!("plugin {name} timed out after {secs}s and was killed")));
    }
    let _ = writer.join();
    let (stdout, stdout_truncated) = out_reader.join().unwrap_or_default();
    let (stderr, _) = err_reader.join().unwrap_or_default();
    if stdout_truncated {
        return Err(exec_error(format!("plugin {name} wrote more than {MAX_STDOUT} bytes to stdout")));
    }
    let exit_code = status.and_then(|s| s.code());
    Ok(RawOutput { stdout, stderr, exit_code })
}

fn lossy_trimmed(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).trim().to_string()
}

/// Interpret a run: Ok(stdout) on exit 0, else the plugin's own error (code kept) or a code-102
/// error that says what went wrong.
fn interpret(plugin: &Path, out: RawOutput) -> Result<Vec<u8>> {
    let name = plugin_name(plugin);
    if out.exit_code == Some(0) {
        if !out.stderr.is_empty() {
            // As upstream: a successful plugin's logs reach the runtime's stderr.
            let _ = std::io::stderr().write_all(&out.stderr);
        }
        return Ok(out.stdout);
    }
    let exit = match out.exit_code {
        Some(c) => format!("exit status {c}"),
        None => "killed by a signal".to_string(),
    };
    let stdout = lossy_trimmed(&out.stdout);
    if stdout.is_empty() {
        let stderr = lossy_trimmed(&out.stderr);
        return Err(exec_error(if stderr.is_empty() {
            format!("netplugin {name} failed with no error message: {exit}")
        } else {
            format!("netplugin {name} failed: {stderr:?}: {exit}")
        }));
    }
    match serde_json::from_slice::<Value>(&out.stdout) {
        Ok(Value::Object(obj)) => {
            let code = obj.get("code").and_then(Value::as_u64).and_then(|c| u32::try_from(c).ok());
            let msg = obj.get("msg").and_then(Value::as_str).unwrap_or_default().to_string();
            let details = obj.get("details").and_then(Value::as_str).unwrap_or_default().to_string();
            match code {
                Some(c) if c != 0 => Err(Error { code: c, msg, details }),
                _ => Err(exec_error(format!(
                    "netplugin {name} failed ({exit}) and its error has no error code: {stdout:?}"
                ))),
            }
        }
        _ => Err(exec_error(format!("netplugin {name} failed but its error output is not JSON: {stdout:?} ({exit})"))),
    }
}

/// Run a verb that returns a result (ADD). A success whose stdout is not a result is code 6.
pub fn exec_with_result(
    plugin: &Path,
    stdin: &[u8],
    env: &CniEnv,
    timeout: Option<Duration>,
    fallback_version: &str,
) -> Result<CniResult> {
    let stdout = interpret(plugin, exec_raw(plugin, stdin, env, timeout)?)?;
    let name = plugin_name(plugin);
    let value: Value = serde_json::from_slice(&stdout).map_err(|e| {
        Error::decode(format!("plugin {name} succeeded but its result is not JSON ({e}): {:?}", lossy_trimmed(&stdout)))
    })?;
    CniResult::parse(&value, fallback_version).map_err(|e| {
        Error::new(if e.code == code::INCOMPATIBLE_VERSION { e.code } else { code::DECODE }, e.msg)
            .context(format!("plugin {name} returned an invalid result"))
    })
}

/// Run a verb without a result (DEL, CHECK, GC, STATUS); stdout of a success is ignored.
pub fn exec_without_result(plugin: &Path, stdin: &[u8], env: &CniEnv, timeout: Option<Duration>) -> Result<()> {
    interpret(plugin, exec_raw(plugin, stdin, env, timeout)?).map(|_| ())
}

/// What a plugin says about itself on VERSION.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginInfo {
    pub cni_version: String,
    pub supported_versions: Vec<String>,
}

impl PluginInfo {
    /// Whether the plugin speaks `v` ("" meaning 0.1.0, as upstream).
    pub fn supports(&self, v: &str) -> bool {
        let v = if v.is_empty() { "0.1.0" } else { v };
        self.supported_versions.iter().any(|s| s == v)
    }
}

/// Ask a plugin which versions it speaks, as upstream's GetVersionInfo does.
pub fn get_version_info(plugin: &Path, timeout: Option<Duration>) -> Result<PluginInfo> {
    let env = CniEnv {
        command: "VERSION".to_string(),
        netns: "dummy".to_string(),
        ifname: "dummy".to_string(),
        path: vec![PathBuf::from("dummy")],
        ..CniEnv::default()
    };
    let stdin = format!("{{\"cniVersion\":\"{}\"}}", version::CURRENT);
    let name = plugin_name(plugin);
    let stdout = match interpret(plugin, exec_raw(plugin, stdin.as_bytes(), &env, timeout)?) {
        Ok(out) => out,
        // A 0.1.0 plugin predates VERSION.
        Err(e) if e.msg.contains("unknown CNI_COMMAND: VERSION") => {
            return Ok(PluginInfo { cni_version: "0.1.0".to_string(), supported_versions: vec!["0.1.0".to_string()] })
        }
        Err(e) => return Err(e.context(format!("VERSION of plugin {name}"))),
    };
    let value: Value = serde_json::from_slice(&stdout).map_err(|e| {
        Error::decode(format!("plugin {name}: VERSION output is not JSON ({e}): {:?}", lossy_trimmed(&stdout)))
    })?;
    let cni_version = value
        .get("cniVersion")
        .and_then(Value::as_str)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| Error::decode(format!("plugin {name}: VERSION output has no \"cniVersion\"")))?
        .to_string();
    let supported_versions = match value.get("supportedVersions") {
        Some(Value::Array(vs)) => vs
            .iter()
            .map(|v| {
                v.as_str().map(str::to_string).ok_or_else(|| {
                    Error::decode(format!("plugin {name}: VERSION \"supportedVersions\" must hold strings"))
                })
            })
            .collect::<Result<Vec<_>>>()?,
        // Only a 0.2.0 plugin may leave it out; it then speaks 0.1.0 and 0.2.0.
        None | Some(Value::Null) if cni_version == "0.2.0" => vec!["0.1.0".to_string(), "0.2.0".to_string()],
        _ => {
            return Err(Error::decode(format!(
                "plugin {name}: VERSION output (cniVersion {cni_version:?}) has no \"supportedVersions\" list"
            )))
        }
    };
    Ok(PluginInfo { cni_version, supported_versions })
}

/// The environment a delegated plugin gets: the request's own, with the verb replaced.
fn delegate_env(command: Command, req: &Request) -> CniEnv {
    CniEnv {
        command: command.as_str().to_string(),
        container_id: req.container_id.clone(),
        netns: req.netns.as_ref().map(|p| p.to_string_lossy().into_owned()).unwrap_or_default(),
        ifname: req.ifname.clone(),
        args: req.args.pairs.clone(),
        path: req.cni_path.clone(),
    }
}

fn delegate(command: Command, plugin_type: &str, req: &Request) -> Result<()> {
    let plugin = find_plugin(plugin_type, &req.cni_path)?;
    exec_without_result(&plugin, &req.stdin, &delegate_env(command, req), None)
}

/// ADD through a delegate (IPAM): same environment and stdin as this plugin got.
pub fn delegate_add(plugin_type: &str, req: &Request) -> Result<CniResult> {
    let plugin = find_plugin(plugin_type, &req.cni_path)?;
    exec_with_result(&plugin, &req.stdin, &delegate_env(Command::Add, req), None, &req.conf.cni_version)
}

pub fn delegate_del(plugin_type: &str, req: &Request) -> Result<()> {
    delegate(Command::Del, plugin_type, req)
}

pub fn delegate_check(plugin_type: &str, req: &Request) -> Result<()> {
    delegate(Command::Check, plugin_type, req)
}

pub fn delegate_status(plugin_type: &str, req: &Request) -> Result<()> {
    delegate(Command::Status, plugin_type, req)
}

pub fn delegate_gc(plugin_type: &str, req: &Request) -> Result<()> {
    delegate(Command::Gc, plugin_type, req)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn tempdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("cni-invoke-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    #[test]
    fn find_rules() {
        let d = tempdir("find");
        let sub = d.join("sub");
        std::fs::create_dir_all(sub.join("dirplugin")).unwrap();
        script(&d, "p", "exit 0");
        let path = vec![sub.clone(), d.clone()];
        assert_eq!(find_plugin("p", &path).unwrap(), d.join("p"));
        let e = find_plugin("dirplugin", &path).unwrap_err();
        assert_eq!(e.msg, format!("failed to find plugin \"dirplugin\" in path [{} {}]", sub.display(), d.display()));
        for bad in ["../p", "a/b", "..", ""] {
            assert_eq!(find_plugin(bad, &path).unwrap_err().code, code::INVALID_CONFIG, "{bad}");
        }
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn outputs_interpreted() {
        let d = tempdir("outputs");
        let env = CniEnv::new(Command::Add);
        let p = script(&d, "err11", r#"echo '{"code":11,"msg":"try later","details":"d"}'; exit 1"#);
        let e = exec_without_result(&p, b"{}", &env, None).unwrap_err();
        assert_eq!((e.code, e.msg.as_str(), e.details.as_str()), (11, "try later", "d"));
        let p = script(&d, "garbage", "echo 'oops not json'; exit 1");
        let e = exec_without_result(&p, b"{}", &env, None).unwrap_err();
        assert_eq!(e.code, code::PLUGIN_EXEC);
        assert!(e.msg.contains("netplugin garbage failed but its error output is not JSON: \"oops not json\""), "{e}");
        let p = script(&d, "silent", "echo 'the disk is on fire' >&2; exit 3");
        let e = exec_without_result(&p, b"{}", &env, None).unwrap_err();
        assert!(e.msg.contains("the disk is on fire") && e.msg.contains("exit status 3"), "{e}");
        let p = script(&d, "badresult", "echo '{\"ips\":\"nope\"}'");
        let e = exec_with_result(&p, b"{}", &env, None, "1.0.0").unwrap_err();
        assert_eq!(e.code, code::DECODE);
        assert!(e.msg.contains("badresult"), "{e}");
        let p = script(
            &d,
            "env",
            r#"cat >/dev/null; printf '{"cniVersion":"1.0.0","interfaces":[{"name":"%s"}]}' "$CNI_COMMAND-$CNI_NETNS-$CNI_ARGS""#,
        );
        let env =
            CniEnv { args: vec![("A".into(), "1".into()), ("B".into(), "2".into())], ..CniEnv::new(Command::Add) };
        let r = exec_with_result(&p, b"{}", &env, None, "1.0.0").unwrap();
        assert_eq!(r.interfaces[0].name, "ADD--A=1;B=2");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn timeout_kills() {
        let d = tempdir("timeout");
        let p = script(&d, "sleepy", "exec sleep 5");
        let start = Instant::now();
        let e =
            exec_without_result(&p, b"{}", &CniEnv::new(Command::Add), Some(Duration::from_millis(200))).unwrap_err();
        assert!(start.elapsed() < Duration::from_secs(3));
        assert_eq!(e.code, code::PLUGIN_EXEC);
        assert!(e.msg.contains("sleepy timed out after 0.2s"), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn text_file_busy_is_retried() {
        let d = tempdir("txtbsy");
        let p = d.join("busy");
        std::fs::copy("/bin/true", &p).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        // Still open for writing, as while a binary is being installed: exec fails with ETXTBSY.
        let writer = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
        let release = thread::spawn(move || {
            thread::sleep(Duration::from_millis(250));
            drop(writer);
        });
        let out = exec_raw(&p, b"", &CniEnv::new(Command::Del), Some(Duration::from_secs(10))).unwrap();
        assert_eq!(out.exit_code, Some(0));
        release.join().unwrap();
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn version_probe() {
        let d = tempdir("version");
        let p = script(&d, "old", r#"echo '{"code":4,"msg":"unknown CNI_COMMAND: VERSION"}'; exit 1"#);
        assert_eq!(get_version_info(&p, None).unwrap().supported_versions, vec!["0.1.0"]);
        let p = script(
            &d,
            "new",
            r#"[ "$CNI_NETNS" = dummy ] && [ "$CNI_PATH" = dummy ] && grep -q '"cniVersion":"1.1.0"' && echo '{"cniVersion":"1.1.0","supportedVersions":["0.4.0","1.0.0"]}'"#,
        );
        let info = get_version_info(&p, None).unwrap();
        assert!(info.supports("1.0.0") && !info.supports("1.1.0"));
        let p = script(&d, "v02", r#"echo '{"cniVersion":"0.2.0"}'"#);
        assert!(get_version_info(&p, None).unwrap().supports(""));
        std::fs::remove_dir_all(&d).unwrap();
    }
}

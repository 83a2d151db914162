//! Running plugins: find the binary on CNI_PATH, exec it with the CNI environment and the config on
//! stdin, and turn what it says into a result or an error. Used by the runtime API and by plugins that
//! delegate to IPAM.

use crate::error::{code, Error, Result};
use crate::registry;
use crate::skel::{Command, PluginOutput, Request};
use crate::types::CniResult;
use crate::version;
use serde_json::Value;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
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

/// Whether `plugin_type` can only name a file in CNI_PATH: no path separator, not `.` or `..`.
pub fn valid_plugin_type(plugin_type: &str) -> bool {
    !(plugin_type.contains('/') || plugin_type.contains('\\') || plugin_type == "." || plugin_type == "..")
}

/// The first regular file `dir/<plugin_type>` in path order. A type that could name another
/// directory (a path separator, `..`) is refused with code 7; not found is code 7 too (it is the
/// configuration that names a plugin we do not have).
pub fn find_plugin(plugin_type: &str, path: &[PathBuf]) -> Result<PathBuf> {
    if plugin_type.is_empty() {
        return Err(Error::config("plugin type is empty: every plugin in a configuration needs a \"type\""));
    }
    if !valid_plugin_type(plugin_type) {
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

fn spawn(plugin: &Path, env: &CniEnv, extra_env: &[(&str, String)]) -> Result<Child> {
    let mut tries = 0;
    loop {
        let mut cmd = std::process::Command::new(plugin);
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        for (k, v) in env.vars() {
            cmd.env(k, v);
        }
        for (k, v) in extra_env {
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

/// Our end of one of the child's pipes, read (or written) without blocking under `poll`.
struct PipeEnd {
    fd: Option<std::os::fd::OwnedFd>,
}

impl PipeEnd {
    fn new(fd: impl Into<std::os::fd::OwnedFd>) -> PipeEnd {
        let fd = fd.into();
        // SAFETY: fcntl on a descriptor we own; failure leaves it blocking, which poll tolerates
        // because we only read or write after poll says it is ready.
        unsafe {
            let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
            if flags >= 0 {
                libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK);
            }
        }
        PipeEnd { fd: Some(fd) }
    }

    fn raw(&self) -> i32 {
        self.fd.as_ref().map_or(-1, |f| f.as_raw_fd())
    }
}

/// `pidfd_open(2)`: a descriptor that polls readable when the child exits (Linux 5.3+). None on an
/// older kernel, where the exit is awaited with short sleeps instead.
fn pidfd_open(pid: u32) -> Option<std::os::fd::OwnedFd> {
    // SAFETY: a plain syscall; on success it returns a new descriptor that we take ownership of.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: the kernel just gave us this descriptor and nothing else owns it.
    Some(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) })
}

/// Wait until one of `fds` is ready or the deadline passes; false on timeout.
fn poll_until(fds: &mut [libc::pollfd], deadline: Option<Instant>) -> bool {
    loop {
        let ms = match deadline {
            None => -1,
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return false;
                }
                // Round up so that we never wake just before the deadline and spin.
                left.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32
            }
        };
        // SAFETY: `fds` is a valid, exclusively borrowed array of pollfd for the whole call.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if n > 0 {
            return true;
        }
        if n < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            // poll itself failing (EINVAL, ENOMEM) is not something waiting longer would fix.
            return true;
        }
        if n == 0 && deadline.is_some_and(|d| Instant::now() >= d) {
            return false;
        }
    }
}

/// Run `plugin` with `stdin` and the CNI environment; return whatever it printed and its exit code.
/// Only a failure to run it at all, an oversized stdout or the timeout is an error here (code 102).
///
/// One thread does it all: the config is written, stdout and stderr are read under `poll`, and the
/// exit is awaited on a pidfd, so nothing sleeps between the plugin exiting and us seeing it.
pub fn exec_raw(plugin: &Path, stdin: &[u8], env: &CniEnv, timeout: Option<Duration>) -> Result<RawOutput> {
    exec_raw_with(plugin, stdin, env, timeout, &[])
}

/// [`exec_raw`] with more variables set for the plugin (over the inherited environment).
fn exec_raw_with(
    plugin: &Path,
    stdin: &[u8],
    env: &CniEnv,
    timeout: Option<Duration>,
    extra_env: &[(&str, String)],
) -> Result<RawOutput> {
    let name = plugin_name(plugin);
    let started = Instant::now();
    let deadline = timeout.map(|t| started + t);
    let mut child = spawn(plugin, env, extra_env)?;
    let (Some(child_stdin), Some(child_stdout), Some(child_stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        let _ = child.kill();
        let _ = child.wait();
        return Err(exec_error(format!("plugin {name}: could not open its stdio pipes")));
    };
    let pidfd = pidfd_open(child.id());
    let mut input = PipeEnd::new(child_stdin);
    let mut pipes = [PipeEnd::new(child_stdout), PipeEnd::new(child_stderr)];
    if stdin.is_empty() {
        input.fd = None;
    }
    let caps = [MAX_STDOUT, MAX_STDERR];
    let mut kept: [Vec<u8>; 2] = [Vec::new(), Vec::new()];
    let mut truncated = [false, false];
    let mut written = 0;
    let mut buf = vec![0u8; 64 << 10];
    let mut timed_out = false;

    // Both pipes closing is the usual sign of exit; a plugin that never reads stdin (VERSION) closes
    // that pipe, and a write error there is not ours to report.
    while pipes.iter().any(|p| p.fd.is_some()) {
        let mut fds = [
            libc::pollfd { fd: input.raw(), events: libc::POLLOUT, revents: 0 },
            libc::pollfd { fd: pipes[0].raw(), events: libc::POLLIN, revents: 0 },
            libc::pollfd { fd: pipes[1].raw(), events: libc::POLLIN, revents: 0 },
        ];
        if !poll_until(&mut fds, deadline) {
            timed_out = true;
            break;
        }
        if fds[0].revents != 0 {
            if let Some(fd) = &input.fd {
                match (&*fd_file(fd)).write(&stdin[written..]) {
                    Ok(n) => written += n,
                    Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted) => {}
                    Err(_) => written = stdin.len(),
                }
            }
            if written >= stdin.len() {
                input.fd = None;
            }
        }
        for (i, pipe) in pipes.iter_mut().enumerate() {
            if fds[i + 1].revents == 0 {
                continue;
            }
            let Some(fd) = &pipe.fd else { continue };
            match (&*fd_file(fd)).read(&mut buf) {
                Ok(0) => pipe.fd = None,
                Ok(n) => {
                    let room = caps[i].saturating_sub(kept[i].len());
                    truncated[i] |= n > room;
                    kept[i].extend_from_slice(&buf[..n.min(room)]);
                }
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted) => {}
                Err(_) => pipe.fd = None,
            }
        }
    }
    drop(input);

    let status = if timed_out { None } else { wait_exit(&mut child, pidfd.as_ref(), deadline) };
    let Some(status) = status else {
        let _ = child.kill();
        let _ = child.wait();
        let secs = timeout.map(|t| t.as_secs_f64()).unwrap_or_default();
        return Err(exec_error(format!("plugin {name} timed out after {secs}s and was killed")));
    };
    let status = status.map_err(|e| exec_error(format!("plugin {name}: wait failed: {e}")))?;
    if truncated[0] {
        return Err(exec_error(format!("plugin {name} wrote more than {MAX_STDOUT} bytes to stdout")));
    }
    let [stdout, stderr] = kept;
    Ok(RawOutput { stdout, stderr, exit_code: status.code() })
}

/// A borrowed `File` view of a pipe end, for its `Read`/`Write` impls (never closes the fd).
fn fd_file(fd: &std::os::fd::OwnedFd) -> std::mem::ManuallyDrop<std::fs::File> {
    // SAFETY: the File is never dropped (ManuallyDrop), so the descriptor stays owned by `fd`.
    std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(fd.as_raw_fd()) })
}

/// Reap the child once its pipes are closed. None when the deadline passed first.
fn wait_exit(
    child: &mut Child,
    pidfd: Option<&std::os::fd::OwnedFd>,
    deadline: Option<Instant>,
) -> Option<std::io::Result<std::process::ExitStatus>> {
    if let Some(pidfd) = pidfd {
        let mut fds = [libc::pollfd { fd: pidfd.as_raw_fd(), events: libc::POLLIN, revents: 0 }];
        if !poll_until(&mut fds, deadline) {
            return None;
        }
        return Some(child.wait());
    }
    // No pidfd (kernel before 5.3): short sleeps, growing, so a quick exit costs microseconds.
    let mut pause = Duration::from_micros(50);
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(Ok(status)),
            Ok(None) => {}
            Err(e) => return Some(Err(e)),
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return None;
        }
        thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(2));
    }
}

fn lossy_trimmed(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).trim().to_string()
}

/// Interpret a run: Ok(stdout) on exit 0, else the plugin's own error (code kept) or a code-102
/// error that says what went wrong.
fn interpret(plugin: &Path, out: RawOutput) -> Result<Vec<u8>> {
    let name = plugin_name(plugin);
    // The plugin's logs reach our stderr, whether it succeeded or not: a failing delegate's
    // diagnostics are what a runtime's log needs most (upstream copies them only on success).
    if !out.stderr.is_empty() {
        let _ = std::io::stderr().write_all(&out.stderr);
    }
    if out.exit_code == Some(0) {
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
            let code = crate::gojson::get(&obj, "code")
                .map(|(_, v)| v)
                .and_then(Value::as_u64)
                .and_then(|c| u32::try_from(c).ok());
            let msg =
                crate::gojson::get(&obj, "msg").map(|(_, v)| v).and_then(Value::as_str).unwrap_or_default().to_string();
            let details = crate::gojson::get(&obj, "details")
                .map(|(_, v)| v)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            match code {
                Some(c) if c != 0 => Err(Error::new(c, msg).with_details(details)),
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
    result_of(plugin, exec_raw(plugin, stdin, env, timeout)?, fallback_version)
}

/// Interpret what an ADD printed: its result, or its error.
fn result_of(plugin: &Path, out: RawOutput, fallback_version: &str) -> Result<CniResult> {
    let stdout = interpret(plugin, out)?;
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
    let field = |name| value.as_object().and_then(|obj| crate::gojson::get(obj, name)).map(|(_, v)| v);
    let cni_version = field("cniVersion")
        .and_then(Value::as_str)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| Error::decode(format!("plugin {name}: VERSION output has no \"cniVersion\"")))?
        .to_string();
    let supported_versions = match field("supportedVersions") {
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

/// A plugin this very binary can run without a new process: given the plugin type, the CNI
/// environment and stdin, what it would have printed and its exit code. None: not one of ours.
pub type InProcessRunner = fn(&str, &HashMap<String, String>, &[u8]) -> Option<PluginOutput>;

static IN_PROCESS: OnceLock<InProcessRunner> = OnceLock::new();

/// Called by a multi-call binary (cni-rs) at start: a delegate found on CNI_PATH that is this same
/// executable (same device and inode as /proc/self/exe, i.e. a hard link of it) is then run in
/// process through `runner`, with exactly the environment and stdin the process would get, and its
/// output interpreted the same way. This saves a process per IPAM call (~1 ms of the ~6 ms an ADD
/// takes); a delegate that is any other file (another vendor's host-local) is still executed.
pub fn set_in_process_runner(runner: InProcessRunner) {
    let _ = IN_PROCESS.set(runner);
}

/// Whether `plugin` is the running executable itself.
fn is_this_executable(plugin: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    static SELF_ID: OnceLock<Option<(u64, u64)>> = OnceLock::new();
    let me = *SELF_ID.get_or_init(|| std::fs::metadata("/proc/self/exe").ok().map(|m| (m.dev(), m.ino())));
    match (me, std::fs::metadata(plugin)) {
        (Some(me), Ok(m)) => me == (m.dev(), m.ino()),
        _ => false,
    }
}

/// The variable that tells an executed delegate how deep in a chain of delegations it runs.
pub const DELEGATION_DEPTH_ENV: &str = "CNI_RS_DELEGATION_DEPTH";

/// Delegations nest at most this deep (a plugin's IPAM is depth 1; a meta plugin's main plugin's
/// IPAM would be 2). Deeper is a cycle, such as an IPAM type that is a copy of the plugin itself,
/// which would otherwise start processes (or recurse in process) without end.
pub const MAX_DELEGATION_DEPTH: usize = 4;

/// In-process delegations under way in this process (the multi-call binary runs a delegate that is
/// itself in process, so no variable reaches it). A process serves one request, so this counts the
/// nesting of that request's delegations.
static IN_PROCESS_DEPTH: AtomicUsize = AtomicUsize::new(0);

/// How deep in a chain of delegations this code runs: what our parent told us plus the in-process
/// delegations we are inside of.
fn delegation_depth() -> usize {
    let inherited =
        std::env::var(DELEGATION_DEPTH_ENV).ok().and_then(|v| v.trim().parse::<usize>().ok()).unwrap_or_default();
    inherited.saturating_add(IN_PROCESS_DEPTH.load(Ordering::SeqCst))
}

/// Undoes one in-process nesting level when the delegate returns (or unwinds).
struct InProcessLevel;

impl InProcessLevel {
    fn enter() -> InProcessLevel {
        IN_PROCESS_DEPTH.fetch_add(1, Ordering::SeqCst);
        InProcessLevel
    }
}

impl Drop for InProcessLevel {
    fn drop(&mut self) {
        IN_PROCESS_DEPTH.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Whether `plugin_type` is one of ours that is not an IPAM plugin (an interface or chained plugin,
/// whose reference counterparts have the same names), or the multi-call binary itself: delegating
/// IPAM to one of them runs a plugin that delegates again, without end.
fn known_not_ipam(plugin_type: &str) -> bool {
    plugin_type == registry::MULTI_CALL || registry::role(plugin_type).is_some_and(|role| role != registry::Role::Ipam)
}

/// Why `plugin_type` may not be delegated to now: a main/meta plugin named as IPAM, or delegation
/// nested too deep. Code 7: it is the configuration that makes this happen.
fn refused_delegate(plugin_type: &str) -> Option<Error> {
    if known_not_ipam(plugin_type) {
        return Some(Error::config(format!(
            "ipam type {plugin_type:?} is not an IPAM plugin (it is a main or meta plugin, and delegating to it \
             would delegate again without end): set \"ipam\": {{\"type\": ...}} to an IPAM plugin such as \
             host-local (ours), or static or dhcp"
        )));
    }
    let depth = delegation_depth();
    if depth >= MAX_DELEGATION_DEPTH {
        return Some(Error::config(format!(
            "delegating to {plugin_type:?} would nest delegations {} deep (at most {MAX_DELEGATION_DEPTH}): the \
             ipam types of these plugins delegate to each other in a cycle; check that \"ipam\": {{\"type\": \
             {plugin_type:?}}} names an IPAM plugin",
            depth + 1
        )));
    }
    None
}

/// Run a delegate: in process when it is this executable and a runner is registered, else as a
/// process told its depth.
fn run_delegate(plugin_type: &str, plugin: &Path, req: &Request, env: &CniEnv) -> Result<RawOutput> {
    if let Some(runner) = IN_PROCESS.get() {
        if is_this_executable(plugin) {
            let vars: HashMap<String, String> = env.vars().into_iter().map(|(k, v)| (k.to_string(), v)).collect();
            let _level = InProcessLevel::enter();
            if let Some(out) = runner(plugin_type, &vars, &req.stdin) {
                return Ok(RawOutput {
                    stdout: out.stdout.into_bytes(),
                    stderr: Vec::new(),
                    exit_code: Some(out.exit_code),
                });
            }
        }
    }
    let depth = (DELEGATION_DEPTH_ENV, (delegation_depth() + 1).to_string());
    exec_raw_with(plugin, &req.stdin, env, None, &[depth])
}

fn delegate(command: Command, plugin_type: &str, req: &Request) -> Result<()> {
    if let Some(refused) = refused_delegate(plugin_type) {
        return Err(refused);
    }
    let plugin = find_plugin(plugin_type, &req.cni_path)?;
    let out = run_delegate(plugin_type, &plugin, req, &delegate_env(command, req))?;
    interpret(&plugin, out).map(|_| ())
}

/// ADD through a delegate (IPAM): same environment and stdin as this plugin got. A type that is a
/// main or meta plugin, or delegation nested deeper than [`MAX_DELEGATION_DEPTH`], is refused (code 7),
/// on every verb but DEL.
pub fn delegate_add(plugin_type: &str, req: &Request) -> Result<CniResult> {
    if let Some(refused) = refused_delegate(plugin_type) {
        return Err(refused);
    }
    let plugin = find_plugin(plugin_type, &req.cni_path)?;
    let out = run_delegate(plugin_type, &plugin, req, &delegate_env(Command::Add, req))?;
    result_of(&plugin, out, &req.conf.cni_version)
}

/// What [`delegate_add`] would refuse before running `plugin_type`: a type that is not an IPAM
/// plugin, delegation nested too deep, or no such plugin in CNI_PATH (code 7 each). A plugin asks
/// this before its first change, so a configuration naming a missing IPAM plugin changes nothing.
pub fn delegate_ready(plugin_type: &str, req: &Request) -> Result<()> {
    if let Some(refused) = refused_delegate(plugin_type) {
        return Err(refused);
    }
    find_plugin(plugin_type, &req.cni_path).map(drop)
}

/// DEL through a delegate. A delegate that ADD refuses (see [`delegate_add`]) never held anything:
/// DEL has nothing to release there and succeeds, so a misconfigured attachment can still be removed.
pub fn delegate_del(plugin_type: &str, req: &Request) -> Result<()> {
    if let Some(refused) = refused_delegate(plugin_type) {
        let _ = writeln!(std::io::stderr(), "DEL: nothing to release through the IPAM plugin: {refused}");
        return Ok(());
    }
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

    /// How often the runner ran type "recurse".
    static RECURSIONS: AtomicUsize = AtomicUsize::new(0);

    /// A runner standing in for a multi-call binary's plugins: answers for type "inproc", and for
    /// type "recurse" delegates to "recurse" again (a plugin whose IPAM type is itself).
    fn test_runner(plugin_type: &str, env: &HashMap<String, String>, stdin: &[u8]) -> Option<PluginOutput> {
        if plugin_type == "recurse" {
            RECURSIONS.fetch_add(1, Ordering::SeqCst);
            let path = env.get("CNI_PATH").map(|p| vec![PathBuf::from(p)]).unwrap_or_default();
            let req = request(Command::Add, std::str::from_utf8(stdin).unwrap(), path);
            return Some(match delegate_add("recurse", &req) {
                Ok(r) => PluginOutput { stdout: r.to_pretty("1.0.0").unwrap(), exit_code: 0 },
                Err(e) => PluginOutput { stdout: e.to_json("1.0.0").to_string(), exit_code: 1 },
            });
        }
        if plugin_type != "inproc" {
            return None;
        }
        let command = env.get("CNI_COMMAND").cloned().unwrap_or_default();
        let ifname = env.get("CNI_IFNAME").cloned().unwrap_or_default();
        let got = String::from_utf8_lossy(stdin).contains("\"type\":\"inproc\"");
        let stdout = format!(
            r#"{{"cniVersion":"1.0.0","ips":[{{"address":"10.9.9.9/24"}}],"dns":{{"domain":"{command}-{ifname}-{got}"}}}}"#
        );
        Some(PluginOutput { stdout, exit_code: 0 })
    }

    fn request(command: Command, stdin: &str, path: Vec<PathBuf>) -> Request {
        let (conf, raw) = crate::conf::parse_netconf(stdin.as_bytes()).unwrap();
        Request {
            command,
            container_id: "c1".into(),
            netns: None,
            ifname: "eth7".into(),
            args: Default::default(),
            netns_override: false,
            cni_path: path,
            conf,
            raw,
            stdin: stdin.as_bytes().to_vec(),
        }
    }

    /// A delegate that is a hard link of the running executable is run through the registered
    /// runner, with the delegate's environment and stdin; any other file of that name is executed.
    #[test]
    fn delegate_to_this_executable_runs_in_process() {
        set_in_process_runner(test_runner);
        // A hard link needs the same file system as the test binary: make the directory next to it.
        let exe = std::env::current_exe().unwrap();
        let d = exe.parent().unwrap().join(format!("inproc-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("same")).unwrap();
        std::fs::create_dir_all(d.join("other")).unwrap();
        std::fs::hard_link(&exe, d.join("same/inproc")).unwrap();
        let stdin = r#"{"cniVersion":"1.0.0","name":"n","type":"inproc"}"#;
        let r = delegate_add("inproc", &request(Command::Add, stdin, vec![d.join("same")])).unwrap();
        assert_eq!(r.ips[0].address.to_string(), "10.9.9.9/24");
        assert_eq!(r.dns.domain.as_deref(), Some("ADD-eth7-true"), "runner saw the wrong env or stdin");
        delegate_del("inproc", &request(Command::Del, stdin, vec![d.join("same")])).unwrap();

        // The same name as another file: executed, not run in process.
        script(&d.join("other"), "inproc", r#"echo '{"code":7,"msg":"the file was executed"}'; exit 1"#);
        let e = delegate_add("inproc", &request(Command::Add, stdin, vec![d.join("other")])).unwrap_err();
        assert!(e.msg.contains("the file was executed"), "{e}");

        // A delegate that delegates to itself in process stops at the depth bound (in this test, not
        // in one of its own: the depth counter is per process).
        std::fs::hard_link(&exe, d.join("same/recurse")).unwrap();
        let stdin = r#"{"cniVersion":"1.0.0","name":"n","type":"recurse"}"#;
        let e = delegate_add("recurse", &request(Command::Add, stdin, vec![d.join("same")])).unwrap_err();
        assert_eq!(e.code, code::INVALID_CONFIG, "{e}");
        assert!(e.msg.contains("would nest delegations 5 deep (at most 4)"), "{e}");
        assert_eq!(RECURSIONS.load(Ordering::SeqCst), MAX_DELEGATION_DEPTH);
        assert_eq!(IN_PROCESS_DEPTH.load(Ordering::SeqCst), 0, "every level was left");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn main_plugins_are_refused_as_ipam() {
        let req = request(Command::Add, r#"{"cniVersion":"1.0.0","name":"n","type":"bridge"}"#, vec![]);
        let not_ipam = registry::PLUGINS.iter().filter(|p| p.role != registry::Role::Ipam).map(|p| p.name);
        let refused: Vec<&str> = not_ipam.chain([registry::MULTI_CALL]).collect();
        for t in ["bridge", "portmap", "loopback", "cni-rs", "macvlan", "tuning"] {
            assert!(refused.contains(&t), "{t}");
        }
        for t in ["host-local", "static", "dhcp", "some-ipam"] {
            assert!(!known_not_ipam(t), "{t}");
        }
        for t in refused {
            let e = delegate_add(t, &req).unwrap_err();
            assert_eq!(e.code, code::INVALID_CONFIG, "{t}: {e}");
            assert!(e.msg.contains(&format!("ipam type {t:?} is not an IPAM plugin")), "{e}");
            assert!(e.msg.contains("host-local"), "{e}");
            assert_eq!(delegate_check(t, &req).unwrap_err().code, code::INVALID_CONFIG);
            // Nothing can be held there: DEL succeeds without running anything.
            delegate_del(t, &req).unwrap();
        }
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

//! Running the netfilter tools (`nft`, `iptables-save`, `iptables-restore`).

use libcni::{code, Error, Result};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Where the tools live when the runtime hands us a thin PATH.
const FALLBACK_DIRS: &[&str] = &["/usr/sbin", "/sbin", "/usr/bin", "/bin", "/usr/local/sbin"];

/// The tool's full path: from PATH, else the usual system directories.
pub(crate) fn find(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(FALLBACK_DIRS.iter().map(PathBuf::from))
        .map(|dir| dir.join(tool))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0).unwrap_or(false)
}

/// What a finished tool said.
pub(crate) struct Output {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `tool args...`, feeding `stdin`; a missing tool is code 50, a spawn failure code 100.
pub(crate) fn run(tool: &str, args: &[&str], stdin: Option<&str>) -> Result<Output> {
    let path = find(tool).ok_or_else(|| {
        Error::new(code::NOT_AVAILABLE, format!("{tool} not found in PATH or the system directories"))
    })?;
    let mut child = Command::new(&path)
        .args(args)
        .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Error::network(format!("run {}: {e}", path.display())))?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        // A tool that exits early closes its stdin; its exit status and stderr then tell why.
        let _ = pipe.write_all(text.as_bytes());
    }
    let out = child.wait_with_output().map_err(|e| Error::network(format!("wait for {tool}: {e}")))?;
    Ok(Output {
        success: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
    })
}

/// Runs the tool and fails (code 100, naming `what` and quoting stderr) unless it succeeds.
pub(crate) fn run_ok(tool: &str, args: &[&str], stdin: Option<&str>, what: &str) -> Result<String> {
    let out = run(tool, args, stdin)?;
    if out.success {
        Ok(out.stdout)
    } else {
        Err(Error::network(format!("{what}: {tool} failed: {}", one_line(&out.stderr))))
    }
}

/// Tool output folded onto one line for an error message.
pub(crate) fn one_line(s: &str) -> String {
    let folded: Vec<&str> = s.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    if folded.is_empty() {
        "(no message)".to_string()
    } else {
        folded.join(" | ")
    }
}

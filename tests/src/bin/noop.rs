//! cni-noop: a test plugin that does nothing but what its debug file tells it, modelled on
//! upstream's plugins/test/noop. It exists so runtime tests can assert on what a plugin receives
//! and script what it answers.
//!
//! The debug file is found at, in order: `DEBUG=<path>` in CNI_ARGS, the netconf's `debugFile`,
//! `<own executable>.debug` (for VERSION, which gets neither). Without one the plugin echoes
//! `prevResult` (or `{"cniVersion": <config version>}`) on ADD and succeeds on everything else.
//!
//! Debug file (JSON object, every key optional):
//! - `reportResult`: the ADD result to print (a JSON value printed as-is, or "PASSTHROUGH")
//! - `reportError` / `reportErrorCode` (default 999) / `reportErrorDetails`: print a CNI error, exit 1
//! - `reportStdout`: raw text printed on stdout instead of anything else
//! - `reportStderr`: text written to stderr
//! - `reportVersionSupport`: the versions VERSION reports (default all seven)
//! - `exitWithCode`: the exit code (defaults: 0, or 1 when reporting an error)
//! - `sleepMs`: sleep before answering
//! - `commandLog`: a file to which one JSON line per invocation is appended:
//!   `{"command","env":{CNI_*},"stdin":<parsed stdin or string>}`
//! - `commands`: `{"ADD": {...}, "DEL": {...}}`, per-verb keys laid over the top-level ones.

use serde_json::{json, Map, Value};
use std::io::{Read, Write};
use std::path::PathBuf;

const ALL_VERSIONS: [&str; 7] = ["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

fn env(k: &str) -> String {
    std::env::var(k).unwrap_or_default()
}

fn debug_path(stdin: &Value) -> Option<PathBuf> {
    for pair in env("CNI_ARGS").split(';') {
        if let Some(p) = pair.strip_prefix("DEBUG=") {
            return Some(PathBuf::from(p));
        }
    }
    if let Some(p) = stdin.get("debugFile").and_then(Value::as_str) {
        return Some(PathBuf::from(p));
    }
    let exe = std::env::current_exe().ok()?;
    let mut name = exe.file_name()?.to_os_string();
    name.push(".debug");
    let beside = exe.with_file_name(name);
    beside.is_file().then_some(beside)
}

/// The top-level keys with the command's own section laid over them.
fn load_debug(path: Option<PathBuf>, command: &str) -> Result<Map<String, Value>, String> {
    let Some(path) = path else { return Ok(Map::new()) };
    let text = std::fs::read_to_string(&path).map_err(|e| format!("read debug file {}: {e}", path.display()))?;
    let Value::Object(mut top) =
        serde_json::from_str(&text).map_err(|e| format!("debug file {} is not JSON: {e}", path.display()))?
    else {
        return Err(format!("debug file {} is not a JSON object", path.display()));
    };
    if let Some(Value::Object(per)) = top.remove("commands") {
        if let Some(Value::Object(section)) = per.get(command) {
            for (k, v) in section {
                top.insert(k.clone(), v.clone());
            }
        }
    }
    Ok(top)
}

fn log_invocation(debug: &Map<String, Value>, command: &str, stdin_raw: &str, stdin: &Value) -> Result<(), String> {
    let Some(log) = debug.get("commandLog").and_then(Value::as_str) else { return Ok(()) };
    let vars: Map<String, Value> =
        std::env::vars().filter(|(k, _)| k.starts_with("CNI_")).map(|(k, v)| (k, Value::String(v))).collect();
    let stdin_logged = if stdin.is_null() { Value::String(stdin_raw.to_string()) } else { stdin.clone() };
    let line = json!({"command": command, "env": vars, "stdin": stdin_logged}).to_string();
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| format!("open command log {log}: {e}"))?;
    // One write per line, so concurrent plugins interleave whole lines.
    f.write_all(format!("{line}\n").as_bytes()).map_err(|e| format!("write command log {log}: {e}"))
}

fn run() -> Result<(String, i32), String> {
    let command = env("CNI_COMMAND");
    let mut stdin_raw = String::new();
    std::io::stdin().read_to_string(&mut stdin_raw).map_err(|e| format!("read stdin: {e}"))?;
    let stdin: Value = serde_json::from_str(&stdin_raw).unwrap_or(Value::Null);
    let debug = load_debug(debug_path(&stdin), &command)?;
    log_invocation(&debug, &command, &stdin_raw, &stdin)?;

    if let Some(ms) = debug.get("sleepMs").and_then(Value::as_u64) {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
    if let Some(text) = debug.get("reportStderr").and_then(Value::as_str) {
        eprint!("{text}");
    }
    let exit_override = debug.get("exitWithCode").and_then(Value::as_i64).and_then(|c| i32::try_from(c).ok());
    if let Some(raw) = debug.get("reportStdout").and_then(Value::as_str) {
        return Ok((raw.to_string(), exit_override.unwrap_or(0)));
    }
    if let Some(msg) = debug.get("reportError").and_then(Value::as_str) {
        let mut err = json!({"code": debug.get("reportErrorCode").cloned().unwrap_or(json!(999)), "msg": msg});
        if let Some(details) = debug.get("reportErrorDetails") {
            err["details"] = details.clone();
        }
        return Ok((err.to_string(), exit_override.unwrap_or(1)));
    }
    let version = stdin.get("cniVersion").and_then(Value::as_str).unwrap_or("").to_string();
    let out = match command.as_str() {
        "VERSION" => {
            let supported = debug.get("reportVersionSupport").cloned().unwrap_or_else(|| json!(ALL_VERSIONS));
            json!({"cniVersion": version, "supportedVersions": supported}).to_string()
        }
        "ADD" => match debug.get("reportResult") {
            Some(Value::String(s)) if s == "PASSTHROUGH" => {
                stdin.get("prevResult").cloned().unwrap_or(Value::Null).to_string()
            }
            Some(v) => v.to_string(),
            None => match stdin.get("prevResult") {
                Some(prev) => prev.to_string(),
                None => json!({"cniVersion": version}).to_string(),
            },
        },
        "DEL" | "CHECK" | "GC" | "STATUS" => String::new(),
        other => {
            let err = json!({"code": 4, "msg": format!("unknown CNI_COMMAND: {other}")});
            return Ok((err.to_string(), exit_override.unwrap_or(1)));
        }
    };
    Ok((out, exit_override.unwrap_or(0)))
}

fn main() {
    let (stdout, code) = match run() {
        Ok(r) => r,
        Err(msg) => (json!({"code": 999, "msg": format!("cni-noop: {msg}")}).to_string(), 1),
    };
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(stdout.as_bytes());
    let _ = out.flush();
    std::process::exit(code)
}

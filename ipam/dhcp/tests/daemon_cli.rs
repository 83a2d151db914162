//! `dhcp daemon` as a service manager runs it: the reference's Go-style flags (single and double
//! dash, `-name=value`, Go durations), the pidfile, a stale socket removed on start, a live one or a
//! file that is not a socket left alone, SIGTERM removing socket and pidfile; and the multi-call
//! binary started as `dhcp daemon`. No root needed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use cni_tests::{bin_dir, wait_for, TempDir};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

fn spawn(bin: &Path, args: &[&str]) -> Child {
    Command::new(bin).args(args).stdin(Stdio::null()).stderr(Stdio::piped()).spawn().expect("spawn dhcp daemon")
}

fn stderr_of(child: Child) -> (Option<i32>, String) {
    let out = child.wait_with_output().unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn terminate(child: &mut Child) {
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
}

#[test]
fn reference_flags_pidfile_and_sigterm_cleanup() {
    let dir = TempDir::new("dhcp-cli");
    let sock = dir.path().join("run/cni/dhcp.sock");
    let pid = dir.path().join("dhcp.pid");
    let mut child = spawn(
        &bin_dir().join("dhcp"),
        &[
            "daemon",
            "-socketpath",
            "/run/cni/dhcp.sock",
            "-hostprefix",
            dir.path().to_str().unwrap(),
            &format!("-pidfile={}", pid.display()),
            "-broadcast",
            "-timeout",
            "10s",
            "--resendmax",
            "1m2s",
        ],
    );
    assert!(wait_for(Duration::from_secs(5), || UnixStream::connect(&sock).is_ok()), "no socket at {}", sock.display());
    assert_eq!(std::fs::read_to_string(&pid).unwrap(), child.id().to_string());
    terminate(&mut child);
    let (code, err) = stderr_of(child);
    assert_eq!(code, Some(0), "{err}");
    assert!(!sock.exists() && !pid.exists(), "SIGTERM must remove the socket and the pidfile");
}

#[test]
fn stale_socket_is_replaced_live_socket_and_other_files_are_not() {
    let dir = TempDir::new("dhcp-cli");
    let sock = dir.path().join("dhcp.sock");
    let sock_arg = sock.to_str().unwrap();
    // A socket nothing listens on, as a killed daemon leaves it.
    drop(UnixListener::bind(&sock).unwrap());
    let mut child = spawn(&bin_dir().join("dhcp"), &["daemon", "--socketpath", sock_arg]);
    assert!(wait_for(Duration::from_secs(5), || UnixStream::connect(&sock).is_ok()), "stale socket not replaced");

    let second = spawn(&bin_dir().join("dhcp"), &["daemon", "-socketpath", sock_arg]);
    let (code, err) = stderr_of(second);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("already listens"), "{err}");
    assert!(UnixStream::connect(&sock).is_ok(), "the first daemon's socket must survive");
    terminate(&mut child);
    let _ = child.wait();

    let file = dir.path().join("not-a-socket");
    std::fs::write(&file, "keep").unwrap();
    let (code, err) = stderr_of(spawn(&bin_dir().join("dhcp"), &["daemon", "-socketpath", file.to_str().unwrap()]));
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("is not a socket"), "{err}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep");
}

#[test]
fn bad_flags_exit_2_with_usage_and_help_exits_0() {
    for (args, want) in [
        (&["daemon", "-nope"][..], "flag provided but not defined: -nope"),
        (&["daemon", "-timeout", "10"][..], "-timeout"),
        (&["daemon", "-pidfile", "relative.pid"][..], "not absolute"),
        (&["daemon", "-socketpath"][..], "needs an argument"),
    ] {
        let (code, err) = stderr_of(spawn(&bin_dir().join("dhcp"), args));
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert!(err.contains(want) && err.contains("usage: dhcp daemon"), "{args:?}: {err}");
    }
    let (code, err) = stderr_of(spawn(&bin_dir().join("dhcp"), &["daemon", "-h"]));
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("-resendmax"), "{err}");
}

/// The multi-call binary, linked as `dhcp`, runs the daemon too.
#[test]
fn multi_call_binary_runs_the_daemon() {
    let dir = TempDir::new("dhcp-cli");
    let link = dir.path().join("dhcp");
    std::os::unix::fs::symlink(bin_dir().join("cni-rs"), &link).unwrap();
    let sock = dir.path().join("m.sock");
    let mut child = spawn(&link, &["daemon", "-socketpath", sock.to_str().unwrap()]);
    assert!(wait_for(Duration::from_secs(5), || UnixStream::connect(&sock).is_ok()), "cni-rs as dhcp daemon");
    terminate(&mut child);
    assert_eq!(stderr_of(child).0, Some(0));
}

/// Under systemd socket activation (here `systemd-socket-activate`, which passes LISTEN_FDS=1 and
/// LISTEN_PID as systemd does) the daemon serves the socket it is given and leaves the file alone.
#[test]
fn serves_a_socket_passed_by_systemd() {
    cni_tests::require_tools(&["systemd-socket-activate"]);
    let dir = TempDir::new("dhcp-cli");
    let sock = dir.path().join("activated.sock");
    let mut activator = KillOnDrop(
        Command::new("systemd-socket-activate")
            .args(["-l", sock.to_str().unwrap(), bin_dir().join("dhcp").to_str().unwrap(), "daemon", "-socketpath"])
            // Ignored under activation; a daemon that did not take the passed socket would listen here.
            .arg(dir.path().join("unused.sock"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    assert!(wait_for(Duration::from_secs(5), || sock.exists()), "systemd-socket-activate made no socket");
    let answer = {
        use std::io::{BufRead, BufReader, Write};
        let mut stream = UnixStream::connect(&sock).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        stream.write_all(b"{\"method\":\"status\"}\n").unwrap();
        let mut line = String::new();
        BufReader::new(stream).read_line(&mut line).unwrap();
        line
    };
    assert_eq!(answer.trim(), "\"done\"");
    // systemd-socket-activate execs the daemon in its own process.
    terminate(&mut activator.0);
    let _ = activator.0.wait();
    assert!(sock.exists(), "the daemon removed a socket systemd owns");
}

/// A child killed when the test ends, passed or failed.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Whoever reaches the socket names the netns path the daemon enters: a regular file, a directory
/// or a FIFO is refused at once with code 4 and a message naming the path and what it is, never
/// opened (a FIFO's open would hang the call) nor retried; the daemon keeps serving.
#[test]
fn a_path_that_is_not_a_network_namespace_is_refused_at_once() {
    use dhcp::proto::{Answer, Call, LeaseKey, LeaseRequest};
    use std::io::{BufRead, BufReader, Write};
    let dir = TempDir::new("dhcp-notns");
    let sock = dir.path().join("dhcp.sock");
    let mut child = KillOnDrop(spawn(&bin_dir().join("dhcp"), &["daemon", "-socketpath", sock.to_str().unwrap()]));
    assert!(wait_for(Duration::from_secs(5), || UnixStream::connect(&sock).is_ok()), "no socket");
    let file = dir.path().join("file");
    std::fs::write(&file, "x").unwrap();
    let fifo = dir.path().join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    for (path, what) in [(file.as_path(), "a regular file"), (dir.path(), "a directory"), (fifo.as_path(), "a pipe")] {
        let call = Call::Allocate(LeaseRequest {
            key: LeaseKey { container_id: "ctr".into(), network: "net".into(), ifname: "eth0".into() },
            netns: path.display().to_string(),
            request: Vec::new(),
            provide: Vec::new(),
            suppress_gateway: false,
        });
        let mut stream = UnixStream::connect(&sock).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        stream.write_all(format!("{}\n", serde_json::to_string(&call).unwrap()).as_bytes()).unwrap();
        let mut line = String::new();
        BufReader::new(&stream)
            .read_line(&mut line)
            .unwrap_or_else(|e| panic!("no answer within 5 s for {what} as the netns: {e}"));
        let answer: Answer = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line:?}: {e}"));
        let Answer::Error { code, msg } = answer else { panic!("{what}: {line}") };
        assert_eq!(code, 4, "{what}: {msg}");
        let want = format!("{} is not a network namespace (it is {what})", path.display());
        assert!(msg.contains(&want) && msg.contains("ctr/net/eth0"), "{what}: {msg}");
    }
    assert!(matches!(dhcp::proto::call(&sock, &Call::Status), Ok(Answer::Done)), "the daemon stopped serving");
    terminate(&mut child.0);
    let status = child.0.wait().unwrap();
    assert_eq!(status.code(), Some(0), "SIGTERM after the refusals");
}

/// Sends one call on a fresh connection and reads the answer (5 s at most).
fn ask(sock: &Path, call: &dhcp::proto::Call) -> dhcp::proto::Answer {
    use std::io::{BufRead, BufReader, Write};
    let mut stream = UnixStream::connect(sock).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    stream.write_all(format!("{}\n", serde_json::to_string(call).unwrap()).as_bytes()).unwrap();
    let mut line = String::new();
    BufReader::new(&stream).read_line(&mut line).unwrap_or_else(|e| panic!("no answer within 5 s: {e}"));
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line:?}: {e}"))
}

/// The daemon's own network namespace, by any path to it, is refused at once with code 4 naming
/// the lease and the path: a DHCP client there would bring up and lease an address for the node's
/// own interface (the interface here does not exist, so nothing happens to the node either way).
#[test]
fn the_daemons_own_namespace_is_refused() {
    use dhcp::proto::{Answer, Call, LeaseKey, LeaseRequest};
    let dir = TempDir::new("dhcp-ownns");
    let sock = dir.path().join("dhcp.sock");
    let child = KillOnDrop(spawn(&bin_dir().join("dhcp"), &["daemon", "-socketpath", sock.to_str().unwrap()]));
    assert!(wait_for(Duration::from_secs(5), || UnixStream::connect(&sock).is_ok()), "no socket");
    for path in ["/proc/self/ns/net".to_string(), format!("/proc/{}/ns/net", child.0.id())] {
        let call = Call::Allocate(LeaseRequest {
            key: LeaseKey { container_id: "ctr".into(), network: "net".into(), ifname: "cnxnone0".into() },
            netns: path.clone(),
            request: Vec::new(),
            provide: Vec::new(),
            suppress_gateway: false,
        });
        let Answer::Error { code, msg } = ask(&sock, &call) else { panic!("{path}: not refused") };
        assert_eq!(code, 4, "{path}: {msg}");
        let want = format!("{path} is the dhcp daemon's own network namespace, not a pod's");
        assert!(msg.contains(&want) && msg.contains("ctr/net/cnxnone0"), "{path}: {msg}");
    }
    assert_eq!(ask(&sock, &Call::Status), Answer::Done, "the daemon stopped serving");
}

/// The socket is mode 0600 whatever the umask the daemon starts with: whoever connects names a
/// namespace the daemon enters and an interface it brings up.
#[test]
fn the_socket_is_0600_whatever_the_umask() {
    use std::os::unix::fs::PermissionsExt;
    let dir = TempDir::new("dhcp-mode");
    for umask in ["000", "022", "077"] {
        let sock = dir.path().join(format!("dhcp-{umask}.sock"));
        let child = Command::new("sh")
            .args(["-c", &format!("umask {umask} && exec \"$0\" daemon -socketpath \"$1\"")])
            .arg(bin_dir().join("dhcp"))
            .arg(&sock)
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut child = KillOnDrop(child);
        assert!(wait_for(Duration::from_secs(5), || UnixStream::connect(&sock).is_ok()), "umask {umask}: no socket");
        let mode = std::fs::symlink_metadata(&sock).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o600, "umask {umask}: the socket is {mode:o}");
        terminate(&mut child.0);
        let _ = child.0.wait();
    }
}

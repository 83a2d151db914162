//! `cni-peak OUT PROGRAM`: runs PROGRAM (environment, stdin, stdout and stderr inherited), then
//! writes `<peak RSS in KiB> <wall time in ns>` of its process tree to the file OUT and exits with
//! PROGRAM's exit code.
//!
//! Why a process of its own: wait4's `ru_maxrss` of a child that was started with vfork (as
//! posix_spawn and Rust's `Command` do) starts at the parent's high-water mark, because exec records
//! the old, shared address space's peak. cni-bench grows to ~10 MiB during a run, and then every
//! plugin it started would have measured that. This process stays at ~1 MiB, so a plugin's own
//! peak is what shows (anything under this process's own peak would read as that peak).

use std::io::Write;
use std::process::{exit, Command};
use std::time::Instant;

fn main() {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let [_, out, program] = args.as_slice() else {
        eprintln!("usage: cni-peak OUT PROGRAM");
        exit(2);
    };
    let started = Instant::now();
    let child = match Command::new(program).spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cni-peak: spawn {}: {e}", program.to_string_lossy());
            exit(127);
        }
    };
    let mut status = 0;
    // SAFETY: an all-zero rusage is valid; wait4 fills it.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waiting for our own child, with valid out-pointers.
    let r = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut ru) };
    let elapsed = started.elapsed();
    if r < 0 {
        eprintln!("cni-peak: wait4: {}", std::io::Error::last_os_error());
        exit(1);
    }
    let report = format!("{} {}\n", ru.ru_maxrss, elapsed.as_nanos());
    if let Err(e) = std::fs::File::create(out).and_then(|mut f| f.write_all(report.as_bytes())) {
        eprintln!("cni-peak: write {}: {e}", out.to_string_lossy());
        exit(1);
    }
    exit(if libc::WIFEXITED(status) { libc::WEXITSTATUS(status) } else { 1 });
}

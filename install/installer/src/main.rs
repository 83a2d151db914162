//! cni-installer: puts the cni-rs plugins and a conflist for given pod CIDRs on a host, then stays
//! running until SIGTERM (or exits with `--once`). In a cluster the node agent (cni-rs-node) does
//! this job with the pod CIDRs of the Node object; the installer serves hosts whose CIDRs are known.

// Tests may unwrap: a panic there is a failed assertion. The shipped binary is still checked.
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

mod cidr;
mod cli;
mod install;
mod render;

use cidr::Cidr;
use install::Placement;
use libcni::{Error, Result};
use nix::sys::signal::{SigSet, Signal};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

const USAGE: &str = "\
usage: cni-installer [options]
  --src DIR            plugin binaries to install       (default /opt/cni-rs/bin); if DIR/.plugins
                       lists plugin names, DIR/cni-rs is installed once and linked under each name
  --bin-dir DIR        host CNI binary directory        (default /host/opt/cni/bin)
  --conf-dir DIR       host CNI configuration directory (default /host/etc/cni/net.d)
  --template FILE      conflist template                (default /opt/cni-rs/conf/10-cni-rs.conflist.template)
  --conf-name NAME     conflist file name in conf-dir   (default 10-cni-rs.conflist)
  --pod-cidr LIST      pod CIDRs, comma-separated; overrides $CNI_RS_POD_CIDR
  --pod-cidr-dir DIR   if no CIDR is given, read DIR/$NODE_NAME  (default /etc/cni-rs/pod-cidrs)
  --once               install and exit instead of waiting for SIGTERM
Pod CIDRs come from --pod-cidr, else $CNI_RS_POD_CIDR, else the file DIR/$NODE_NAME.
In a Kubernetes cluster run the node agent instead (cni-rs-node, install/daemonset.yaml):
it reads each Node's spec.podCIDRs itself.";

#[derive(Debug, PartialEq)]
struct Options {
    src: PathBuf,
    bin_dir: PathBuf,
    conf_dir: PathBuf,
    template: PathBuf,
    conf_name: String,
    pod_cidr: Option<String>,
    pod_cidr_dir: PathBuf,
    once: bool,
}

impl Options {
    fn parse(args: impl IntoIterator<Item = String>) -> Result<Option<Options>> {
        let mut options = Options {
            src: "/opt/cni-rs/bin".into(),
            bin_dir: "/host/opt/cni/bin".into(),
            conf_dir: "/host/etc/cni/net.d".into(),
            template: "/opt/cni-rs/conf/10-cni-rs.conflist.template".into(),
            conf_name: "10-cni-rs.conflist".into(),
            pod_cidr: None,
            pod_cidr_dir: "/etc/cni-rs/pod-cidrs".into(),
            once: false,
        };
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            let (flag, inline) = match arg.split_once('=') {
                Some((flag, value)) if flag.starts_with("--") => (flag.to_string(), Some(value)),
                _ => (arg.clone(), None),
            };
            match flag.as_str() {
                "-h" | "--help" => return Ok(None),
                "--once" if inline.is_none() => {
                    options.once = true;
                    continue;
                }
                _ => {}
            }
            let value = match inline {
                Some(value) => value.to_string(),
                None => args.next().ok_or_else(|| Error::config(format!("{flag} needs a value")))?,
            };
            match flag.as_str() {
                "--src" => options.src = value.into(),
                "--bin-dir" => options.bin_dir = value.into(),
                "--conf-dir" => options.conf_dir = value.into(),
                "--template" => options.template = value.into(),
                "--conf-name" => options.conf_name = checked_file_name("--conf-name", value)?,
                "--pod-cidr" => options.pod_cidr = Some(value),
                "--pod-cidr-dir" => options.pod_cidr_dir = value.into(),
                _ => return Err(Error::config(format!("unknown argument {arg:?}"))),
            }
        }
        Ok(Some(options))
    }
}

/// A plain name inside a directory: no separators, not `.` or `..`.
fn checked_file_name(what: &str, name: String) -> Result<String> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        return Err(Error::config(format!("{what} {name:?} is not a plain file name")));
    }
    Ok(name)
}

/// Finds the pod CIDRs and says where they came from.
fn pod_cidrs(options: &Options, env_cidr: Option<String>, node_name: Option<String>) -> Result<(Vec<Cidr>, String)> {
    if let Some(list) = &options.pod_cidr {
        return Ok((Cidr::parse_list(list)?, "--pod-cidr".into()));
    }
    if let Some(list) = env_cidr.filter(|list| !list.trim().is_empty()) {
        return Ok((Cidr::parse_list(&list)?, "CNI_RS_POD_CIDR".into()));
    }
    let missing = "no pod CIDR: set CNI_RS_POD_CIDR (e.g. 10.244.1.0/24,fd00:10:244:1::/64) \
                   or --pod-cidr";
    let Some(node) = node_name.filter(|node| !node.is_empty()) else {
        return Err(Error::config(format!("{missing}, or NODE_NAME with a file per node in --pod-cidr-dir")));
    };
    let node = checked_file_name("NODE_NAME", node)?;
    let path = options.pod_cidr_dir.join(&node);
    match fs::read_to_string(&path) {
        Ok(list) => {
            Ok((Cidr::parse_list(&list).map_err(|err| err.context(path.display()))?, path.display().to_string()))
        }
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            Err(Error::config(format!("{missing}, or write the file for node {node:?} ({} not found)", path.display())))
        }
        Err(err) => Err(Error::io(format_args!("read {}", path.display()), &err)),
    }
}

fn log_outcome(name: &str, dir: &Path, outcome: &Placement) {
    let path = dir.join(name);
    match outcome {
        Placement::Installed { sha256 } => eprintln!("installed {name} -> {} (sha256 {sha256})", path.display()),
        Placement::Unchanged => eprintln!("unchanged {name}"),
        Placement::Linked => {
            eprintln!("linked {name} -> {} (hard link to {})", path.display(), install::MULTI_CALL)
        }
        Placement::Copied { sha256 } => {
            eprintln!("copied {name} -> {} (full copy of {}, sha256 {sha256})", path.display(), install::MULTI_CALL)
        }
    }
}

/// Runtimes load the lexicographically first configuration file, so say when ours is shadowed.
fn warn_if_shadowed(conf_dir: &Path, conf_name: &str) {
    let Ok(entries) = fs::read_dir(conf_dir) else {
        return;
    };
    let mut earlier: Vec<String> = entries
        .flatten()
        .filter_map(|entry| entry.file_name().into_string().ok())
        .filter(|name| {
            [".conf", ".conflist", ".json"].iter().any(|ext| name.ends_with(ext)) && name.as_str() < conf_name
        })
        .collect();
    earlier.sort();
    if let Some(first) = earlier.first() {
        eprintln!(
            "warning: {} sorts before {conf_name}; runtimes that load the first file will use it instead",
            conf_dir.join(first).display()
        );
    }
}

fn install(options: &Options) -> Result<()> {
    // Everything that can be wrong with the input is checked before the first write.
    let (cidrs, source) = pod_cidrs(options, std::env::var("CNI_RS_POD_CIDR").ok(), std::env::var("NODE_NAME").ok())?;
    let shown: Vec<String> = cidrs.iter().map(Cidr::to_string).collect();
    eprintln!("pod CIDRs {} (from {source})", shown.join(","));
    let template = fs::read_to_string(&options.template)
        .map_err(|err| Error::io(format_args!("read template {}", options.template.display()), &err))?;
    let conflist = render::render(&template, &cidrs).map_err(|err| err.context(options.template.display()))?;

    for dir in [&options.bin_dir, &options.conf_dir] {
        fs::create_dir_all(dir).map_err(|err| Error::io(format_args!("create {}", dir.display()), &err))?;
    }

    // Binaries first: a runtime may act on the conflist as soon as it appears.
    let source = install::Source::read(&options.src)?;
    let owned = source.names();
    install::remove_stale_temps(&options.bin_dir, &owned);
    let report = install::install_dir(&options.src, &options.bin_dir)?;
    if let Some(err) = &report.link_error {
        eprintln!("warning: {err}; each plugin name is a full copy of {} instead of a hard link", install::MULTI_CALL);
    }
    for (name, outcome) in &report.outcomes {
        log_outcome(name, &options.bin_dir, outcome);
    }
    let (bytes, inodes) = install::installed_size(&options.bin_dir, &owned);
    eprintln!("{} names in {}: {inodes} distinct file(s), {bytes} bytes", owned.len(), options.bin_dir.display());

    install::remove_stale_temps(&options.conf_dir, &[options.conf_name.as_str()]);
    let outcome = install::place(&options.conf_dir, &options.conf_name, conflist.as_bytes(), 0o644)?;
    log_outcome(&options.conf_name, &options.conf_dir, &outcome);
    warn_if_shadowed(&options.conf_dir, &options.conf_name);
    Ok(())
}

fn main() -> ExitCode {
    let options = match cli::options_or_exit(
        Options::parse(std::env::args_os().skip(1).map(|a| a.to_string_lossy().into_owned())),
        USAGE,
    ) {
        Ok(options) => options,
        Err(code) => return code,
    };

    // As PID 1 in a container, SIGTERM has no default action, so it must be waited for explicitly.
    // Blocking it before the install defers a stop that arrives mid-copy until the copy is done.
    let mut stop_signals = SigSet::empty();
    stop_signals.add(Signal::SIGTERM);
    stop_signals.add(Signal::SIGINT);
    if !options.once {
        if let Err(err) = stop_signals.thread_block() {
            eprintln!("error: block SIGTERM: {err}");
            return ExitCode::FAILURE;
        }
    }

    if let Err(err) = install(&options) {
        eprintln!("error: {err}");
        return ExitCode::FAILURE;
    }
    if options.once {
        return ExitCode::SUCCESS;
    }

    eprintln!("install complete; waiting for SIGTERM");
    match stop_signals.wait() {
        Ok(signal) => {
            eprintln!("received {signal}, exiting");
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("error: wait for SIGTERM: {err}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cni_tests::TempDir;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn parses_flags_in_both_forms() {
        let options = Options::parse(args(&[
            "--src",
            "/s",
            "--bin-dir=/b",
            "--conf-dir",
            "/c",
            "--template=/t",
            "--conf-name",
            "99-x.conflist",
            "--pod-cidr=10.0.0.0/24",
            "--once",
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(options.src, Path::new("/s"));
        assert_eq!(options.bin_dir, Path::new("/b"));
        assert_eq!(options.conf_dir, Path::new("/c"));
        assert_eq!(options.template, Path::new("/t"));
        assert_eq!(options.conf_name, "99-x.conflist");
        assert_eq!(options.pod_cidr.as_deref(), Some("10.0.0.0/24"));
        assert!(options.once);

        let defaults = Options::parse(args(&[])).unwrap().unwrap();
        assert_eq!(defaults.bin_dir, Path::new("/host/opt/cni/bin"));
        assert!(!defaults.once);
        assert_eq!(Options::parse(args(&["--help"])).unwrap(), None);
    }

    #[test]
    fn rejects_bad_flags() {
        for (bad, why) in [
            (&["--bogus", "x"][..], "unknown argument"),
            (&["--src"][..], "needs a value"),
            (&["--conf-name", "../x"][..], "not a plain file name"),
            (&["--once=yes"][..], "unknown argument"),
        ] {
            let err = Options::parse(args(bad)).unwrap_err();
            assert!(err.msg.contains(why), "{bad:?}: {err}");
            assert_eq!(err.code, libcni::code::INVALID_CONFIG);
        }
    }

    #[test]
    fn pod_cidr_precedence_and_node_file() {
        let dir = TempDir::new("cidrs");
        fs::write(dir.0.join("node-a"), "10.244.7.0/24\n").unwrap();
        let mut options = Options::parse(args(&["--pod-cidr-dir", dir.0.to_str().unwrap()])).unwrap().unwrap();

        let (cidrs, source) = pod_cidrs(&options, Some("10.244.1.0/24".into()), Some("node-a".into())).unwrap();
        assert_eq!(cidrs[0].to_string(), "10.244.1.0/24");
        assert_eq!(source, "CNI_RS_POD_CIDR");

        let (cidrs, _) = pod_cidrs(&options, Some(" ".into()), Some("node-a".into())).unwrap();
        assert_eq!(cidrs[0].to_string(), "10.244.7.0/24");

        let err = pod_cidrs(&options, None, Some("node-b".into())).unwrap_err();
        assert!(err.msg.contains("file for node \"node-b\""), "{err}");
        let err = pod_cidrs(&options, None, None).unwrap_err();
        assert!(err.msg.contains("no pod CIDR"), "{err}");
        let err = pod_cidrs(&options, None, Some("../etc".into())).unwrap_err();
        assert!(err.msg.contains("not a plain file name"), "{err}");

        options.pod_cidr = Some("10.9.0.0/16".into());
        let (cidrs, source) = pod_cidrs(&options, Some("10.244.1.0/24".into()), None).unwrap();
        assert_eq!(cidrs[0].to_string(), "10.9.0.0/16");
        assert_eq!(source, "--pod-cidr");
    }

    fn fixture() -> (TempDir, Options) {
        let root = TempDir::new("root");
        let src = root.0.join("src");
        fs::create_dir_all(&src).unwrap();
        fs::write(src.join("loopback"), b"loopback binary").unwrap();
        let template = root.0.join("template");
        fs::write(&template, include_str!("../../conf/10-cni-rs.conflist.template")).unwrap();
        let options = Options {
            src,
            bin_dir: root.0.join("bin"),
            conf_dir: root.0.join("net.d"),
            template,
            conf_name: "10-cni-rs.conflist".into(),
            pod_cidr: None,
            pod_cidr_dir: root.0.join("none"),
            once: true,
        };
        (root, options)
    }

    #[test]
    fn installs_binaries_and_conflist() {
        let (_root, mut options) = fixture();
        options.pod_cidr = Some("10.244.1.0/24,fd00:10:244:1::/64".into());
        install(&options).unwrap();
        assert_eq!(fs::read(options.bin_dir.join("loopback")).unwrap(), b"loopback binary");
        let conf = fs::read_to_string(options.conf_dir.join("10-cni-rs.conflist")).unwrap();
        assert!(conf.contains(r#"[[{"subnet":"10.244.1.0/24"}],[{"subnet":"fd00:10:244:1::/64"}]]"#));
    }

    #[test]
    fn installs_the_multi_call_binary_with_links() {
        use std::os::unix::fs::MetadataExt;
        let (_root, mut options) = fixture();
        fs::write(options.src.join(install::MULTI_CALL), b"multi-call").unwrap();
        fs::write(options.src.join(install::MANIFEST), "bridge\nportmap\n").unwrap();
        fs::create_dir_all(&options.bin_dir).unwrap();
        fs::write(options.bin_dir.join(".bridge.tmp-1"), b"left by a crash").unwrap();
        options.pod_cidr = Some("10.244.1.0/24".into());
        install(&options).unwrap();
        let ino = |name: &str| fs::metadata(options.bin_dir.join(name)).unwrap().ino();
        assert_eq!(ino("bridge"), ino("cni-rs"));
        assert_eq!(ino("portmap"), ino("cni-rs"));
        assert_ne!(ino("loopback"), ino("cni-rs"));
        let mut names: Vec<String> =
            fs::read_dir(&options.bin_dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        names.sort();
        assert_eq!(names, ["bridge", "cni-rs", "loopback", "portmap"]);
    }

    #[test]
    fn bad_cidr_writes_nothing() {
        let (_root, mut options) = fixture();
        options.pod_cidr = Some("10.244.1.1/24".into());
        let err = install(&options).unwrap_err();
        assert!(err.msg.contains("host bits are set"), "{err}");
        assert!(!options.bin_dir.exists());
        assert!(!options.conf_dir.exists());
    }
}

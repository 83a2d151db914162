//! Real traffic for the bandwidth tests: a TCP sender and a receiver that measures, on threads that
//! may run inside a network namespace; ADD and DEL of a chain with bandwidth through libcni.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, dead_code)]

use cni_tests::{run, unique, Netns};
use libcni::conflist::NetworkConfigList;
use libcni::runtime::{CniConfig, RuntimeConf};
use libcni::types::CniResult;
use serde_json::{Map, Value};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

/// Runs `f` on a thread inside the namespace at `path` (setns affects only that thread).
pub fn in_netns<T: Send + 'static>(path: &str, f: impl FnOnce() -> T + Send + 'static) -> std::thread::JoinHandle<T> {
    let file = std::fs::File::open(path).unwrap();
    std::thread::spawn(move || {
        nix::sched::setns(file.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        f()
    })
}

/// Receives one connection until EOF: bits per second between its first and last byte.
pub fn receive(listener: TcpListener) -> f64 {
    let (s, _) = listener.accept().unwrap();
    read_rate(s)
}

/// Reads `s` until EOF: bits per second between the first and the last byte.
pub fn read_rate(mut s: impl Read) -> f64 {
    let mut buf = vec![0u8; 65536];
    let (mut first, mut last, mut total) = (None, Instant::now(), 0usize);
    loop {
        let n = s.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        if first.is_none() {
            first = Some(Instant::now());
        } else {
            total += n;
        }
        last = Instant::now();
    }
    total as f64 * 8.0 / (last - first.unwrap()).as_secs_f64()
}

pub fn send(to: String, bytes: usize) {
    let s = TcpStream::connect_timeout(&to.parse().unwrap(), Duration::from_secs(5)).unwrap();
    write_bytes(s, bytes);
}

/// Writes `bytes` bytes to `s`, 64 KiB at a time.
pub fn write_bytes(mut s: impl Write, bytes: usize) {
    let chunk = vec![0x5au8; 65536];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(chunk.len());
        s.write_all(&chunk[..n]).unwrap();
        left -= n;
    }
}

/// ADD of `list` for `pod` (eth0, a fresh container id) with these capability args; the runtime
/// config, the result and its last interface, the ifb bandwidth made.
pub fn add(
    cni: &CniConfig,
    list: &NetworkConfigList,
    pod: &Netns,
    caps: Map<String, Value>,
) -> (RuntimeConf, CniResult, String) {
    let rt = RuntimeConf {
        container_id: unique("bwc"),
        netns: pod.path.clone(),
        ifname: "eth0".into(),
        capability_args: caps,
        ..Default::default()
    };
    let result = cni.add_network_list(list, &rt).expect("ADD");
    let ifb = result.interfaces.last().unwrap().name.clone();
    assert!(ifb.starts_with("bwp"), "the ifb is the last interface of the result: {result:?}");
    cni.check_network_list(list, &rt).expect("CHECK");
    (rt, result, ifb)
}

/// DEL twice; the ifb is gone after the first.
pub fn del_twice(cni: &CniConfig, list: &NetworkConfigList, rt: &RuntimeConf, ifb: &str) {
    cni.del_network_list(list, rt).expect("DEL");
    cni.del_network_list(list, rt).expect("DEL again");
    assert!(!run("ip", &["link", "show", ifb]).status.success(), "ifb {ifb} left after DEL");
}

pub fn within(measured: f64, rate: f64, what: &str) {
    let ratio = measured / rate;
    eprintln!("{what}: {:.2} Mbit/s for a limit of {:.2} Mbit/s ({:.0}%)", measured / 1e6, rate / 1e6, ratio * 100.0);
    assert!(
        (0.8..=1.2).contains(&ratio),
        "{what}: {:.2} Mbit/s is not within 20% of {:.2} Mbit/s",
        measured / 1e6,
        rate / 1e6
    );
}

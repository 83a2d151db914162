//! Real traffic for the bandwidth tests: a TCP sender and a receiver that measures, on threads that
//! may run inside a network namespace.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, dead_code)]

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
    let (mut s, _) = listener.accept().unwrap();
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
    let mut s = TcpStream::connect_timeout(&to.parse().unwrap(), Duration::from_secs(5)).unwrap();
    let chunk = vec![0x5au8; 65536];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(chunk.len());
        s.write_all(&chunk[..n]).unwrap();
        left -= n;
    }
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

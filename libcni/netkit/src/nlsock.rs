//! A blocking netlink socket: the one place that opens netlink sockets and moves bytes through
//! them, for rtnetlink ([`crate::netlink`]) and nf_tables (the firewall's nfnl). Plugins are
//! short-lived single-threaded processes that wait on one kernel answer at a time, so plain
//! blocking calls are all they need.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// How long a read waits for the kernel. The kernel queues its answer to a request before
/// `sendmsg` returns (a dump's next part before `recvmsg` returns), so a read that waits this long
/// means an answer was lost.
const READ_TIMEOUT_SECS: i32 = 10;

/// A netlink socket of one protocol, talking to the kernel (port 0).
#[derive(Debug)]
pub(crate) struct Socket {
    fd: OwnedFd,
}

impl Socket {
    /// A socket of `protocol` (NETLINK_ROUTE, NETLINK_NETFILTER) in the calling thread's network
    /// namespace; the kernel picks its port on the first send.
    pub(crate) fn open(protocol: libc::c_int) -> io::Result<Socket> {
        // SAFETY: plain socket(2); the fd is owned (and closed) by `fd` below.
        let raw = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, protocol) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: raw is a fresh socket we own.
        let sock = Socket { fd: unsafe { OwnedFd::from_raw_fd(raw) } };
        // Not libc::time_t: that alias is deprecated on musl.
        let timeout = libc::timeval { tv_sec: READ_TIMEOUT_SECS as _, tv_usec: 0 };
        sock.setsockopt(libc::SOL_SOCKET, libc::SO_RCVTIMEO, &timeout)?;
        Ok(sock)
    }

    /// A socket over an existing descriptor: tests feed answers through a socket pair.
    #[cfg(test)]
    pub(crate) fn from_fd(fd: OwnedFd) -> Socket {
        Socket { fd }
    }

    pub(crate) fn setsockopt<T>(&self, level: libc::c_int, name: libc::c_int, value: &T) -> io::Result<()> {
        // SAFETY: value points to a valid T of the size given.
        let rc = unsafe {
            libc::setsockopt(
                self.fd.as_raw_fd(),
                level,
                name,
                (value as *const T).cast(),
                std::mem::size_of::<T>() as libc::socklen_t,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    /// Sends `buf` (one or more netlink messages) to the kernel, whole. No address: an unconnected
    /// netlink socket sends to port 0, the kernel.
    pub(crate) fn send(&self, buf: &[u8]) -> io::Result<()> {
        loop {
            // SAFETY: buf is valid for its length.
            let sent = unsafe { libc::send(self.fd.as_raw_fd(), buf.as_ptr().cast(), buf.len(), 0) };
            if sent == buf.len() as isize {
                return Ok(());
            }
            let e = io::Error::last_os_error();
            if sent < 0 && e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(if sent < 0 { e } else { io::Error::other(format!("sent {sent} of {} bytes", buf.len())) });
        }
    }

    /// Reads one datagram into `buf` with `flags`: its full length (more than `buf.len()` when
    /// MSG_TRUNC is given and it did not fit).
    pub(crate) fn recv_flags(&self, buf: &mut [u8], flags: libc::c_int) -> io::Result<usize> {
        loop {
            // SAFETY: buf is writable for its length.
            let n = unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), flags) };
            if n >= 0 {
                return Ok(n as usize);
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    /// Reads one datagram into `buf`.
    pub(crate) fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.recv_flags(buf, 0)
    }

    /// Reads one datagram whole, growing `buf` first when it is larger than `buf` (a link with
    /// many SR-IOV VFs answers in one message larger than a page).
    pub(crate) fn recv_whole(&self, buf: &mut Vec<u8>) -> io::Result<usize> {
        let len = self.recv_flags(buf, libc::MSG_PEEK | libc::MSG_TRUNC)?;
        if len > buf.len() {
            buf.resize(len, 0);
        }
        self.recv(buf)
    }
}

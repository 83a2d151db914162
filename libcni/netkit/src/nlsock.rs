//! The one netlink exchange: a blocking socket to the kernel and the rules for reading its
//! answers, for rtnetlink ([`crate::netlink`]) and nf_tables (the firewall's nfnl) alike. Plugins
//! are short-lived single-threaded processes that wait on one kernel answer at a time, so plain
//! blocking calls are all they need.
//!
//! What is shared:
//! - an answer is ours when the kernel sent it (source port 0), to our port, with the sequence
//!   number of a request we are waiting on; anything else in the socket (the rest of an
//!   abandoned dump, an answer past its timeout) is skipped;
//! - NLMSG_ERROR is an acknowledgement (0) or a refusal: its errno and the kernel's own text
//!   (extended ack, NLMSGERR_ATTR_MSG), which every error message then carries;
//! - a dump the kernel flags as interrupted (NLM_F_DUMP_INTR, or EINTR) is read to its end and
//!   asked again, [`DUMP_ATTEMPTS`] times in all;
//! - one receive buffer per socket, [`RECV_BUF`] to start with, grown to a datagram that does
//!   not fit (a link with many SR-IOV VFs answers in one message larger than a page).

use libcni::Error;
use nix::sys::socket::{self, sockopt, AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType};
use nix::sys::time::TimeVal;
use std::fmt;
use std::io::{self, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

/// How long a read waits for the kernel. The kernel queues its answer to a request before
/// `sendmsg` returns (a dump's next part before `recvmsg` returns), so a read that waits this long
/// means an answer was lost.
const READ_TIMEOUT_SECS: i64 = 10;

/// How often a dump is asked for when the kernel says a concurrent change interrupted it (the
/// reference plugins needed the same in `netlinksafe`).
pub(crate) const DUMP_ATTEMPTS: usize = 10;

/// The receive buffer a socket starts with: a dump's datagrams are at most 32 KiB unless one
/// object is larger; a larger datagram grows it.
pub(crate) const RECV_BUF: usize = 32 * 1024;

/// Receive-buffer bytes one queued acknowledgement is counted for, with room to spare, and the
/// room kept besides them: what [`Exchange::make_room`] plans with.
const ACK_COST: usize = 2048;
const ACK_HEADROOM: usize = 64 * 1024;
/// The most acknowledgements independent requests queue at once (~2 MiB of receive buffer).
const SPLIT_AT: usize = 1024;

pub(crate) const NLMSG_HDRLEN: usize = 16;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_MULTI: u16 = 0x2;
const NLM_F_DUMP_INTR: u16 = 0x10;
/// In an NLMSG_ERROR: the original message was capped to its header / TLVs follow it.
const NLM_F_CAPPED: u16 = 0x100;
const NLM_F_ACK_TLVS: u16 = 0x200;
const NLMSGERR_ATTR_MSG: u16 = 1;
const NETLINK_CAP_ACK: libc::c_int = 10;
const NETLINK_EXT_ACK: libc::c_int = 11;

/// The header of one netlink message from the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Header {
    pub ty: u16,
    pub flags: u16,
    pub seq: u32,
    pub port: u32,
}

/// The messages of one datagram, each with its header (the message slice includes it); a
/// truncated one ends the list.
pub(crate) fn messages(mut rest: &[u8]) -> impl Iterator<Item = (Header, &[u8])> {
    std::iter::from_fn(move || {
        let len = u32_at(rest, 0) as usize;
        if rest.len() < NLMSG_HDRLEN || len < NLMSG_HDRLEN || len > rest.len() {
            return None;
        }
        let header =
            Header { ty: u16_at(rest, 4), flags: u16_at(rest, 6), seq: u32_at(rest, 8), port: u32_at(rest, 12) };
        let msg = &rest[..len];
        rest = rest.get(len.next_multiple_of(4)..).unwrap_or_default();
        Some((header, msg))
    })
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    b.get(at..at + 2).map_or(0, |s| u16::from_ne_bytes([s[0], s[1]]))
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4).map_or(0, |s| u32::from_ne_bytes([s[0], s[1], s[2], s[3]]))
}

/// The (type, value) of each netlink attribute in `b` (NLA_F_NESTED and NLA_F_NET_BYTEORDER
/// cleared from the type): rtnetlink's, nf_tables' and ctnetlink's alike.
pub(crate) fn attributes(mut b: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        let len = usize::from(u16_at(b, 0));
        if b.len() < 4 || len < 4 || len > b.len() {
            return None;
        }
        let ty = u16_at(b, 2) & 0x3fff;
        let value = &b[4..len];
        b = b.get(len.next_multiple_of(4)..).unwrap_or_default();
        Some((ty, value))
    })
}

/// The errno (positive) of an NLMSG_ERROR or NLMSG_DONE message, 0 for success, and the
/// kernel's text when it gave one.
fn verdict(header: &Header, msg: &[u8]) -> (i32, Option<String>) {
    let errno = (u32_at(msg, NLMSG_HDRLEN) as i32).wrapping_neg();
    if header.flags & NLM_F_ACK_TLVS == 0 {
        return (errno, None);
    }
    // After the errno: the request's header (capped) or the whole request, then the TLVs. NLMSG_DONE
    // has no request.
    let request_len = match header.ty {
        NLMSG_ERROR if header.flags & NLM_F_CAPPED != 0 => NLMSG_HDRLEN,
        NLMSG_ERROR => u32_at(msg, NLMSG_HDRLEN + 4) as usize,
        _ => 0,
    };
    let tlvs = msg.get((NLMSG_HDRLEN + 4 + request_len).next_multiple_of(4)..).unwrap_or_default();
    let text = attributes(tlvs)
        .find(|(ty, _)| *ty == NLMSGERR_ATTR_MSG)
        .map(|(_, text)| String::from_utf8_lossy(text).trim_end_matches('\0').trim().to_string());
    (errno, text.filter(|t| !t.is_empty()))
}

/// Why a request failed, before it is turned into an error naming the operation.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The kernel refused it: its (positive) errno and its own text (extended ack), if any.
    Errno(i32, Option<String>),
    /// A dump stayed inconsistent through every attempt.
    Interrupted,
    /// Sending (`false`) or reading (`true`) failed.
    Io(bool, io::Error),
    /// An answer did not decode.
    Decode(String),
}

impl Failure {
    pub(crate) fn errno(&self) -> Option<i32> {
        match self {
            Failure::Errno(e, _) => Some(*e),
            _ => None,
        }
    }

    /// `"<what> (<kernel's text>): <os error text>"` with the errno as data for a refusal, code
    /// NETWORK for the rest.
    pub(crate) fn into_error(self, what: impl fmt::Display) -> Error {
        match self {
            Failure::Errno(e, text) => {
                let text = text.map(|t| format!(" ({t})")).unwrap_or_default();
                Error::os(e, format_args!("{what}{text}"))
            }
            Failure::Interrupted => Error::os(
                libc::EINTR,
                format_args!("{what}: dump interrupted {DUMP_ATTEMPTS} times by concurrent changes"),
            ),
            Failure::Io(false, e) => Error::network(format!("{what}: send to the kernel: {e}")),
            Failure::Io(true, e) => {
                let why = match e.raw_os_error() {
                    Some(libc::EAGAIN) => format!("no answer from the kernel within {READ_TIMEOUT_SECS} s"),
                    Some(libc::ENOBUFS) => {
                        "answers lost (receive buffer full); whether it was applied is unknown".to_string()
                    }
                    _ => "read the kernel's answer".to_string(),
                };
                Error::network(format!("{what}: {why}: {e}"))
            }
            Failure::Decode(msg) => Error::network(format!("{what}: decode the kernel's answer: {msg}")),
        }
    }
}

/// How a request ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answer {
    /// With the kernel's acknowledgement (NLM_F_ACK was asked for).
    Ack,
    /// With one message (a GET of one object).
    One,
    /// With NLMSG_DONE (NLM_F_DUMP).
    Dump,
}

/// A netlink socket of one protocol, talking to the kernel, with the state of its exchange.
#[derive(Debug)]
pub(crate) struct Exchange {
    fd: OwnedFd,
    /// The port the kernel addresses its answers to; 0 on a test's socket pair.
    port: u32,
    /// Only datagrams from the kernel count: false on a test's socket pair, which has no sender
    /// address.
    kernel_only: bool,
    /// The sequence number of the last request.
    seq: AtomicU32,
    /// The receive buffer, taken out while a request reads (a request made while another reads,
    /// such as naming a link for an error, reads into a buffer of its own).
    buf: Mutex<Vec<u8>>,
}

impl Exchange {
    /// A socket of `protocol` in the calling thread's network namespace, bound (the kernel picks
    /// its port), asking for capped errors with the kernel's text.
    pub(crate) fn open(protocol: SockProtocol) -> io::Result<Exchange> {
        let fd = socket::socket(AddressFamily::Netlink, SockType::Raw, SockFlag::SOCK_CLOEXEC, protocol)?;
        socket::setsockopt(&fd, sockopt::ReceiveTimeout, &TimeVal::new(READ_TIMEOUT_SECS, 0))?;
        // Best effort (kernels since 4.3 / 4.12): errors then carry only the failed request's
        // header, so a refused large batch does not fill the receive buffer, plus the kernel's
        // reason.
        let _ = set_netlink_flag(&fd, NETLINK_CAP_ACK);
        let _ = set_netlink_flag(&fd, NETLINK_EXT_ACK);
        socket::bind(fd.as_raw_fd(), &NetlinkAddr::new(0, 0))?;
        let port = socket::getsockname::<NetlinkAddr>(fd.as_raw_fd())?.pid();
        Ok(Exchange::new(fd, port, true))
    }

    fn new(fd: OwnedFd, port: u32, kernel_only: bool) -> Exchange {
        Exchange { fd, port, kernel_only, seq: AtomicU32::new(0), buf: Mutex::new(Vec::new()) }
    }

    /// An exchange over an existing descriptor: tests play the kernel on the other end of a
    /// socket pair, sending from port 0 to port 0.
    #[cfg(test)]
    pub(crate) fn from_fd(fd: OwnedFd) -> Exchange {
        Exchange::new(fd, 0, false)
    }

    /// Reserves `n` consecutive sequence numbers; the first.
    pub(crate) fn next_seqs(&self, n: u32) -> u32 {
        self.seq.fetch_add(n, Ordering::Relaxed).wrapping_add(1)
    }

    /// Room for a request of `request_len` bytes and `answers` answers to it, all queued by the
    /// kernel before `sendmsg` returns; how many answers the receive buffer then holds (at least
    /// one). Each acknowledgement counts about 1 KiB against the receive buffer (~208 KiB by
    /// default, so about [`ACK_COST`] with room to spare), and the kernel drops those past it. The
    /// FORCE options need CAP_NET_ADMIN, which the requests need anyway; without it the plain
    /// option is capped by rmem_max / wmem_max. This is the one policy for many answers at once:
    /// requests that are independent (rtnetlink's, conntrack deletes) are sent at most this many
    /// per datagram ([`Exchange::requests_per_send`]); an nf_tables batch is one transaction and
    /// relies on the growth alone.
    pub(crate) fn make_room(&self, answers: usize, request_len: usize) -> usize {
        const DEFAULT_BUF: usize = 200 * 1024;
        let rcv = answers.saturating_mul(ACK_COST).saturating_add(ACK_HEADROOM);
        if rcv > DEFAULT_BUF {
            let v = rcv.min(i32::MAX as usize);
            if socket::setsockopt(&self.fd, sockopt::RcvBufForce, &v).is_err() {
                let _ = socket::setsockopt(&self.fd, sockopt::RcvBuf, &v);
            }
        }
        if request_len + 4096 > DEFAULT_BUF {
            let v = (request_len + 4096).min(i32::MAX as usize);
            if socket::setsockopt(&self.fd, sockopt::SndBufForce, &v).is_err() {
                let _ = socket::setsockopt(&self.fd, sockopt::SndBuf, &v);
            }
        }
        // The kernel reports the buffer it accounts against (twice what was asked for).
        let held = socket::getsockopt(&self.fd, sockopt::RcvBuf).unwrap_or(DEFAULT_BUF);
        (held.saturating_sub(ACK_HEADROOM) / ACK_COST).max(1)
    }

    /// How many independent requests to send per datagram when `answers` acknowledgements are
    /// due in all: what [`Exchange::make_room`] makes room for, at most [`SPLIT_AT`] (kernel
    /// memory is held for every queued answer until it is read).
    pub(crate) fn requests_per_send(&self, answers: usize) -> usize {
        self.make_room(answers.min(SPLIT_AT), 0)
    }

    /// Sends `buf` (one or more netlink messages) to the kernel, whole. No address: an
    /// unconnected netlink socket sends to port 0, the kernel.
    pub(crate) fn send(&self, buf: &[u8]) -> Result<(), Failure> {
        loop {
            match socket::send(self.fd.as_raw_fd(), buf, MsgFlags::empty()) {
                Ok(n) if n == buf.len() => return Ok(()),
                Ok(n) => return Err(Failure::Io(false, io::Error::other(format!("sent {n} of {} bytes", buf.len())))),
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(Failure::Io(false, e.into())),
            }
        }
    }

    /// Reads one datagram into `buf`, whole when `whole` (growing `buf` first when it is
    /// larger); its length, and whether the kernel sent it.
    fn recv(&self, buf: &mut Vec<u8>, whole: bool) -> Result<(usize, bool), Failure> {
        if buf.len() < RECV_BUF {
            buf.resize(RECV_BUF, 0);
        }
        if whole {
            let (len, _) = self.recv_flags(buf, MsgFlags::MSG_PEEK | MsgFlags::MSG_TRUNC)?;
            if len > buf.len() {
                buf.resize(len, 0);
            }
        }
        let (len, from) = self.recv_flags(buf, MsgFlags::empty())?;
        let from_kernel = !self.kernel_only || from.is_some_and(|a| a.pid() == 0);
        Ok((len.min(buf.len()), from_kernel))
    }

    fn recv_flags(&self, buf: &mut [u8], flags: MsgFlags) -> Result<(usize, Option<NetlinkAddr>), Failure> {
        loop {
            let mut iov = [IoSliceMut::new(buf)];
            match socket::recvmsg::<NetlinkAddr>(self.fd.as_raw_fd(), &mut iov, None, flags) {
                Ok(m) => return Ok((m.bytes, m.address)),
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(Failure::Io(true, e.into())),
            }
        }
    }

    /// Runs `read` over the socket's receive buffer, taken out for the time.
    fn with_buf<T>(&self, read: impl FnOnce(&mut Vec<u8>) -> T) -> T {
        let mut buf = std::mem::take(&mut *self.buf.lock().unwrap_or_else(|p| p.into_inner()));
        let out = read(&mut buf);
        *self.buf.lock().unwrap_or_else(|p| p.into_inner()) = buf;
        out
    }

    /// Whether a message is an answer to the request numbered `seq`.
    fn ours(&self, header: &Header, seq: u32) -> bool {
        header.seq == seq && header.port == self.port
    }

    /// Sends `request` (one message numbered `seq`) and hands every message that answers it,
    /// other than errors, acknowledgements and NLMSG_DONE, to `each` (header and whole message),
    /// up to the one that ends it as `ends` says. A refusal, or a failure of `each`, ends it too.
    /// An interrupted dump is read to its end and then fails with [`Failure::Interrupted`].
    pub(crate) fn request(
        &self,
        request: &[u8],
        seq: u32,
        ends: Answer,
        mut each: impl FnMut(&Header, &[u8]) -> Result<(), Failure>,
    ) -> Result<(), Failure> {
        self.send(request)?;
        self.with_buf(|buf| {
            let mut interrupted = false;
            loop {
                let (len, from_kernel) = self.recv(buf, true)?;
                if !from_kernel {
                    continue;
                }
                for (header, msg) in messages(buf.get(..len).unwrap_or_default()) {
                    if !self.ours(&header, seq) {
                        continue;
                    }
                    interrupted |= header.flags & NLM_F_DUMP_INTR != 0;
                    match header.ty {
                        NLMSG_ERROR | NLMSG_DONE => {
                            let (errno, text) = verdict(&header, msg);
                            return match errno {
                                0 if interrupted => Err(Failure::Interrupted),
                                0 => Ok(()),
                                e => Err(Failure::Errno(e, text)),
                            };
                        }
                        _ => {
                            each(&header, msg)?;
                            if ends == Answer::One && header.flags & NLM_F_MULTI == 0 {
                                return Ok(());
                            }
                        }
                    }
                }
            }
        })
    }

    /// A dump: `encode` writes the request with the sequence number it is given, `each` takes
    /// every answer into a collection that starts empty at each attempt. Asked again, up to
    /// [`DUMP_ATTEMPTS`] in all, while the kernel reports it interrupted.
    pub(crate) fn dump<T: Default>(
        &self,
        encode: impl Fn(u32) -> Vec<u8>,
        mut each: impl FnMut(&mut T, &Header, &[u8]) -> Result<(), Failure>,
    ) -> Result<T, Failure> {
        for _ in 0..DUMP_ATTEMPTS {
            let seq = self.next_seqs(1);
            let mut out = T::default();
            match self.request(&encode(seq), seq, Answer::Dump, |h, m| each(&mut out, h, m)) {
                Ok(()) => return Ok(out),
                Err(Failure::Interrupted | Failure::Errno(libc::EINTR, _)) => continue,
                Err(e) => return Err(e),
            }
        }
        Err(Failure::Interrupted)
    }

    /// Sends `batch`, requests numbered from `first` on, and hands every acknowledgement or
    /// refusal that answers one of the `count` numbers from `first` to `each` (its offset from
    /// `first`, Ok or the refusal) until `each` says all are in. Acknowledgements are small (with
    /// capped errors), so datagrams are not read whole: a larger one is not an answer here.
    pub(crate) fn acks(
        &self,
        batch: &[u8],
        first: u32,
        count: u32,
        mut each: impl FnMut(u32, Result<(), Failure>) -> bool,
    ) -> Result<(), Failure> {
        self.send(batch)?;
        self.with_buf(|buf| loop {
            let (len, from_kernel) = self.recv(buf, false)?;
            if !from_kernel {
                continue;
            }
            for (header, msg) in messages(buf.get(..len).unwrap_or_default()) {
                let offset = header.seq.wrapping_sub(first);
                if header.ty != NLMSG_ERROR || offset >= count || header.port != self.port {
                    continue;
                }
                let outcome = match verdict(&header, msg) {
                    (0, _) => Ok(()),
                    (e, text) => Err(Failure::Errno(e, text)),
                };
                if each(offset, outcome) {
                    return Ok(());
                }
            }
        })
    }
}

/// Sets a SOL_NETLINK flag nix has no option for.
fn set_netlink_flag(fd: &impl AsFd, name: libc::c_int) -> io::Result<()> {
    let on: libc::c_int = 1;
    // SAFETY: `on` is a valid c_int for the duration of the call and its size is passed with it;
    // the descriptor is borrowed, so it is open.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_fd().as_raw_fd(),
            libc::SOL_NETLINK,
            name,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

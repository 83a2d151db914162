//! The DHCP client the daemon runs for each lease: the sockets are made inside the pod's network
//! namespace (they stay bound to it afterwards, so the thread returns to the host namespace at once)
//! and closed after each exchange, so a lease never keeps a vanished pod's namespace alive.
//!
//! Messages go out through a UDP socket bound to the pod's interface (port 68, broadcast allowed):
//! the kernel sends a limited broadcast on a bound interface even before it has an address. Answers
//! are read from a packet socket on the interface, which sees them whether the server broadcasts or
//! unicasts to the offered address (not yet configured, so the kernel's UDP would drop it).

use crate::packet::{self, opt, MessageType, Outgoing, Reply, CLIENT_PORT, SERVER_PORT};
use libcni::{Error, Result};
use netkit::netns::NetNs;
use std::io;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, Instant};

/// How the daemon talks to servers (its command line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// How long one exchange waits for an answer (`-timeout`, default 10 s).
    pub timeout: Duration,
    /// The longest wait between retries before giving up (`-resendmax`, default 62 s).
    pub resend_max: Duration,
    /// Ask servers to broadcast their answers (`-broadcast`).
    pub broadcast: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings { timeout: Duration::from_secs(10), resend_max: Duration::from_secs(62), broadcast: false }
    }
}

/// Why an exchange failed.
#[derive(Debug)]
pub enum Failure {
    /// The pod's namespace or interface is gone: nothing more can be done for this lease.
    Gone(String),
    /// The server said no.
    Nak(String),
    Other(String),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Gone(m) | Failure::Nak(m) | Failure::Other(m) => f.write_str(m),
        }
    }
}

/// The sockets of one exchange on one interface.
pub struct Conn {
    udp: UdpSocket,
    packet: OwnedFd,
    pub mac: [u8; 6],
    ifname: String,
}

fn last_os_error(what: impl std::fmt::Display) -> String {
    format!("{what}: {}", io::Error::last_os_error())
}

fn ifreq(name: &str) -> Result<libc::ifreq> {
    // SAFETY: ifreq is plain old data; all zeroes is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    if name.is_empty() || name.len() >= req.ifr_name.len() {
        return Err(Error::config(format!("interface name {name:?} is empty or too long")));
    }
    for (dst, src) in req.ifr_name.iter_mut().zip(name.bytes()) {
        *dst = src as libc::c_char;
    }
    Ok(req)
}

fn setsockopt_int(fd: i32, level: i32, name: i32, value: i32, what: &str) -> Result<()> {
    // SAFETY: the option value is an int that outlives the call.
    let rc = unsafe {
        libc::setsockopt(fd, level, name, (&value as *const i32).cast(), std::mem::size_of::<i32>() as libc::socklen_t)
    };
    if rc != 0 {
        return Err(Error::io(what, &io::Error::last_os_error()));
    }
    Ok(())
}

/// Makes the sockets inside the current namespace; brings the interface up if it is down, as the
/// reference does (a macvlan or bridge pod interface may still be down when IPAM runs).
fn open_here(ifname: &str) -> Result<Conn, Failure> {
    // SAFETY: plain socket(2) calls; each fd is owned right away.
    let udp = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if udp < 0 {
        return Err(Failure::Other(last_os_error("socket(AF_INET)")));
    }
    // SAFETY: udp is a fresh fd we own.
    let udp = unsafe { OwnedFd::from_raw_fd(udp) };
    let fd = udp.as_raw_fd();

    let mut req = ifreq(ifname).map_err(|e| Failure::Other(e.msg))?;
    // SAFETY: SIOCGIFHWADDR fills the ifreq we own.
    if unsafe { libc::ioctl(fd, libc::SIOCGIFHWADDR as _, &mut req) } != 0 {
        let err = io::Error::last_os_error();
        let msg = format!("interface {ifname} in the pod: {err}");
        return Err(if err.raw_os_error() == Some(libc::ENODEV) { Failure::Gone(msg) } else { Failure::Other(msg) });
    }
    let mut mac = [0u8; 6];
    // SAFETY: the union member ifru_hwaddr was just filled by the kernel.
    let hw = unsafe { req.ifr_ifru.ifru_hwaddr };
    for (m, b) in mac.iter_mut().zip(hw.sa_data.iter()) {
        *m = *b as u8;
    }

    let mut req = ifreq(ifname).map_err(|e| Failure::Other(e.msg))?;
    // SAFETY: SIOCGIFINDEX fills the ifreq we own.
    if unsafe { libc::ioctl(fd, libc::SIOCGIFINDEX as _, &mut req) } != 0 {
        return Err(Failure::Gone(last_os_error(format!("interface {ifname} in the pod"))));
    }
    // SAFETY: ifru_ifindex was just filled by the kernel.
    let ifindex = unsafe { req.ifr_ifru.ifru_ifindex };

    let mut req = ifreq(ifname).map_err(|e| Failure::Other(e.msg))?;
    // SAFETY: SIOCGIFFLAGS / SIOCSIFFLAGS read and write the ifreq we own.
    unsafe {
        if libc::ioctl(fd, libc::SIOCGIFFLAGS as _, &mut req) != 0 {
            return Err(Failure::Other(last_os_error(format!("flags of {ifname}"))));
        }
        if req.ifr_ifru.ifru_flags & libc::IFF_UP as libc::c_short == 0 {
            req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
            if libc::ioctl(fd, libc::SIOCSIFFLAGS as _, &mut req) != 0 {
                return Err(Failure::Other(last_os_error(format!("set {ifname} up"))));
            }
        }
    }

    setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_REUSEADDR, 1, "SO_REUSEADDR").map_err(|e| Failure::Other(e.msg))?;
    setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_BROADCAST, 1, "SO_BROADCAST").map_err(|e| Failure::Other(e.msg))?;
    // SAFETY: the device name buffer outlives the call.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_BINDTODEVICE,
            ifname.as_ptr().cast(),
            ifname.len() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(Failure::Other(last_os_error(format!("SO_BINDTODEVICE {ifname}"))));
    }
    // SAFETY: sockaddr_in is plain old data.
    let mut sin: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    sin.sin_family = libc::AF_INET as libc::sa_family_t;
    sin.sin_port = CLIENT_PORT.to_be();
    // SAFETY: sin is a valid sockaddr_in of the length given.
    let rc = unsafe {
        libc::bind(
            fd,
            (&sin as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(Failure::Other(last_os_error(format!("bind UDP port {CLIENT_PORT} on {ifname}"))));
    }
    let udp = UdpSocket::from(udp);

    let proto = (libc::ETH_P_IP as u16).to_be();
    // SAFETY: plain socket(2); the fd is owned right away.
    let packet = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, proto as i32) };
    if packet < 0 {
        return Err(Failure::Other(last_os_error("socket(AF_PACKET)")));
    }
    // SAFETY: packet is a fresh fd we own.
    let packet = unsafe { OwnedFd::from_raw_fd(packet) };
    // SAFETY: sockaddr_ll is plain old data.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_protocol = proto;
    sll.sll_ifindex = ifindex;
    // SAFETY: sll is a valid sockaddr_ll of the length given.
    let rc = unsafe {
        libc::bind(
            packet.as_raw_fd(),
            (&sll as *const libc::sockaddr_ll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(Failure::Other(last_os_error(format!("bind a packet socket to {ifname}"))));
    }
    Ok(Conn { udp, packet, mac, ifname: ifname.to_string() })
}

impl Conn {
    /// The sockets for `ifname` in the namespace at `netns`; `Failure::Gone` when the namespace or
    /// the interface no longer exists, or the path now names the daemon's own namespace (a pod's
    /// path mounted over with the node's: nothing is sent from the node's interfaces).
    pub fn open(netns: &Path, ifname: &str) -> Result<Conn, Failure> {
        let ns = match NetNs::open(netns) {
            Ok(ns) => ns,
            Err(e) if !netns.exists() => return Err(Failure::Gone(e.msg)),
            Err(e) => return Err(Failure::Other(e.msg)),
        };
        if ns.same_as_current().map_err(|e| Failure::Other(e.msg))? {
            return Err(Failure::Gone(format!(
                "{} is the dhcp daemon's own network namespace, not a pod's",
                netns.display()
            )));
        }
        ns.run(|| open_here(ifname)).map_err(|e| Failure::Other(e.msg))?
    }

    fn send(&self, msg: &Outgoing, to: Ipv4Addr) -> Result<(), Failure> {
        self.udp.send_to(&msg.encode(), SocketAddrV4::new(to, SERVER_PORT)).map(drop).map_err(|e| {
            let text = format!("send {} on {} to {to}: {e}", msg.kind.name(), self.ifname);
            if e.raw_os_error() == Some(libc::ENODEV) {
                Failure::Gone(text)
            } else {
                Failure::Other(text)
            }
        })
    }

    /// Sends `msg` and waits up to `timeout` for an answer of one of `kinds`, sending it again after
    /// 1 s, 2 s, 4 s, ... without one: the first message on an interface that has just come up is
    /// often lost.
    fn exchange(
        &self,
        msg: &Outgoing,
        to: Ipv4Addr,
        kinds: &[MessageType],
        timeout: Duration,
    ) -> Result<Reply, Failure> {
        let deadline = Instant::now() + timeout;
        let mut interval = Duration::from_secs(1);
        loop {
            self.send(msg, to)?;
            if let Some(reply) = self.receive(msg.xid, kinds, (Instant::now() + interval).min(deadline))? {
                return Ok(reply);
            }
            if Instant::now() >= deadline {
                return Err(Failure::Other(format!(
                    "no answer to {} on {} within {} ms",
                    msg.kind.name(),
                    self.ifname,
                    timeout.as_millis()
                )));
            }
            interval *= 2;
        }
    }

    /// The next answer to `xid` for our MAC whose type is one of `kinds`, until `deadline` (None
    /// then).
    fn receive(&self, xid: u32, kinds: &[MessageType], deadline: Instant) -> Result<Option<Reply>, Failure> {
        let mut buf = vec![0u8; 4096];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            let mut pfd = libc::pollfd { fd: self.packet.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
            // SAFETY: one valid pollfd.
            let n = unsafe { libc::poll(&mut pfd, 1, ms) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(Failure::Other(format!("poll the packet socket on {}: {e}", self.ifname)));
            }
            if n == 0 {
                continue;
            }
            // SAFETY: buf is writable for its length.
            let len = unsafe { libc::recv(self.packet.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if len < 0 {
                let e = io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::ENETDOWN) || e.raw_os_error() == Some(libc::ENODEV) {
                    return Err(Failure::Gone(format!("interface {} went away: {e}", self.ifname)));
                }
                continue;
            }
            let Some(reply) = packet::udp_payload_to_client(&buf[..len as usize]).and_then(Reply::parse) else {
                continue;
            };
            if reply.xid == xid && reply.chaddr == self.mac && reply.kind.is_some_and(|k| kinds.contains(&k)) {
                return Ok(Some(reply));
            }
        }
    }
}

/// A transaction id: random enough that answers to another client or an older try are told apart.
fn new_xid() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(Instant::now().elapsed().as_nanos());
    h.finish() as u32
}

/// What a lease sends besides the message type: client id, provided options, request list.
#[derive(Debug, Clone)]
pub struct Identity {
    pub client_id: Vec<u8>,
    pub request: Vec<u8>,
    pub provide: Vec<(u8, Vec<u8>)>,
}

impl Identity {
    /// The client identifier option: type 0 and the id, as the reference sends it, unless the
    /// configuration provides its own.
    fn client_id_option(&self) -> (u8, Vec<u8>) {
        match self.provide.iter().find(|(c, _)| *c == opt::CLIENT_ID) {
            Some((c, v)) => (*c, v.clone()),
            None => {
                let mut v = vec![0u8];
                v.extend_from_slice(&self.client_id);
                (opt::CLIENT_ID, v)
            }
        }
    }

    fn options(&self, extra: Vec<(u8, Vec<u8>)>) -> Vec<(u8, Vec<u8>)> {
        let mut o = extra;
        o.push(self.client_id_option());
        o.extend(self.provide.iter().filter(|(c, _)| *c != opt::CLIENT_ID).cloned());
        if !self.request.is_empty() {
            o.push((opt::PARAMETER_LIST, self.request.clone()));
        }
        o
    }
}

fn answer_or_nak(reply: Reply, what: &str) -> Result<Reply, Failure> {
    if reply.kind == Some(MessageType::Nak) {
        return Err(Failure::Nak(format!("the server {} refused the {what} (DHCPNAK)", fmt_server(&reply))));
    }
    Ok(reply)
}

fn fmt_server(r: &Reply) -> String {
    r.server_id.map_or_else(|| "(no server id)".to_string(), |s| s.to_string())
}

/// DISCOVER, OFFER, REQUEST, ACK: a new lease.
pub fn acquire(conn: &Conn, id: &Identity, settings: &Settings) -> Result<Reply, Failure> {
    let xid = new_xid();
    let mut msg = Outgoing {
        kind: MessageType::Discover,
        xid,
        mac: conn.mac,
        broadcast: settings.broadcast,
        ciaddr: Ipv4Addr::UNSPECIFIED,
        options: id.options(Vec::new()),
    };
    let offer = conn.exchange(&msg, Ipv4Addr::BROADCAST, &[MessageType::Offer], settings.timeout)?;
    let (Some(addr), Some(server)) = (offer.yiaddr, offer.server_id) else {
        return Err(Failure::Other(format!("DHCPOFFER on {} without an address or a server identifier", conn.ifname)));
    };
    msg.kind = MessageType::Request;
    msg.options =
        id.options(vec![(opt::REQUESTED_IP, addr.octets().to_vec()), (opt::SERVER_ID, server.octets().to_vec())]);
    let ack = conn.exchange(&msg, Ipv4Addr::BROADCAST, &[MessageType::Ack, MessageType::Nak], settings.timeout)?;
    let ack = answer_or_nak(ack, "address it offered")?;
    if ack.yiaddr.is_none() {
        return Err(Failure::Other(format!("DHCPACK from {} on {} without an address", fmt_server(&ack), conn.ifname)));
    }
    Ok(ack)
}

/// A REQUEST for the address held: unicast to the server at T1 (RENEWING), broadcast after T2
/// (REBINDING, `server` None).
pub fn extend(
    conn: &Conn,
    id: &Identity,
    settings: &Settings,
    addr: Ipv4Addr,
    server: Option<Ipv4Addr>,
) -> Result<Reply, Failure> {
    let xid = new_xid();
    let msg = Outgoing {
        kind: MessageType::Request,
        xid,
        mac: conn.mac,
        broadcast: settings.broadcast,
        ciaddr: addr,
        options: id.options(Vec::new()),
    };
    let to = server.unwrap_or(Ipv4Addr::BROADCAST);
    let ack = conn.exchange(&msg, to, &[MessageType::Ack, MessageType::Nak], settings.timeout)?;
    let ack = answer_or_nak(ack, "renewal")?;
    if ack.yiaddr != Some(addr) {
        return Err(Failure::Nak(format!(
            "the server {} answered the renewal of {addr} with {}",
            fmt_server(&ack),
            ack.yiaddr.map_or_else(|| "no address".to_string(), |a| a.to_string())
        )));
    }
    Ok(ack)
}

/// DHCPRELEASE of `addr` to `server` (no answer comes).
pub fn release(conn: &Conn, id: &Identity, addr: Ipv4Addr, server: Ipv4Addr) -> Result<(), Failure> {
    let msg = Outgoing {
        kind: MessageType::Release,
        xid: new_xid(),
        mac: conn.mac,
        broadcast: false,
        ciaddr: addr,
        options: vec![(opt::SERVER_ID, server.octets().to_vec()), id.client_id_option()],
    };
    conn.send(&msg, server)
}

/// Runs `attempt` until it succeeds, as the reference retries: four quick retries about 2 s apart,
/// then waits of 4 s doubling up to `resend_max`, then gives up. A `Gone` or `Nak` failure is
/// final at once.
pub fn with_retries<T>(
    settings: &Settings,
    mut attempt: impl FnMut() -> Result<T, Failure>,
    stop: &dyn Fn() -> bool,
) -> Result<T, Failure> {
    let mut fast = 4;
    let mut delay = Duration::from_secs(4);
    loop {
        let err = match attempt() {
            Ok(v) => return Ok(v),
            Err(e @ (Failure::Gone(_) | Failure::Nak(_))) => return Err(e),
            Err(e) => e,
        };
        let wait = if fast > 0 {
            fast -= 1;
            Duration::from_secs(2)
        } else if delay <= settings.resend_max {
            let d = delay;
            delay *= 2;
            d
        } else {
            return Err(Failure::Other(format!("{err} (gave up after retrying up to -resendmax)")));
        };
        eprintln!("dhcp: {err}; retrying in {} s", wait.as_secs());
        let until = Instant::now() + wait;
        while Instant::now() < until {
            if stop() {
                return Err(err);
            }
            std::thread::sleep(Duration::from_millis(100).min(until.saturating_duration_since(Instant::now())));
        }
    }
}

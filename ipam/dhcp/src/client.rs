//! The DHCP client the daemon runs for each lease: the sockets are made inside the pod's network
//! namespace (they stay bound to it afterwards, so the thread returns to the host namespace at once)
//! and closed after each exchange, so a lease never keeps a vanished pod's namespace alive.
//!
//! Messages go out through a UDP socket bound to the pod's interface (port 68, broadcast allowed):
//! the kernel sends a limited broadcast on a bound interface even before it has an address. Answers
//! are read from a packet socket on the interface, which sees them whether the server broadcasts or
//! unicasts to the offered address (not yet configured, so the kernel's UDP would drop it).

use crate::packet::{self, opt, MessageType, Outgoing, Reply, CLIENT_PORT, SERVER_PORT};
use libcni::Result;
use netkit::netns::NetNs;
use netkit::Netlink;
use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{self, sockopt, AddressFamily, MsgFlags, SockFlag, SockProtocol, SockType, SockaddrIn};
use std::ffi::OsString;
use std::io;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
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

/// The pod's interface as the kernel lists it (RTM_GETLINK through netkit): its index and MAC,
/// brought up if it is down, as the reference does (a macvlan or bridge pod interface may still
/// be down when IPAM runs). `Failure::Gone` when there is no such interface.
fn pod_link(ifname: &str) -> Result<(u32, [u8; 6]), Failure> {
    let what = || format!("interface {ifname} in the pod");
    let nl = Netlink::open().map_err(|e| Failure::Other(format!("{}: {}", what(), e.msg)))?;
    let link = match nl.link(ifname) {
        Ok(Some(link)) => link,
        Ok(None) => return Err(Failure::Gone(format!("{}: no such interface", what()))),
        Err(e) => return Err(Failure::Other(format!("{}: {}", what(), e.msg))),
    };
    let Some(mac) = link.mac else {
        return Err(Failure::Other(format!("{}: it has no Ethernet address", what())));
    };
    if !link.up {
        nl.set_up(link.index).map_err(|e| Failure::Other(format!("set {ifname} up: {}", e.msg)))?;
    }
    Ok((link.index, mac.into()))
}

/// Makes the sockets inside the current namespace.
fn open_here(ifname: &str) -> Result<Conn, Failure> {
    let (ifindex, mac) = pod_link(ifname)?;
    let fail = |what: String| move |e: Errno| Failure::Other(format!("{what}: {}", io::Error::from(e)));

    let udp = socket::socket(AddressFamily::Inet, SockType::Datagram, SockFlag::SOCK_CLOEXEC, None)
        .map_err(fail("socket(AF_INET)".into()))?;
    socket::setsockopt(&udp, sockopt::ReuseAddr, &true).map_err(fail("SO_REUSEADDR".into()))?;
    socket::setsockopt(&udp, sockopt::Broadcast, &true).map_err(fail("SO_BROADCAST".into()))?;
    socket::setsockopt(&udp, sockopt::BindToDevice, &OsString::from(ifname))
        .map_err(fail(format!("SO_BINDTODEVICE {ifname}")))?;
    socket::bind(udp.as_raw_fd(), &SockaddrIn::new(0, 0, 0, 0, CLIENT_PORT))
        .map_err(fail(format!("bind UDP port {CLIENT_PORT} on {ifname}")))?;
    let udp = UdpSocket::from(udp);

    let packet = socket::socket(AddressFamily::Packet, SockType::Datagram, SockFlag::SOCK_CLOEXEC, SockProtocol::EthIp)
        .map_err(fail("socket(AF_PACKET)".into()))?;
    bind_packet(&packet, ifindex).map_err(fail(format!("bind a packet socket to {ifname}")))?;
    Ok(Conn { udp, packet, mac, ifname: ifname.to_string() })
}

/// Binds a packet socket to IPv4 frames on interface `ifindex`: nix has no way to build a
/// `sockaddr_ll`.
fn bind_packet(fd: &OwnedFd, ifindex: u32) -> Result<(), Errno> {
    // SAFETY: sockaddr_ll is plain old data; all zeroes is a valid value.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_protocol = (libc::ETH_P_IP as u16).to_be();
    sll.sll_ifindex = i32::try_from(ifindex).map_err(|_| Errno::ENODEV)?;
    // SAFETY: sll is a valid sockaddr_ll of the length given; the descriptor is borrowed, so open.
    let rc = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&sll as *const libc::sockaddr_ll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    };
    Errno::result(rc).map(drop)
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
            let ms = PollTimeout::try_from(left.as_millis().max(1)).unwrap_or(PollTimeout::MAX);
            match poll(&mut [PollFd::new(self.packet.as_fd(), PollFlags::POLLIN)], ms) {
                Ok(0) | Err(Errno::EINTR) => continue,
                Ok(_) => {}
                Err(e) => {
                    return Err(Failure::Other(format!(
                        "poll the packet socket on {}: {}",
                        self.ifname,
                        io::Error::from(e)
                    )))
                }
            }
            let len = match socket::recv(self.packet.as_raw_fd(), &mut buf, MsgFlags::empty()) {
                Ok(len) => len,
                Err(e @ (Errno::ENETDOWN | Errno::ENODEV)) => {
                    return Err(Failure::Gone(format!("interface {} went away: {}", self.ifname, io::Error::from(e))))
                }
                Err(_) => continue,
            };
            let Some(reply) = packet::udp_payload_to_client(&buf[..len]).and_then(Reply::parse) else {
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

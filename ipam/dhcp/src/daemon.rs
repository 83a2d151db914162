//! `dhcp daemon`: holds the leases of every pod on the node behind a unix socket (mode 0600), renews
//! them at T1 (unicast to the server, no sooner than [`RENEWAL_FLOOR`]) and after T2 (broadcast,
//! REBINDING), and releases them on DEL. One thread per lease; a lease whose pod namespace or
//! interface has vanished is dropped at its next renewal, and the daemon keeps serving the others.
//!
//! The command line is the reference's, Go `flag` style: `-socketpath P`, `-pidfile F`,
//! `-hostprefix P`, `-broadcast`, `-timeout 10s`, `-resendmax 1m2s`, each also as `--name`,
//! `-name=value` or `--name=value`.

use crate::client::{self, Conn, Failure, Identity, Settings};
use crate::config::DEFAULT_SOCKET;
use crate::packet::Reply;
use crate::proto::{self, Answer, Call, LeaseInfo, LeaseKey, LeaseRequest, RouteInfo};
use libcni::{code, Error, Result};
use netkit::netns::NetNs;
use std::collections::HashMap;
use std::io::Write;
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    pub socket_path: PathBuf,
    pub pidfile: Option<PathBuf>,
    pub host_prefix: String,
    pub settings: Settings,
}

const USAGE: &str = "usage: dhcp daemon [-socketpath PATH] [-pidfile PATH] [-hostprefix PREFIX] [-broadcast] \
                     [-timeout DURATION] [-resendmax DURATION]
  -socketpath  the unix socket to listen on (default /run/cni/dhcp.sock; -hostprefix is prepended)
  -pidfile     write the daemon's pid there (an absolute path)
  -hostprefix  prefix of the host's root, for a daemon in a container: prepended to the socket path
               and to every pod's netns path
  -broadcast   ask DHCP servers to broadcast their answers
  -timeout     how long one DHCP exchange waits for an answer (default 10s)
  -resendmax   the longest wait between retries before a lease attempt gives up (default 1m2s)";

/// A Go duration: a sequence of decimal numbers with units (`ns`, `us`/`µs`, `ms`, `s`, `m`, `h`),
/// e.g. `10s`, `1m2s`, `1.5h`; `0` alone. Negative durations are refused (they make no sense here).
pub fn parse_duration(text: &str) -> Option<Duration> {
    if text == "0" {
        return Some(Duration::ZERO);
    }
    let mut rest = text.strip_prefix('+').unwrap_or(text);
    if rest.is_empty() {
        return None;
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let num_end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        let (num, tail) = rest.split_at(num_end);
        if num.is_empty() || num == "." || num.matches('.').count() > 1 {
            return None;
        }
        let value: f64 = num.parse().ok()?;
        let unit_end = tail.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_end);
        let scale = match unit {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        total += value * scale;
        rest = tail;
    }
    Duration::try_from_secs_f64(total).ok()
}

/// Go `flag` parsing of the daemon's arguments (after `daemon`). Err holds the message; `Ok(None)`
/// means help was asked for.
pub fn parse_args(args: &[String]) -> Result<Option<Options>> {
    let mut o = Options {
        socket_path: PathBuf::new(),
        pidfile: None,
        host_prefix: String::new(),
        settings: Settings::default(),
    };
    let mut socket = String::new();
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        i += 1;
        if arg == "--" {
            break;
        }
        let Some(flag) = arg.strip_prefix("--").or_else(|| arg.strip_prefix('-')).filter(|f| !f.is_empty()) else {
            // Go's flag package stops at the first non-flag argument; the reference ignores the rest.
            break;
        };
        if flag.starts_with('-') || flag.starts_with('=') {
            return Err(Error::config(format!("bad flag syntax: {arg}")));
        }
        let (name, inline) = match flag.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            None => (flag, None),
        };
        if name == "h" || name == "help" {
            return Ok(None);
        }
        if name == "broadcast" {
            o.settings.broadcast = match inline.as_deref() {
                None => true,
                Some("1" | "t" | "T" | "true" | "TRUE" | "True") => true,
                Some("0" | "f" | "F" | "false" | "FALSE" | "False") => false,
                Some(v) => return Err(Error::config(format!("invalid boolean value {v:?} for -broadcast"))),
            };
            continue;
        }
        if !matches!(name, "socketpath" | "pidfile" | "hostprefix" | "timeout" | "resendmax") {
            return Err(Error::config(format!("flag provided but not defined: -{name}")));
        }
        let value = match inline {
            Some(v) => v,
            None => {
                let v = args.get(i).ok_or_else(|| Error::config(format!("flag needs an argument: -{name}")))?.clone();
                i += 1;
                v
            }
        };
        match name {
            "socketpath" => socket = value,
            "pidfile" => o.pidfile = (!value.is_empty()).then(|| PathBuf::from(value)),
            "hostprefix" => o.host_prefix = value,
            "timeout" | "resendmax" => {
                let d = parse_duration(&value).ok_or_else(|| {
                    Error::config(format!("invalid value {value:?} for flag -{name}: a duration such as 10s or 1m2s"))
                })?;
                if name == "timeout" {
                    o.settings.timeout = d;
                } else {
                    o.settings.resend_max = d;
                }
            }
            _ => {}
        }
    }
    if socket.is_empty() {
        socket = DEFAULT_SOCKET.to_string();
    }
    if let Some(p) = &o.pidfile {
        if !p.is_absolute() {
            return Err(Error::config(format!(
                "Error writing pidfile {:?}: path not absolute",
                p.display().to_string()
            )));
        }
    }
    if o.settings.timeout.is_zero() {
        return Err(Error::config("-timeout must be above zero"));
    }
    o.socket_path = PathBuf::from(format!("{}{socket}", o.host_prefix));
    Ok(Some(o))
}

/// The soonest a lease is renewed after an ACK, whatever T1 the server sends: a T1 of zero (or a
/// lease of a second) would otherwise renew in a loop, a packet storm for the server and a busy
/// thread here.
pub const RENEWAL_FLOOR: Duration = Duration::from_secs(10);
/// Under the floor, rebinding and expiry keep at least this far apart, so a renewal that fails is
/// tried again (rebinding) before the lease counts as expired.
const TIMER_GAP: Duration = Duration::from_secs(5);

/// A bound lease.
#[derive(Debug, Clone)]
struct Binding {
    ack: Reply,
    addr: Ipv4Addr,
    server: Ipv4Addr,
    renew_at: Instant,
    rebind_at: Instant,
    expires_at: Instant,
    /// Set when the server's timers were raised to the floor: says what it sent and what is used.
    raised: Option<String>,
}

impl Binding {
    /// The timers of RFC 2131 4.4.5: T1 defaults to half the lease, T2 to 7/8 (the reference takes
    /// 85%); a T2 beyond the lease or a T1 beyond T2 is replaced by its default. Then T1 is at
    /// least [`RENEWAL_FLOOR`], and T2 and the lease at least [`TIMER_GAP`] after the timer before.
    fn new(ack: Reply, fallback_server: Option<Ipv4Addr>) -> Result<Binding> {
        let addr = ack.yiaddr.ok_or_else(|| Error::network("DHCPACK without an address"))?;
        let server = ack
            .server_id
            .or(fallback_server)
            .ok_or_else(|| Error::network(format!("DHCPACK for {addr} without a server identifier (option 54)")))?;
        let lease = Duration::from_secs(u64::from(ack.lease_secs.unwrap_or(u32::MAX)));
        let mut t2 = ack.rebinding_secs.map(|s| Duration::from_secs(s.into())).unwrap_or(lease * 7 / 8);
        if t2 > lease {
            t2 = lease * 7 / 8;
        }
        let mut t1 = ack.renewal_secs.map(|s| Duration::from_secs(s.into())).unwrap_or(lease / 2);
        if t1 > t2 {
            t1 = lease / 2;
        }
        let (sent_t1, sent_t2, sent_lease) = (t1, t2, lease);
        let t1 = t1.max(RENEWAL_FLOOR);
        let t2 = t2.max(t1 + TIMER_GAP);
        let lease = lease.max(t2 + TIMER_GAP);
        let raised = (t1, t2, lease) != (sent_t1, sent_t2, sent_lease);
        let raised = raised.then(|| {
            format!(
                "the server {server} gave {addr} renewal (T1) {} s, rebinding (T2) {} s, lease {} s; renewing no \
                 sooner than {} s: renewal at {} s, rebinding at {} s, expiry at {} s",
                sent_t1.as_secs(),
                sent_t2.as_secs(),
                sent_lease.as_secs(),
                RENEWAL_FLOOR.as_secs(),
                t1.as_secs(),
                t2.as_secs(),
                lease.as_secs()
            )
        });
        let now = Instant::now();
        // A lease of "infinity" (0xffffffff) is never renewed; the far future stands for it.
        let far = |d: Duration| now.checked_add(d).unwrap_or(now + Duration::from_secs(100 * 365 * 86400));
        Ok(Binding { addr, server, renew_at: far(t1), rebind_at: far(t2), expires_at: far(lease), ack, raised })
    }

    fn info(&self, suppress_gateway: bool) -> Result<LeaseInfo> {
        let mask = self.ack.subnet_mask.ok_or_else(|| {
            Error::network(format!("the server {} sent no subnet mask (option 1) for {}", self.server, self.addr))
        })?;
        let bits = u32::from(mask);
        let prefix = bits.leading_ones() as u8;
        if bits.checked_shl(prefix.into()).unwrap_or(0) != 0 {
            return Err(Error::network(format!("the server {} sent a non-contiguous subnet mask {mask}", self.server)));
        }
        let gateway = if suppress_gateway { None } else { self.ack.routers.first().copied() };
        let route = |r: &crate::packet::StaticRoute| RouteInfo { dst: r.dst, prefix: r.prefix, gw: r.gw };
        // RFC 3442: with classless routes, the router option and static routes are ignored.
        let mut routes: Vec<RouteInfo> = if !self.ack.classless_routes.is_empty() {
            self.ack.classless_routes.iter().map(route).collect()
        } else {
            let mut r: Vec<RouteInfo> = self.ack.static_routes.iter().map(route).collect();
            if let Some(gw) = gateway {
                r.push(RouteInfo { dst: Ipv4Addr::UNSPECIFIED, prefix: 0, gw: Some(gw) });
            }
            r
        };
        if suppress_gateway {
            routes.retain(|r| r.prefix != 0);
        }
        Ok(LeaseInfo {
            address: self.addr,
            prefix,
            gateway,
            routes,
            nameservers: self.ack.dns.clone(),
            domain: self.ack.domain.clone(),
            server: self.server,
            expires_in: self.expires_at.saturating_duration_since(Instant::now()).as_secs(),
        })
    }
}

enum Command {
    /// Send DHCPRELEASE and stop; the sender is told when it is done.
    Release(mpsc::Sender<()>),
}

struct Handle {
    id: u64,
    key: LeaseKey,
    suppress_gateway: bool,
    binding: Arc<Mutex<Binding>>,
    commands: mpsc::Sender<Command>,
}

type Leases = Arc<Mutex<HashMap<Vec<u8>, Handle>>>;

pub struct Daemon {
    leases: Leases,
    /// Client ids with an acquisition under way: a second ADD for one of them (a runtime retrying
    /// a slow ADD) is told to try again instead of starting a second lease that nothing would release.
    acquiring: Mutex<std::collections::HashSet<Vec<u8>>>,
    settings: Settings,
    host_prefix: String,
    next_id: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A thread that panicked while holding the lock cannot have left the map half-changed (each
    // change is one insert or remove), so its poison is ignored.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn error(code: u32, msg: impl Into<String>) -> Answer {
    Answer::Error { code, msg: msg.into() }
}

impl Daemon {
    pub fn new(settings: Settings, host_prefix: String) -> Daemon {
        Daemon {
            leases: Arc::default(),
            acquiring: Mutex::default(),
            settings,
            host_prefix,
            next_id: AtomicU64::new(1),
        }
    }

    pub fn handle(&self, call: Call) -> Answer {
        match call {
            Call::Allocate(req) => self.allocate(req),
            Call::Check { key } => match lock(&self.leases).get(&key.client_id()) {
                Some(h) => match lock(&h.binding).info(h.suppress_gateway) {
                    Ok(info) => Answer::Lease(info),
                    Err(e) => error(e.code, e.msg),
                },
                None => Answer::NoLease,
            },
            Call::Release { key } => {
                let handle = lock(&self.leases).remove(&key.client_id());
                if let Some(h) = handle {
                    self.stop(h);
                }
                Answer::Done
            }
            Call::Gc { network, keep } => {
                let stale: Vec<Handle> = {
                    let mut leases = lock(&self.leases);
                    let ids: Vec<Vec<u8>> = leases
                        .iter()
                        .filter(|(_, h)| h.key.network == network && !keep.contains(&h.key))
                        .map(|(id, _)| id.clone())
                        .collect();
                    ids.iter().filter_map(|id| leases.remove(id)).collect()
                };
                for h in stale {
                    eprintln!("dhcp: GC releases the lease of {}", h.key.display());
                    self.stop(h);
                }
                Answer::Done
            }
            Call::Status => Answer::Done,
        }
    }

    /// Tells a lease's thread to release and waits for it (bounded: a DEL must not hang on a slow
    /// exchange).
    fn stop(&self, h: Handle) {
        let (done, wait) = mpsc::channel();
        if h.commands.send(Command::Release(done)).is_ok() {
            let _ = wait.recv_timeout(self.settings.timeout + Duration::from_secs(1));
        }
    }

    fn allocate(&self, req: LeaseRequest) -> Answer {
        let client_id = req.key.client_id();
        {
            let mut acquiring = lock(&self.acquiring);
            if let Some(h) = lock(&self.leases).get(&client_id) {
                return match lock(&h.binding).info(h.suppress_gateway) {
                    Ok(info) => Answer::Lease(info),
                    Err(e) => error(e.code, e.msg),
                };
            }
            if !acquiring.insert(client_id.clone()) {
                return error(
                    libcni::code::TRY_AGAIN,
                    format!("a lease for {} is being acquired by an earlier ADD; try again", req.key.display()),
                );
            }
        }
        let answer = self.acquire(req, client_id.clone());
        lock(&self.acquiring).remove(&client_id);
        answer
    }

    /// A new lease for `req` and the thread that keeps it, registered under `client_id`.
    fn acquire(&self, req: LeaseRequest, client_id: Vec<u8>) -> Answer {
        let netns = PathBuf::from(format!("{}{}", self.host_prefix, req.netns));
        let identity =
            Identity { client_id: client_id.clone(), request: req.request.clone(), provide: req.provide.clone() };
        let settings = self.settings;
        let ifname = req.key.ifname.clone();
        // Whoever can reach the socket names the path: only a network namespace is ever opened and
        // entered, anything else is refused at once (code 4), before any retry.
        // (A path that does not exist is left to the attempt below, which reports it gone.)
        match NetNs::open(&netns) {
            Err(e) if !netkit::is_not_found(&e) => {
                return error(e.code, format!("no DHCP lease for {} on {ifname}: {}", req.key.display(), e.msg))
            }
            // The daemon's own namespace is the node's (or its container's): a DHCP client there
            // would bring up and lease an address for the node's own interface.
            Ok(ns) => match ns.same_as_current() {
                Ok(false) => {}
                Ok(true) => {
                    return error(
                        libcni::code::INVALID_ENV,
                        format!(
                            "no DHCP lease for {} on {ifname}: {} is the dhcp daemon's own network namespace, \
                             not a pod's: refused, nothing sent or changed there (CNI_NETNS must be the pod's)",
                            req.key.display(),
                            netns.display()
                        ),
                    )
                }
                Err(e) => {
                    return error(e.code, format!("no DHCP lease for {} on {ifname}: {}", req.key.display(), e.msg))
                }
            },
            Err(_) => {}
        }
        let ack = client::with_retries(
            &settings,
            || {
                let conn = Conn::open(&netns, &ifname)?;
                client::acquire(&conn, &identity, &settings)
            },
            &|| false,
        );
        let ack = match ack {
            Ok(a) => a,
            Err(e) => {
                return error(
                    libcni::code::NETWORK,
                    format!("no DHCP lease for {} on {ifname} in {}: {e}", req.key.display(), netns.display()),
                )
            }
        };
        let binding = match Binding::new(ack, None) {
            Ok(b) => b,
            Err(e) => return error(e.code, format!("lease for {}: {e}", req.key.display())),
        };
        let info = match binding.info(req.suppress_gateway) {
            Ok(i) => i,
            Err(e) => return error(e.code, format!("lease for {}: {e}", req.key.display())),
        };
        if let Some(raised) = &binding.raised {
            eprintln!("dhcp: {}: {raised}", req.key.display());
        }
        eprintln!(
            "dhcp: {}: leased {}/{} from {} for {} s",
            req.key.display(),
            info.address,
            info.prefix,
            info.server,
            info.expires_in
        );
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let binding = Arc::new(Mutex::new(binding));
        let (tx, rx) = mpsc::channel();
        let lease = Maintainer {
            id,
            client_id: client_id.clone(),
            name: req.key.display(),
            netns,
            ifname,
            identity,
            settings,
            binding: binding.clone(),
            leases: self.leases.clone(),
        };
        if let Err(e) = std::thread::Builder::new().name("lease".into()).spawn(move || lease.run(rx)) {
            return error(libcni::code::INTERNAL, format!("start the renewal thread for {}: {e}", req.key.display()));
        }
        lock(&self.leases).insert(
            client_id,
            Handle { id, key: req.key, suppress_gateway: req.suppress_gateway, binding, commands: tx },
        );
        Answer::Lease(info)
    }
}

/// The thread that keeps one lease: renews, rebinds, releases.
struct Maintainer {
    id: u64,
    client_id: Vec<u8>,
    name: String,
    netns: PathBuf,
    ifname: String,
    identity: Identity,
    settings: Settings,
    binding: Arc<Mutex<Binding>>,
    leases: Leases,
}

impl Maintainer {
    fn run(self, commands: mpsc::Receiver<Command>) {
        loop {
            let b = lock(&self.binding).clone();
            let now = Instant::now();
            let wait = if now < b.renew_at {
                b.renew_at - now
            } else if now >= b.expires_at {
                eprintln!("dhcp: {}: lease of {} expired without renewal; dropping it", self.name, b.addr);
                return self.forget();
            } else {
                let rebinding = now >= b.rebind_at;
                let server = (!rebinding).then_some(b.server);
                let outcome = Conn::open(&self.netns, &self.ifname)
                    .and_then(|conn| client::extend(&conn, &self.identity, &self.settings, b.addr, server));
                match outcome {
                    Ok(ack) => match Binding::new(ack, Some(b.server)) {
                        Ok(nb) => {
                            if let Some(raised) = &nb.raised {
                                eprintln!("dhcp: {}: {raised}", self.name);
                            }
                            eprintln!(
                                "dhcp: {}: renewed {} until {} s from now",
                                self.name,
                                nb.addr,
                                nb.expires_at.saturating_duration_since(Instant::now()).as_secs()
                            );
                            *lock(&self.binding) = nb;
                            continue;
                        }
                        Err(e) => {
                            eprintln!("dhcp: {}: {e}", self.name);
                            retry_wait(now, if rebinding { b.expires_at } else { b.rebind_at })
                        }
                    },
                    Err(Failure::Gone(e)) => {
                        eprintln!("dhcp: {}: the pod is gone ({e}); dropping its lease of {}", self.name, b.addr);
                        return self.forget();
                    }
                    Err(Failure::Nak(e)) => {
                        eprintln!("dhcp: {}: {e}; dropping the lease of {}", self.name, b.addr);
                        return self.forget();
                    }
                    Err(Failure::Other(e)) => {
                        eprintln!(
                            "dhcp: {}: {} failed: {e}",
                            self.name,
                            if rebinding { "rebinding" } else { "renewal" }
                        );
                        retry_wait(now, if rebinding { b.expires_at } else { b.rebind_at })
                    }
                }
            };
            match commands.recv_timeout(wait) {
                Ok(Command::Release(done)) => {
                    self.release(&b);
                    let _ = done.send(());
                    return;
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                // The daemon dropped the handle without a release (it never does): stop quietly.
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            }
        }
    }

    fn release(&self, b: &Binding) {
        match Conn::open(&self.netns, &self.ifname)
            .and_then(|conn| client::release(&conn, &self.identity, b.addr, b.server))
        {
            Ok(()) => eprintln!("dhcp: {}: released {} to {}", self.name, b.addr, b.server),
            Err(e) => eprintln!(
                "dhcp: {}: could not send DHCPRELEASE for {} ({e}); the server frees it when the lease expires",
                self.name, b.addr
            ),
        }
    }

    /// Drops this lease from the map, unless a newer lease for the same client took its place.
    fn forget(&self) {
        let mut leases = lock(&self.leases);
        if leases.get(&self.client_id).is_some_and(|h| h.id == self.id) {
            leases.remove(&self.client_id);
        }
    }
}

/// RFC 2131 4.4.5: after a failed renewal, wait half the time left until `limit`, at least a second.
fn retry_wait(now: Instant, limit: Instant) -> Duration {
    (limit.saturating_duration_since(now) / 2).max(Duration::from_secs(1))
}

/// The status line answering the reference plugin's Go net/rpc handshake (`CONNECT /_goRPC_`): Go's
/// `rpc.DialHTTP` puts it in its error, so the kubelet's log says what is wrong.
const NOT_GO_RPC: &str = "HTTP/1.0 400 this is the cni-rs dhcp daemon, which does not speak Go net/rpc: \
                          use the cni-rs dhcp plugin with it\n\n";

/// How long a caller has to send its whole call, and the daemon to write its answer: the plugin
/// writes its call as soon as it connects, so only a stuck or hostile caller takes longer, and it
/// must not keep a thread (or the daemon, at the process's thread limit) forever.
pub const CALL_DEADLINE: Duration = Duration::from_secs(10);

/// Reads from a stream until a deadline for the whole read, not for each `read`: a caller that
/// trickles a byte at a time is cut off as one that sends nothing.
struct ReadBefore<'a> {
    stream: &'a UnixStream,
    deadline: Instant,
}

impl std::io::Read for ReadBefore<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        self.stream.set_read_timeout(Some(left))?;
        let mut stream = self.stream;
        stream.read(buf).map_err(|e| match e.kind() {
            std::io::ErrorKind::WouldBlock => std::io::ErrorKind::TimedOut.into(),
            _ => e,
        })
    }
}

fn serve_connection(daemon: &Daemon, mut stream: UnixStream) {
    if let Err(e) = stream.set_write_timeout(Some(CALL_DEADLINE)) {
        eprintln!("dhcp: set a write timeout on a call's connection: {e}; closing it");
        return;
    }
    let answer = match proto::read_line(ReadBefore { stream: &stream, deadline: Instant::now() + CALL_DEADLINE }) {
        Ok(line) if line.starts_with("CONNECT ") => {
            let _ = stream.write_all(NOT_GO_RPC.as_bytes());
            return;
        }
        Ok(line) => match serde_json::from_str::<Call>(&line) {
            Ok(call) => daemon.handle(call),
            Err(e) => error(libcni::code::DECODE, format!("the dhcp daemon could not read the call: {e}")),
        },
        Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
            let secs = CALL_DEADLINE.as_secs();
            eprintln!("dhcp: a caller sent no complete call within {secs} s; closing its connection");
            error(libcni::code::IO, format!("the dhcp daemon got no complete call within {secs} s"))
        }
        Err(e) => error(libcni::code::IO, format!("the dhcp daemon could not read the call: {e}")),
    };
    if let Ok(mut text) = serde_json::to_string(&answer) {
        text.push('\n');
        let _ = stream.write_all(text.as_bytes());
    }
}

/// The listening socket: one passed by systemd socket activation (LISTEN_FDS=1), else a new one at
/// `path` after removing a stale socket file there (one nothing listens on). A live daemon's
/// socket or a file that is not a socket is left alone and is an error.
fn listen(path: &Path) -> Result<(UnixListener, bool)> {
    let pid_matches = std::env::var("LISTEN_PID").ok().and_then(|p| p.parse::<u32>().ok()) == Some(std::process::id());
    if pid_matches {
        match std::env::var("LISTEN_FDS").ok().and_then(|n| n.parse::<u32>().ok()) {
            Some(1) => {
                use std::os::fd::FromRawFd;
                // SAFETY: systemd passes the listening socket as fd 3 (SD_LISTEN_FDS_START); it is
                // ours from here on.
                let listener = unsafe { UnixListener::from_raw_fd(3) };
                // SAFETY: fcntl on an fd we own.
                unsafe { libc::fcntl(3, libc::F_SETFD, libc::FD_CLOEXEC) };
                return Ok((listener, true));
            }
            Some(0) | None => {}
            Some(n) => return Err(Error::env(format!("Too many ({n}) FDs passed through socket activation"))),
        }
    }
    if let Some(dir) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| Error::io(format_args!("create the socket's directory {}", dir.display()), &e))?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            if UnixStream::connect(path).is_ok() {
                return Err(Error::new(code::IO, format!("another dhcp daemon already listens on {}", path.display())));
            }
            std::fs::remove_file(path)
                .map_err(|e| Error::io(format_args!("remove the stale socket {}", path.display()), &e))?;
            eprintln!("dhcp: removed the stale socket {}", path.display());
        }
        Ok(_) => {
            return Err(Error::config(format!(
                "{} exists and is not a socket: remove it or pick another -socketpath",
                path.display()
            )))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(Error::io(path.display(), &e)),
    }
    let listener = bind_private(path).map_err(|e| Error::io(format_args!("listen on {}", path.display()), &e))?;
    Ok((listener, false))
}

/// A listening socket at `path` that only the daemon's user can connect to (mode 0600, whatever
/// the umask): whoever connects names a namespace path the daemon enters and an interface it
/// brings up. The mode is set between bind and listen, so no connection is accepted before it
/// holds (a connect to a socket not yet listening is refused).
fn bind_private(path: &Path) -> std::io::Result<UnixListener> {
    use std::os::fd::{FromRawFd, OwnedFd};
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::PermissionsExt;
    // SAFETY: sockaddr_un is plain old data; all zeroes is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    let bytes = path.as_os_str().as_bytes();
    // One byte stays zero: the path is NUL-terminated.
    if bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("a unix socket path holds at most {} bytes and no NUL", addr.sun_path.len() - 1),
        ));
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (dst, src) in addr.sun_path.iter_mut().zip(bytes) {
        *dst = *src as libc::c_char;
    }
    // SAFETY: plain socket(2); the fd is owned right away.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh socket we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let len = std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1;
    // SAFETY: addr is a valid sockaddr_un and len does not exceed its size.
    if unsafe { libc::bind(fd.as_raw_fd(), (&addr as *const libc::sockaddr_un).cast(), len as libc::socklen_t) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let listening = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).and_then(|()| {
        // SAFETY: listen(2) on a socket we own.
        if unsafe { libc::listen(fd.as_raw_fd(), 128) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    });
    if let Err(e) = listening {
        let _ = std::fs::remove_file(path);
        return Err(e);
    }
    Ok(UnixListener::from(fd))
}

/// Runs the daemon until SIGTERM or SIGINT, which remove the socket (unless systemd made it) and the
/// pidfile. The leases are not released on exit, as with the reference: the pods keep their
/// addresses until the servers' leases expire, and a restarted daemon answers DEL for them with
/// success.
pub fn run(o: Options) -> Result<()> {
    use nix::sys::signal::{SigSet, Signal};
    let mut signals = SigSet::empty();
    signals.add(Signal::SIGTERM);
    signals.add(Signal::SIGINT);
    signals
        .thread_block()
        .map_err(|e| Error::new(code::IO, format!("block SIGTERM/SIGINT: {e}")).with_errno(e as i32))?;

    let (listener, activated) = listen(&o.socket_path)?;
    if let Some(p) = &o.pidfile {
        std::fs::write(p, std::process::id().to_string())
            .map_err(|e| Error::io(format_args!("Error writing pidfile {:?}", p.display().to_string()), &e))?;
    }
    let cleanup_socket = (!activated).then(|| o.socket_path.clone());
    let pidfile = o.pidfile.clone();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let sig = signals.wait();
            if let Some(s) = &cleanup_socket {
                let _ = std::fs::remove_file(s);
            }
            if let Some(p) = &pidfile {
                let _ = std::fs::remove_file(p);
            }
            eprintln!("dhcp: {} received, exiting", sig.map_or_else(|_| "signal".to_string(), |s| s.to_string()));
            std::process::exit(0);
        })
        .map_err(|e| Error::io("start the signal thread", &e))?;
    eprintln!("dhcp: daemon listening on {}", o.socket_path.display());

    let daemon = Arc::new(Daemon::new(o.settings, o.host_prefix));
    for stream in listener.incoming() {
        match stream {
            Ok(stream) => {
                let daemon = daemon.clone();
                if let Err(e) =
                    std::thread::Builder::new().name("call".into()).spawn(move || serve_connection(&daemon, stream))
                {
                    eprintln!("dhcp: cannot start a thread for a call: {e}");
                }
            }
            Err(e) => eprintln!("dhcp: accept on {}: {e}", o.socket_path.display()),
        }
    }
    Ok(())
}

/// `dhcp daemon ARGS`: the process's exit status.
pub fn main(args: &[String]) -> i32 {
    match parse_args(args) {
        Ok(None) => {
            eprintln!("{USAGE}");
            0
        }
        Ok(Some(o)) => match run(o) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("dhcp: {e}");
                1
            }
        },
        Err(e) => {
            eprintln!("dhcp daemon: {e}\n{USAGE}");
            2
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn args(a: &[&str]) -> Result<Option<Options>> {
        parse_args(&a.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn go_durations() {
        assert_eq!(parse_duration("10s"), Some(Duration::from_secs(10)));
        assert_eq!(parse_duration("1m2s"), Some(Duration::from_secs(62)));
        assert_eq!(parse_duration("1.5h"), Some(Duration::from_secs(5400)));
        assert_eq!(parse_duration("300ms"), Some(Duration::from_millis(300)));
        assert_eq!(parse_duration("2us"), Some(Duration::from_micros(2)));
        assert_eq!(parse_duration("0"), Some(Duration::ZERO));
        for bad in ["", "10", "s", "1x", "-1s", "1..2s", "1m2"] {
            assert_eq!(parse_duration(bad), None, "{bad}");
        }
    }

    #[test]
    fn reference_flags_single_and_double_dash() {
        let o = args(&[
            "-socketpath",
            "/run/x.sock",
            "-pidfile=/run/x.pid",
            "--hostprefix",
            "/host",
            "-broadcast",
            "-timeout",
            "3s",
            "--resendmax=1m2s",
        ])
        .unwrap()
        .unwrap();
        assert_eq!(o.socket_path, PathBuf::from("/host/run/x.sock"));
        assert_eq!(o.pidfile, Some(PathBuf::from("/run/x.pid")));
        assert_eq!(o.host_prefix, "/host");
        assert!(o.settings.broadcast);
        assert_eq!(o.settings.timeout, Duration::from_secs(3));
        assert_eq!(o.settings.resend_max, Duration::from_secs(62));
    }

    #[test]
    fn defaults_and_errors() {
        let o = args(&[]).unwrap().unwrap();
        assert_eq!(o.socket_path, PathBuf::from("/run/cni/dhcp.sock"));
        assert_eq!(o.settings, Settings::default());
        assert!(!args(&["-broadcast=false"]).unwrap().unwrap().settings.broadcast);
        assert!(args(&["-help"]).unwrap().is_none());
        assert!(args(&["-nope"]).unwrap_err().msg.contains("not defined: -nope"));
        assert!(args(&["-timeout"]).unwrap_err().msg.contains("needs an argument"));
        assert!(args(&["-timeout", "ten"]).unwrap_err().msg.contains("-timeout"));
        assert!(args(&["-pidfile", "rel.pid"]).unwrap_err().msg.contains("not absolute"));
        assert!(args(&["-broadcast=maybe"]).unwrap_err().msg.contains("boolean"));
    }

    fn ack(lease: u32, t1: Option<u32>, t2: Option<u32>) -> Reply {
        Reply {
            yiaddr: Some(Ipv4Addr::new(10, 0, 0, 7)),
            server_id: Some(Ipv4Addr::new(10, 0, 0, 1)),
            subnet_mask: Some(Ipv4Addr::new(255, 255, 255, 0)),
            routers: vec![Ipv4Addr::new(10, 0, 0, 1)],
            lease_secs: Some(lease),
            renewal_secs: t1,
            rebinding_secs: t2,
            ..Reply::default()
        }
    }

    #[test]
    fn timers_default_and_clamp() {
        let b = Binding::new(ack(160, None, None), None).unwrap();
        let now = Instant::now();
        let secs = |t: Instant| t.saturating_duration_since(now).as_secs_f64().round() as u64;
        assert_eq!((secs(b.renew_at), secs(b.rebind_at), secs(b.expires_at)), (80, 140, 160));
        let b = Binding::new(ack(160, Some(158), Some(155)), None).unwrap();
        assert_eq!((secs(b.renew_at), secs(b.rebind_at)), (80, 155));
        let b = Binding::new(ack(160, Some(10), Some(200)), None).unwrap();
        assert_eq!((secs(b.renew_at), secs(b.rebind_at)), (10, 140));
    }

    /// T1 of zero, T2 at or before T1, a lease of a second: renewal waits RENEWAL_FLOOR, rebinding
    /// and expiry follow TIMER_GAP apart, and the binding says what the server sent.
    #[test]
    fn timers_have_a_floor() {
        let now = Instant::now();
        let secs = |t: Instant| t.saturating_duration_since(now).as_secs_f64().round() as u64;
        for (lease, t1, t2, want) in [
            (120, Some(0), None, (10, 105, 120)),
            (120, Some(0), Some(0), (10, 15, 120)),
            (120, Some(30), Some(30), (30, 35, 120)),
            (1, None, None, (10, 15, 20)),
            (0, Some(0), Some(0), (10, 15, 20)),
            (12, Some(11), Some(11), (11, 16, 21)),
        ] {
            let b = Binding::new(ack(lease, t1, t2), None).unwrap();
            assert_eq!((secs(b.renew_at), secs(b.rebind_at), secs(b.expires_at)), want, "{lease} {t1:?} {t2:?}");
            let raised = b.raised.unwrap();
            assert!(raised.contains(&format!("lease {lease} s")) && raised.contains("no sooner than 10 s"), "{raised}");
        }
        let b = Binding::new(ack(120, Some(60), Some(105)), None).unwrap();
        assert_eq!((secs(b.renew_at), secs(b.rebind_at), secs(b.expires_at), b.raised), (60, 105, 120, None));
    }

    #[test]
    fn result_routes_follow_rfc_3442() {
        let b = Binding::new(ack(100, None, None), None).unwrap();
        let info = b.info(false).unwrap();
        assert_eq!(
            (info.address, info.prefix, info.gateway),
            (Ipv4Addr::new(10, 0, 0, 7), 24, Some(Ipv4Addr::new(10, 0, 0, 1)))
        );
        assert_eq!(
            info.routes,
            vec![RouteInfo { dst: Ipv4Addr::UNSPECIFIED, prefix: 0, gw: Some(Ipv4Addr::new(10, 0, 0, 1)) }]
        );
        assert!(b.info(true).unwrap().routes.is_empty());
        assert_eq!(b.info(true).unwrap().gateway, None);

        let mut a = ack(100, None, None);
        a.classless_routes =
            vec![crate::packet::StaticRoute { dst: Ipv4Addr::new(192, 168, 0, 0), prefix: 16, gw: None }];
        a.static_routes = vec![crate::packet::StaticRoute { dst: Ipv4Addr::new(172, 16, 0, 0), prefix: 16, gw: None }];
        let info = Binding::new(a, None).unwrap().info(false).unwrap();
        assert_eq!(info.routes, vec![RouteInfo { dst: Ipv4Addr::new(192, 168, 0, 0), prefix: 16, gw: None }]);

        let mut a = ack(100, None, None);
        a.subnet_mask = None;
        assert!(Binding::new(a, None).unwrap().info(false).unwrap_err().msg.contains("subnet mask"));
        let mut a = ack(100, None, None);
        a.subnet_mask = Some(Ipv4Addr::new(255, 0, 255, 0));
        assert!(Binding::new(a, None).unwrap().info(false).unwrap_err().msg.contains("non-contiguous"));
    }

    #[test]
    fn unknown_release_check_and_gc_succeed_without_traffic() {
        let d = Daemon::new(Settings::default(), String::new());
        let key = LeaseKey { container_id: "c".into(), network: "n".into(), ifname: "eth0".into() };
        assert_eq!(d.handle(Call::Release { key: key.clone() }), Answer::Done);
        assert_eq!(d.handle(Call::Check { key: key.clone() }), Answer::NoLease);
        assert_eq!(d.handle(Call::Gc { network: "n".into(), keep: vec![] }), Answer::Done);
        assert_eq!(d.handle(Call::Status), Answer::Done);
    }
}

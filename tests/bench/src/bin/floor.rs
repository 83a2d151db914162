//! cni-floor: the kernel work of one bridge attachment done by about the smallest program that can
//! do it, as a yardstick for the plugins. Raw rtnetlink, no runtime, no JSON, no IPAM state:
//!
//! ```text
//! cni-floor add <netns> <ifname> <host-veth> <bridge> <addr/prefix> <gateway> [nft]
//! cni-floor del <netns> <ifname> <host-veth> [nft]
//! ```
//! ADD is one request in the host namespace (veth pair with its peer created in the netns, the host
//! end already a bridge port and up) and one batch in the netns (lo up, peer up, address, default route).
//! DEL is one request in the netns (delete the peer; the kernel removes the pair). With `nft`, the
//! same masquerade and port-mapping chains as the nftables backend are added (or deleted) in one
//! `nft -f -` transaction: that is the firewall floor for a program that uses the nft tool.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::io::Write;
use std::os::fd::AsRawFd;
use std::process::{Command, Stdio};

const NLMSG_ERROR: u16 = 2;
const RTM_NEWLINK: u16 = 16;
const RTM_DELLINK: u16 = 17;
const RTM_NEWADDR: u16 = 20;
const RTM_NEWROUTE: u16 = 24;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
const NLM_F_EXCL: u16 = 0x200;
const NLM_F_CREATE: u16 = 0x400;
const IFLA_IFNAME: u16 = 3;
const IFLA_MASTER: u16 = 10;
const IFLA_LINKINFO: u16 = 18;
const IFLA_NET_NS_FD: u16 = 28;
const IFLA_INFO_KIND: u16 = 1;
const IFLA_INFO_DATA: u16 = 2;
const VETH_INFO_PEER: u16 = 1;
const IFA_LOCAL: u16 = 2;
const IFA_ADDRESS: u16 = 1;
const RTA_GATEWAY: u16 = 5;
const RTA_OIF: u16 = 4;
const NLA_F_NESTED: u16 = 0x8000;

/// A netlink request being built: header, payload and attributes, sent as one datagram.
struct NlRequest(Vec<u8>);

impl NlRequest {
    fn new(ty: u16, flags: u16, seq: u32) -> NlRequest {
        let mut b = vec![0u8; 16];
        b[4..6].copy_from_slice(&ty.to_ne_bytes());
        b[6..8].copy_from_slice(&(flags | NLM_F_REQUEST | NLM_F_ACK).to_ne_bytes());
        b[8..12].copy_from_slice(&seq.to_ne_bytes());
        NlRequest(b)
    }
    fn raw(&mut self, data: &[u8]) -> &mut Self {
        self.0.extend_from_slice(data);
        while self.0.len() % 4 != 0 {
            self.0.push(0);
        }
        self
    }
    /// struct ifinfomsg
    fn ifinfo(&mut self, index: i32, up: bool) -> &mut Self {
        let mut h = [0u8; 16];
        h[4..8].copy_from_slice(&index.to_ne_bytes());
        if up {
            h[8..12].copy_from_slice(&(libc::IFF_UP as u32).to_ne_bytes());
            h[12..16].copy_from_slice(&(libc::IFF_UP as u32).to_ne_bytes());
        }
        self.raw(&h)
    }
    fn attr(&mut self, ty: u16, data: &[u8]) -> &mut Self {
        let len = (4 + data.len()) as u16;
        self.0.extend_from_slice(&len.to_ne_bytes());
        self.0.extend_from_slice(&ty.to_ne_bytes());
        self.raw(data)
    }
    fn str_attr(&mut self, ty: u16, s: &str) -> &mut Self {
        let mut d = s.as_bytes().to_vec();
        d.push(0);
        self.attr(ty, &d)
    }
    fn begin(&mut self, ty: u16) -> usize {
        let at = self.0.len();
        self.0.extend_from_slice(&[0, 0]);
        self.0.extend_from_slice(&(ty | NLA_F_NESTED).to_ne_bytes());
        at
    }
    fn end(&mut self, at: usize) -> &mut Self {
        let len = (self.0.len() - at) as u16;
        self.0[at..at + 2].copy_from_slice(&len.to_ne_bytes());
        self
    }
    fn done(mut self) -> Vec<u8> {
        let len = self.0.len() as u32;
        self.0[0..4].copy_from_slice(&len.to_ne_bytes());
        self.0
    }
}

struct Sock(i32);

impl Sock {
    fn open() -> Sock {
        // SAFETY: plain socket(2) call.
        let fd = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, libc::NETLINK_ROUTE) };
        assert!(fd >= 0, "netlink socket: {}", std::io::Error::last_os_error());
        Sock(fd)
    }
    /// Sends all messages in one datagram and waits for one ack each.
    fn batch(&self, msgs: &[Vec<u8>], what: &str) {
        let buf: Vec<u8> = msgs.concat();
        // SAFETY: an all-zero sockaddr_nl is valid; family set below (port 0 = the kernel).
        let mut kernel: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        kernel.nl_family = libc::AF_NETLINK as u16;
        let kernel_ptr = (&kernel as *const libc::sockaddr_nl).cast::<libc::sockaddr>();
        let kernel_len = std::mem::size_of::<libc::sockaddr_nl>() as u32;
        // SAFETY: buf is a valid buffer of buf.len() bytes, kernel a valid address.
        let n = unsafe { libc::sendto(self.0, buf.as_ptr().cast(), buf.len(), 0, kernel_ptr, kernel_len) };
        assert!(n == buf.len() as isize, "{what}: send: {}", std::io::Error::last_os_error());
        let mut acks = 0;
        let mut rbuf = vec![0u8; 65536];
        while acks < msgs.len() {
            // SAFETY: rbuf is writable for its length.
            let n = unsafe { libc::recv(self.0, rbuf.as_mut_ptr().cast(), rbuf.len(), 0) };
            assert!(n > 0, "{what}: recv: {}", std::io::Error::last_os_error());
            let mut off = 0usize;
            while off + 16 <= n as usize {
                let len = u32::from_ne_bytes(rbuf[off..off + 4].try_into().unwrap()) as usize;
                let ty = u16::from_ne_bytes(rbuf[off + 4..off + 6].try_into().unwrap());
                if ty == NLMSG_ERROR {
                    let code = i32::from_ne_bytes(rbuf[off + 16..off + 20].try_into().unwrap());
                    if code != 0 {
                        panic!("{what}: {}", std::io::Error::from_raw_os_error(-code));
                    }
                    acks += 1;
                }
                off += (len + 3) & !3;
                if len == 0 {
                    break;
                }
            }
        }
    }
}

impl Drop for Sock {
    fn drop(&mut self) {
        // SAFETY: we own the fd.
        unsafe { libc::close(self.0) };
    }
}

/// Opens a netlink socket inside the namespace `ns` (the socket stays there) and, while inside,
/// the index of `ifname` there.
fn sock_in(ns: &std::fs::File, ifname: Option<&str>) -> (Sock, u32) {
    let me = std::fs::File::open("/proc/thread-self/ns/net").expect("own netns");
    // SAFETY: setns on fds we hold; the thread returns to its namespace below.
    assert_eq!(unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) }, 0, "setns");
    let s = Sock::open();
    let idx = ifname.map(index_of).unwrap_or(0);
    // SAFETY: as above.
    assert_eq!(unsafe { libc::setns(me.as_raw_fd(), libc::CLONE_NEWNET) }, 0, "setns back");
    (s, idx)
}

fn index_of(name: &str) -> u32 {
    let c = std::ffi::CString::new(name).unwrap();
    // SAFETY: c is a valid C string.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    assert!(i != 0, "no interface {name}");
    i
}

fn nft(batch: &str) {
    let mut child = Command::new("nft").args(["-f", "-"]).stdin(Stdio::piped()).spawn().expect("spawn nft");
    child.stdin.take().unwrap().write_all(batch.as_bytes()).unwrap();
    assert!(child.wait().unwrap().success(), "nft failed on:\n{batch}");
}

fn chain_names(hostveth: &str) -> [String; 5] {
    ["mq", "dnat", "pre", "out", "post"].map(|s| format!("fl-{hostveth}-{s}"))
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let usage = "usage: cni-floor add <netns> <ifname> <host-veth> <bridge> <addr/prefix> <gateway> [nft] | del <netns> <ifname> <host-veth> [nft]";
    let ns = std::fs::File::open(a.get(2).expect(usage)).expect("open netns");
    let ifname = a.get(3).expect(usage);
    let hostveth = a.get(4).expect(usage);
    match a.get(1).map(String::as_str) {
        Some("add") => {
            let bridge = a.get(5).expect(usage);
            let (addr, prefix) = a.get(6).expect(usage).split_once('/').expect("addr/prefix");
            let addr: std::net::Ipv4Addr = addr.parse().expect("IPv4 address");
            let prefix: u8 = prefix.parse().expect("prefix");
            let gw: std::net::Ipv4Addr = a.get(7).expect(usage).parse().expect("gateway");
            let with_nft = a.get(8).map(String::as_str) == Some("nft");

            let host = Sock::open();
            let mut m = NlRequest::new(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, 1);
            m.ifinfo(0, true).str_attr(IFLA_IFNAME, hostveth);
            m.attr(IFLA_MASTER, &index_of(bridge).to_ne_bytes());
            let li = m.begin(IFLA_LINKINFO);
            m.str_attr(IFLA_INFO_KIND, "veth");
            let data = m.begin(IFLA_INFO_DATA);
            let peer = m.begin(VETH_INFO_PEER);
            // The peer cannot be brought up before it is paired (veth_open: ENOTCONN): up in the netns batch.
            m.ifinfo(0, false).str_attr(IFLA_IFNAME, ifname).attr(IFLA_NET_NS_FD, &ns.as_raw_fd().to_ne_bytes());
            m.end(peer).end(data).end(li);
            host.batch(&[m.done()], "create veth");

            let (cont, idx) = sock_in(&ns, Some(ifname));
            let mut lo = NlRequest::new(RTM_NEWLINK, 0, 2);
            lo.ifinfo(1, true);
            let mut ad = NlRequest::new(RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL, 3);
            // struct ifaddrmsg: family, prefixlen, flags, scope, index
            let mut h = [0u8; 8];
            h[0] = libc::AF_INET as u8;
            h[1] = prefix;
            h[4..8].copy_from_slice(&idx.to_ne_bytes());
            ad.raw(&h).attr(IFA_LOCAL, &addr.octets()).attr(IFA_ADDRESS, &addr.octets());
            let mut rt = NlRequest::new(RTM_NEWROUTE, NLM_F_CREATE | NLM_F_EXCL, 4);
            // struct rtmsg: family, dst_len, src_len, tos, table, protocol, scope, type, flags
            let mut r = [0u8; 12];
            r[0] = libc::AF_INET as u8;
            r[4] = libc::RT_TABLE_MAIN;
            r[5] = libc::RTPROT_BOOT;
            r[6] = libc::RT_SCOPE_UNIVERSE;
            r[7] = libc::RTN_UNICAST;
            rt.raw(&r).attr(RTA_GATEWAY, &gw.octets()).attr(RTA_OIF, &idx.to_ne_bytes());
            let mut up = NlRequest::new(RTM_NEWLINK, 0, 5);
            up.ifinfo(idx as i32, true);
            cont.batch(&[lo.done(), up.done(), ad.done(), rt.done()], "configure container");

            if with_nft {
                let [mq, dnat, pre, out, post] = chain_names(hostveth);
                let net = u32::from(addr) & (u32::MAX << (32 - prefix as u32));
                let net = format!("{}/{prefix}", std::net::Ipv4Addr::from(net));
                let t = "inet cni_bench_floor";
                let port = 20000 + (u32::from(addr) & 0x3fff);
                nft(&format!(
                    "add table {t}\n\
                     add chain {t} {mq} {{ type nat hook postrouting priority 100; policy accept; }}\n\
                     add rule {t} {mq} ip saddr {addr} ip daddr != {net} ip daddr != 224.0.0.0/4 masquerade\n\
                     add chain {t} {dnat}\n\
                     add chain {t} {pre} {{ type nat hook prerouting priority -100; policy accept; }}\n\
                     add chain {t} {out} {{ type nat hook output priority -100; policy accept; }}\n\
                     add chain {t} {post} {{ type nat hook postrouting priority 100; policy accept; }}\n\
                     add rule {t} {dnat} tcp dport {port} dnat ip to {addr}:80\n\
                     add rule {t} {pre} meta nfproto ipv4 fib daddr type local jump {dnat}\n\
                     add rule {t} {out} meta nfproto ipv4 fib daddr type local jump {dnat}\n\
                     add rule {t} {post} ct status dnat ip daddr {addr} ip saddr {{ {net}, 127.0.0.1 }} meta l4proto tcp ct original proto-dst {port} masquerade\n"
                ));
            }
        }
        Some("del") => {
            let with_nft = a.get(5).map(String::as_str) == Some("nft");
            let (cont, _) = sock_in(&ns, None);
            let mut m = NlRequest::new(RTM_DELLINK, 0, 1);
            m.ifinfo(0, false).str_attr(IFLA_IFNAME, ifname);
            cont.batch(&[m.done()], "delete veth");
            if with_nft {
                let t = "inet cni_bench_floor";
                let mut b = String::new();
                let names = chain_names(hostveth);
                for c in &names {
                    b.push_str(&format!("flush chain {t} {c}\n"));
                }
                for c in &names {
                    b.push_str(&format!("delete chain {t} {c}\n"));
                }
                nft(&b);
            }
        }
        _ => panic!("{usage}"),
    }
}

//! cni-floor: the kernel work of one bridge attachment done by about the smallest program that can
//! do it, as a yardstick for the plugins. Raw rtnetlink, no runtime, no JSON, no IPAM state:
//!
//! ```text
//! cni-floor add <netns> <ifname> <host-veth> <bridge> <addr/prefix> <gateway> [nft]
//! cni-floor del <netns> <ifname> <host-veth> [nft]
//! cni-floor ptp-add <netns> <ifname> <host-veth> <addr/prefix> <gateway>
//! cni-floor macvlan-add <netns> <ifname> <master> <addr/prefix> <gateway>
//! cni-floor bw-add <netns> <ifname> <host-veth> <bridge> <addr/prefix> <gateway> <ifb>
//! cni-floor del-links <netns> <ifname> [host link...]
//! ```
//! ADD is one request in the host namespace (veth pair with its peer created in the netns, the host
//! end already a bridge port and up) and one batch in the netns (lo up, peer up, address, default route).
//! DEL is one request in the netns (delete the peer; the kernel removes the pair). With `nft`, the
//! same masquerade and port-mapping chains as the nftables backend are added (or deleted) in one
//! `nft -f -` transaction: that is the firewall floor for a program that uses the nft tool.
//!
//! The floors of the other chains of the benchmark do their kernel work the same way: `ptp-add` a
//! veth pair without a bridge, the gateway on the host end and a host route to the pod, the pod's
//! address (without the subnet route ptp removes), its two routes through the gateway and the
//! default route;
//! `macvlan-add` a bridge-mode macvlan on `master` created in the pod's netns, up, its address and
//! default route; `bw-add` what `add` does plus bandwidth's: an ifb (up), a tbf as root qdisc of
//! the host end and of the ifb, an ingress qdisc on the host end with a u32 filter redirecting
//! everything to the ifb. `del-links` deletes each host link named (an ifb: bandwidth's DEL runs
//! first), then `ifname` in the netns, one request each, in order, as a chain's plugins must.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::io::Write;
use std::os::fd::AsRawFd;
use std::process::{Command, Stdio};

const NLMSG_ERROR: u16 = 2;
const RTM_NEWLINK: u16 = 16;
const RTM_DELLINK: u16 = 17;
const RTM_NEWADDR: u16 = 20;
const RTM_NEWROUTE: u16 = 24;
const RTM_NEWQDISC: u16 = 36;
const RTM_NEWTFILTER: u16 = 44;
const IFLA_LINK: u16 = 5;
const IFLA_MACVLAN_MODE: u16 = 1;
const MACVLAN_MODE_BRIDGE: u32 = 4;
const IFA_FLAGS: u16 = 8;
const IFA_F_NOPREFIXROUTE: u32 = 0x200;
const RTA_DST: u16 = 1;
const RTA_PREFSRC: u16 = 7;
const TCA_KIND: u16 = 1;
const TCA_OPTIONS: u16 = 2;
const TCA_TBF_PARMS: u16 = 1;
const TCA_U32_CLASSID: u16 = 1;
const TCA_U32_SEL: u16 = 5;
const TCA_U32_ACT: u16 = 7;
const TCA_ACT_KIND: u16 = 1;
const TCA_ACT_OPTIONS: u16 = 2;
const TCA_MIRRED_PARMS: u16 = 2;
const TC_ACT_STOLEN: i32 = 4;
const TCA_EGRESS_REDIR: i32 = 1;
const TC_H_ROOT: u32 = 0xffff_ffff;
const TC_H_INGRESS: u32 = 0xffff_fff1;
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

/// struct ifaddrmsg (family, prefix, flags, scope, index) with the address, for `index`.
fn new_addr(seq: u32, index: u32, addr: std::net::Ipv4Addr, prefix: u8, no_prefix_route: bool) -> Vec<u8> {
    let mut ad = NlRequest::new(RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL, seq);
    let mut h = [0u8; 8];
    h[0] = libc::AF_INET as u8;
    h[1] = prefix;
    h[4..8].copy_from_slice(&index.to_ne_bytes());
    ad.raw(&h).attr(IFA_LOCAL, &addr.octets()).attr(IFA_ADDRESS, &addr.octets());
    if no_prefix_route {
        ad.attr(IFA_FLAGS, &IFA_F_NOPREFIXROUTE.to_ne_bytes());
    }
    ad.done()
}

/// An IPv4 route in the main table: `dst/len` (0.0.0.0/0 for a default route) out of `oif`,
/// through `gw` when set, with `src` as preferred source when set.
fn new_route(
    seq: u32,
    dst: std::net::Ipv4Addr,
    len: u8,
    oif: u32,
    gw: Option<std::net::Ipv4Addr>,
    src: Option<std::net::Ipv4Addr>,
    scope: u8,
) -> Vec<u8> {
    let mut rt = NlRequest::new(RTM_NEWROUTE, NLM_F_CREATE | NLM_F_EXCL, seq);
    // struct rtmsg: family, dst_len, src_len, tos, table, protocol, scope, type, flags
    let mut r = [0u8; 12];
    r[0] = libc::AF_INET as u8;
    r[1] = len;
    r[4] = libc::RT_TABLE_MAIN;
    r[5] = libc::RTPROT_BOOT;
    r[6] = scope;
    r[7] = libc::RTN_UNICAST;
    rt.raw(&r);
    if len > 0 {
        rt.attr(RTA_DST, &dst.octets());
    }
    if let Some(gw) = gw {
        rt.attr(RTA_GATEWAY, &gw.octets());
    }
    if let Some(src) = src {
        rt.attr(RTA_PREFSRC, &src.octets());
    }
    rt.attr(RTA_OIF, &oif.to_ne_bytes());
    rt.done()
}

/// Sets link `index` up.
fn link_up(seq: u32, index: u32) -> Vec<u8> {
    let mut up = NlRequest::new(RTM_NEWLINK, 0, seq);
    up.ifinfo(index as i32, true);
    up.done()
}

/// Creates the veth pair `hostveth` (up, a port of `master` when given) - `ifname` in `ns`.
fn create_veth(host: &Sock, ns: &std::fs::File, hostveth: &str, ifname: &str, master: Option<u32>) {
    let mut m = NlRequest::new(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, 1);
    m.ifinfo(0, true).str_attr(IFLA_IFNAME, hostveth);
    if let Some(master) = master {
        m.attr(IFLA_MASTER, &master.to_ne_bytes());
    }
    let li = m.begin(IFLA_LINKINFO);
    m.str_attr(IFLA_INFO_KIND, "veth");
    let data = m.begin(IFLA_INFO_DATA);
    let peer = m.begin(VETH_INFO_PEER);
    // The peer cannot be brought up before it is paired (veth_open: ENOTCONN): up in the netns batch.
    m.ifinfo(0, false).str_attr(IFLA_IFNAME, ifname).attr(IFLA_NET_NS_FD, &ns.as_raw_fd().to_ne_bytes());
    m.end(peer).end(data).end(li);
    host.batch(&[m.done()], "create veth");
}

/// struct tcmsg: family, ifindex, handle, parent, info.
fn tcmsg(m: &mut NlRequest, index: u32, handle: u32, parent: u32, info: u32) {
    let mut h = [0u8; 20];
    h[4..8].copy_from_slice(&index.to_ne_bytes());
    h[8..12].copy_from_slice(&handle.to_ne_bytes());
    h[12..16].copy_from_slice(&parent.to_ne_bytes());
    h[16..20].copy_from_slice(&info.to_ne_bytes());
    m.raw(&h);
}

/// A root tbf (handle 1:) on `index`, 100 Mbit/s with a 1 Mbit burst, as the bench's pods get.
fn root_tbf(seq: u32, index: u32) -> Vec<u8> {
    let mut m = NlRequest::new(RTM_NEWQDISC, NLM_F_CREATE | NLM_F_EXCL, seq);
    tcmsg(&mut m, index, 0x0001_0000, TC_H_ROOT, 0);
    m.str_attr(TCA_KIND, "tbf");
    let o = m.begin(TCA_OPTIONS);
    // struct tc_tbf_qopt: rate and peakrate tc_ratespec (12 bytes each), limit, buffer, mtu.
    let (rate, burst) = (12_500_000u32, 125_000u32);
    let mut q = [0u8; 36];
    q[8..12].copy_from_slice(&rate.to_ne_bytes());
    q[24..28].copy_from_slice(&(rate / 40 + burst).to_ne_bytes());
    // 10 ms of bucket time in psched ticks of 15.625 us (/proc/net/psched here).
    q[28..32].copy_from_slice(&156_250u32.to_ne_bytes());
    m.attr(TCA_TBF_PARMS, &q).end(o);
    m.done()
}

/// bandwidth's egress path on the host end `veth`: an ifb `ifb` (up), its root tbf, and an
/// ingress qdisc on `veth` whose u32 match-all filter redirects every packet to the ifb.
fn ifb_redirect(host: &Sock, veth: u32, ifb: &str) {
    let mut m = NlRequest::new(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, 1);
    m.ifinfo(0, true).str_attr(IFLA_IFNAME, ifb);
    let li = m.begin(IFLA_LINKINFO);
    m.str_attr(IFLA_INFO_KIND, "ifb").end(li);
    host.batch(&[m.done()], "create ifb");
    let ifb_index = index_of(ifb);
    let mut ing = NlRequest::new(RTM_NEWQDISC, NLM_F_CREATE | NLM_F_EXCL, 2);
    tcmsg(&mut ing, veth, 0xffff_0000, TC_H_INGRESS, 0);
    ing.str_attr(TCA_KIND, "ingress");
    let mut f = NlRequest::new(RTM_NEWTFILTER, NLM_F_CREATE | NLM_F_EXCL, 3);
    // info: preference 1, protocol all (ETH_P_ALL, network order).
    tcmsg(&mut f, veth, 0, 0xffff_0000, (1 << 16) | u32::from(0x0003u16.to_be()));
    f.str_attr(TCA_KIND, "u32");
    let o = f.begin(TCA_OPTIONS);
    f.attr(TCA_U32_CLASSID, &0x0001_0001u32.to_ne_bytes());
    // struct tc_u32_sel (flags TC_U32_TERMINAL, one key) and one all-zero tc_u32_key: match all.
    let mut sel = [0u8; 32];
    sel[0] = 1;
    sel[2] = 1;
    f.attr(TCA_U32_SEL, &sel);
    let acts = f.begin(TCA_U32_ACT);
    let act = f.begin(1);
    f.str_attr(TCA_ACT_KIND, "mirred");
    let ao = f.begin(TCA_ACT_OPTIONS);
    // struct tc_mirred: index, capab, action, refcnt, bindcnt, eaction, ifindex.
    let mut p = [0u8; 28];
    p[8..12].copy_from_slice(&TC_ACT_STOLEN.to_ne_bytes());
    p[20..24].copy_from_slice(&TCA_EGRESS_REDIR.to_ne_bytes());
    p[24..28].copy_from_slice(&ifb_index.to_ne_bytes());
    f.attr(TCA_MIRRED_PARMS, &p).end(ao).end(act).end(acts).end(o);
    host.batch(&[ing.done(), f.done(), root_tbf(4, ifb_index)], "ifb redirect");
}

fn ipv4_prefix(s: &str) -> (std::net::Ipv4Addr, u8) {
    let (addr, prefix) = s.split_once('/').expect("addr/prefix");
    (addr.parse().expect("IPv4 address"), prefix.parse().expect("prefix"))
}

/// Deletes link `name` through `sock` (a socket in the link's namespace).
fn del_link(sock: &Sock, name: &str) {
    let mut m = NlRequest::new(RTM_DELLINK, 0, 1);
    m.ifinfo(0, false).str_attr(IFLA_IFNAME, name);
    sock.batch(&[m.done()], &format!("delete {name}"));
}

/// The pod's side of a bridge-like attachment: lo up, `ifname` up, its address and a default route.
fn bridge_pod(ns: &std::fs::File, ifname: &str, addr: std::net::Ipv4Addr, prefix: u8, gw: std::net::Ipv4Addr) {
    let (cont, idx) = sock_in(ns, Some(ifname));
    let ad = new_addr(3, idx, addr, prefix, false);
    let rt = new_route(4, std::net::Ipv4Addr::UNSPECIFIED, 0, idx, Some(gw), None, libc::RT_SCOPE_UNIVERSE);
    cont.batch(&[link_up(2, 1), link_up(5, idx), ad, rt], "configure container");
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let usage = "usage: cni-floor add <netns> <ifname> <host-veth> <bridge> <addr/prefix> <gateway> [nft] | del <netns> <ifname> <host-veth> [nft] | ptp-add <netns> <ifname> <host-veth> <addr/prefix> <gateway> | macvlan-add <netns> <ifname> <master> <addr/prefix> <gateway> | bw-add <netns> <ifname> <host-veth> <bridge> <addr/prefix> <gateway> <ifb> | del-links <netns> <ifname> [host link...]";
    let arg = |i: usize| a.get(i).expect(usage);
    let ns = std::fs::File::open(arg(2)).expect("open netns");
    let ifname = arg(3);
    match a.get(1).map(String::as_str) {
        Some(verb @ ("add" | "bw-add")) => {
            let hostveth = arg(4);
            let (addr, prefix) = ipv4_prefix(arg(6));
            let gw: std::net::Ipv4Addr = arg(7).parse().expect("gateway");
            let host = Sock::open();
            create_veth(&host, &ns, hostveth, ifname, Some(index_of(arg(5))));
            bridge_pod(&ns, ifname, addr, prefix, gw);
            if verb == "bw-add" {
                let veth = index_of(hostveth);
                host.batch(&[root_tbf(1, veth)], "root tbf");
                ifb_redirect(&host, veth, arg(8));
            } else if a.get(8).map(String::as_str) == Some("nft") {
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
        Some("ptp-add") => {
            let hostveth = arg(4);
            let (addr, prefix) = ipv4_prefix(arg(5));
            let gw: std::net::Ipv4Addr = arg(6).parse().expect("gateway");
            let host = Sock::open();
            create_veth(&host, &ns, hostveth, ifname, None);
            let veth = index_of(hostveth);
            let to_pod = new_route(3, addr, 32, veth, None, None, libc::RT_SCOPE_HOST);
            host.batch(&[new_addr(2, veth, gw, 32, false), to_pod], "host end");
            let (cont, idx) = sock_in(&ns, Some(ifname));
            let net = std::net::Ipv4Addr::from(u32::from(addr) & (u32::MAX << (32 - prefix as u32)));
            let to_gw = new_route(3, gw, 32, idx, None, Some(addr), libc::RT_SCOPE_LINK);
            let via_gw = new_route(4, net, prefix, idx, Some(gw), Some(addr), libc::RT_SCOPE_UNIVERSE);
            let default =
                new_route(5, std::net::Ipv4Addr::UNSPECIFIED, 0, idx, Some(gw), None, libc::RT_SCOPE_UNIVERSE);
            let batch = [link_up(1, idx), new_addr(2, idx, addr, prefix, true), to_gw, via_gw, default];
            cont.batch(&batch, "configure container");
        }
        Some("macvlan-add") => {
            let (addr, prefix) = ipv4_prefix(arg(5));
            let gw: std::net::Ipv4Addr = arg(6).parse().expect("gateway");
            let host = Sock::open();
            let mut m = NlRequest::new(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, 1);
            m.ifinfo(0, false).str_attr(IFLA_IFNAME, ifname);
            m.attr(IFLA_LINK, &index_of(arg(4)).to_ne_bytes()).attr(IFLA_NET_NS_FD, &ns.as_raw_fd().to_ne_bytes());
            let li = m.begin(IFLA_LINKINFO);
            m.str_attr(IFLA_INFO_KIND, "macvlan");
            let data = m.begin(IFLA_INFO_DATA);
            m.attr(IFLA_MACVLAN_MODE, &MACVLAN_MODE_BRIDGE.to_ne_bytes()).end(data).end(li);
            host.batch(&[m.done()], "create macvlan");
            let (cont, idx) = sock_in(&ns, Some(ifname));
            let ad = new_addr(2, idx, addr, prefix, false);
            let rt = new_route(4, std::net::Ipv4Addr::UNSPECIFIED, 0, idx, Some(gw), None, libc::RT_SCOPE_UNIVERSE);
            cont.batch(&[ad, link_up(3, idx), rt], "configure container");
        }
        Some("del-links") => {
            let host = Sock::open();
            for name in &a[4..] {
                del_link(&host, name);
            }
            let (cont, _) = sock_in(&ns, None);
            del_link(&cont, ifname);
        }
        Some("del") => {
            let hostveth = arg(4);
            let (cont, _) = sock_in(&ns, None);
            del_link(&cont, ifname);
            if a.get(5).map(String::as_str) == Some("nft") {
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

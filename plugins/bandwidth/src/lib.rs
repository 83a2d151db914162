//! bandwidth: rate limits for a pod's traffic, a chained plugin after an interface plugin that made
//! a veth pair (bridge, ptp).
//!
//! The reference's kernel layout, built over rtnetlink:
//! - pod ingress (traffic to the pod): a tbf qdisc, handle `1:`, as the root qdisc of the host end
//!   of the pod's veth;
//! - pod egress (traffic from the pod): an `ingress` qdisc (`ffff:`) on the host end with a u32
//!   match-all filter whose mirred actions redirect every packet to an ifb device
//!   `bwp<first 12 hex digits of sha512(network name + container id)>`, which has the tbf.
//!
//! tbf parameters as the reference computes them: rate in bytes/s, the burst as a bucket time in
//! psched ticks (from /proc/net/psched), limit = rate × 25 ms + burst. DEL deletes the ifb and the
//! qdiscs on the host end, with or without the pod's netns. Our ifb carries an alias naming its
//! network and container, so GC can find the ones whose attachment is gone.

pub mod config;

use config::{Config, Limit};
use libcni::skel::{Plugin, Request};
use libcni::types::{CniResult, Interface};
use libcni::{code, Error, Errors, Result};
use netkit::netlink::tc::{Tbf, INGRESS_HANDLE, INGRESS_PARENT, ROOT_PARENT, TBF_HANDLE};
use netkit::{Link, NetNs, Netlink};
use sha2::{Digest, Sha512};

/// The plugin.
pub struct Bandwidth;

/// The reference's queueing latency for the tbf limit.
const LATENCY_MS: f64 = 25.0;
const TIME_UNITS_PER_SEC: f64 = 1_000_000.0;
const IFB_PREFIX: &str = "bwp";
const ALIAS_PREFIX: &str = "cni-bandwidth";

/// The reference's spec versions: 0.3.0 and later.
const VERSIONS: [&str; 5] = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

/// The ifb's name: `bwp` + the first 12 hex digits of sha512(network + container id), as the reference.
pub fn ifb_name(network: &str, container_id: &str) -> String {
    let digest = Sha512::digest(format!("{network}{container_id}").as_bytes());
    let hex: String = digest.iter().take(6).map(|b| format!("{b:02x}")).collect();
    format!("{IFB_PREFIX}{hex}")
}

fn ifb_alias(network: &str, container_id: &str) -> String {
    format!("{ALIAS_PREFIX} {network} {container_id}")
}

/// Microseconds per psched tick, read from /proc/net/psched as the reference's netlink library does.
pub fn tick_in_usec() -> Result<f64> {
    let text = std::fs::read_to_string("/proc/net/psched").map_err(|e| Error::io("read /proc/net/psched", &e))?;
    tick_in_usec_from(&text)
        .ok_or_else(|| Error::new(code::IO, format!("read /proc/net/psched: unexpected content {:?}", text.trim())))
}

fn tick_in_usec_from(text: &str) -> Option<f64> {
    let v: Vec<u64> =
        text.split_whitespace().take(4).map(|p| u64::from_str_radix(p, 16).ok()).collect::<Option<_>>()?;
    if v.len() < 3 || v[1] == 0 {
        return None;
    }
    let t2us = if v[2] == 1_000_000_000 { v[1] } else { v[0] };
    let clock_factor = v[2] as f64 / TIME_UNITS_PER_SEC;
    Some(t2us as f64 / v[1] as f64 * clock_factor)
}

/// The tbf for a limit, as the reference computes it; `None` when a value does not fit the kernel's
/// 32-bit fields.
pub fn tbf_params(l: &Limit, tick_in_usec: f64) -> Option<Tbf> {
    let rate = l.rate / 8;
    let burst = u32::try_from(l.burst / 8).ok()?;
    if rate == 0 || burst == 0 {
        return None;
    }
    let usec = f64::from(burst) * TIME_UNITS_PER_SEC / rate as f64;
    if usec >= f64::from(u32::MAX) {
        return None;
    }
    let ticks = f64::from(usec as u32) * tick_in_usec;
    if ticks >= f64::from(u32::MAX) {
        return None;
    }
    let latency = TIME_UNITS_PER_SEC * (LATENCY_MS / 1000.0);
    let queued = rate as f64 * latency / TIME_UNITS_PER_SEC;
    let limit = u32::try_from(queued as u64).ok()?.checked_add(burst)?;
    Some(Tbf { rate, buffer: ticks as u32, limit })
}

/// The host end of the veth whose other end is CNI_IFNAME in the pod, which prevResult must list
/// as a host interface (no sandbox), as the reference requires.
fn host_interface(host: &Netlink, pod: &NetNs, req: &Request, prev: &CniResult) -> Result<Link> {
    if prev.interfaces.is_empty() {
        return Err(Error::config("bandwidth: prevResult lists no interfaces"));
    }
    let in_pod = Netlink::open_in(pod)?;
    let pod_link = in_pod.link(&req.ifname)?.ok_or_else(|| {
        Error::network(format!("bandwidth: no interface {} in netns {}", req.ifname, pod.path().display()))
    })?;
    let peer = match (pod_link.kind.as_deref(), pod_link.link_index) {
        (Some("veth"), Some(peer)) => peer,
        _ => {
            return Err(Error::network(format!(
                "bandwidth: container interface {} has no veth peer (bandwidth needs a veth, as from bridge or ptp)",
                req.ifname
            )))
        }
    };
    let link = host.link_by_index(peer)?.ok_or_else(|| {
        Error::network(format!("bandwidth: veth peer of {} (index {peer}) is not in the host netns", req.ifname))
    })?;
    let listed = prev.interfaces.iter().any(|i| i.sandbox.as_deref().unwrap_or("").is_empty() && i.name == link.name);
    if !listed {
        return Err(Error::network(format!(
            "bandwidth: the veth peer {} of container interface {} is not a host interface of prevResult",
            link.name, req.ifname
        )));
    }
    Ok(link)
}

/// What ADD made, undone in reverse on failure.
#[derive(Default)]
struct Made {
    host_tbf: Option<u32>,
    host_ingress: Option<u32>,
    ifb: Option<String>,
}

impl Made {
    fn undo(&self, nl: &Netlink, errs: &mut Errors) {
        if let Some(ifb) = &self.ifb {
            errs.record(nl.delete_link_by_name(ifb));
        }
        if let Some(index) = self.host_ingress {
            errs.record(nl.delete_qdisc(index, INGRESS_HANDLE, INGRESS_PARENT));
        }
        if let Some(index) = self.host_tbf {
            errs.record(nl.delete_qdisc(index, TBF_HANDLE, ROOT_PARENT));
        }
    }
}

fn shape(nl: &Netlink, req: &Request, conf: &Config, host: &Link, made: &mut Made) -> Result<Option<Interface>> {
    let tick = tick_in_usec()?;
    let params = |l: &Limit, dir: &str| {
        tbf_params(l, tick).ok_or_else(|| Error::config(format!("bandwidth {dir} limit {l:?} does not fit a tbf")))
    };
    if let Some(l) = &conf.ingress {
        nl.add_root_tbf(host.index, &params(l, "ingress")?)?;
        made.host_tbf = Some(host.index);
    }
    let Some(l) = &conf.egress else { return Ok(None) };
    let tbf = params(l, "egress")?;
    let name = ifb_name(&req.conf.name, &req.container_id);
    // The kernel keeps aliases under IFALIASZ (256) bytes; a longer one is left out (GC then
    // cannot tell the ifb's owner, and leaves it, as it leaves the reference's).
    let alias = Some(ifb_alias(&req.conf.name, &req.container_id)).filter(|a| a.len() < 256);
    nl.create_ifb(&name, host.mtu, alias.as_deref()).map_err(|e| {
        if netkit::is_exists(&e) {
            e.with_details(format!(
                "an interface {name} already exists: another attachment of network {:?} with container id {:?}, \
                 or a leftover; DEL that attachment first",
                req.conf.name, req.container_id
            ))
        } else {
            e
        }
    })?;
    made.ifb = Some(name.clone());
    let ifb = nl
        .link(&name)?
        .ok_or_else(|| Error::network(format!("bandwidth: ifb {name} vanished right after creation")))?;
    nl.add_ingress_qdisc(host.index)?;
    made.host_ingress = Some(host.index);
    nl.add_redirect_filter(host.index, ifb.index)?;
    nl.add_root_tbf(ifb.index, &tbf)?;
    Ok(Some(Interface { name, mac: ifb.mac_string(), ..Default::default() }))
}

fn check_tbf(nl: &Netlink, link: &Link, l: &Limit, dir: &str) -> Result<()> {
    let want = tbf_params(l, tick_in_usec()?)
        .ok_or_else(|| Error::config(format!("bandwidth {dir} limit {l:?} does not fit a tbf")))?;
    let qdiscs = nl.qdiscs(link.index)?;
    let root = qdiscs.iter().find(|q| q.parent == ROOT_PARENT);
    let fail =
        |what: String| Err(Error::new(code::CHECK_FAILED, format!("bandwidth CHECK {dir} on {}: {what}", link.name)));
    match root {
        None => fail("no root qdisc (want tbf 1:)".to_string()),
        Some(q) if q.kind != "tbf" || q.handle != TBF_HANDLE => {
            fail(format!("root qdisc is {} {:x}:, want tbf 1:", q.kind, q.handle >> 16))
        }
        Some(q) => match q.tbf {
            Some(got) if got.rate != want.rate => fail(format!("rate is {} bytes/s, want {}", got.rate, want.rate)),
            Some(got) if got.limit != want.limit => fail(format!("limit is {} bytes, want {}", got.limit, want.limit)),
            Some(got) if got.buffer != want.buffer => {
                fail(format!("buffer is {} ticks, want {}", got.buffer, want.buffer))
            }
            Some(_) => Ok(()),
            None => fail("tbf without parameters".to_string()),
        },
    }
}

impl Plugin for Bandwidth {
    fn supported_versions(&self) -> &'static [&'static str] {
        &VERSIONS
    }

    fn reads_cni_args(&self) -> bool {
        false
    }

    fn add(&self, req: &Request) -> Result<CniResult> {
        let conf = Config::parse(req)?;
        if conf.is_empty() {
            return Ok(req.conf.prev_result.clone().unwrap_or_default());
        }
        let prev = req.prev_result("bandwidth")?;
        let pod = netkit::container_netns(req)?;
        let nl = Netlink::open()?;
        let host = host_interface(&nl, &pod, req, prev)?;
        let mut made = Made::default();
        match shape(&nl, req, &conf, &host, &mut made) {
            Ok(ifb) => {
                let mut result = prev.clone();
                result.interfaces.extend(ifb);
                Ok(result)
            }
            Err(e) => {
                let mut errs = Errors::new();
                errs.push(e.context("bandwidth ADD"));
                made.undo(&nl, &mut errs);
                errs.finish().map(|()| prev.clone())
            }
        }
    }

    fn del(&self, req: &Request) -> Result<()> {
        let nl = Netlink::open()?;
        let mut errs = Errors::new();
        errs.record(nl.delete_link_by_name(&ifb_name(&req.conf.name, &req.container_id)));
        // The host end of the veth outlives the pod's netns only briefly (or when the netns is
        // kept by a bind mount elsewhere); our qdiscs on it go either way. Only veths prevResult
        // names as host interfaces are touched, and only qdiscs of our kinds and handles.
        if let Some(prev) = &req.conf.prev_result {
            for iface in prev.interfaces.iter().filter(|i| i.sandbox.as_deref().unwrap_or("").is_empty()) {
                let Some(link) = errs.record(nl.link(&iface.name)).flatten() else { continue };
                if link.kind.as_deref() != Some("veth") {
                    continue;
                }
                let Some(qdiscs) = errs.record(nl.qdiscs(link.index)) else { continue };
                for q in qdiscs {
                    let ours = (q.kind == "tbf" && q.handle == TBF_HANDLE && q.parent == ROOT_PARENT)
                        || (q.kind == "ingress" && q.handle == INGRESS_HANDLE);
                    if ours {
                        errs.record(nl.delete_qdisc(link.index, q.handle, q.parent));
                    }
                }
            }
        }
        errs.finish()
    }

    fn check(&self, req: &Request) -> Result<()> {
        let conf = Config::parse(req)?;
        let prev = req.prev_result("bandwidth")?;
        let pod = netkit::container_netns(req)?;
        let nl = Netlink::open()?;
        let host = host_interface(&nl, &pod, req, prev)?;
        if let Some(l) = &conf.ingress {
            check_tbf(&nl, &host, l, "ingress")?;
        }
        if let Some(l) = &conf.egress {
            let name = ifb_name(&req.conf.name, &req.container_id);
            let ifb = nl.link(&name)?.ok_or_else(|| {
                Error::new(code::CHECK_FAILED, format!("bandwidth CHECK egress: ifb {name} does not exist"))
            })?;
            check_tbf(&nl, &ifb, l, "egress")?;
            let redirect = nl.qdiscs(host.index)?.iter().any(|q| q.kind == "ingress" && q.handle == INGRESS_HANDLE)
                && nl.filters(host.index, INGRESS_HANDLE)?.iter().any(|f| f.kind == "u32");
            if !redirect {
                return Err(Error::new(
                    code::CHECK_FAILED,
                    format!("bandwidth CHECK egress: no ingress qdisc with a u32 redirect filter on {}", host.name),
                ));
            }
        }
        Ok(())
    }

    fn gc(&self, req: &Request) -> Result<()> {
        // Without the list of valid attachments we cannot tell garbage from live pods.
        let Some(keep) = req.conf.valid_attachments.as_deref() else { return Ok(()) };
        let nl = Netlink::open()?;
        let prefix = format!("{ALIAS_PREFIX} {} ", req.conf.name);
        let mut errs = Errors::new();
        for (_, name, alias) in nl.ifbs()? {
            let Some(id) = alias.as_deref().and_then(|a| a.strip_prefix(&prefix)) else { continue };
            if keep.iter().any(|a| a.container_id == id) {
                continue;
            }
            errs.record(nl.delete_link_by_name(&name));
        }
        errs.finish()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn ifb_name_matches_the_reference() {
        // Observed from /usr/lib/cni/bandwidth (1.1.1): network "net1", container id "c1".
        assert_eq!(ifb_name("net1", "c1"), "bwpc2d892b58e87");
        assert_eq!(ifb_name("net1", "c1").len(), 15);
    }

    #[test]
    fn psched_tick() {
        assert_eq!(tick_in_usec_from("000003e8 00000040 000f4240 3b9aca00\n"), Some(15.625));
        assert_eq!(tick_in_usec_from("garbage"), None);
    }

    #[test]
    fn tbf_as_the_reference() {
        // 16 Mbit/s, 800000 bits: the reference's tbf shows rate 2000000, burst 100000b, lat 25ms.
        let t = tbf_params(&Limit { rate: 16_000_000, burst: 800_000 }, 15.625).unwrap();
        assert_eq!(t.rate, 2_000_000);
        assert_eq!(t.buffer, 781_250); // 50000 us of bucket time in 15.625 us ticks
        assert_eq!(t.limit, 50_000 + 100_000);
    }
}

//! Traffic control over rtnetlink: token bucket (tbf) and ingress qdiscs, a u32 match-all filter
//! that redirects everything to an ifb device with `mirred`, and ifb devices. This is the kernel
//! layout the bandwidth plugin builds, message for message as the reference plugin sends it, so
//! `tc qdisc show` and `tc filter show` print the same for both.
//!
//! netlink-packet-route has no tbf options, so TCA_TBF_PARMS is built here (`struct tc_tbf_qopt`).

use super::{Netlink, RequestFailure};
use libcni::{Error, Result};
use netlink_packet_core::{DefaultNla, Nla, NLM_F_CREATE, NLM_F_EXCL};
use netlink_packet_route::link::{InfoKind, LinkAttribute, LinkFlags, LinkInfo, LinkMessage};
use netlink_packet_route::tc::{
    TcAction, TcActionAttribute, TcActionGeneric, TcActionMirrorOption, TcActionOption, TcActionType, TcAttribute,
    TcFilterU32Option, TcHandle, TcHeader, TcMessage, TcMirror, TcMirrorActionType, TcOption, TcU32Key, TcU32Selector,
    TcU32SelectorFlags,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};

/// Handle `1:` of the root tbf qdisc.
pub const TBF_HANDLE: u32 = 0x0001_0000;
/// Handle `ffff:` of the ingress qdisc.
pub const INGRESS_HANDLE: u32 = 0xffff_0000;
/// Parent `ffff:fff1` (TC_H_INGRESS) of the ingress qdisc.
pub const INGRESS_PARENT: u32 = 0xffff_fff1;
/// TC_H_ROOT.
pub const ROOT_PARENT: u32 = 0xffff_ffff;

const TCA_TBF_PARMS: u16 = 1;
const TCA_TBF_RATE64: u16 = 4;
const TC_U32_TERMINAL: u8 = 1;
const ETH_P_ALL: u16 = 0x0003;
/// Preference of the redirect filter, as the reference's.
const REDIRECT_PRIO: u16 = 1;
/// Flow id `1:1` the reference's redirect filter carries.
const REDIRECT_CLASSID: u32 = 0x0001_0001;

/// A tbf qdisc's parameters as the kernel keeps them: rate in bytes/s, `buffer` in psched ticks
/// (the bucket size expressed as the time it takes to send it at `rate`), `limit` in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tbf {
    pub rate: u64,
    pub buffer: u32,
    pub limit: u32,
}

/// A qdisc as dumped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Qdisc {
    pub kind: String,
    pub handle: u32,
    pub parent: u32,
    /// For a tbf: its parameters.
    pub tbf: Option<Tbf>,
}

/// A filter as dumped (the u32 filter's hash-table entries included).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Filter {
    pub kind: String,
    pub parent: u32,
    pub prio: u16,
    pub protocol: u16,
}

fn handle(h: u32) -> TcHandle {
    TcHandle { major: (h >> 16) as u16, minor: (h & 0xffff) as u16 }
}

fn handle_u32(h: TcHandle) -> u32 {
    (u32::from(h.major) << 16) | u32::from(h.minor)
}

fn header(index: u32, handle_: u32, parent: u32) -> TcHeader {
    let mut h = TcMessage::with_index(index as i32).header;
    h.family = AddressFamily::Unspec;
    h.handle = handle(handle_);
    h.parent = handle(parent);
    h
}

/// `struct tc_tbf_qopt`: rate and peakrate `tc_ratespec` (only `rate` set, as the reference's
/// netlink library does; the kernel computes its own rate table), limit, buffer, mtu.
fn tbf_qopt(t: &Tbf) -> Vec<u8> {
    let mut out = Vec::with_capacity(36);
    let rate32 = u32::try_from(t.rate).unwrap_or(u32::MAX);
    // tc_ratespec { cell_log u8, linklayer u8, overhead u16, cell_align i16, mpu u16, rate u32 }
    out.extend_from_slice(&[0u8; 8]);
    out.extend_from_slice(&rate32.to_ne_bytes());
    out.extend_from_slice(&[0u8; 12]); // peakrate
    out.extend_from_slice(&t.limit.to_ne_bytes());
    out.extend_from_slice(&t.buffer.to_ne_bytes());
    out.extend_from_slice(&0u32.to_ne_bytes()); // mtu
    out
}

fn nla_value(nla: &DefaultNla) -> Vec<u8> {
    let mut v = vec![0u8; nla.value_len()];
    nla.emit_value(&mut v);
    v
}

fn read_u32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// Reads TCA_TBF_PARMS (and TCA_TBF_RATE64) out of the nested TCA_OPTIONS bytes.
fn parse_tbf(nested: &[u8]) -> Option<Tbf> {
    let mut params = None;
    let mut rate64 = None;
    let mut at = 0;
    while at + 4 <= nested.len() {
        let len = usize::from(u16::from_ne_bytes([nested[at], nested[at + 1]]));
        let kind = u16::from_ne_bytes([nested[at + 2], nested[at + 3]]) & 0x3fff;
        if len < 4 || at + len > nested.len() {
            break;
        }
        let value = &nested[at + 4..at + len];
        match kind {
            TCA_TBF_PARMS => {
                params = Some(Tbf {
                    rate: u64::from(read_u32(value, 8)?),
                    limit: read_u32(value, 24)?,
                    buffer: read_u32(value, 28)?,
                })
            }
            TCA_TBF_RATE64 => rate64 = Some(u64::from_ne_bytes(value.get(..8)?.try_into().ok()?)),
            _ => {}
        }
        at += (len + 3) & !3;
    }
    let mut t = params?;
    if let Some(r) = rate64 {
        t.rate = r;
    }
    Some(t)
}

fn mirred(tab: u16, target: u32, action: TcActionType) -> TcAction {
    let mut generic = TcActionGeneric::default();
    generic.action = action;
    let mut parms = TcMirror::default();
    parms.generic = generic;
    parms.eaction = TcMirrorActionType::EgressRedir;
    parms.ifindex = target;
    let mut a = TcAction::default();
    a.tab = tab;
    a.attributes = vec![
        TcActionAttribute::Kind("mirred".to_string()),
        TcActionAttribute::Options(vec![TcActionOption::Mirror(TcActionMirrorOption::Parms(parms))]),
    ];
    a
}

impl Netlink {
    /// Creates an ifb device, up, with `mtu` and a transmit queue length of 0 (as the reference),
    /// and `alias` (IFLA_IFALIAS) if given, so its owner can be found again.
    pub fn create_ifb(&self, name: &str, mtu: u32, alias: Option<&str>) -> Result<()> {
        if !crate::valid_ifname(name) {
            return Err(Error::config(format!("ifb {name:?}: invalid interface name")));
        }
        let mut msg = LinkMessage::default();
        msg.header.flags |= LinkFlags::Up;
        msg.header.change_mask |= LinkFlags::Up;
        msg.attributes.push(LinkAttribute::IfName(name.to_string()));
        msg.attributes.push(LinkAttribute::Mtu(mtu));
        msg.attributes.push(LinkAttribute::TxQueueLen(0));
        msg.attributes.push(LinkAttribute::LinkInfo(vec![LinkInfo::Kind(InfoKind::Ifb)]));
        self.ack(RouteNetlinkMessage::NewLink(msg), NLM_F_CREATE | NLM_F_EXCL)
            .map_err(|f| f.into_error(format_args!("create ifb {name}")))?;
        let Some(alias) = alias else { return Ok(()) };
        // The kernel ignores IFLA_IFALIAS in the request that creates a link: set it afterwards.
        let mut set = LinkMessage::default();
        set.attributes.push(LinkAttribute::IfName(name.to_string()));
        set.attributes.push(LinkAttribute::IfAlias(alias.to_string()));
        self.ack(RouteNetlinkMessage::NewLink(set), 0)
            .map_err(|f| f.into_error(format_args!("set alias {alias:?} on ifb {name}")))
    }

    /// Every ifb device of the namespace: `(index, name, alias)`.
    pub fn ifbs(&self) -> Result<Vec<(u32, String, Option<String>)>> {
        let msgs =
            self.dump(RouteNetlinkMessage::GetLink(LinkMessage::default())).map_err(|f| f.into_error("list links"))?;
        let mut out = Vec::new();
        for m in msgs {
            let RouteNetlinkMessage::NewLink(l) = m else { continue };
            let (mut name, mut alias, mut ifb) = (String::new(), None, false);
            for a in &l.attributes {
                match a {
                    LinkAttribute::IfName(n) => name = n.clone(),
                    LinkAttribute::IfAlias(n) => alias = Some(n.clone()),
                    LinkAttribute::LinkInfo(infos) => {
                        ifb |= infos.iter().any(|i| matches!(i, LinkInfo::Kind(InfoKind::Ifb)));
                    }
                    _ => {}
                }
            }
            if ifb {
                out.push((l.header.index, name, alias));
            }
        }
        Ok(out)
    }

    /// Adds a tbf qdisc as the root qdisc (handle `1:`) of link `index`.
    pub fn add_root_tbf(&self, index: u32, tbf: &Tbf) -> Result<()> {
        let mut options = vec![TcOption::Other(DefaultNla::new(TCA_TBF_PARMS, tbf_qopt(tbf)))];
        if tbf.rate > u64::from(u32::MAX) {
            options.push(TcOption::Other(DefaultNla::new(TCA_TBF_RATE64, tbf.rate.to_ne_bytes().to_vec())));
        }
        let mut msg = TcMessage::with_index(index as i32);
        msg.header = header(index, TBF_HANDLE, ROOT_PARENT);
        msg.attributes = vec![TcAttribute::Kind("tbf".to_string()), TcAttribute::Options(options)];
        self.ack(RouteNetlinkMessage::NewQueueDiscipline(msg), NLM_F_CREATE | NLM_F_EXCL)
            .map_err(|f| f.into_error(format_args!("add tbf qdisc on {}", self.describe(index))))
    }

    /// Adds the ingress qdisc (handle `ffff:`) to link `index`.
    pub fn add_ingress_qdisc(&self, index: u32) -> Result<()> {
        let mut msg = TcMessage::with_index(index as i32);
        msg.header = header(index, INGRESS_HANDLE, INGRESS_PARENT);
        msg.attributes = vec![TcAttribute::Kind("ingress".to_string())];
        self.ack(RouteNetlinkMessage::NewQueueDiscipline(msg), NLM_F_CREATE | NLM_F_EXCL)
            .map_err(|f| f.into_error(format_args!("add ingress qdisc on {}", self.describe(index))))
    }

    /// On the ingress qdisc of link `index`: a u32 filter (pref 1, protocol all, flowid 1:1)
    /// matching every packet, with two mirred actions redirecting to the egress of `target`
    /// (the first `stolen`, the second `pass`), the reference's filter exactly.
    pub fn add_redirect_filter(&self, index: u32, target: u32) -> Result<()> {
        let mut sel = TcU32Selector::default();
        sel.flags = TcU32SelectorFlags::from_bits_retain(TC_U32_TERMINAL);
        sel.nkeys = 1;
        sel.keys = vec![TcU32Key::default()];
        let options = vec![
            TcOption::U32(TcFilterU32Option::Selector(sel)),
            TcOption::U32(TcFilterU32Option::ClassId(handle(REDIRECT_CLASSID))),
            TcOption::U32(TcFilterU32Option::Action(vec![
                mirred(1, target, TcActionType::Stolen),
                mirred(2, target, TcActionType::Ok),
            ])),
        ];
        let mut msg = TcMessage::with_index(index as i32);
        msg.header = header(index, 0, INGRESS_HANDLE);
        msg.header.info = (u32::from(REDIRECT_PRIO) << 16) | u32::from(ETH_P_ALL.to_be());
        msg.attributes = vec![TcAttribute::Kind("u32".to_string()), TcAttribute::Options(options)];
        self.ack(RouteNetlinkMessage::NewTrafficFilter(msg), NLM_F_CREATE | NLM_F_EXCL).map_err(|f| {
            f.into_error(format_args!(
                "add u32 redirect filter on {} to {}",
                self.describe(index),
                self.describe(target)
            ))
        })
    }

    /// The qdiscs of link `index` (a deleted link has none).
    pub fn qdiscs(&self, index: u32) -> Result<Vec<Qdisc>> {
        let msgs = self
            .dump(RouteNetlinkMessage::GetQueueDiscipline(TcMessage::with_index(index as i32)))
            .map_err(|f| f.into_error(format_args!("list qdiscs of {}", self.describe(index))))?;
        let mut out = Vec::new();
        for m in msgs {
            let RouteNetlinkMessage::NewQueueDiscipline(m) = m else { continue };
            if m.header.index != index as i32 {
                continue;
            }
            let mut q = Qdisc {
                kind: String::new(),
                handle: handle_u32(m.header.handle),
                parent: handle_u32(m.header.parent),
                tbf: None,
            };
            for attr in &m.attributes {
                match attr {
                    TcAttribute::Kind(k) => q.kind = k.clone(),
                    TcAttribute::Options(opts) => {
                        for o in opts {
                            if let TcOption::Other(nla) = o {
                                q.tbf = parse_tbf(&nla_value(nla));
                            }
                        }
                    }
                    _ => {}
                }
            }
            if q.kind != "tbf" {
                q.tbf = None;
            }
            out.push(q);
        }
        Ok(out)
    }

    /// The filters attached under qdisc `parent` of link `index`.
    pub fn filters(&self, index: u32, parent: u32) -> Result<Vec<Filter>> {
        let mut req = TcMessage::with_index(index as i32);
        req.header = header(index, 0, parent);
        let msgs = self
            .dump(RouteNetlinkMessage::GetTrafficFilter(req))
            .map_err(|f| f.into_error(format_args!("list filters of {}", self.describe(index))))?;
        let mut out = Vec::new();
        for m in msgs {
            let RouteNetlinkMessage::NewTrafficFilter(m) = m else { continue };
            let kind = m
                .attributes
                .iter()
                .find_map(|a| match a {
                    TcAttribute::Kind(k) => Some(k.clone()),
                    _ => None,
                })
                .unwrap_or_default();
            out.push(Filter {
                kind,
                parent: handle_u32(m.header.parent),
                prio: (m.header.info >> 16) as u16,
                protocol: u16::from_be((m.header.info & 0xffff) as u16),
            });
        }
        Ok(out)
    }

    /// Deletes the qdisc `handle` under `parent` of link `index`; `Ok(false)` if it (or the link)
    /// was not there.
    pub fn delete_qdisc(&self, index: u32, handle_: u32, parent: u32) -> Result<bool> {
        let mut msg = TcMessage::with_index(index as i32);
        msg.header = header(index, handle_, parent);
        match self.ack(RouteNetlinkMessage::DelQueueDiscipline(msg), 0) {
            Ok(()) => Ok(true),
            Err(RequestFailure::Errno(libc::ENOENT | libc::ENODEV | libc::EINVAL, _)) => Ok(false),
            Err(f) => Err(f.into_error(format_args!("delete qdisc {handle_:x}: of {}", self.describe(index)))),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn tbf_parms_round_trip() {
        let t = Tbf { rate: 2_000_000, buffer: 781_250, limit: 150_000 };
        let value = tbf_qopt(&t);
        assert_eq!(value.len(), 36);
        let mut nested = Vec::new();
        nested.extend_from_slice(&40u16.to_ne_bytes());
        nested.extend_from_slice(&TCA_TBF_PARMS.to_ne_bytes());
        nested.extend_from_slice(&value);
        assert_eq!(parse_tbf(&nested), Some(t));
    }

    #[test]
    fn handles() {
        assert_eq!(handle(TBF_HANDLE), TcHandle { major: 1, minor: 0 });
        assert_eq!(handle_u32(handle(INGRESS_PARENT)), INGRESS_PARENT);
    }
}

//! Masquerade of a pod's addresses (bridge, ptp `ipMasq`): the rules of an attachment, and the
//! STATUS, GC and DEL both plugins share.

use crate::firewall::{self, IpMasq, Masquerade};
use libcni::conf::Attachment;
use libcni::invoke;
use libcni::types::IpConfig;
use libcni::{Error, Errors, Request, Result};

/// The masquerade rules of the attachment `req` names, in `network`, for `addresses`.
pub fn rules<'i>(req: &Request, network: &str, addresses: impl Iterator<Item = &'i IpConfig>) -> Masquerade {
    Masquerade {
        network: network.to_string(),
        container_id: req.container_id.clone(),
        ifname: req.ifname.clone(),
        addresses: addresses.map(|ip| ip.address).collect(),
    }
}

/// STATUS of a plugin that delegates to IPAM and may masquerade: IPAM's STATUS when `ipam` names a
/// plugin, then the masquerade backend's.
pub fn status(req: &Request, ipam: Option<&str>, ip_masq: Option<IpMasq>) -> Result<()> {
    if let Some(ipam) = ipam {
        invoke::delegate_status(ipam, req)?;
    }
    if let Some(m) = ip_masq {
        firewall::open(m.backend).status()?;
    }
    Ok(())
}

/// GC of such a plugin: IPAM's GC when `ipam` names a plugin, then the masquerade rules of every
/// attachment of `network` not in the list of valid attachments. Without that list garbage cannot
/// be told from live pods (host-local and portmap decide so too): then only IPAM's GC runs. The
/// errors, and the list for the plugin's own rules.
pub fn gc<'r>(
    req: &'r Request,
    network: &str,
    ipam: Option<&str>,
    ip_masq: Option<IpMasq>,
) -> (Errors, Option<&'r [Attachment]>) {
    let mut errs = Errors::new();
    if let Some(ipam) = ipam {
        errs.record(invoke::delegate_gc(ipam, req));
    }
    let keep = req.conf.valid_attachments.as_deref();
    if let (Some(keep), Some(m)) = (keep, ip_masq) {
        errs.record(firewall::open(m.backend).gc_masquerade(network, keep));
    }
    (errs, keep)
}

/// Which masquerade rules DEL removes: from a configuration that validates, those of its `ipMasq`
/// (`None`: masquerade is off); from one that does not (edited since ADD, a key the runtime sent
/// broken), every backend's rules of the attachment, so a bad key never strands a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MasqueradeDel {
    Configured(Option<IpMasq>),
    Everywhere,
}

/// DEL of attachment `id`/`ifname`'s masquerade rules in `network`, on the backend `open` gives
/// ([`firewall::open`]; a fake in unit tests). A backend detected as nftables also removes what
/// the reference plugin left in iptables, on a node that switched from it. The errors, in order.
pub fn del(
    open: &dyn Fn(firewall::BackendKind) -> Box<dyn firewall::Firewall>,
    masq: MasqueradeDel,
    network: &str,
    id: &str,
    ifname: &str,
) -> Vec<Error> {
    let mut errs = Vec::new();
    match masq {
        MasqueradeDel::Configured(None) => {}
        MasqueradeDel::Configured(Some(m)) => {
            errs.extend(open(m.backend).del_masquerade(network, id, ifname).err());
            if m.detected && m.backend == firewall::BackendKind::Nftables {
                errs.extend(firewall::del_reference_leftovers(network, id, ifname, false).err());
            }
        }
        MasqueradeDel::Everywhere => {
            errs.extend(firewall::del_everywhere(firewall::Rules::Masquerade, network, id, ifname).err());
        }
    }
    errs
}

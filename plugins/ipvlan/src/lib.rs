//! ipvlan: the pod's interface is an ipvlan on a master link (`master`; else, chained, the one
//! interface of prevResult; else the interface of the default route), in l2, l3 or l3s mode, with
//! addresses from IPAM or, chained without IPAM, prevResult's. The verbs are the ones every
//! link-on-a-master plugin shares ([`netkit::iface::sublink`]); what is ipvlan's own is its
//! configuration.

pub mod config;

use libcni::types::CniResult;
use libcni::{Plugin, Request, Result};
use netkit::iface::sublink;

pub struct Ipvlan;

impl Plugin for Ipvlan {
    fn known_args(&self) -> &'static [&'static str] {
        // IP is read by host-local and static, which get our CNI_ARGS.
        &["IP"]
    }

    fn add(&self, req: &Request) -> Result<CniResult> {
        sublink::add(req, &config::parse(req)?)
    }

    fn del(&self, req: &Request) -> Result<()> {
        // Only the IPAM type matters: the link is found by CNI_IFNAME in the pod.
        sublink::del(req, req.conf.ipam_type())
    }

    fn check(&self, req: &Request) -> Result<()> {
        sublink::check(req, &config::parse(req)?)
    }

    fn status(&self, req: &Request) -> Result<()> {
        sublink::status(req, &config::parse(req)?)
    }

    fn gc(&self, req: &Request) -> Result<()> {
        sublink::gc(req, &config::parse(req)?)
    }
}

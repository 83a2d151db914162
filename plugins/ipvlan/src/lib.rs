//! ipvlan: the pod's interface is an ipvlan on a master link (`master`; else, chained, the one
//! interface of prevResult; else the interface of the default route), in l2, l3 or l3s mode, with
//! addresses from IPAM or, chained without IPAM, prevResult's. The verbs are the ones every
//! link-on-a-master plugin shares ([`netkit::iface::sublink`]); what is ipvlan's own is its
//! configuration.

pub mod config;

use netkit::iface::sublink::SubLinkPlugin;

/// The plugin. `CNI_ARGS`: `IP`, for host-local and static, which get our CNI_ARGS.
pub const PLUGIN: SubLinkPlugin = SubLinkPlugin { parse: config::parse, known_args: &["IP"] };

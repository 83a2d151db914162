//! The steps every interface plugin shares (bridge, ptp, host-device, macvlan, ipvlan, vlan, dummy
//! and tap), one module each, in the order ADD takes them:
//!
//! 1. open the pod's namespace and refuse an `ifname` already there ([`Pod::open_for_add`]);
//! 2. create the link: a veth pair with a host name derived from the attachment ([`veth`],
//!    [`naming`]), or a link created straight into the pod ([`inpod`]);
//! 3. ask IPAM ([`ipam`]), fill gateways and default routes ([`result`]);
//! 4. configure the pod's interface from the result ([`configure`], Go's `ipam.ConfigureIface`);
//! 5. forwarding sysctls for the families in use ([`configure::enable_forwarding`]);
//!
//! each successful step registering its reversal in an [`Undo`] that a failed ADD runs. CHECK
//! starts with prevResult, the namespace and IPAM and compares the pod's interface with prevResult
//! ([`check`]); DEL removes the pod's link ([`veth::del`], [`inpod::del`]), alongside what does
//! not need it ([`concurrent`]). A chained ADD outputs the previous result with its own appended
//! ([`result::chained`]). A plugin that masquerades (bridge, ptp) shares its rules, STATUS, GC and
//! DEL ([`masquerade`]); the configuration keys several plugins read are in [`keys`]. A plugin
//! whose only interface is the pod's (dummy, vlan, tap) ends its verbs with [`single`]; one whose
//! link sits on a master (macvlan, ipvlan) runs [`sublink`]'s.

pub mod check;
pub mod concurrent;
pub mod configure;
pub mod hostnet;
pub mod inpod;
pub mod ipam;
pub mod keys;
pub mod masquerade;
pub mod naming;
mod pod;
pub mod result;
pub mod single;
pub mod sublink;
mod undo;
pub mod veth;

pub use pod::Pod;
pub use undo::Undo;

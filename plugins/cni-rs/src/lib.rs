//! The names the multi-call binary `cni-rs` answers to, for the binary and for the tests that
//! check an installation or every plugin (one list, so a new plugin is named once), and its
//! allocator.

pub mod alloc;

/// The plugins `cni-rs` can be, by type name, sorted.
pub const PLUGINS: [&str; 18] = [
    "bandwidth",
    "bridge",
    "dhcp",
    "dummy",
    "firewall",
    "host-device",
    "host-local",
    "ipvlan",
    "loopback",
    "macvlan",
    "portmap",
    "ptp",
    "sbr",
    "static",
    "tap",
    "tuning",
    "vlan",
    "vrf",
];

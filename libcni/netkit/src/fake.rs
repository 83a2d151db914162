//! Test doubles for the kernel-facing traits, so a plugin's ordering of steps is unit-tested
//! without root.

use crate::firewall::{BackendKind, Firewall, Masquerade, PortMap};
use libcni::conf::Attachment;
use libcni::{Error, Result};
use std::sync::{Arc, Mutex};

/// A [`Firewall`] that changes nothing and records each call as one line in a log it shares with
/// its clones (and with anything else that writes there, to interleave other steps), e.g.
/// `add_masquerade net c1 eth0 10.1.2.7/24` or `del_masquerade net c1 eth0`. A call whose name is
/// in `fail` is recorded, then fails with code 100. With a `probe`, each line ends with
/// ` | <what the probe returned>`: the state (a pod's addresses, say) at the moment of the call.
#[derive(Clone, Default)]
pub struct RecordingFirewall {
    pub log: Arc<Mutex<Vec<String>>>,
    pub fail: Vec<&'static str>,
    pub probe: Option<Probe>,
}

/// What [`RecordingFirewall`] looks at on each call.
pub type Probe = Arc<dyn Fn() -> String + Send + Sync>;

impl RecordingFirewall {
    /// A recorder writing to `log`.
    pub fn new(log: Arc<Mutex<Vec<String>>>) -> Self {
        RecordingFirewall { log, ..Default::default() }
    }

    /// The lines recorded so far.
    pub fn calls(&self) -> Vec<String> {
        self.log.lock().map(|l| l.clone()).unwrap_or_default()
    }

    fn record(&self, call: &'static str, args: String) -> Result<()> {
        let seen = self.probe.as_ref().map(|probe| format!(" | {}", probe())).unwrap_or_default();
        if let Ok(mut log) = self.log.lock() {
            log.push(format!("{call} {args}{seen}"));
        }
        if self.fail.contains(&call) {
            return Err(Error::network(format!("{call}: failed as the test asked")));
        }
        Ok(())
    }
}

fn addrs(m: &Masquerade) -> String {
    m.addresses.iter().map(|a| a.to_string()).collect::<Vec<_>>().join(",")
}

fn kept(keep: &[Attachment]) -> String {
    keep.iter().map(|a| format!("{}/{}", a.container_id, a.ifname)).collect::<Vec<_>>().join(",")
}

impl Firewall for RecordingFirewall {
    fn kind(&self) -> BackendKind {
        BackendKind::Nftables
    }
    fn add_masquerade(&self, m: &Masquerade) -> Result<()> {
        self.record("add_masquerade", format!("{} {} {} {}", m.network, m.container_id, m.ifname, addrs(m)))
    }
    fn del_masquerade(&self, network: &str, container_id: &str, ifname: &str) -> Result<()> {
        self.record("del_masquerade", format!("{network} {container_id} {ifname}"))
    }
    fn check_masquerade(&self, m: &Masquerade) -> Result<()> {
        self.record("check_masquerade", format!("{} {} {} {}", m.network, m.container_id, m.ifname, addrs(m)))
    }
    fn gc_masquerade(&self, network: &str, keep: &[Attachment]) -> Result<()> {
        self.record("gc_masquerade", format!("{network} {}", kept(keep)))
    }
    fn add_portmap(&self, p: &PortMap) -> Result<()> {
        self.record("add_portmap", format!("{} {} {}", p.network, p.container_id, p.ifname))
    }
    fn del_portmap(&self, network: &str, container_id: &str, ifname: &str) -> Result<()> {
        self.record("del_portmap", format!("{network} {container_id} {ifname}"))
    }
    fn check_portmap(&self, p: &PortMap) -> Result<()> {
        self.record("check_portmap", format!("{} {} {}", p.network, p.container_id, p.ifname))
    }
    fn gc_portmap(&self, network: &str, keep: &[Attachment]) -> Result<()> {
        self.record("gc_portmap", format!("{network} {}", kept(keep)))
    }
    fn status(&self) -> Result<()> {
        self.record("status", String::new())
    }
}

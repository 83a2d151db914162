//! dhcp IPAM: addresses from a DHCP server on the pod's network, held by a long-running daemon
//! (`dhcp daemon`, the same binary) that renews them for the pod's lifetime and releases them on
//! DEL. The plugin side resolves the configuration and asks the daemon over its unix socket
//! (`ipam.daemonSocketPath`, default `/run/cni/dhcp.sock`).
//!
//! The daemon speaks a line of JSON each way (module `proto`), not the reference's Go net/rpc (gob
//! over an HTTP CONNECT), so our plugin needs our daemon: the binary, its command line, socket path
//! and systemd unit are the reference's, and a node swaps both at once.

pub mod client;
pub mod config;
pub mod daemon;
pub mod packet;
pub mod proto;

use config::DhcpConfig;
use ipnetwork::{IpNetwork, Ipv4Network};
use libcni::types::{Dns, IpConfig, Route};
use libcni::{code, CniResult, Error, Plugin, Request, Result};
use proto::{Answer, Call, CallError, LeaseInfo, LeaseKey, LeaseRequest};
use std::net::IpAddr;
use std::path::Path;

pub struct Dhcp;

fn key(req: &Request) -> LeaseKey {
    LeaseKey { container_id: req.container_id.clone(), network: req.conf.name.clone(), ifname: req.ifname.clone() }
}

fn unreachable(socket: &Path, e: &std::io::Error) -> String {
    format!(
        "the dhcp daemon is not reachable at {}: {e}; start it with `dhcp daemon` (see docs/plugins.md, dhcp) or \
         set ipam.daemonSocketPath to where it listens",
        socket.display()
    )
}

/// One call to the daemon; its errors keep their code, a connection failure is `unavailable`.
fn ask(socket: &Path, call: &Call, unavailable: u32) -> Result<Answer> {
    match proto::call(socket, call) {
        Ok(Answer::Error { code, msg }) => Err(Error::new(code, msg)),
        Ok(answer) => Ok(answer),
        Err(CallError::Connect(e)) => Err(Error::new(unavailable, unreachable(socket, &e))),
        Err(CallError::Protocol(m)) => {
            Err(Error::new(code::PLUGIN_EXEC, format!("the dhcp daemon at {}: {m}", socket.display())))
        }
    }
}

/// Best-effort calls (DEL, GC): a daemon that is not running holds no lease, so there is nothing to
/// release; the caller succeeds and the reason goes to stderr.
fn ask_best_effort(socket: &Path, call: &Call) -> Result<()> {
    match proto::call(socket, call) {
        Ok(Answer::Error { code, msg }) => Err(Error::new(code, msg)),
        Ok(_) => Ok(()),
        Err(CallError::Connect(e)) => {
            eprintln!("dhcp: {}; no lease is held, nothing to release", unreachable(socket, &e));
            Ok(())
        }
        Err(CallError::Protocol(m)) => {
            Err(Error::new(code::PLUGIN_EXEC, format!("the dhcp daemon at {}: {m}", socket.display())))
        }
    }
}

fn result(info: &LeaseInfo) -> Result<CniResult> {
    let net = |addr, prefix| {
        Ipv4Network::new(addr, prefix)
            .map(IpNetwork::V4)
            .map_err(|e| Error::network(format!("the dhcp daemon answered {addr}/{prefix}: {e}")))
    };
    let mut routes = Vec::new();
    for r in &info.routes {
        routes.push(Route {
            dst: IpNetwork::V4(
                Ipv4Network::new(r.dst, r.prefix)
                    .map_err(|e| Error::network(format!("route {}/{}: {e}", r.dst, r.prefix)))?,
            ),
            gw: r.gw.map(IpAddr::V4),
            mtu: None,
            advmss: None,
            priority: None,
            table: None,
            scope: None,
        });
    }
    Ok(CniResult {
        cni_version: String::new(),
        interfaces: Vec::new(),
        ips: vec![IpConfig {
            address: net(info.address, info.prefix)?,
            gateway: info.gateway.map(IpAddr::V4),
            interface: None,
        }],
        routes,
        dns: Dns {
            nameservers: info.nameservers.iter().map(|n| n.to_string()).collect(),
            domain: info.domain.clone(),
            ..Dns::default()
        },
    })
}

impl Plugin for Dhcp {
    /// `provide[].fromArg` names any CNI_ARGS key, as in the reference, which never refuses one.
    fn reads_cni_args(&self) -> bool {
        false
    }

    fn add(&self, req: &Request) -> Result<CniResult> {
        let conf = DhcpConfig::parse(&req.conf, &req.args)?;
        let netns = req.netns.as_ref().ok_or_else(|| Error::env("CNI_NETNS is required for ADD"))?;
        let netns = std::path::absolute(netns)
            .map_err(|e| Error::env(format!("CNI_NETNS {}: {e}", netns.display())))?
            .to_string_lossy()
            .into_owned();
        let call = Call::Allocate(LeaseRequest {
            key: key(req),
            netns,
            request: conf.request,
            provide: conf.provide,
            suppress_gateway: conf.suppress_gateway,
        });
        match ask(&conf.socket_path, &call, code::TRY_AGAIN)? {
            Answer::Lease(info) => result(&info),
            other => Err(Error::new(code::PLUGIN_EXEC, format!("the dhcp daemon answered ADD with {other:?}"))),
        }
    }

    /// The daemon holds a lease for this attachment, and its address is the one in prevResult.
    fn check(&self, req: &Request) -> Result<()> {
        let conf = DhcpConfig::parse(&req.conf, &req.args)?;
        let k = key(req);
        let info = match ask(&conf.socket_path, &Call::Check { key: k.clone() }, code::TRY_AGAIN)? {
            Answer::Lease(info) => info,
            _ => {
                return Err(Error::new(
                    code::CHECK_FAILED,
                    format!("the dhcp daemon holds no lease for {}", k.display()),
                ))
            }
        };
        if let Some(prev) = &req.conf.prev_result {
            let held = IpAddr::V4(info.address);
            if !prev.ips.iter().any(|ip| ip.address.ip() == held) {
                return Err(Error::new(
                    code::CHECK_FAILED,
                    format!("the lease of {} is {held}, which is not in prevResult", k.display()),
                ));
            }
        }
        Ok(())
    }

    fn del(&self, req: &Request) -> Result<()> {
        let socket = config::socket_path_lenient(&req.conf);
        ask_best_effort(&socket, &Call::Release { key: key(req) })
    }

    fn status(&self, req: &Request) -> Result<()> {
        let conf = DhcpConfig::parse(&req.conf, &req.args)?;
        ask(&conf.socket_path, &Call::Status, code::NOT_AVAILABLE).map(drop)
    }

    /// Releases the leases the daemon holds for this network that are not valid attachments.
    fn gc(&self, req: &Request) -> Result<()> {
        let socket = config::socket_path_lenient(&req.conf);
        let keep = req
            .valid_attachments()
            .iter()
            .map(|a| LeaseKey {
                container_id: a.container_id.clone(),
                network: req.conf.name.clone(),
                ifname: a.ifname.clone(),
            })
            .collect();
        ask_best_effort(&socket, &Call::Gc { network: req.conf.name.clone(), keep })
    }
}

/// The process entry point: `dhcp daemon ...` runs the daemon, anything else is a CNI call.
pub fn main_with_args(args: &[String]) -> ! {
    if args.get(1).map(String::as_str) == Some("daemon") {
        std::process::exit(daemon::main(&args[2..]));
    }
    libcni::skel::run(&Dhcp)
}

//! Names ADD gives links it makes outside the pod, derived from the attachment (container id and
//! `ifname`), so that DEL finds them again from the same request and two attachments never pick
//! the same one first.

use sha2::{Digest, Sha256};

/// How many candidate names ADD tries before giving up on collisions.
pub const HOST_NAME_ATTEMPTS: u32 = 8;

/// Candidate names for a veth's host end (`attempt` 0 first). A later attempt is used only when a
/// hash collision gives another pod's veth the same name.
pub fn host_veth_name(container_id: &str, ifname: &str, attempt: u32) -> String {
    let seed =
        if attempt == 0 { format!("{container_id}:{ifname}") } else { format!("{container_id}:{ifname}:{attempt}") };
    format!("veth{}", hex4(&seed))
}

/// Candidate temporary names for a link created outside the pod's namespace and renamed to its
/// `ifname` once inside (`attempt` 0 first; [`super::inpod::create_renamed`]).
pub fn temp_link_name(container_id: &str, ifname: &str, attempt: u32) -> String {
    format!("tmp{}", hex4(&format!("{container_id}:{ifname}:temp:{attempt}")))
}

/// The first four bytes of the seed's SHA-256, in hex: eight characters, so that a prefix of up
/// to seven keeps the name within IFNAMSIZ.
fn hex4(seed: &str) -> String {
    Sha256::digest(seed.as_bytes()).iter().take(4).map(|b| format!("{b:02x}")).collect()
}

//! The node's WireGuard key pair. The private key is made once, on the first start with
//! `--backend wireguard`, and kept in `<state-dir>/wireguard.key` (base64, as `wg genkey` writes
//! it): a restarted agent keeps its public key, so the other nodes' peers stay valid and traffic
//! keeps flowing. The file is written to a temporary name with mode 0600 and renamed into place,
//! so a crash leaves either no key or a whole one, and no other user ever can read it.

use anyhow::{anyhow, Result};
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use x25519_dalek::{PublicKey, StaticSecret};

pub const KEY_FILE: &str = "wireguard.key";

/// A WireGuard key pair; the private half is wiped from memory on drop.
pub struct KeyPair {
    pub private: StaticSecret,
    pub public: [u8; 32],
}

impl KeyPair {
    pub fn from_private(bytes: [u8; 32]) -> KeyPair {
        let private = StaticSecret::from(bytes);
        let public = PublicKey::from(&private).to_bytes();
        KeyPair { private, public }
    }

    pub fn public_base64(&self) -> String {
        encode(&self.public)
    }
}

pub fn encode(key: &[u8; 32]) -> String {
    STANDARD.encode(key)
}

/// A key in WireGuard's text form: standard base64 of exactly 32 bytes.
pub fn decode(text: &str) -> Option<[u8; 32]> {
    if text.len() != 44 {
        return None;
    }
    STANDARD.decode(text).ok()?.try_into().ok()
}

pub fn key_path(state_dir: &Path) -> PathBuf {
    state_dir.join(KEY_FILE)
}

/// The key pair kept in `state_dir`, made (and saved) when there is none. A key file that is not
/// a regular file, or holds anything but one key, is an error naming the file: replacing it would
/// change this node's identity behind the operator's back.
pub fn load_or_create(state_dir: &Path) -> Result<(KeyPair, bool)> {
    let path = key_path(state_dir);
    match OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC).open(&path) {
        Ok(file) => Ok((read_key(&path, file)?, false)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let mut bytes = [0u8; 32];
            getrandom::fill(&mut bytes).map_err(|e| anyhow!("make a WireGuard private key: getrandom: {e}"))?;
            let pair = KeyPair::from_private(bytes);
            write_key(state_dir, &path, &pair)?;
            Ok((pair, true))
        }
        Err(e) => {
            Err(anyhow!("open WireGuard key {}: {e} (it must be a regular file, not a symbolic link)", path.display()))
        }
    }
}

fn read_key(path: &Path, file: File) -> Result<KeyPair> {
    let meta = file.metadata().map_err(|e| anyhow!("stat WireGuard key {}: {e}", path.display()))?;
    if !meta.is_file() {
        return Err(anyhow!("WireGuard key {} is not a regular file; remove it", path.display()));
    }
    if meta.mode() & 0o077 != 0 {
        // Someone widened it; the key may have leaked, but narrowing it keeps it from leaking further.
        file.set_permissions(std::fs::Permissions::from_mode(0o600))
            .map_err(|e| anyhow!("make WireGuard key {} mode 0600: {e}", path.display()))?;
        eprintln!("warning: WireGuard key {} was readable by others; made it mode 0600", path.display());
    }
    let mut text = String::new();
    file.take(256).read_to_string(&mut text).map_err(|e| anyhow!("read WireGuard key {}: {e}", path.display()))?;
    let bytes = decode(text.trim()).ok_or_else(|| {
        anyhow!(
            "WireGuard key {} does not hold one base64 32-byte key; restore it, or remove it to make a new one \
             (the other nodes then learn the new public key from this node's record)",
            path.display()
        )
    })?;
    Ok(KeyPair::from_private(bytes))
}

fn write_key(state_dir: &Path, path: &Path, pair: &KeyPair) -> Result<()> {
    std::fs::create_dir_all(state_dir).map_err(|e| anyhow!("create --state-dir {}: {e}", state_dir.display()))?;
    let temp = state_dir.join(format!(".{KEY_FILE}.{}", std::process::id()));
    let _ = std::fs::remove_file(&temp);
    let result = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&temp)
            .map_err(|e| anyhow!("create {}: {e}", temp.display()))?;
        let text = format!("{}\n", encode(&pair.private.to_bytes()));
        file.write_all(text.as_bytes()).map_err(|e| anyhow!("write {}: {e}", temp.display()))?;
        file.sync_all().map_err(|e| anyhow!("sync {}: {e}", temp.display()))?;
        std::fs::rename(&temp, path).map_err(|e| anyhow!("rename {} to {}: {e}", temp.display(), path.display()))?;
        File::open(state_dir)
            .and_then(|dir| dir.sync_all())
            .map_err(|e| anyhow!("sync --state-dir {}: {e}", state_dir.display()))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("cni-rs-node-wgkey-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn public_key_is_x25519_of_the_private_key() {
        // RFC 7748 section 6.1, Alice's key pair.
        let private: [u8; 32] = [
            0x77, 0x07, 0x6d, 0x0a, 0x73, 0x18, 0xa5, 0x7d, 0x3c, 0x16, 0xc1, 0x72, 0x51, 0xb2, 0x66, 0x45, 0xdf, 0x4c,
            0x2f, 0x87, 0xeb, 0xc0, 0x99, 0x2a, 0xb1, 0x77, 0xfb, 0xa5, 0x1d, 0xb9, 0x2c, 0x2a,
        ];
        let public: [u8; 32] = [
            0x85, 0x20, 0xf0, 0x09, 0x89, 0x30, 0xa7, 0x54, 0x74, 0x8b, 0x7d, 0xdc, 0xb4, 0x3e, 0xf7, 0x5a, 0x0d, 0xbf,
            0x3a, 0x0d, 0x26, 0x38, 0x1a, 0xf4, 0xeb, 0xa4, 0xa9, 0x8e, 0xaa, 0x9b, 0x4e, 0x6a,
        ];
        assert_eq!(KeyPair::from_private(private).public, public);
    }

    #[test]
    fn key_is_made_once_with_mode_0600_and_kept() {
        let dir = temp_dir("keep");
        let (first, made) = load_or_create(&dir.join("nested")).unwrap();
        assert!(made);
        let path = key_path(&dir.join("nested"));
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.mode() & 0o777, 0o600);
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(decode(text.trim()), Some(first.private.to_bytes()));
        let (again, made) = load_or_create(&dir.join("nested")).unwrap();
        assert!(!made);
        assert_eq!(again.public, first.public);
        assert_eq!(std::fs::read_dir(dir.join("nested")).unwrap().count(), 1, "no temporary file left");
        // A widened mode is narrowed again, the key kept.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let (again, _) = load_or_create(&dir.join("nested")).unwrap();
        assert_eq!(again.public, first.public);
        assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
        // Two nodes do not make one key.
        let (other, _) = load_or_create(&dir.join("other")).unwrap();
        assert_ne!(other.public, first.public);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn refuses_a_bad_or_linked_key_file() {
        let dir = temp_dir("bad");
        std::fs::create_dir_all(&dir).unwrap();
        let path = key_path(&dir);
        std::fs::write(&path, "not a key\n").unwrap();
        let err = load_or_create(&dir).err().unwrap();
        assert!(err.to_string().contains("does not hold one base64 32-byte key"), "{err}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "not a key\n", "a bad key is not replaced");
        std::fs::remove_file(&path).unwrap();
        std::fs::write(dir.join("elsewhere"), format!("{}\n", encode(&[7; 32]))).unwrap();
        std::os::unix::fs::symlink(dir.join("elsewhere"), &path).unwrap();
        let err = load_or_create(&dir).err().unwrap();
        assert!(err.to_string().contains("not a symbolic link"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn decodes_only_32_byte_keys() {
        assert_eq!(decode(&encode(&[1; 32])), Some([1; 32]));
        assert_eq!(decode(&STANDARD.encode([1u8; 31])), None);
        assert_eq!(decode(&STANDARD.encode([1u8; 33])), None);
        assert_eq!(decode("AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE"), None, "padding is required");
        assert_eq!(decode(&encode(&[1; 32]).replace('A', "-")), None);
    }
}

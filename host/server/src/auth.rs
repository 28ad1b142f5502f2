//! Bearer tokens with roles, loaded from a file. Viewers read; admins also change policy.
//!
//! The file is YAML:
//! ```yaml
//! tokens:
//!   - name: alice        # shown in the audit log
//!     role: admin        # or viewer
//!     token: "…"         # at least 16 characters
//! ```

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use arc_swap::ArcSwap;

use axum::http::HeaderMap;
use serde::{Deserialize, Serialize};

use crate::error::{ApiError, Result};

pub use gantry_contract::{Caller, Role};

/// Refusing a viewer: the one check every mutating route makes. A trait because [`Caller`] is
/// the contract's type and the refusal is the server's error.
pub trait RequireAdmin {
    /// Refuses a viewer with 403, naming what it tried.
    fn require_admin(&self, action: &str) -> Result<()>;
}

impl RequireAdmin for Caller {
    fn require_admin(&self, action: &str) -> Result<()> {
        match self.role {
            Role::Admin => Ok(()),
            Role::Viewer => Err(ApiError::Forbidden {
                who: self.name.clone(),
                role: self.role.as_str(),
                action: action.to_string(),
            }),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenFile {
    tokens: Vec<TokenEntry>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenEntry {
    name: String,
    role: Role,
    token: String,
}

/// Why a token file was refused.
#[derive(Debug, thiserror::Error)]
pub enum TokenFileError {
    #[error("cannot read the token file {path}: {detail}")]
    Read { path: String, detail: String },
    #[error("the token file {path} is malformed: {detail}")]
    Malformed { path: String, detail: String },
    #[error("the token file {path}: token of {name} is shorter than 16 characters")]
    Short { path: String, name: String },
    #[error(
        "the token file {path}: token of {name} starts with `sha256:` but is not 64 hex digits after it"
    )]
    BadDigest { path: String, name: String },
    #[error("the token file {path}: {name} and {other} share a token")]
    Duplicate {
        path: String,
        name: String,
        other: String,
    },
    #[error("the token file {path} holds no tokens")]
    Empty { path: String },
}

/// The tokens the server accepts, kept only as SHA-256 digests: a memory dump or a debug print
/// shows no token. Loaded from a file, they follow it: an edit (a token revoked or added) takes
/// effect within [`RELOAD_EVERY`], without a restart.
#[derive(Debug, Clone, Default)]
pub struct Tokens {
    inner: Arc<Inner>,
}

/// How often the token file is looked at again (one `stat`, on a request).
pub const RELOAD_EVERY: Duration = Duration::from_secs(1);

#[derive(Debug, Default)]
struct Inner {
    /// Each token's digest and its caller; every request compares against all of them in
    /// constant time, so timing tells nothing about how close a guess came. Swapped whole on
    /// a reload while requests read it.
    digest_to_caller: ArcSwap<Vec<([u8; 32], Caller)>>,
    /// The file, and its modification time and length when last loaded.
    source: Option<PathBuf>,
    stamp: Mutex<Option<(SystemTime, u64)>>,
    /// When the file was last looked at, so a flood of requests costs one `stat` a second.
    checked: Mutex<Option<Instant>>,
}

fn digest(token: &str) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(token.as_bytes()).into()
}

/// The 32 bytes of a SHA-256 digest written as 64 hex digits.
fn parse_digest(hex: &str) -> Option<[u8; 32]> {
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// Equal or not, in time that does not depend on where two digests differ.
fn same(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Tokens {
    /// Loads and checks a token file, and follows it from then on.
    pub fn load(path: &Path) -> std::result::Result<Self, TokenFileError> {
        let digest_to_caller = Self::read(path)?;
        Ok(Self {
            inner: Arc::new(Inner {
                digest_to_caller: ArcSwap::from_pointee(digest_to_caller),
                source: Some(path.to_path_buf()),
                stamp: Mutex::new(stamp(path)),
                checked: Mutex::new(Some(Instant::now())),
            }),
        })
    }

    /// Reads the file again when its time or length changed. A file that no longer loads
    /// leaves the tokens as they were, and says why in the log.
    fn reload_if_changed(&self) {
        let Some(path) = &self.inner.source else {
            return;
        };
        {
            let mut checked = self.inner.checked.lock().unwrap_or_else(|e| e.into_inner());
            if checked.is_some_and(|at| at.elapsed() < RELOAD_EVERY) {
                return;
            }
            *checked = Some(Instant::now());
        }
        let now = stamp(path);
        let mut last = self.inner.stamp.lock().unwrap_or_else(|e| e.into_inner());
        if now == *last {
            return;
        }
        match Self::read(path) {
            Ok(digest_to_caller) => {
                tracing::info!(path = %path.display(), tokens = digest_to_caller.len(), "token file reloaded");
                self.inner
                    .digest_to_caller
                    .store(Arc::new(digest_to_caller));
                *last = now;
            }
            Err(error) => {
                tracing::error!(%error, "the token file changed but does not load; keeping the tokens loaded before");
                *last = now;
            }
        }
    }

    /// The digests and callers of a token file.
    fn read(path: &Path) -> std::result::Result<Vec<([u8; 32], Caller)>, TokenFileError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| TokenFileError::Read {
            path: shown.clone(),
            detail: e.to_string(),
        })?;
        let file: TokenFile =
            serde_yaml::from_str(&text).map_err(|e| TokenFileError::Malformed {
                path: shown.clone(),
                detail: e.to_string(),
            })?;
        if file.tokens.is_empty() {
            return Err(TokenFileError::Empty { path: shown });
        }
        // A token is given as itself, or as `sha256:` and its digest in hex, so a Secret (or
        // a file anyone may read) need not hold the token: both compare the same way.
        let mut digest_to_caller: HashMap<[u8; 32], Caller> = HashMap::new();
        for entry in file.tokens {
            let digest = match entry.token.strip_prefix("sha256:") {
                Some(hex) => parse_digest(hex).ok_or_else(|| TokenFileError::BadDigest {
                    path: shown.clone(),
                    name: entry.name.clone(),
                })?,
                None if entry.token.len() < 16 => {
                    return Err(TokenFileError::Short {
                        path: shown,
                        name: entry.name,
                    });
                }
                None => digest(&entry.token),
            };
            if let Some(other) = digest_to_caller.get(&digest) {
                return Err(TokenFileError::Duplicate {
                    path: shown,
                    name: entry.name,
                    other: other.name.clone(),
                });
            }
            digest_to_caller.insert(
                digest,
                Caller {
                    name: entry.name,
                    role: entry.role,
                },
            );
        }
        Ok(digest_to_caller.into_iter().collect())
    }

    /// Writes a token file with one fresh admin and one fresh viewer token, readable by the owner
    /// only: what `gantry serve` does on first start so a newcomer can sign in. Returns the
    /// admin token and the viewer token.
    pub fn generate(path: &Path) -> std::io::Result<(String, String)> {
        let admin = random_token()?;
        let viewer = random_token()?;
        let file = serde_yaml::to_string(&serde_json::json!({
            "tokens": [
                TokenEntry { name: "admin".into(), role: Role::Admin, token: admin.clone() },
                TokenEntry { name: "viewer".into(), role: Role::Viewer, token: viewer.clone() },
            ]
        }))
        .map_err(std::io::Error::other)?;
        // Owner-only from creation: there is no moment at which another user could read it.
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            let mut dir = std::fs::DirBuilder::new();
            dir.recursive(true);
            #[cfg(unix)]
            std::os::unix::fs::DirBuilderExt::mode(&mut dir, 0o700);
            dir.create(parent)?;
        }
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        use std::io::Write;
        options.open(path)?.write_all(file.as_bytes())?;
        Ok((admin, viewer))
    }

    /// The caller behind a request's `Authorization` header: 401 when it is missing or unknown.
    pub fn caller(&self, headers: &HeaderMap) -> Result<Caller> {
        let token = bearer(headers)?;
        self.reload_if_changed();
        let presented = digest(token);
        let mut found = None;
        let known_tokens = self.inner.digest_to_caller.load();
        for (known, caller) in known_tokens.iter() {
            if same(known, &presented) {
                found = Some(caller);
            }
        }
        found.cloned().ok_or(ApiError::BadToken)
    }
}

impl Tokens {
    /// The first 12 hex digits of the SHA-256 of the bearer token presented, if any: enough to
    /// tell refused tokens apart in the audit log without writing a secret there.
    pub fn presented_digest(&self, headers: &HeaderMap) -> Option<String> {
        let token = bearer(headers).ok()?;
        Some(
            digest(token)[..6]
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect(),
        )
    }
}

/// The token of an `Authorization: Bearer …` header.
fn bearer(headers: &HeaderMap) -> Result<&str> {
    let value = headers
        .get(axum::http::header::AUTHORIZATION)
        .ok_or(ApiError::MissingToken)?;
    let value = value.to_str().map_err(|_| ApiError::BadToken)?;
    Ok(value
        .strip_prefix("Bearer ")
        .or_else(|| value.strip_prefix("bearer "))
        .ok_or(ApiError::MissingToken)?
        .trim())
}

/// A file's modification time and length, or `None` when it cannot be read.
fn stamp(path: &Path) -> Option<(SystemTime, u64)> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

/// 32 random bytes from the OS, hex-encoded.
fn random_token() -> std::io::Result<String> {
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            axum::http::header::AUTHORIZATION,
            value.parse().expect("header"),
        );
        h
    }

    #[test]
    fn generated_tokens_load_and_check_roles() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("tokens.yaml");
        let (admin, viewer) = Tokens::generate(&path).expect("generate");
        let tokens = Tokens::load(&path).expect("load");
        let a = tokens
            .caller(&headers(&format!("Bearer {admin}")))
            .expect("admin");
        assert_eq!(a.role, Role::Admin);
        assert!(a.require_admin("activate").is_ok());
        let v = tokens
            .caller(&headers(&format!("Bearer {viewer}")))
            .expect("viewer");
        let err = v.require_admin("activate a policy set").unwrap_err();
        assert_eq!(
            err.to_string(),
            "the viewer token of viewer may not activate a policy set: an admin token is needed"
        );
        assert!(matches!(
            tokens.caller(&HeaderMap::new()),
            Err(ApiError::MissingToken)
        ));
        assert!(matches!(
            tokens.caller(&headers("Bearer nope-nope-nope-nope")),
            Err(ApiError::BadToken)
        ));
    }

    #[test]
    fn a_token_removed_from_the_file_stops_working_without_a_restart() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("tokens.yaml");
        let file = |tokens: &[(&str, &str)]| {
            let lines: String = tokens
                .iter()
                .map(|(name, token)| {
                    format!("  - {{name: {name}, role: viewer, token: {token}}}\n")
                })
                .collect();
            std::fs::write(&path, format!("tokens:\n{lines}")).expect("write");
        };
        let (keep, revoke) = ("keep-0123456789abcdef", "revoke-0123456789abcdef");
        file(&[("keep", keep), ("gone", revoke)]);
        let tokens = Tokens::load(&path).expect("load");
        let bearer = |t: &str| headers(&format!("Bearer {t}"));
        assert!(tokens.caller(&bearer(revoke)).is_ok());
        file(&[("keep", keep)]);
        std::thread::sleep(RELOAD_EVERY + Duration::from_millis(100));
        assert!(matches!(
            tokens.caller(&bearer(revoke)),
            Err(ApiError::BadToken)
        ));
        assert_eq!(tokens.caller(&bearer(keep)).expect("kept").name, "keep");
        // A broken edit keeps what was loaded.
        std::fs::write(&path, "tokens: [oops").expect("write");
        std::thread::sleep(RELOAD_EVERY + Duration::from_millis(100));
        assert_eq!(tokens.caller(&bearer(keep)).expect("kept").name, "keep");
    }

    #[cfg(unix)]
    #[test]
    fn a_generated_token_file_is_owner_only_from_creation() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("fresh").join("tokens.yaml");
        Tokens::generate(&path).expect("generate");
        let mode = |p: &Path| std::fs::metadata(p).expect("metadata").permissions().mode() & 0o777;
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(path.parent().expect("dir")), 0o700);
        // Never over an existing file.
        assert!(Tokens::generate(&path).is_err());
    }

    #[test]
    fn bad_token_files_name_the_problem() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("t.yaml");
        std::fs::write(&path, "tokens:\n  - {name: a, role: admin, token: short}\n")
            .expect("write");
        let err = Tokens::load(&path).unwrap_err().to_string();
        assert!(
            err.ends_with("token of a is shorter than 16 characters"),
            "{err}"
        );
        std::fs::write(
            &path,
            "tokens:\n  - {name: a, role: root, token: 0123456789abcdef}\n",
        )
        .expect("write");
        let err = Tokens::load(&path).unwrap_err().to_string();
        assert!(
            err.contains("is malformed") && err.contains("root"),
            "{err}"
        );
        let err = Tokens::load(&dir.path().join("missing.yaml"))
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("cannot read the token file"), "{err}");
        std::fs::write(
            &path,
            "tokens:\n  - {name: a, role: admin, token: \"sha256:0123\"}\n",
        )
        .expect("write");
        let err = Tokens::load(&path).unwrap_err().to_string();
        assert!(
            err.ends_with("token of a starts with `sha256:` but is not 64 hex digits after it"),
            "{err}"
        );
    }

    #[test]
    fn a_token_given_by_its_digest_signs_in_and_cannot_be_given_twice() {
        use sha2::Digest;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("t.yaml");
        let token = "a-secret-token-0123456789";
        let hex: String = sha2::Sha256::digest(token.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        std::fs::write(
            &path,
            format!("tokens:\n  - {{name: prom, role: viewer, token: \"sha256:{hex}\"}}\n"),
        )
        .expect("write");
        let tokens = Tokens::load(&path).expect("load");
        let caller = tokens
            .caller(&headers(&format!("Bearer {token}")))
            .expect("the token signs in");
        assert_eq!((caller.name.as_str(), caller.role), ("prom", Role::Viewer));
        // The digest itself is no token.
        assert!(
            tokens
                .caller(&headers(&format!("Bearer sha256:{hex}")))
                .is_err()
        );
        // The same token given as itself and by its digest is one token twice.
        std::fs::write(
            &path,
            format!(
                "tokens:\n  - {{name: prom, role: viewer, token: \"sha256:{hex}\"}}\n  - {{name: again, role: admin, token: {token}}}\n"
            ),
        )
        .expect("write");
        let err = Tokens::load(&path).unwrap_err().to_string();
        assert!(err.ends_with("again and prom share a token"), "{err}");
    }
}

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
use std::path::Path;

use axum::http::HeaderMap;
use serde::{Deserialize, Serialize};

use crate::error::{ApiError, Result};

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Viewer,
    Admin,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Admin => "admin",
        }
    }
}

/// The caller of a request, once its token checked out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Caller {
    pub name: String,
    pub role: Role,
}

impl Caller {
    /// Refuses a viewer with 403, naming what it tried.
    pub fn require_admin(&self, action: &str) -> Result<()> {
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
/// shows no token.
#[derive(Debug, Clone, Default)]
pub struct Tokens {
    /// Each token's digest and its caller; every request compares against all of them in
    /// constant time, so timing tells nothing about how close a guess came.
    digest_to_caller: Vec<([u8; 32], Caller)>,
}

fn digest(token: &str) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(token.as_bytes()).into()
}

/// Equal or not, in time that does not depend on where two digests differ.
fn same(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Tokens {
    /// Loads and checks a token file.
    pub fn load(path: &Path) -> std::result::Result<Self, TokenFileError> {
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
        let mut token_to_caller: HashMap<String, Caller> = HashMap::new();
        for entry in file.tokens {
            if entry.token.len() < 16 {
                return Err(TokenFileError::Short {
                    path: shown,
                    name: entry.name,
                });
            }
            if let Some(other) = token_to_caller.get(&entry.token) {
                return Err(TokenFileError::Duplicate {
                    path: shown,
                    name: entry.name,
                    other: other.name.clone(),
                });
            }
            token_to_caller.insert(
                entry.token,
                Caller {
                    name: entry.name,
                    role: entry.role,
                },
            );
        }
        Ok(Self {
            digest_to_caller: token_to_caller
                .into_iter()
                .map(|(token, caller)| (digest(&token), caller))
                .collect(),
        })
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
        let value = headers
            .get(axum::http::header::AUTHORIZATION)
            .ok_or(ApiError::MissingToken)?;
        let value = value.to_str().map_err(|_| ApiError::BadToken)?;
        let token = value
            .strip_prefix("Bearer ")
            .or_else(|| value.strip_prefix("bearer "))
            .ok_or(ApiError::MissingToken)?
            .trim();
        let presented = digest(token);
        let mut found = None;
        for (known, caller) in &self.digest_to_caller {
            if same(known, &presented) {
                found = Some(caller);
            }
        }
        found.cloned().ok_or(ApiError::BadToken)
    }
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
    }
}

//! Policy artifacts (content-addressed `.wasm` bytes with manifests) and policy-set versions
//! with the active pointer. Each change commits with its audit entry in one transaction.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use sled::Transactional;
use sled::transaction::{ConflictableTransactionError, TransactionError};

use crate::{Actor, KEY_ACTIVE_SET, KEY_LAST_SET, Result, Store, StoreError, be_u64};

fn tx_err(e: TransactionError<StoreError>) -> StoreError {
    match e {
        TransactionError::Abort(e) => e,
        TransactionError::Storage(e) => StoreError::Sled(e),
    }
}

// A policy's role and failure policy are the core's words: the store keeps them as they are.
pub use gantry_core::{FailurePolicy, PolicyRole};

/// What the uploader says about a policy; the store adds the hash, who and when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewPolicy {
    pub name: String,
    pub role: PolicyRole,
    pub version: String,
    /// The policy's default config, a JSON string passed to its init.
    pub config: String,
}

/// A stored policy's manifest, kept apart from its bytes so listings stay cheap.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct PolicyManifest {
    /// Lowercase hex sha256 of the `.wasm` bytes; the artifact's identity.
    pub sha256: String,
    /// The name the policy declares.
    pub name: String,
    /// The world it implements.
    pub role: PolicyRole,
    /// The version the policy declares.
    pub version: String,
    /// Its default config, the JSON string passed to its init.
    pub config: String,
    /// Size of the `.wasm`, in bytes.
    pub size: u64,
    /// The token name that uploaded it.
    pub uploaded_by: String,
    /// When (ms since the epoch).
    pub uploaded_at_ms: u64,
}

/// The answer to an upload: the manifest kept, and whether these bytes were already stored (in
/// which case the first manifest is kept and nothing but the audit entry is written).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PutPolicy {
    pub manifest: PolicyManifest,
    pub already_stored: bool,
}

/// One entry of a policy set: which policy, how it weighs, how it fails and its config.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct SetEntry {
    /// The policy's sha256 (a unique prefix of 8 or more hex characters when creating a set).
    pub sha256: String,
    /// The weight of a score policy's scores.
    pub weight: u32,
    /// What a fault of this policy does.
    #[serde(default)]
    pub failure: FailurePolicy,
    /// JSON config for this use of the policy, passed to its init.
    pub config: String,
    /// This entry's own call deadline in milliseconds; `None` runs it under the engine's
    /// default. Per entry, because an interpreted policy on a large cluster needs more time
    /// than the default grants every other policy.
    #[serde(default)]
    #[cfg_attr(feature = "schema", schema(minimum = 1, maximum = 10000))]
    pub deadline_ms: Option<u64>,
}

/// One version of the policy set: immutable once written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct PolicySet {
    /// 1, 2, 3…; never reused.
    pub version: u64,
    /// In the order the cycle runs them.
    pub entries: Vec<SetEntry>,
    /// The token name that created it.
    pub created_by: String,
    /// When (ms since the epoch).
    pub created_at_ms: u64,
    /// The creator's note: why this version.
    pub note: String,
}

/// Lowercase hex sha256 of `bytes`: the key policies are stored under.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let digest = Sha256::digest(bytes);
    let mut s = String::with_capacity(64);
    for b in digest {
        let _ = write!(s, "{b:02x}");
    }
    s
}

impl Store {
    /// Stores a policy's bytes under their sha256 with its manifest. The same bytes twice are
    /// stored once, and the first manifest is kept. Audited as `policy.upload`.
    pub fn put_policy(
        &self,
        actor: &Actor,
        wasm: &[u8],
        policy: NewPolicy,
        now_ms: u64,
    ) -> Result<PutPolicy> {
        let sha = sha256_hex(wasm);
        let manifest = PolicyManifest {
            sha256: sha.clone(),
            name: policy.name,
            role: policy.role,
            version: policy.version,
            config: policy.config,
            size: wasm.len() as u64,
            uploaded_by: actor.who.clone(),
            uploaded_at_ms: now_ms,
        };
        let manifest_json = serde_json::to_vec(&manifest)?;
        let entry = self.pending_audit(
            actor,
            now_ms,
            "policy.upload",
            format!(
                "{} {} ({}) sha256 {sha}, {} bytes",
                manifest.name, manifest.version, manifest.role, manifest.size
            ),
        )?;
        let existing = (&self.artifacts, &self.manifests, &self.audit)
            .transaction(|(artifacts, manifests, audit)| {
                audit.insert(&entry.key[..], &entry.value[..])?;
                let existing = manifests.get(sha.as_bytes())?;
                if existing.is_none() {
                    artifacts.insert(sha.as_bytes(), wasm)?;
                    manifests.insert(sha.as_bytes(), &manifest_json[..])?;
                }
                Ok(existing)
            })
            .map_err(tx_err)?;
        match existing {
            Some(v) => Ok(PutPolicy {
                manifest: crate::decode("manifests", sha.as_bytes(), &v)?,
                already_stored: true,
            }),
            None => Ok(PutPolicy {
                manifest,
                already_stored: false,
            }),
        }
    }

    /// A policy's manifest by sha256.
    pub fn policy_manifest(&self, sha256: &str) -> Result<Option<PolicyManifest>> {
        self.manifests
            .get(sha256.as_bytes())?
            .map(|v| crate::decode("manifests", sha256.as_bytes(), &v))
            .transpose()
    }

    /// The full sha256 of the one stored policy whose sha256 starts with `prefix`: 8 to 64 hex
    /// characters, so the 12 that `gantry policy list` prints (or any unique shorter run) name
    /// a policy wherever a sha256 is asked for.
    pub fn resolve_policy(&self, prefix: &str) -> Result<String> {
        let prefix = prefix.to_ascii_lowercase();
        if !(8..=64).contains(&prefix.len()) || !prefix.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(StoreError::BadPolicyRef(prefix));
        }
        let mut keys = self.manifests.scan_prefix(prefix.as_bytes()).keys();
        let Some(first) = keys.next().transpose()? else {
            return Err(StoreError::UnknownPolicy(prefix));
        };
        let others = keys.count();
        if others > 0 {
            return Err(StoreError::AmbiguousPolicy {
                prefix,
                count: others + 1,
            });
        }
        String::from_utf8(first.to_vec()).map_err(|_| StoreError::Malformed { tree: "manifests" })
    }

    /// A policy's `.wasm` bytes by sha256.
    pub fn policy_bytes(&self, sha256: &str) -> Result<Option<Vec<u8>>> {
        Ok(self.artifacts.get(sha256.as_bytes())?.map(|v| v.to_vec()))
    }

    /// Every stored policy's manifest, in sha256 order.
    pub fn list_policies(&self) -> Result<Vec<PolicyManifest>> {
        let mut out = Vec::new();
        for item in self.manifests.iter() {
            let (k, v) = item?;
            out.push(crate::decode("manifests", &k, &v)?);
        }
        Ok(out)
    }

    /// Writes a new policy-set version (the previous number plus one) without activating it.
    /// Every entry must name a stored policy. Audited as `set.create`.
    pub fn put_set(
        &self,
        actor: &Actor,
        entries: Vec<SetEntry>,
        note: &str,
        now_ms: u64,
    ) -> Result<PolicySet> {
        if entries.is_empty() {
            return Err(StoreError::EmptySet);
        }
        for e in &entries {
            if !self.manifests.contains_key(e.sha256.as_bytes())? {
                return Err(StoreError::UnknownPolicy(e.sha256.clone()));
            }
        }
        let entry = self.pending_audit(actor, now_ms, "set.create", String::new())?;
        let mut set = PolicySet {
            version: 0,
            entries,
            created_by: actor.who.clone(),
            created_at_ms: now_ms,
            note: note.to_string(),
        };
        let version = (&self.sets, &self.meta, &self.audit)
            .transaction(|(sets, meta, audit)| {
                let last = match meta.get(KEY_LAST_SET)? {
                    Some(v) => be_u64(&v, "meta").map_err(ConflictableTransactionError::Abort)?,
                    None => 0,
                };
                let version = last + 1;
                let mut set = set.clone();
                set.version = version;
                let json = serde_json::to_vec(&set)
                    .map_err(|e| ConflictableTransactionError::Abort(e.into()))?;
                sets.insert(&version.to_be_bytes()[..], json)?;
                meta.insert(KEY_LAST_SET, &version.to_be_bytes()[..])?;
                let mut audit_entry = entry.entry.clone();
                audit_entry.detail = format!(
                    "version {version}, {} entries{}",
                    set.entries.len(),
                    if note.is_empty() {
                        String::new()
                    } else {
                        format!(": {note}")
                    }
                );
                let value = serde_json::to_vec(&audit_entry)
                    .map_err(|e| ConflictableTransactionError::Abort(e.into()))?;
                audit.insert(&entry.key[..], value)?;
                Ok(version)
            })
            .map_err(tx_err)?;
        set.version = version;
        Ok(set)
    }

    /// Makes `version` the active set. Audited as `set.activate`.
    pub fn activate(&self, actor: &Actor, version: u64, now_ms: u64) -> Result<PolicySet> {
        self.point_active(actor, version, now_ms, false)
    }

    /// Makes an earlier `version` active again: the same as [`Store::activate`], but audited as
    /// `set.rollback` so the log shows intent.
    pub fn rollback_to(&self, actor: &Actor, version: u64, now_ms: u64) -> Result<PolicySet> {
        self.point_active(actor, version, now_ms, true)
    }

    /// Points the active set at `version`: a rollback is audited as `set.rollback`, and refused
    /// when `version` is already active (it would change nothing).
    fn point_active(
        &self,
        actor: &Actor,
        version: u64,
        now_ms: u64,
        rollback: bool,
    ) -> Result<PolicySet> {
        let action = if rollback {
            "set.rollback"
        } else {
            "set.activate"
        };
        let previous = self.meta_u64(KEY_ACTIVE_SET)?;
        if rollback && previous == Some(version) {
            return Err(StoreError::AlreadyActive(version));
        }
        let detail = match previous {
            Some(p) => format!("version {p} -> {version}"),
            None => format!("none -> {version}"),
        };
        let entry = self.pending_audit(actor, now_ms, action, detail)?;
        let json = (&self.sets, &self.meta, &self.audit)
            .transaction(|(sets, meta, audit)| {
                let Some(json) = sets.get(version.to_be_bytes())? else {
                    return Err(ConflictableTransactionError::Abort(
                        StoreError::UnknownSetVersion(version),
                    ));
                };
                meta.insert(KEY_ACTIVE_SET, &version.to_be_bytes()[..])?;
                audit.insert(&entry.key[..], &entry.value[..])?;
                Ok(json)
            })
            .map_err(tx_err)?;
        Ok(serde_json::from_slice(&json)?)
    }

    /// The active policy set, if one was ever activated.
    pub fn active(&self) -> Result<Option<PolicySet>> {
        match self.meta_u64(KEY_ACTIVE_SET)? {
            None => Ok(None),
            Some(v) => self.get_set(v),
        }
    }

    /// One policy-set version.
    pub fn get_set(&self, version: u64) -> Result<Option<PolicySet>> {
        self.sets
            .get(version.to_be_bytes())?
            .map(|v| crate::decode("sets", version.to_string().as_bytes(), &v))
            .transpose()
    }

    /// Every policy-set version, oldest first.
    pub fn list_sets(&self) -> Result<Vec<PolicySet>> {
        let mut out = Vec::new();
        for item in self.sets.iter() {
            let (k, v) = item?;
            let version = crate::be_u64(&k, "sets")?;
            out.push(crate::decode("sets", version.to_string().as_bytes(), &v)?);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_is_lowercase_hex() {
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn failure_policy_names() {
        let names: Vec<String> = [
            FailurePolicy::Default,
            FailurePolicy::FailOpen,
            FailurePolicy::FailClosed,
        ]
        .iter()
        .map(|f| serde_json::to_string(f).unwrap())
        .collect();
        assert_eq!(names, ["\"default\"", "\"fail-open\"", "\"fail-closed\""]);
    }
}

//! The audit log: who changed what, when and from where. Entries are written inside the same
//! transaction as the change they describe, so a change is never without its entry.

use serde::{Deserialize, Serialize};

use crate::{Result, Store};

/// Who is making a change and from where; every mutating method takes one so the audit log can
/// answer "who activated this set?".
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Actor {
    /// The authenticated identity (token name, user), or `gantry` for the scheduler itself.
    pub who: String,
    /// The remote address, or a label such as `cli` or `retention` for local actors.
    pub from: String,
}

impl Actor {
    pub fn new(who: impl Into<String>, from: impl Into<String>) -> Self {
        Self {
            who: who.into(),
            from: from.into(),
        }
    }
}

/// One audit-log entry, as stored and as served to admins.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct AuditEntry {
    /// Unique and increasing across restarts (sled's id generator).
    pub id: u64,
    /// When (ms since the epoch).
    pub at_ms: u64,
    /// Who: a token's name (and role), or who a refused token was.
    pub who: String,
    /// The client's address.
    pub from: String,
    /// A short verb: `policy.upload`, `policy.validate`, `set.create`, `set.activate`,
    /// `set.rollback`, `shadow.start`, `shadow.stop`, `compact`, or `request.refused` (a 401 or
    /// 403, with the token and the client).
    pub action: String,
    /// Free text: which policy, which version, what changed.
    pub detail: String,
}

/// An audit entry ready to be written inside a transaction: key and value are computed outside
/// it, because sled may run a transaction's closure more than once.
pub(crate) struct PendingAudit {
    pub(crate) key: [u8; 16],
    pub(crate) entry: AuditEntry,
    pub(crate) value: Vec<u8>,
}

impl Store {
    pub(crate) fn pending_audit(
        &self,
        actor: &Actor,
        at_ms: u64,
        action: &str,
        detail: String,
    ) -> Result<PendingAudit> {
        let id = self.db.generate_id()?;
        let entry = AuditEntry {
            id,
            at_ms,
            who: actor.who.clone(),
            from: actor.from.clone(),
            action: action.to_string(),
            detail,
        };
        let mut key = [0u8; 16];
        key[..8].copy_from_slice(&at_ms.to_be_bytes());
        key[8..].copy_from_slice(&id.to_be_bytes());
        Ok(PendingAudit {
            key,
            value: serde_json::to_vec(&entry)?,
            entry,
        })
    }

    /// Writes one audit entry for a change that lives outside the store (starting or stopping a
    /// shadow run, for example), so the log covers every mutation an admin makes.
    pub fn audit(&self, actor: &Actor, action: &str, detail: &str, at_ms: u64) -> Result<()> {
        let entry = self.pending_audit(actor, at_ms, action, detail.to_string())?;
        self.audit.insert(&entry.key[..], entry.value)?;
        Ok(())
    }

    /// Audit entries with `from_ms <= at_ms < to_ms`, oldest first, at most `limit`.
    pub fn audit_between(&self, from_ms: u64, to_ms: u64, limit: usize) -> Result<Vec<AuditEntry>> {
        let mut out = Vec::new();
        let start = from_ms.to_be_bytes();
        let end = to_ms.to_be_bytes();
        for item in self.audit.range(start..end).take(limit) {
            let (k, v) = item?;
            out.push(crate::decode("audit", &k, &v)?);
        }
        Ok(out)
    }

    /// The newest `limit` audit entries, newest first.
    pub fn audit_recent(&self, limit: usize) -> Result<Vec<AuditEntry>> {
        let mut out = Vec::new();
        for item in self.audit.iter().rev().take(limit) {
            let (k, v) = item?;
            out.push(crate::decode("audit", &k, &v)?);
        }
        Ok(out)
    }
}

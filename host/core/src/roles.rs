//! The words every stage uses for a policy: its role ([`PolicyRole`]: which hook of the cycle
//! calls it) and what a fault of it does ([`FailurePolicy`]). Defined here, the lowest crate
//! that needs them, so the store that keeps them, the Wasm host that runs them and the API that
//! shows them share one type each and map nothing by hand.

use serde::{Deserialize, Serialize};

/// The world a policy implements; decides which hook of the cycle calls it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub enum PolicyRole {
    /// Rejects nodes.
    Filter,
    /// Ranks feasible nodes.
    Score,
    /// Admits or refuses a job for its queue.
    Quota,
}

impl PolicyRole {
    /// Every role, in the order a cycle consults them.
    pub const ALL: [PolicyRole; 3] = [PolicyRole::Filter, PolicyRole::Score, PolicyRole::Quota];

    /// The role's name, as the WIT world and the API spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            PolicyRole::Filter => "filter",
            PolicyRole::Score => "score",
            PolicyRole::Quota => "quota",
        }
    }

    /// Filter and quota fail closed (a fault rejects, with the fault as the reason); score
    /// fails open (the policy is skipped for that call), so a broken ranking never blocks
    /// placement.
    pub fn default_failure(self) -> FailurePolicy {
        match self {
            PolicyRole::Filter | PolicyRole::Quota => FailurePolicy::FailClosed,
            PolicyRole::Score => FailurePolicy::FailOpen,
        }
    }
}

impl std::fmt::Display for PolicyRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What to do when a policy faults: the role's default (filter and quota fail closed, score
/// fails open) unless a set entry overrides it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub enum FailurePolicy {
    /// The role's default.
    #[default]
    Default,
    /// A fault lets the node or job through.
    FailOpen,
    /// A fault rejects the node or job.
    FailClosed,
}

impl FailurePolicy {
    /// Every value, as the CLI and the API spell them.
    pub const ALL: [FailurePolicy; 3] = [
        FailurePolicy::Default,
        FailurePolicy::FailOpen,
        FailurePolicy::FailClosed,
    ];

    /// Its name, as stored and as the CLI and the API spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            FailurePolicy::Default => "default",
            FailurePolicy::FailOpen => "fail-open",
            FailurePolicy::FailClosed => "fail-closed",
        }
    }

    /// What it comes to for a policy of `role`: [`FailurePolicy::Default`] is the role's own.
    pub fn for_role(self, role: PolicyRole) -> FailurePolicy {
        match self {
            FailurePolicy::Default => role.default_failure(),
            given => given,
        }
    }

    /// Whether a fault, for a policy of `role`, lets the call through (the policy is skipped)
    /// rather than rejecting.
    pub fn fails_open(self, role: PolicyRole) -> bool {
        self.for_role(role) == FailurePolicy::FailOpen
    }

    /// The value named `name` (as [`FailurePolicy::as_str`] spells it), if any.
    pub fn parse(name: &str) -> Option<FailurePolicy> {
        Self::ALL.into_iter().find(|f| f.as_str() == name)
    }
}

impl std::fmt::Display for FailurePolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_failure_is_the_roles_and_names_read_back() {
        assert!(!FailurePolicy::Default.fails_open(PolicyRole::Filter));
        assert!(!FailurePolicy::Default.fails_open(PolicyRole::Quota));
        assert!(FailurePolicy::Default.fails_open(PolicyRole::Score));
        assert!(FailurePolicy::FailOpen.fails_open(PolicyRole::Filter));
        assert!(!FailurePolicy::FailClosed.fails_open(PolicyRole::Score));
        for f in FailurePolicy::ALL {
            assert_eq!(FailurePolicy::parse(f.as_str()), Some(f));
            assert_eq!(serde_json::to_value(f).unwrap(), f.as_str());
        }
        assert_eq!(FailurePolicy::parse("open"), None);
        for role in PolicyRole::ALL {
            assert_eq!(serde_json::to_value(role).unwrap(), role.as_str());
        }
    }
}

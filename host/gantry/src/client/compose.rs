//! Composing a policy set from an earlier one: the edits `gantry policy compose` (and `push`)
//! apply to a set's entries, kept apart from the HTTP calls so they are tested without a server.
//!
//! - [`find_policy`] turns what an admin types (a sha256 prefix, `name` or `name@version`) into
//!   one stored policy;
//! - [`Edits`] is the list of changes, applied in a fixed order by [`Edits::apply`]: removals,
//!   replacements, additions, then per-entry settings.

use gantry_store::{FailurePolicy, PolicyManifest, SetEntry};

/// Why an edit cannot be applied: the sentence the admin reads, naming what they typed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ComposeError {
    /// No stored policy answers to the reference.
    #[error("no stored policy is {0}: `gantry policy list` shows what is stored")]
    UnknownPolicy(String),
    /// A sha256 prefix that several stored policies share.
    #[error("{count} stored policies have a sha256 starting with {prefix}: give more characters")]
    AmbiguousPolicy {
        /// What was typed.
        prefix: String,
        /// How many share it.
        count: usize,
    },
    /// The set has no entry answering to the reference.
    #[error("the set has no entry {reference}; its entries are {entries}")]
    NoEntry {
        /// What was typed.
        reference: String,
        /// The set's entries, by name.
        entries: String,
    },
    /// Several entries answer to a name.
    #[error("{count} entries of the set are named {name}: name one by its sha256 prefix")]
    AmbiguousEntry {
        /// What was typed.
        name: String,
        /// How many entries have it.
        count: usize,
    },
    /// An edit is not `ENTRY=VALUE`, or its value does not parse.
    #[error("{flag} {given}: {problem}")]
    BadEdit {
        /// The flag, `--weight` say.
        flag: &'static str,
        /// Its argument as given.
        given: String,
        /// What is wrong with it.
        problem: String,
    },
    /// The result would run one policy twice.
    #[error("{0} would be in the set twice")]
    Duplicate(String),
}

/// The one stored policy `reference` names: a sha256 prefix of 8 or more hex characters, a
/// name (its newest upload), or `name@version` (the newest upload of that version).
pub fn find_policy<'a>(
    manifests: &'a [PolicyManifest],
    reference: &str,
) -> Result<&'a PolicyManifest, ComposeError> {
    let lower = reference.to_ascii_lowercase();
    if lower.len() >= 8 && lower.bytes().all(|b| b.is_ascii_hexdigit()) {
        let by_hash: Vec<&PolicyManifest> = manifests
            .iter()
            .filter(|m| m.sha256.starts_with(&lower))
            .collect();
        match by_hash.len() {
            0 => {}
            1 => return Ok(by_hash[0]),
            count => {
                return Err(ComposeError::AmbiguousPolicy {
                    prefix: lower,
                    count,
                });
            }
        }
    }
    let (name, version) = match reference.split_once('@') {
        Some((name, version)) => (name, Some(version)),
        None => (reference, None),
    };
    manifests
        .iter()
        .filter(|m| m.name == name && version.is_none_or(|v| m.version == v))
        .max_by_key(|m| m.uploaded_at_ms)
        .ok_or_else(|| ComposeError::UnknownPolicy(reference.to_string()))
}

/// The changes to make to a set, as the CLI's flags give them.
#[derive(Debug, Default, Clone)]
pub struct Edits {
    /// Entries to drop (an entry is named by its policy's name or a sha256 prefix).
    pub remove: Vec<String>,
    /// `ENTRY=POLICY`: the entry's policy swapped, its weight, failure policy and deadline
    /// kept, its config reset to `{}` unless a config edit follows.
    pub replace: Vec<String>,
    /// Policies to add at the end, weight 1 and config `{}`.
    pub add: Vec<String>,
    /// `ENTRY=WEIGHT`.
    pub weight: Vec<String>,
    /// `ENTRY=JSON`, or `ENTRY=@PATH` for a file (read by the caller beforehand).
    pub config: Vec<(String, String)>,
    /// `ENTRY=default|fail-open|fail-closed`.
    pub failure: Vec<String>,
    /// `ENTRY=MS`, or `ENTRY=default` for the engine's.
    pub deadline_ms: Vec<String>,
}

/// `ENTRY=VALUE` split at the first `=`.
fn split<'a>(flag: &'static str, given: &'a str) -> Result<(&'a str, &'a str), ComposeError> {
    given
        .split_once('=')
        .filter(|(entry, _)| !entry.is_empty())
        .ok_or_else(|| ComposeError::BadEdit {
            flag,
            given: given.to_string(),
            problem: "expected ENTRY=VALUE".into(),
        })
}

/// The index of the one entry `reference` names.
fn entry_index(
    entries: &[SetEntry],
    manifests: &[PolicyManifest],
    reference: &str,
) -> Result<usize, ComposeError> {
    let name_of = |e: &SetEntry| {
        manifests
            .iter()
            .find(|m| m.sha256 == e.sha256)
            .map(|m| m.name.clone())
            .unwrap_or_else(|| e.sha256.chars().take(12).collect())
    };
    let lower = reference.to_ascii_lowercase();
    let by_hash: Vec<usize> = (0..entries.len())
        .filter(|&i| lower.len() >= 8 && entries[i].sha256.starts_with(&lower))
        .collect();
    if by_hash.len() == 1 {
        return Ok(by_hash[0]);
    }
    let by_name: Vec<usize> = (0..entries.len())
        .filter(|&i| name_of(&entries[i]) == reference)
        .collect();
    match by_name.len() {
        1 => Ok(by_name[0]),
        0 => Err(ComposeError::NoEntry {
            reference: reference.to_string(),
            entries: entries.iter().map(name_of).collect::<Vec<_>>().join(", "),
        }),
        count => Err(ComposeError::AmbiguousEntry {
            name: reference.to_string(),
            count,
        }),
    }
}

impl Edits {
    /// Whether there is nothing to change.
    pub fn is_empty(&self) -> bool {
        self.remove.is_empty()
            && self.replace.is_empty()
            && self.add.is_empty()
            && self.weight.is_empty()
            && self.config.is_empty()
            && self.failure.is_empty()
            && self.deadline_ms.is_empty()
    }

    /// `entries` with the edits applied, in order: removals, replacements, additions, then
    /// weights, configs, failure policies and deadlines (which name entries of the result, so
    /// they can set up a policy just added or swapped in).
    pub fn apply(
        &self,
        mut entries: Vec<SetEntry>,
        manifests: &[PolicyManifest],
    ) -> Result<Vec<SetEntry>, ComposeError> {
        for reference in &self.remove {
            let i = entry_index(&entries, manifests, reference)?;
            entries.remove(i);
        }
        for given in &self.replace {
            let (old, new) = split("--replace", given)?;
            let i = entry_index(&entries, manifests, old)?;
            let policy = find_policy(manifests, new)?;
            entries[i].sha256 = policy.sha256.clone();
            entries[i].config = "{}".into();
        }
        for reference in &self.add {
            let policy = find_policy(manifests, reference)?;
            entries.push(SetEntry {
                sha256: policy.sha256.clone(),
                weight: 1,
                failure: FailurePolicy::Default,
                config: "{}".into(),
                deadline_ms: None,
            });
        }
        for given in &self.weight {
            let (entry, value) = split("--weight", given)?;
            let i = entry_index(&entries, manifests, entry)?;
            entries[i].weight = value.parse().map_err(|e| ComposeError::BadEdit {
                flag: "--weight",
                given: given.clone(),
                problem: format!("the weight is not a whole number ({e})"),
            })?;
        }
        for (entry, config) in &self.config {
            let i = entry_index(&entries, manifests, entry)?;
            if let Err(e) = serde_json::from_str::<serde_json::Value>(config) {
                return Err(ComposeError::BadEdit {
                    flag: "--config",
                    given: format!("{entry}=…"),
                    problem: format!("the config is not JSON ({e})"),
                });
            }
            entries[i].config = config.clone();
        }
        for given in &self.failure {
            let (entry, value) = split("--failure", given)?;
            let i = entry_index(&entries, manifests, entry)?;
            entries[i].failure = match FailurePolicy::parse(value) {
                Some(failure) => failure,
                None => {
                    return Err(ComposeError::BadEdit {
                        flag: "--failure",
                        given: given.clone(),
                        problem: "expected default, fail-open or fail-closed".into(),
                    });
                }
            };
        }
        for given in &self.deadline_ms {
            let (entry, value) = split("--deadline-ms", given)?;
            let i = entry_index(&entries, manifests, entry)?;
            entries[i].deadline_ms = match value {
                "default" => None,
                _ => Some(value.parse().map_err(|e| ComposeError::BadEdit {
                    flag: "--deadline-ms",
                    given: given.clone(),
                    problem: format!("expected milliseconds or `default` ({e})"),
                })?),
            };
        }
        let mut seen = std::collections::HashSet::new();
        for e in &entries {
            if !seen.insert((&e.sha256, &e.config)) {
                let name = manifests
                    .iter()
                    .find(|m| m.sha256 == e.sha256)
                    .map(|m| format!("{} {}", m.name, m.version))
                    .unwrap_or_else(|| e.sha256.clone());
                return Err(ComposeError::Duplicate(format!(
                    "{name} with config {}",
                    e.config
                )));
            }
        }
        Ok(entries)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gantry_store::PolicyRole;

    fn manifest(sha: &str, name: &str, version: &str, at: u64) -> PolicyManifest {
        PolicyManifest {
            sha256: sha.repeat(64 / sha.len()),
            name: name.into(),
            role: PolicyRole::Score,
            version: version.into(),
            config: "{}".into(),
            size: 1,
            uploaded_by: "alice".into(),
            uploaded_at_ms: at,
        }
    }

    fn stored() -> Vec<PolicyManifest> {
        vec![
            manifest("aa", "gpu-fit", "0.1.0", 1),
            manifest("bb", "gpu-binpack", "0.1.0", 2),
            manifest("bc", "gpu-binpack", "0.2.0", 3),
            manifest("cc", "team-quota", "0.1.0", 4),
        ]
    }

    fn entry(sha: &str) -> SetEntry {
        SetEntry {
            sha256: sha.repeat(64 / sha.len()),
            weight: 2,
            failure: FailurePolicy::FailOpen,
            config: r#"{"x":1}"#.into(),
            deadline_ms: None,
        }
    }

    #[test]
    fn policies_are_found_by_prefix_name_or_name_at_version() {
        let m = stored();
        assert_eq!(find_policy(&m, "bcbcbcbc").unwrap().version, "0.2.0");
        assert_eq!(find_policy(&m, "BBBBBBBBBBBB").unwrap().version, "0.1.0");
        // By name, the newest upload.
        assert_eq!(find_policy(&m, "gpu-binpack").unwrap().version, "0.2.0");
        assert_eq!(
            find_policy(&m, "gpu-binpack@0.1.0").unwrap().version,
            "0.1.0"
        );
        assert_eq!(
            find_policy(&m, "gpu-binpack@9").unwrap_err().to_string(),
            "no stored policy is gpu-binpack@9: `gantry policy list` shows what is stored"
        );
        let twins = vec![
            manifest("abcdef0123456789", "a", "1", 1),
            manifest("abcdef01", "b", "1", 2),
        ];
        assert_eq!(
            find_policy(&twins, "abcdef01").unwrap_err().to_string(),
            "2 stored policies have a sha256 starting with abcdef01: give more characters"
        );
    }

    #[test]
    fn a_replacement_keeps_weight_failure_and_deadline_and_settings_follow() {
        let m = stored();
        let edits = Edits {
            replace: vec!["gpu-binpack=gpu-binpack@0.2.0".into()],
            config: vec![("gpu-binpack".into(), r#"{"domain_weight":50}"#.into())],
            deadline_ms: vec!["gpu-binpack=500".into()],
            ..Edits::default()
        };
        let out = edits
            .apply(vec![entry("aa"), entry("bb"), entry("cc")], &m)
            .unwrap();
        assert_eq!(out.len(), 3);
        assert_eq!(out[1].sha256, "bc".repeat(32));
        assert_eq!(out[1].config, r#"{"domain_weight":50}"#);
        assert_eq!(
            (out[1].weight, out[1].failure, out[1].deadline_ms),
            (2, FailurePolicy::FailOpen, Some(500))
        );
        // The others are untouched.
        assert_eq!(out[0], entry("aa"));
        assert_eq!(out[2], entry("cc"));
    }

    #[test]
    fn removals_additions_and_bad_edits() {
        let m = stored();
        let edits = Edits {
            remove: vec!["team-quota".into()],
            add: vec!["gpu-binpack@0.1.0".into()],
            weight: vec!["gpu-binpack=5".into()],
            failure: vec!["gpu-fit=fail-closed".into()],
            ..Edits::default()
        };
        let out = edits.apply(vec![entry("aa"), entry("cc")], &m).unwrap();
        assert_eq!(out.len(), 2);
        assert_eq!((out[1].weight, out[1].config.as_str()), (5, "{}"));
        assert_eq!(out[0].failure, FailurePolicy::FailClosed);

        let bad = |edits: Edits| {
            edits
                .apply(vec![entry("aa"), entry("cc")], &m)
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            bad(Edits {
                remove: vec!["nope".into()],
                ..Edits::default()
            }),
            "the set has no entry nope; its entries are gpu-fit, team-quota"
        );
        assert_eq!(
            bad(Edits {
                weight: vec!["gpu-fit".into()],
                ..Edits::default()
            }),
            "--weight gpu-fit: expected ENTRY=VALUE"
        );
        assert_eq!(
            bad(Edits {
                deadline_ms: vec!["gpu-fit=soon".into()],
                ..Edits::default()
            }),
            "--deadline-ms gpu-fit=soon: expected milliseconds or `default` (invalid digit found in string)"
        );
        assert_eq!(
            bad(Edits {
                config: vec![("gpu-fit".into(), "{".into())],
                ..Edits::default()
            }),
            "--config gpu-fit=…: the config is not JSON (EOF while parsing an object at line 1 column 1)"
        );
        assert_eq!(
            bad(Edits {
                add: vec!["gpu-fit".into()],
                weight: vec!["gpu-fit=3".into()],
                ..Edits::default()
            }),
            "2 entries of the set are named gpu-fit: name one by its sha256 prefix"
        );
    }
}

//! Gantry's embedded store, on sled: the decision history (every explanation the core produces,
//! looked up by job, node and time), the policy artifacts (`.wasm` bytes, content-addressed by
//! sha256, with their manifests), the policy-set versions with the active pointer, and the audit
//! log. Everything else talks to sled only through [`Store`], so key layouts, atomicity and
//! retention live in one place.
//!
//! Layout: one sled tree per kind of data, all keys big-endian so range scans run in order.
//!
//! | tree             | key                                   | value                          |
//! |------------------|---------------------------------------|--------------------------------|
//! | `meta`           | `schema_version`, counters, `active_set` | big-endian `u64`/`u32`      |
//! | `decisions`      | time_ms ‖ seq (BE u64 each)           | the explanation as JSON        |
//! | `by_job`         | job ‖ 0x00 ‖ time_ms ‖ seq            | empty                          |
//! | `by_node`        | node ‖ 0x00 ‖ time_ms ‖ seq           | empty                          |
//! | `final_outcomes` | job                                   | key ‖ JSON copy (or old pointer) |
//! | `artifacts`      | sha256 hex                            | `.wasm` bytes                  |
//! | `manifests`      | sha256 hex                            | [`PolicyManifest`] JSON        |
//! | `sets`           | version (BE u64)                      | [`PolicySet`] JSON             |
//! | `audit`          | at_ms ‖ id (BE u64 each)              | [`AuditEntry`] JSON            |
//!
//! Atomicity: every mutation is one sled multi-tree transaction (a batch of records, their index
//! entries and the byte counter; a compaction chunk's deletions and final-outcome copies; or a
//! policy change and its audit entry). sled
//! 0.34 seals a transaction's writes as one log batch, which recovery replays whole or not at
//! all, so after a `kill -9` a record is either all there or absent.

mod audit;
mod bench;
mod decisions;
mod policies;

use std::path::{Path, PathBuf};
use std::time::Duration;

pub use audit::{Actor, AuditEntry};
pub use bench::{BenchResult, bench_append, sample_explanation};
pub use decisions::{CompactReport, DecisionRecord, NewDecision};
pub use policies::{
    FailurePolicy, NewPolicy, PolicyManifest, PolicyRole, PolicySet, PutPolicy, SetEntry,
    sha256_hex,
};

/// The schema version this build writes and understands. Bump it when a key or value layout
/// changes; an older build then refuses the directory instead of misreading it.
pub const SCHEMA_VERSION: u32 = 1;

const KEY_SCHEMA: &[u8] = b"schema_version";
const KEY_DECISION_BYTES: &[u8] = b"decision_bytes";
const KEY_LAST_SET: &[u8] = b"last_set_version";
const KEY_ACTIVE_SET: &[u8] = b"active_set";

const TREE_NAMES: [&str; 9] = [
    "meta",
    "decisions",
    "by_job",
    "by_node",
    "final_outcomes",
    "artifacts",
    "manifests",
    "sets",
    "audit",
];

/// Everything that can go wrong in the store, one enum for the crate so callers (the API server,
/// the CLI) map store failures to responses in one place.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot open the Gantry store at {path}: it is a file, not a directory")]
    NotADirectory { path: String },
    #[error(
        "cannot open the Gantry store at {path}: the directory holds other files ({found}) and no sled database"
    )]
    Foreign { path: String, found: String },
    #[error(
        "cannot open the Gantry store at {path}: it is a sled database without a Gantry schema version (trees: {trees})"
    )]
    ForeignSled { path: String, trees: String },
    #[error(
        "cannot open the Gantry store at {path}: its schema version {found} is newer than the newest this build understands ({supported})"
    )]
    NewerSchema {
        path: String,
        found: u32,
        supported: u32,
    },
    #[error("cannot open the Gantry store at {path}: the database is corrupt ({detail})")]
    Corrupt { path: String, detail: String },
    #[error("cannot open the Gantry store at {path}: {detail}")]
    Io { path: String, detail: String },
    #[error("store: {0}")]
    Sled(#[from] sled::Error),
    #[error("store: cannot encode or decode a value: {0}")]
    Codec(#[from] serde_json::Error),
    #[error("store: a stored value under {tree} is malformed")]
    Malformed { tree: &'static str },
    #[error("no policy with sha256 {0} is stored")]
    UnknownPolicy(String),
    #[error("no policy set version {0} exists")]
    UnknownSetVersion(u64),
    #[error("a policy set needs at least one entry")]
    EmptySet,
}

/// The crate's result type.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// Where the store lives and how much decision history it keeps. Retention is enforced by
/// [`Store::compact`], which the caller runs periodically (for example once a minute).
#[derive(Debug, Clone)]
pub struct StoreConfig {
    pub path: PathBuf,
    /// Decisions older than this (relative to the `now_ms` given to `compact`) are dropped.
    pub max_age: Duration,
    /// Bound on the decision history, in the store's own byte accounting (see
    /// [`Store::decision_bytes`]); the oldest records go first.
    pub max_bytes: u64,
    /// sled's page cache, in bytes. Appends slow down sharply when the hot index pages do not
    /// fit: on the 2-core dev box 16 MiB gave ~8k records/s, 64 MiB ~12k, 256 MiB ~15k.
    pub cache_bytes: u64,
}

impl StoreConfig {
    /// Defaults: 30 days and 1 GiB of decision history, a 256 MiB cache.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            max_age: Duration::from_secs(30 * 24 * 3600),
            max_bytes: 1 << 30,
            cache_bytes: 256 << 20,
        }
    }
}

/// A handle on the open store. Cheap to clone (sled trees are reference-counted) and safe to
/// share between threads; sled's transactions serialise writers, so no lock of our own is needed.
#[derive(Clone)]
pub struct Store {
    /// Kept for error messages.
    path: PathBuf,
    config: StoreConfig,
    /// The database, for ids, flushing and the on-disk size.
    db: sled::Db,
    /// Schema version, the decision byte counter, the set-version counter and the active set
    /// pointer: small values that change together with other trees, inside their transactions.
    meta: sled::Tree,
    /// The authoritative decision records, keyed by (time, seq) so range scans are in time order.
    decisions: sled::Tree,
    /// Index: job name → record keys, so a job's history is a prefix scan in time order.
    by_job: sled::Tree,
    /// Index: node name → record keys of the placements on that node.
    by_node: sled::Tree,
    /// A copy of each job's latest record, written by compaction when it deletes that record, so
    /// compaction can drop the history freely and a job's final outcome survives retention.
    /// While the record is retained, the job's newest `by_job` entry is its final outcome and
    /// appends write nothing here. (Stores written by earlier builds may hold 16-byte pointers
    /// into `decisions`; readers still resolve them.)
    final_outcomes: sled::Tree,
    /// Content-addressed `.wasm` bytes: one copy per sha256 however often it is uploaded.
    artifacts: sled::Tree,
    /// The manifest of each artifact, kept apart so listing policies never reads the bytes.
    manifests: sled::Tree,
    /// Every policy-set version ever written; never overwritten or deleted.
    sets: sled::Tree,
    /// Who did what, when and from where, in time order.
    audit: sled::Tree,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("path", &self.path).finish()
    }
}

fn be_u64(v: &[u8], tree: &'static str) -> Result<u64> {
    let bytes: [u8; 8] = v.try_into().map_err(|_| StoreError::Malformed { tree })?;
    Ok(u64::from_be_bytes(bytes))
}

impl Store {
    /// Opens the store at `config.path`, initialising an empty or missing directory. A path that
    /// is a file, a directory of other files, a foreign sled database, a corrupt one or one from
    /// a newer schema is refused with a one-line error naming the path.
    pub fn open(config: StoreConfig) -> Result<Self> {
        let path = config.path.clone();
        let shown = path.display().to_string();
        check_directory(&path, &shown)?;
        let db = open_sled(&path, &shown, config.cache_bytes)?;
        let existing: Vec<String> = db
            .tree_names()
            .iter()
            .map(|n| String::from_utf8_lossy(n).into_owned())
            .filter(|n| n != "__sled__default")
            .collect();
        let had_meta = existing.iter().any(|n| n == "meta");
        if had_meta {
            let meta = db.open_tree("meta").map_err(|e| corrupt(&shown, e))?;
            match meta.get(KEY_SCHEMA).map_err(|e| corrupt(&shown, e))? {
                None => {
                    return Err(StoreError::ForeignSled {
                        path: shown,
                        trees: existing.join(", "),
                    });
                }
                Some(v) => {
                    let bytes: [u8; 4] =
                        v.as_ref().try_into().map_err(|_| StoreError::Corrupt {
                            path: shown.clone(),
                            detail: "the schema version is not a 4-byte integer".into(),
                        })?;
                    let found = u32::from_be_bytes(bytes);
                    if found > SCHEMA_VERSION {
                        return Err(StoreError::NewerSchema {
                            path: shown,
                            found,
                            supported: SCHEMA_VERSION,
                        });
                    }
                }
            }
        } else {
            let default_empty = db.is_empty();
            if !existing.is_empty() || !default_empty {
                let mut trees = existing.clone();
                if !default_empty {
                    trees.insert(0, "default".into());
                }
                return Err(StoreError::ForeignSled {
                    path: shown,
                    trees: trees.join(", "),
                });
            }
        }
        let open = |name: &str| db.open_tree(name).map_err(|e| corrupt(&shown, e));
        let store = Store {
            meta: open(TREE_NAMES[0])?,
            decisions: open(TREE_NAMES[1])?,
            by_job: open(TREE_NAMES[2])?,
            by_node: open(TREE_NAMES[3])?,
            final_outcomes: open(TREE_NAMES[4])?,
            artifacts: open(TREE_NAMES[5])?,
            manifests: open(TREE_NAMES[6])?,
            sets: open(TREE_NAMES[7])?,
            audit: open(TREE_NAMES[8])?,
            db,
            path,
            config,
        };
        if !had_meta {
            store
                .meta
                .insert(KEY_SCHEMA, &SCHEMA_VERSION.to_be_bytes())?;
            store.db.flush()?;
        }
        Ok(store)
    }

    /// The configuration the store was opened with.
    pub fn config(&self) -> &StoreConfig {
        &self.config
    }

    /// Forces everything written so far to disk. sled also flushes by itself every 500 ms.
    pub fn flush(&self) -> Result<()> {
        self.db.flush()?;
        Ok(())
    }

    /// sled's own figure for the directory's size. It lags behind writes and deletions (sled
    /// reclaims space lazily), so retention uses [`Store::decision_bytes`] instead.
    pub fn size_on_disk(&self) -> Result<u64> {
        Ok(self.db.size_on_disk()?)
    }

    fn meta_u64(&self, key: &[u8]) -> Result<Option<u64>> {
        self.meta.get(key)?.map(|v| be_u64(&v, "meta")).transpose()
    }
}

fn corrupt(shown: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt {
        path: shown.to_string(),
        detail: e.to_string(),
    }
}

/// Refuses a file, and a directory holding files that are not sled's, before sled creates its
/// own files there.
fn check_directory(path: &Path, shown: &str) -> Result<()> {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => {
            return Err(StoreError::Io {
                path: shown.into(),
                detail: e.to_string(),
            });
        }
    };
    if !meta.is_dir() {
        return Err(StoreError::NotADirectory { path: shown.into() });
    }
    let io = |e: std::io::Error| StoreError::Io {
        path: shown.into(),
        detail: e.to_string(),
    };
    let mut names: Vec<String> = std::fs::read_dir(path)
        .map_err(io)?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<std::io::Result<_>>()
        .map_err(io)?;
    names.sort();
    if names.is_empty() || names.iter().any(|n| n == "conf") {
        return Ok(());
    }
    let mut found: Vec<String> = names.iter().take(3).cloned().collect();
    if names.len() > 3 {
        found.push(format!("and {} more", names.len() - 3));
    }
    Err(StoreError::Foreign {
        path: shown.into(),
        found: found.join(", "),
    })
}

/// Opens sled, turning its errors and any panic on garbage input into a one-line error.
fn open_sled(path: &Path, shown: &str, cache_bytes: u64) -> Result<sled::Db> {
    // LowSpace measured faster than HighThroughput for our append pattern (~12k vs ~9.5k
    // records/s) and keeps the directory smaller.
    let config = sled::Config::new()
        .path(path)
        .cache_capacity(cache_bytes)
        .mode(sled::Mode::LowSpace);
    // Asserting unwind safety is sound: on a panic the config is dropped, never reused.
    let opened = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| config.open()));
    match opened {
        Ok(Ok(db)) => Ok(db),
        Ok(Err(sled::Error::Io(e))) => Err(StoreError::Io {
            path: shown.into(),
            detail: e.to_string(),
        }),
        Ok(Err(e)) => Err(corrupt(shown, e)),
        Err(panic) => {
            let detail = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "sled panicked while reading it".into());
            Err(corrupt(shown, detail))
        }
    }
}

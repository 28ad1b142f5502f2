//! The simulator's input side: cluster specs (YAML) and job traces (CSV), read and checked into
//! the core's model. This is the simulated cluster source of DESIGN.md's data flow, kept apart
//! from the core so that the core never parses files, and from the replay loop so that a bad
//! input fails here, once, with a message naming the file, the line or item and the field.
//!
//! - [`spec`]: `clusters/*.yaml` → [`ClusterSpec`] → [`Cluster`] (a columnar `NodeTable` plus
//!   the queue tree).
//! - [`trace`]: Gantry job trace v1 (`traces/FORMAT.md`) → [`TraceJob`]s in submit order.
//! - [`alibaba`]: importers for the Alibaba GPU 2023 (`openb_*`) pod and node lists.
//! - [`replay`]: trace replay through the core scheduler in virtual time, and its report.
//! - [`synthetic`]: the demo's synthetic load, a cluster source and binder for the engine.
//! - [`oracle`]: the futures `--known-future` hands the forecast, to measure it.
//! - [`failures`]: the failure model of a spec (or `--failures` file) and its injector.
//! - [`fair`]: the max-min fair targets the report measures each queue's share against.

pub mod alibaba;
pub mod failures;
pub mod fair;
pub mod oracle;
pub mod replay;
pub mod spec;
pub mod synthetic;
pub mod trace;

pub use alibaba::{PodListImport, SkippedPod, import_node_list, import_pod_list};
pub use failures::{FailureModel, FailureModelError, FailureReport};
pub use oracle::KnownFutureMode;
pub use replay::{
    FirstEstimate, Replay, ReplayError, ReplayOptions, Report, write_first_estimates,
};
pub use spec::{Cluster, ClusterSpec, NodePoolSpec, QueueSpec, SpecError, TopologyLevelSpec};
pub use synthetic::{SyntheticConfig, SyntheticLoad};
pub use trace::{Trace, TraceError, TraceJob};

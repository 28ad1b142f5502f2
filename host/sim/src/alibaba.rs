//! Importers for the Alibaba GPU 2023 trace (`cluster-trace-gpu-v2023`, the `openb_*` files in
//! `shared/traces/alibaba-gpu-2023/`), so that its pod lists replay as Gantry jobs and its node
//! list becomes a cluster spec.
//!
//! A pod-list row becomes a one-pod job, as `shared/traces/FORMAT.md` says:
//! - `job_id` = `name`; `submit_s` = `creation_time`;
//! - `duration_s` = `deletion_time` − `scheduled_time`;
//! - `queue` = `qos` in lower case;
//! - `gpus_per_pod` = `num_gpu`; `gpu_milli` is kept only where it is 1–999 (1000 means a whole
//!   GPU, and 0 comes with `num_gpu` = 0);
//! - `gpu_type` = `gpu_spec` (empty = any); `cpu_milli`, `memory_mib` as they are; priority 0.
//!
//! Two rules FORMAT.md leaves out, read off the shipped `alibaba-openb-default.gantry.csv`:
//! - a pod never scheduled (`scheduled_time` empty; `pod_phase` Pending) runs from
//!   `creation_time` instead: it held its request, unserved, that long;
//! - a pod whose run comes out at 0 seconds asks nothing of the cluster and cannot be a job
//!   (`duration_s` > 0), so it is left out, and listed in [`PodListImport::skipped`] with why.

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;

use crate::spec::{ClusterSpec, MAX_GPUS_PER_NODE, NodePoolSpec, TopologyLevelSpec};
use crate::trace::{self, CsvTable, JobIds, MAX_GPUS_PER_POD, TraceError, TraceJob};

/// Nodes per rack in a spec made from a node list. The trace gives no topology; 16 matches
/// `shared/clusters/alibaba-openb-2023.yaml`, so both describe one cluster.
pub const NODE_LIST_RACK_SIZE: u32 = 16;

/// A converted pod list. The skipped pods travel with the jobs, because FORMAT.md's promise that
/// nothing is silently dropped has to hold for imports too: the caller decides how to report
/// them.
#[derive(Debug, Clone, PartialEq)]
pub struct PodListImport {
    /// Sorted by `submit_s`, ties in row order.
    pub jobs: Vec<TraceJob>,
    pub skipped: Vec<SkippedPod>,
}

/// A pod-list row that is valid but cannot become a job (it ran for 0 seconds). Kept apart from
/// errors, because one such row should not stop a whole 8,000-pod import.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedPod {
    pub line: u64,
    pub name: String,
    pub reason: String,
}

/// Converts an `openb_pod_list_*.csv` file. Messages name the path as given.
pub fn import_pod_list(path: impl AsRef<Path>) -> Result<PodListImport, TraceError> {
    let (file, origin) = trace::open(path.as_ref())?;
    pod_list_from_reader(file, &origin)
}

/// Converts a pod list read from `reader`; `origin` names it in error messages.
pub fn pod_list_from_reader(reader: impl Read, origin: &str) -> Result<PodListImport, TraceError> {
    let mut table = CsvTable::new(reader, origin)?;
    let col = |name, required| table.column(name, required);
    let name = col("name", true)?;
    let cpu_milli = col("cpu_milli", true)?;
    let memory_mib = col("memory_mib", true)?;
    let num_gpu = col("num_gpu", true)?;
    let gpu_milli = col("gpu_milli", true)?;
    let gpu_spec = col("gpu_spec", false)?;
    let qos = col("qos", true)?;
    let creation_time = col("creation_time", true)?;
    let deletion_time = col("deletion_time", true)?;
    let scheduled_time = col("scheduled_time", true)?;

    let mut jobs = Vec::new();
    let mut skipped = Vec::new();
    let mut seen = JobIds::default();
    table.for_each_row(|row| {
        let job_id = row.required(name)?.to_owned();
        seen.insert(&row, name, &job_id)?;
        let gpus = row.uint(num_gpu, 0, MAX_GPUS_PER_POD)?;
        let milli = match row.opt_uint(gpu_milli)? {
            Some(milli @ 1..=999) => {
                if gpus != 1 {
                    return Err(row.bad(
                        gpu_milli,
                        format!(
                            "{:?} is a fraction of one GPU, so num_gpu must be 1, not {gpus}",
                            row.text(gpu_milli)
                        ),
                    ));
                }
                Some(u32::try_from(milli).unwrap_or(999))
            }
            _ => None,
        };
        let gpu_type = row.optional(gpu_spec).map(str::to_owned);
        if let Some(spec) = &gpu_type
            && spec.contains('|')
        {
            return Err(row.bad(
                gpu_spec,
                format!("{spec:?} lists several GPU models; a Gantry job names one"),
            ));
        }
        let created = row.uint(creation_time, 0, u64::MAX)?;
        let scheduled = row.opt_uint(scheduled_time)?;
        if let Some(scheduled) = scheduled
            && scheduled < created
        {
            return Err(row.bad(
                scheduled_time,
                format!("\"{scheduled}\" is before creation_time {created}"),
            ));
        }
        let (start, start_column) = match scheduled {
            Some(scheduled) => (scheduled, "scheduled_time"),
            None => (created, "creation_time"),
        };
        let deleted = row.uint(deletion_time, 0, u64::MAX)?;
        if deleted < start {
            return Err(row.bad(
                deletion_time,
                format!("\"{deleted}\" is before {start_column} {start}"),
            ));
        }
        if deleted == start {
            let reason = if scheduled.is_some() {
                "ran for 0 seconds (deletion_time = scheduled_time)"
            } else {
                "never scheduled, and deleted when created (deletion_time = creation_time)"
            };
            skipped.push(SkippedPod {
                line: row.line,
                name: job_id,
                reason: reason.to_owned(),
            });
            return Ok(());
        }
        jobs.push(TraceJob {
            job_id,
            submit_s: created as f64,
            duration_s: (deleted - start) as f64,
            pods: 1,
            gpus_per_pod: u32::try_from(gpus).unwrap_or(u32::MAX),
            queue: row.required(qos)?.to_lowercase(),
            priority: 0,
            gpu_milli: milli,
            gpu_type,
            cpu_milli: row.opt_uint(cpu_milli)?,
            memory_mib: row.opt_uint(memory_mib)?,
            expected_runtime_s: None,
            checkpoint_s: None,
            line: row.line,
        });
        Ok(())
    })?;
    trace::sort_by_submit(&mut jobs);
    Ok(PodListImport { jobs, skipped })
}

/// Converts an `openb_node_list_*.csv` file into a spec named after the file's stem, with no
/// queues (the node list has none; add them before use).
pub fn import_node_list(path: impl AsRef<Path>) -> Result<ClusterSpec, TraceError> {
    let path = path.as_ref();
    let name = path
        .file_stem()
        .map_or_else(String::new, |s| s.to_string_lossy().into_owned());
    let (file, origin) = trace::open(path)?;
    node_list_from_reader(file, &origin, &name)
}

/// What makes two nodes of a node list interchangeable: (GPUs, model, CPU milli, memory MiB).
type NodeShape = (u32, Option<String>, u32, u32);

/// Converts a node list read from `reader` into a spec called `name`. Identical nodes (same GPU
/// count, model, CPU and memory) form one pool, named like `g2-8gpu-96c`; pools are ordered by
/// size, largest first, ties in order of first appearance; each pool is cut into racks of
/// [`NODE_LIST_RACK_SIZE`]. A file without rows gives a spec without pools, which
/// [`ClusterSpec::validate`] refuses.
pub fn node_list_from_reader(
    reader: impl Read,
    origin: &str,
    name: &str,
) -> Result<ClusterSpec, TraceError> {
    let mut table = CsvTable::new(reader, origin)?;
    let col = |name, required| table.column(name, required);
    let sn = col("sn", true)?;
    let cpu_milli = col("cpu_milli", true)?;
    let memory_mib = col("memory_mib", true)?;
    let gpu = col("gpu", true)?;
    let model = col("model", true)?;

    // Node shapes in order of first appearance, with node counts.
    let mut shapes: Vec<(NodeShape, u32)> = Vec::new();
    let mut seen = JobIds::default();
    table.for_each_row(|row| {
        let node = row.required(sn)?;
        seen.insert(&row, sn, node)?;
        let shape = (
            u32::try_from(row.uint(gpu, 0, u64::from(MAX_GPUS_PER_NODE))?).unwrap_or(0),
            row.optional(model).map(str::to_owned),
            u32::try_from(row.uint(cpu_milli, 0, u64::from(u32::MAX))?).unwrap_or(u32::MAX),
            u32::try_from(row.uint(memory_mib, 0, u64::from(u32::MAX))?).unwrap_or(u32::MAX),
        );
        match shapes.iter_mut().find(|(s, _)| *s == shape) {
            Some((_, count)) => *count += 1,
            None => shapes.push((shape, 1)),
        }
        Ok(())
    })?;
    shapes.sort_by_key(|&(_, count)| std::cmp::Reverse(count));

    let mut used: HashMap<String, u32> = HashMap::new();
    let node_pools = shapes
        .into_iter()
        .map(|((gpus, model, cpu, memory), count)| {
            let cpus = if cpu % 1000 == 0 {
                format!("{}c", cpu / 1000)
            } else {
                format!("{cpu}mc")
            };
            let family = model.as_deref().unwrap_or("cpu").to_lowercase();
            let base = format!("{family}-{gpus}gpu-{cpus}");
            let uses = used.entry(base.clone()).or_insert(0);
            *uses += 1;
            let name = if *uses == 1 {
                base
            } else {
                format!("{base}-{uses}")
            };
            NodePoolSpec {
                name,
                count,
                gpus_per_node: gpus,
                gpu_type: model,
                cpu_milli: cpu,
                memory_mib: memory,
                topology: vec![TopologyLevelSpec {
                    level: "rack".to_owned(),
                    size: NODE_LIST_RACK_SIZE,
                }],
            }
        })
        .collect();
    Ok(ClusterSpec {
        name: name.to_owned(),
        node_pools,
        queues: Vec::new(),
        failures: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::Trace;

    fn shared(file: &str) -> String {
        format!("{}/../../../shared/{file}", env!("CARGO_MANIFEST_DIR"))
    }

    #[test]
    fn default_pod_list_matches_the_shipped_conversion() {
        let imported =
            import_pod_list(shared("traces/alibaba-gpu-2023/openb_pod_list_default.csv")).unwrap();
        let shipped = Trace::load(shared("traces/alibaba-openb-default.gantry.csv")).unwrap();
        // The pod list has 8,152 rows; the shipped file 8,151 jobs. The one left out is a
        // Pending pod created and deleted in the same second: 0 s is no valid duration, so the
        // converter dropped it, and the importer lists it as skipped instead of dropping it.
        assert_eq!(imported.jobs.len() + imported.skipped.len(), 8152);
        assert_eq!(imported.jobs.len(), shipped.len());
        assert_eq!(
            imported.skipped,
            [SkippedPod {
                line: 7287,
                name: "openb-pod-7285".to_owned(),
                reason: "never scheduled, and deleted when created (deletion_time = creation_time)"
                    .to_owned(),
            }]
        );
        // Every other field matches, job for job. `line` differs by design: it is the line in
        // the file each job was read from, and the shipped file lacks the skipped row.
        for (ours, theirs) in imported.jobs.iter().zip(&shipped) {
            let ours_at_their_line = TraceJob {
                line: theirs.line,
                ..ours.clone()
            };
            assert_eq!(&ours_at_their_line, theirs);
        }
        // Spot checks against the raw rows: a fractional GPU, a CPU-only pod, and a Pending pod
        // charged from creation_time (10001403 - 10001278).
        let by_id = |id: &str| imported.jobs.iter().find(|j| j.job_id == id).unwrap();
        assert_eq!(by_id("openb-pod-0001").gpu_milli, Some(460));
        assert_eq!(by_id("openb-pod-0001").duration_s, 12_902_960.0 - 427_061.0);
        assert_eq!(by_id("openb-pod-0005").gpus_per_pod, 0);
        assert_eq!(by_id("openb-pod-0005").gpu_milli, None);
        assert_eq!(by_id("openb-pod-0061").duration_s, 125.0);
        assert_eq!(by_id("openb-pod-0061").queue, "be");
    }

    #[test]
    fn gpushare40_pod_list_imports() {
        let imported = import_pod_list(shared(
            "traces/alibaba-gpu-2023/openb_pod_list_gpushare40.csv",
        ))
        .unwrap();
        assert_eq!(imported.jobs.len() + imported.skipped.len(), 8152);
        let skipped: Vec<&str> = imported.skipped.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(skipped, ["openb-pod-3231", "openb-pod-3748"]);
        assert_eq!(imported.skipped[0].line, 3233);
        let fractional = imported
            .jobs
            .iter()
            .filter(|j| j.gpu_milli.is_some())
            .count();
        assert_eq!(fractional, 3999);
    }

    #[test]
    fn multigpu50_has_no_times_and_says_so() {
        let message = import_pod_list(shared(
            "traces/alibaba-gpu-2023/openb_pod_list_multigpu50.csv",
        ))
        .unwrap_err()
        .to_string();
        assert!(
            message.ends_with("openb_pod_list_multigpu50.csv line 1: missing required column qos"),
            "{message}"
        );
    }

    const POD_HEADER: &str = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n";

    fn pod_error(row: &str) -> String {
        pod_list_from_reader(format!("{POD_HEADER}{row}\n").as_bytes(), "pods.csv")
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn pod_list_error_texts() {
        assert_eq!(
            pod_error("p,1000,1024,2,500,,LS,Running,0,10,0"),
            r#"pods.csv line 2, column gpu_milli: "500" is a fraction of one GPU, so num_gpu must be 1, not 2"#
        );
        assert_eq!(
            pod_error("p,1000,1024,1,1000,,LS,Running,0,10,20"),
            r#"pods.csv line 2, column deletion_time: "10" is before scheduled_time 20"#
        );
        assert_eq!(
            pod_error("p,1000,1024,1,1000,,LS,Running,30,40,20"),
            r#"pods.csv line 2, column scheduled_time: "20" is before creation_time 30"#
        );
        assert_eq!(
            pod_error("p,1000,1024,9,1000,,LS,Running,0,10,0"),
            r#"pods.csv line 2, column num_gpu: "9" is not an integer 0-8"#
        );
        assert_eq!(
            pod_error("p,1000,1024,1,1000,V100M16|V100M32,LS,Running,0,10,0"),
            r#"pods.csv line 2, column gpu_spec: "V100M16|V100M32" lists several GPU models; a Gantry job names one"#
        );
        assert_eq!(
            pod_error("p,1000,1024,1,1000,,LS,Running,0,10,0\np,1,1,1,1000,,LS,Running,0,10,0"),
            r#"pods.csv line 3, column name: "p" is also the name on line 2"#
        );
    }

    #[test]
    fn node_list_matches_the_shipped_spec() {
        let imported = import_node_list(shared(
            "traces/alibaba-gpu-2023/openb_node_list_gpu_node.csv",
        ))
        .unwrap();
        assert_eq!(imported.name, "openb_node_list_gpu_node");
        assert_eq!(imported.node_count(), 1213);
        assert_eq!(imported.gpu_count(), 6212);
        imported.validate("imported").unwrap();
        let shipped = ClusterSpec::load(shared("clusters/alibaba-openb-2023.yaml")).unwrap();
        // Same pools, same names, same order; the shipped spec adds the QoS queues.
        assert_eq!(imported.node_pools, shipped.node_pools);
        assert!(imported.queues.is_empty());
    }

    #[test]
    fn node_list_pool_names_stay_unique() {
        let text = "sn,cpu_milli,memory_mib,gpu,model\n\
                    a,8000,1024,1,T4\n\
                    b,8000,2048,1,T4\n\
                    c,8500,2048,0,\n";
        let spec = node_list_from_reader(text.as_bytes(), "nodes.csv", "n").unwrap();
        let names: Vec<&str> = spec.node_pools.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["t4-1gpu-8c", "t4-1gpu-8c-2", "cpu-0gpu-8500mc"]);
        spec.validate("n").unwrap();
    }
}

//! Gantry job trace v1 (`shared/traces/FORMAT.md`): CSV with a header row, one row per job.
//!
//! | column | required | rule |
//! |---|---|---|
//! | `job_id` | yes | non-empty, unique |
//! | `submit_s` | yes | float ≥ 0 |
//! | `duration_s` | yes | float > 0 |
//! | `pods` | yes | integer ≥ 1 (a gang) |
//! | `gpus_per_pod` | yes | integer 0–8 |
//! | `queue` | yes | non-empty |
//! | `priority` | no | integer; empty = 0 |
//! | `gpu_milli` | no | 1–999, only with `gpus_per_pod` = 1; empty = whole GPUs |
//! | `gpu_type` | no | empty = any |
//! | `cpu_milli`, `memory_mib` | no | integer ≥ 0; empty = not constrained |
//! | `expected_runtime_s` | no | float > 0: the runtime the job declares (what the scheduler is told, unlike `duration_s`); empty = not declared |
//! | `checkpoint_s` | no | float > 0: how often the job checkpoints (a node failure loses the work since the last one); empty = never |
//!
//! Columns may come in any order and unknown ones are ignored. Every broken rule is an error
//! naming the line (the header is line 1) and the column; no row is skipped.

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;

use csv::StringRecord;
use serde::{Deserialize, Serialize};

/// Most whole GPUs one pod of a trace job may ask for, as FORMAT.md fixes it.
pub const MAX_GPUS_PER_POD: u64 = 8;

/// One job of a trace, checked against every rule of the format. Plain strings rather than
/// symbols: a trace is read before any cluster exists, and the replay interns names as it
/// submits jobs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TraceJob {
    pub job_id: String,
    /// Seconds from the start of the trace, ≥ 0.
    pub submit_s: f64,
    /// Run time once every pod is running, > 0.
    pub duration_s: f64,
    /// Pods that must all run at once (a gang), ≥ 1.
    pub pods: u32,
    /// Whole GPUs per pod, 0..=8.
    pub gpus_per_pod: u32,
    pub queue: String,
    /// Higher first.
    pub priority: i32,
    /// 1..=999 milli-GPUs of one GPU per pod (then `gpus_per_pod` is 1); `None` = whole GPUs.
    pub gpu_milli: Option<u32>,
    /// The GPU model required; `None` = any.
    pub gpu_type: Option<String>,
    /// Per-pod request; `None` = not constrained.
    pub cpu_milli: Option<u64>,
    /// Per-pod request; `None` = not constrained.
    pub memory_mib: Option<u64>,
    /// The runtime the job declares, which the scheduler is told (`duration_s` it never is);
    /// `None` = not declared, so the planner estimates it from finished jobs.
    pub expected_runtime_s: Option<f64>,
    /// How often the job checkpoints, in seconds: a failure or a preemption loses only the
    /// work since the last checkpoint. `None` = never (a restart starts over).
    pub checkpoint_s: Option<f64>,
    /// The source line this job came from (header = line 1), so that later errors about the
    /// job, such as a queue the cluster lacks, can point the reader at it.
    pub line: u64,
}

/// The trace format's readers. A type rather than free functions so that call sites read
/// `Trace::load(path)`, beside `ClusterSpec::load(path)`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Trace;

/// Why a trace (or an imported Alibaba file) was refused. Each message names the file, the line
/// and, for a bad value, the column, and quotes the value as written, because the reader has to
/// find the cell to fix.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("{origin}: cannot read: {source}")]
    Read {
        origin: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{origin} line 1: missing required column {column}")]
    MissingColumn {
        origin: String,
        column: &'static str,
    },
    #[error("{origin} line 1, column {column}: appears more than once")]
    DuplicateColumn {
        origin: String,
        column: &'static str,
    },
    /// The row itself is broken: not UTF-8, or a field count that differs from the header's.
    #[error("{origin} line {line}: {message}")]
    Malformed {
        origin: String,
        line: u64,
        message: String,
    },
    #[error("{origin} line {line}, column {column}: {message}")]
    BadValue {
        origin: String,
        line: u64,
        column: &'static str,
        message: String,
    },
}

impl Trace {
    /// Reads a whole trace. Jobs come back sorted by `submit_s`, ties in row order. `origin`
    /// names the source in error messages.
    pub fn from_reader(reader: impl Read, origin: &str) -> Result<Vec<TraceJob>, TraceError> {
        let mut table = CsvTable::new(reader, origin)?;
        let col = |name, required| table.column(name, required);
        let job_id = col("job_id", true)?;
        let submit_s = col("submit_s", true)?;
        let duration_s = col("duration_s", true)?;
        let pods = col("pods", true)?;
        let gpus_per_pod = col("gpus_per_pod", true)?;
        let queue = col("queue", true)?;
        let priority = col("priority", false)?;
        let gpu_milli = col("gpu_milli", false)?;
        let gpu_type = col("gpu_type", false)?;
        let cpu_milli = col("cpu_milli", false)?;
        let memory_mib = col("memory_mib", false)?;
        let expected_runtime_s = col("expected_runtime_s", false)?;
        let checkpoint_s = col("checkpoint_s", false)?;

        let mut jobs = Vec::new();
        let mut seen = JobIds::default();
        table.for_each_row(|row| {
            let id = row.required(job_id)?.to_owned();
            let gpus = row.uint(gpus_per_pod, 0, MAX_GPUS_PER_POD)?;
            let job = TraceJob {
                submit_s: row.float(submit_s, Bound::AtLeastZero)?,
                duration_s: row.float(duration_s, Bound::AboveZero)?,
                pods: to_u32(row.uint(pods, 1, u64::from(u32::MAX))?),
                gpus_per_pod: to_u32(gpus),
                queue: row.required(queue)?.to_owned(),
                priority: row.int(priority)?.unwrap_or(0),
                gpu_milli: row.gpu_milli(gpu_milli, gpus, "gpus_per_pod")?,
                gpu_type: row.optional(gpu_type).map(str::to_owned),
                cpu_milli: row.opt_uint(cpu_milli)?,
                memory_mib: row.opt_uint(memory_mib)?,
                expected_runtime_s: match row.optional(expected_runtime_s) {
                    None => None,
                    Some(_) => Some(row.float(expected_runtime_s, Bound::AboveZero)?),
                },
                checkpoint_s: match row.optional(checkpoint_s) {
                    None => None,
                    Some(_) => Some(row.float(checkpoint_s, Bound::AboveZero)?),
                },
                line: row.line,
                job_id: id,
            };
            seen.insert(&row, job_id, &job.job_id)?;
            jobs.push(job);
            Ok(())
        })?;
        sort_by_submit(&mut jobs);
        Ok(jobs)
    }

    /// Reads a trace file; messages name the path as given.
    pub fn load(path: impl AsRef<Path>) -> Result<Vec<TraceJob>, TraceError> {
        let (file, origin) = open(path.as_ref())?;
        Self::from_reader(file, &origin)
    }
}

/// Stable sort on submit time, so equal times keep row order.
pub(crate) fn sort_by_submit(jobs: &mut [TraceJob]) {
    jobs.sort_by(|a, b| a.submit_s.total_cmp(&b.submit_s));
}

pub(crate) fn open(path: &Path) -> Result<(std::fs::File, String), TraceError> {
    let origin = path.display().to_string();
    match std::fs::File::open(path) {
        Ok(file) => Ok((file, origin)),
        Err(source) => Err(TraceError::Read { origin, source }),
    }
}

fn to_u32(value: u64) -> u32 {
    u32::try_from(value).unwrap_or(u32::MAX)
}

/// Ids (job ids, pod or node names) seen so far and their lines, to refuse a repeat.
#[derive(Default)]
pub(crate) struct JobIds(HashMap<String, u64>);

impl JobIds {
    pub(crate) fn insert(
        &mut self,
        row: &Row<'_>,
        column: Col,
        id: &str,
    ) -> Result<(), TraceError> {
        if let Some(&first) = self.0.get(id) {
            let message = format!("{id:?} is also the {} on line {first}", column.name);
            return Err(row.bad(column, message));
        }
        self.0.insert(id.to_owned(), row.line);
        Ok(())
    }
}

/// A column of the header: its name (for messages) and its index, `None` when an optional
/// column is absent.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Col {
    name: &'static str,
    index: Option<usize>,
}

/// A CSV file with its header read, shared by the trace reader and the Alibaba importers. The
/// input is read whole, so that line numbers come from byte offsets: the csv crate's own line
/// count runs one behind on CRLF files, and the shipped Alibaba files are CRLF.
pub(crate) struct CsvTable {
    origin: String,
    reader: csv::Reader<std::io::Cursor<Vec<u8>>>,
    headers: StringRecord,
    /// Byte offsets of every `\n`, to turn a record's offset into its line.
    newlines: Vec<usize>,
}

impl CsvTable {
    pub(crate) fn new(mut input: impl Read, origin: &str) -> Result<Self, TraceError> {
        let mut bytes = Vec::new();
        input
            .read_to_end(&mut bytes)
            .map_err(|source| TraceError::Read {
                origin: origin.to_owned(),
                source,
            })?;
        let newlines = bytes
            .iter()
            .enumerate()
            .filter(|&(_, &b)| b == b'\n')
            .map(|(i, _)| i)
            .collect();
        let reader = csv::ReaderBuilder::new()
            .has_headers(true)
            .flexible(true)
            .trim(csv::Trim::All)
            .from_reader(std::io::Cursor::new(bytes));
        let mut table = Self {
            origin: origin.to_owned(),
            reader,
            headers: StringRecord::new(),
            newlines,
        };
        table.headers = match table.reader.headers() {
            Ok(headers) => headers.clone(),
            Err(e) => return Err(table.csv_error(e)),
        };
        Ok(table)
    }

    /// The 1-based line of the record the csv crate places at `byte`. It places a record at
    /// the end of the line before (the `\n` of a CRLF, or before skipped blank lines), so skip
    /// line breaks first: no record starts with one (a quoted field starts with `"`).
    fn line_at(&self, byte: u64) -> u64 {
        let bytes = self.reader.get_ref().get_ref();
        let mut at = usize::try_from(byte).unwrap_or(usize::MAX).min(bytes.len());
        while at < bytes.len() && matches!(bytes[at], b'\r' | b'\n') {
            at += 1;
        }
        1 + self.newlines.partition_point(|&newline| newline < at) as u64
    }

    fn csv_error(&self, error: csv::Error) -> TraceError {
        let line = error.position().map_or(1, |p| self.line_at(p.byte()));
        let origin = self.origin.clone();
        match error.into_kind() {
            csv::ErrorKind::Io(source) => TraceError::Read { origin, source },
            csv::ErrorKind::Utf8 { .. } => TraceError::Malformed {
                origin,
                line,
                message: "is not valid UTF-8".to_owned(),
            },
            other => TraceError::Malformed {
                origin,
                line,
                message: format!("{other:?}"),
            },
        }
    }

    /// Finds a column by exact name; a required one must be there, and none may repeat.
    pub(crate) fn column(&self, name: &'static str, required: bool) -> Result<Col, TraceError> {
        let mut found = self.headers.iter().enumerate().filter(|(_, h)| *h == name);
        let index = found.next().map(|(i, _)| i);
        if found.next().is_some() {
            return Err(TraceError::DuplicateColumn {
                origin: self.origin.clone(),
                column: name,
            });
        }
        if required && index.is_none() {
            return Err(TraceError::MissingColumn {
                origin: self.origin.clone(),
                column: name,
            });
        }
        Ok(Col { name, index })
    }

    /// Calls `f` on every data row, in file order, stopping at the first error.
    pub(crate) fn for_each_row(
        &mut self,
        mut f: impl FnMut(Row<'_>) -> Result<(), TraceError>,
    ) -> Result<(), TraceError> {
        let mut record = StringRecord::new();
        loop {
            match self.reader.read_record(&mut record) {
                Ok(false) => return Ok(()),
                Ok(true) => {}
                Err(e) => return Err(self.csv_error(e)),
            }
            let byte = record
                .position()
                .map_or_else(|| self.reader.position().byte(), csv::Position::byte);
            let line = self.line_at(byte);
            if record.len() != self.headers.len() {
                return Err(TraceError::Malformed {
                    origin: self.origin.clone(),
                    line,
                    message: format!(
                        "has {} fields, but the header has {}",
                        record.len(),
                        self.headers.len()
                    ),
                });
            }
            f(Row {
                origin: &self.origin,
                line,
                record: &record,
            })?;
        }
    }
}

/// Which floats a column accepts.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Bound {
    AtLeastZero,
    AboveZero,
}

/// One data row, with what it takes to name a cell in an error.
pub(crate) struct Row<'a> {
    origin: &'a str,
    pub(crate) line: u64,
    record: &'a StringRecord,
}

impl Row<'_> {
    pub(crate) fn bad(&self, column: Col, message: String) -> TraceError {
        TraceError::BadValue {
            origin: self.origin.to_owned(),
            line: self.line,
            column: column.name,
            message,
        }
    }

    /// The cell's text, "" when the column is absent.
    pub(crate) fn text(&self, column: Col) -> &str {
        column.index.and_then(|i| self.record.get(i)).unwrap_or("")
    }

    pub(crate) fn optional(&self, column: Col) -> Option<&str> {
        Some(self.text(column)).filter(|t| !t.is_empty())
    }

    pub(crate) fn required(&self, column: Col) -> Result<&str, TraceError> {
        self.optional(column)
            .ok_or_else(|| self.bad(column, "is empty, but the column is required".to_owned()))
    }

    /// A required integer in `min..=max`.
    pub(crate) fn uint(&self, column: Col, min: u64, max: u64) -> Result<u64, TraceError> {
        let text = self.required(column)?;
        // A maximum that is only the type's limit is not part of the rule the reader knows.
        let open_ended = max >= u64::from(u32::MAX);
        let range = if open_ended {
            format!(">= {min}")
        } else {
            format!("{min}-{max}")
        };
        match text.parse::<u64>() {
            Ok(value) if (min..=max).contains(&value) => Ok(value),
            Ok(value) if value > max && open_ended => {
                Err(self.bad(column, format!("{text:?} is too large; the most is {max}")))
            }
            _ => Err(self.bad(column, format!("{text:?} is not an integer {range}"))),
        }
    }

    /// An optional integer ≥ 0.
    pub(crate) fn opt_uint(&self, column: Col) -> Result<Option<u64>, TraceError> {
        if self.optional(column).is_none() {
            return Ok(None);
        }
        self.uint(column, 0, u64::MAX).map(Some)
    }

    /// An optional signed integer.
    pub(crate) fn int(&self, column: Col) -> Result<Option<i32>, TraceError> {
        let Some(text) = self.optional(column) else {
            return Ok(None);
        };
        text.parse::<i32>()
            .map(Some)
            .map_err(|_| self.bad(column, format!("{text:?} is not an integer")))
    }

    /// A required finite float within `bound`.
    pub(crate) fn float(&self, column: Col, bound: Bound) -> Result<f64, TraceError> {
        let text = self.required(column)?;
        let (ok, wanted): (fn(f64) -> bool, &str) = match bound {
            Bound::AtLeastZero => (|v| v >= 0.0, "a number >= 0"),
            Bound::AboveZero => (|v| v > 0.0, "a number > 0"),
        };
        match text.parse::<f64>() {
            Ok(value) if value.is_finite() && ok(value) => Ok(value),
            _ => Err(self.bad(column, format!("{text:?} is not {wanted}"))),
        }
    }

    /// An optional fraction of one GPU, 1–999, allowed only when the pod asks for one GPU.
    /// `gpus_column` names the whole-GPU column in the message.
    pub(crate) fn gpu_milli(
        &self,
        column: Col,
        gpus: u64,
        gpus_column: &str,
    ) -> Result<Option<u32>, TraceError> {
        if self.optional(column).is_none() {
            return Ok(None);
        }
        let milli = self.uint(column, 1, 999)?;
        if gpus != 1 {
            let text = self.text(column);
            return Err(self.bad(
                column,
                format!(
                    "{text:?} is a fraction of one GPU, so {gpus_column} must be 1, not {gpus}"
                ),
            ));
        }
        Ok(Some(to_u32(milli)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shared(file: &str) -> String {
        format!(
            "{}/../../../shared/traces/{file}",
            env!("CARGO_MANIFEST_DIR")
        )
    }

    const HEADER: &str = "job_id,submit_s,duration_s,pods,gpus_per_pod,queue,priority,gpu_milli,gpu_type,cpu_milli,memory_mib\n";

    fn parse(text: &str) -> Result<Vec<TraceJob>, TraceError> {
        Trace::from_reader(text.as_bytes(), "tiresias.csv")
    }

    fn error(text: &str) -> String {
        parse(text).unwrap_err().to_string()
    }

    /// Five good rows, so that a bad sixth row sits on line 7.
    fn rows_then(bad: &str) -> String {
        let mut text = HEADER.to_owned();
        for i in 0..5 {
            text.push_str(&format!("j{i},{i},10,1,1,default,0,,,,\n"));
        }
        text.push_str(bad);
        text.push('\n');
        text
    }

    #[test]
    fn tiresias_sample_loads() {
        let jobs = Trace::load(shared("tiresias-60.gantry.csv")).unwrap();
        assert_eq!(jobs.len(), 60);
        assert_eq!(jobs[0].job_id, "tiresias-0");
        assert_eq!(jobs[1].gpus_per_pod, 8);
        assert!(jobs.iter().all(|j| j.queue == "default"));
        assert!(jobs.windows(2).all(|w| w[0].submit_s <= w[1].submit_s));
        // SOURCES.md says jobs over 8 GPUs became gangs of 8-GPU pods, but the source has no job
        // over 8 GPUs, so this sample has no gang.
        assert!(jobs.iter().all(|j| j.pods == 1));
        assert!(
            jobs.iter()
                .all(|j| j.gpu_milli.is_none() && j.cpu_milli.is_none())
        );
    }

    #[test]
    fn alibaba_sample_loads() {
        let jobs = Trace::load(shared("alibaba-openb-default.gantry.csv")).unwrap();
        assert_eq!(jobs.len(), 8151);
        assert!(jobs.iter().all(|j| j.pods == 1));
        assert!(jobs.iter().any(|j| j.gpu_milli.is_some()));
        let mut queues: Vec<&str> = jobs.iter().map(|j| j.queue.as_str()).collect();
        queues.sort_unstable();
        queues.dedup();
        assert_eq!(queues, ["be", "burstable", "guaranteed", "ls"]);
        let second = &jobs[1];
        assert_eq!(second.job_id, "openb-pod-0001");
        assert_eq!(second.submit_s, 427_061.0);
        assert_eq!(second.gpu_milli, Some(460));
        assert_eq!(second.cpu_milli, Some(6000));
        assert_eq!(second.memory_mib, Some(12288));
        assert_eq!(second.line, 3);
    }

    #[test]
    fn columns_in_any_order_unknown_ignored_sorted_by_submit() {
        let text = "queue,extra,gpus_per_pod,pods,duration_s,submit_s,job_id\n\
                    a,x,1,2,5.5,30,late\n\
                    b,y,0,1,1,10,early\n\
                    c,z,8,1,1,30,late-too\n";
        let jobs = parse(text).unwrap();
        let ids: Vec<&str> = jobs.iter().map(|j| j.job_id.as_str()).collect();
        assert_eq!(ids, ["early", "late", "late-too"]);
        assert_eq!(jobs[1].pods, 2);
        assert_eq!(jobs[1].duration_s, 5.5);
        assert_eq!(jobs[1].line, 2);
        assert_eq!(jobs[1].priority, 0);
        assert_eq!(jobs[1].gpu_type, None);
    }

    #[test]
    fn optional_columns_are_read() {
        let jobs = parse(&format!("{HEADER}j,0,1,1,1,q,-3,250,A100,4000,8192\n")).unwrap();
        let job = &jobs[0];
        assert_eq!(job.priority, -3);
        assert_eq!(job.gpu_milli, Some(250));
        assert_eq!(job.gpu_type.as_deref(), Some("A100"));
        assert_eq!(job.cpu_milli, Some(4000));
        assert_eq!(job.memory_mib, Some(8192));
    }

    #[test]
    fn trace_error_texts() {
        assert_eq!(
            error(&rows_then("j9,9,10,1,nine,default,0,,,,")),
            r#"tiresias.csv line 7, column gpus_per_pod: "nine" is not an integer 0-8"#
        );
        assert_eq!(
            error(&rows_then("j9,9,10,1,9,default,0,,,,")),
            r#"tiresias.csv line 7, column gpus_per_pod: "9" is not an integer 0-8"#
        );
        assert_eq!(
            error("job_id,submit_s,duration_s,pods,gpus_per_pod\nj,0,1,1,1\n"),
            "tiresias.csv line 1: missing required column queue"
        );
        assert_eq!(
            error(&rows_then("j9,-5,10,1,1,default,0,,,,")),
            r#"tiresias.csv line 7, column submit_s: "-5" is not a number >= 0"#
        );
        assert_eq!(
            error(&rows_then("j9,NaN,10,1,1,default,0,,,,")),
            r#"tiresias.csv line 7, column submit_s: "NaN" is not a number >= 0"#
        );
        assert_eq!(
            error(&rows_then("j9,9,0,1,1,default,0,,,,")),
            r#"tiresias.csv line 7, column duration_s: "0" is not a number > 0"#
        );
        assert_eq!(
            error(&rows_then("j9,9,10,0,1,default,0,,,,")),
            r#"tiresias.csv line 7, column pods: "0" is not an integer >= 1"#
        );
        assert_eq!(
            error(&rows_then("j9,9,10,99999999999,1,default,0,,,,")),
            r#"tiresias.csv line 7, column pods: "99999999999" is too large; the most is 4294967295"#
        );
        assert_eq!(
            error(&rows_then("j9,9,10,1,2,default,0,500,,,")),
            r#"tiresias.csv line 7, column gpu_milli: "500" is a fraction of one GPU, so gpus_per_pod must be 1, not 2"#
        );
        assert_eq!(
            error(&rows_then("j9,9,10,1,1,default,0,1000,,,")),
            r#"tiresias.csv line 7, column gpu_milli: "1000" is not an integer 1-999"#
        );
        assert_eq!(
            error(&rows_then("j3,9,10,1,1,default,0,,,,")),
            r#"tiresias.csv line 7, column job_id: "j3" is also the job_id on line 5"#
        );
        assert_eq!(
            error(&rows_then(",9,10,1,1,default,0,,,,")),
            "tiresias.csv line 7, column job_id: is empty, but the column is required"
        );
        assert_eq!(
            error(&rows_then("j9,9,10,1,1,,0,,,,")),
            "tiresias.csv line 7, column queue: is empty, but the column is required"
        );
        assert_eq!(
            error(&rows_then("j9,9,10,1,1,default,high,,,,")),
            r#"tiresias.csv line 7, column priority: "high" is not an integer"#
        );
        assert_eq!(
            error(&rows_then("j9,9,10,1,1,default,0,,,-1,")),
            r#"tiresias.csv line 7, column cpu_milli: "-1" is not an integer >= 0"#
        );
        assert_eq!(
            error(&rows_then("j9,9,10,1,1,default,0,,")),
            "tiresias.csv line 7: has 9 fields, but the header has 11"
        );
        assert_eq!(
            error("job_id,submit_s,duration_s,pods,gpus_per_pod,queue,pods\n"),
            "tiresias.csv line 1, column pods: appears more than once"
        );
    }

    #[test]
    fn line_numbers_count_quoted_newlines() {
        let text = format!("{HEADER}\"a\nb\",0,1,1,1,q,,,,,\nj,0,1,1,x,q,,,,,\n");
        assert_eq!(
            error(&text),
            r#"tiresias.csv line 4, column gpus_per_pod: "x" is not an integer 0-8"#
        );
    }

    #[test]
    fn line_numbers_hold_for_crlf_and_blank_lines() {
        let text = format!("{HEADER}j1,0,1,1,1,q,,,,,\n\nj2,0,1,1,1,q,,,,,\nj3,0,1,1,x,q,,,,,\n")
            .replace('\n', "\r\n");
        let ok = parse(&text.replace(",x,", ",1,")).unwrap();
        let lines: Vec<u64> = ok.iter().map(|j| j.line).collect();
        assert_eq!(lines, [2, 4, 5]);
        assert_eq!(
            error(&text),
            r#"tiresias.csv line 5, column gpus_per_pod: "x" is not an integer 0-8"#
        );
    }

    #[test]
    fn invalid_utf8_names_the_line() {
        let mut bytes = HEADER.as_bytes().to_vec();
        bytes.extend_from_slice(b"j,0,1,1,1,q\xff,,,,,\n");
        let message = Trace::from_reader(&bytes[..], "t.csv")
            .unwrap_err()
            .to_string();
        assert_eq!(message, "t.csv line 2: is not valid UTF-8");
    }

    #[test]
    fn a_byte_order_mark_is_not_part_of_the_first_column() {
        let jobs = parse(&format!("\u{feff}{HEADER}j,0,1,1,1,q,,,,,\n")).unwrap();
        assert_eq!(jobs[0].job_id, "j");
    }

    #[test]
    fn header_only_is_an_empty_trace() {
        assert!(parse(HEADER).unwrap().is_empty());
    }

    #[test]
    fn missing_file_names_the_path() {
        let message = Trace::load("/nonexistent/t.csv").unwrap_err().to_string();
        assert!(
            message.starts_with("/nonexistent/t.csv: cannot read: "),
            "{message}"
        );
    }
}

//! `gantry bench server`: what a viewer token can cost the server, measured on a `gantry serve`
//! child process on a loopback port. Figures, not thresholds (the README quotes them); each
//! scenario is one of the hardening issue's measurements:
//!
//! - `probes_idle`: `/healthz` round trips with nothing else open, the yardstick;
//! - `viewer_uploads`: concurrent viewers each announce a large policy upload and then send
//!   it; every answer's status, and how far the server's resident memory grew;
//! - `slow_requests`: viewers (a few tokens, under each token's cap) hold requests open by
//!   sending one byte of their bodies, while `/healthz` and an admin call are timed; those
//!   the server refused at once (past the viewers' share) are counted by status;
//! - `heavy_reads`: viewers loop the largest decision reads while a probe with a 1-second
//!   deadline runs four times a second; how many missed it.
//!
//! The server is a child process so that its resident memory is its own, not the bench's
//! clients'.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use serde_json::json;

#[derive(Args, Debug)]
pub struct ServerBenchArgs {
    /// Cluster spec the server simulates.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/clusters/openai-like-7500.yaml"))]
    cluster: PathBuf,
    /// New jobs per second of the simulated load, so there are decisions to read.
    #[arg(long, default_value_t = 20.0)]
    jobs_per_s: f64,
    /// Probes timed in each probe measurement.
    #[arg(long, default_value_t = 200)]
    probes: usize,
    /// Concurrent viewer uploads.
    #[arg(long, default_value_t = 20)]
    uploads: usize,
    /// Size each upload announces and then sends, in MiB.
    #[arg(long, default_value_t = 64)]
    upload_mib: usize,
    /// Viewer requests held open by a trickled body.
    #[arg(long, default_value_t = 300)]
    slow: usize,
    /// Viewers looping large decision reads.
    #[arg(long, default_value_t = 32)]
    readers: usize,
    /// How long the readers loop, in seconds.
    #[arg(long, default_value_t = 60)]
    read_s: u64,
    /// `limit` of each decision read.
    #[arg(long, default_value_t = 10_000)]
    read_limit: usize,
    /// Print one JSON object instead of indented JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    plugins: crate::policy::PluginDir,
}

/// The admin token of the bench's token file.
const ADMIN: &str = "bench-admin-token-0123456789abcdef";
/// Viewer tokens: the slow requests are spread over them so that no token's own cap (the
/// server's per-token limit) refuses them before they are open.
const VIEWERS: usize = 8;
/// A probe slower than this missed (the kubelet's probe timeout in `deploy/`).
const PROBE_DEADLINE: Duration = Duration::from_secs(1);

fn viewer(n: usize) -> String {
    format!("bench-viewer-{n}-token-0123456789abcdef")
}

/// The `gantry serve` under test, killed when dropped.
struct Served {
    child: Child,
    addr: String,
    _data: tempfile::TempDir,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Served {
    fn start(args: &ServerBenchArgs) -> anyhow::Result<Self> {
        let data = tempfile::tempdir().context("a data directory for the server")?;
        let tokens = data.path().join("tokens.yaml");
        let mut file = format!("tokens:\n  - {{name: admin, role: admin, token: {ADMIN}}}\n");
        for n in 0..VIEWERS {
            file.push_str(&format!(
                "  - {{name: viewer-{n}, role: viewer, token: {}}}\n",
                viewer(n)
            ));
        }
        std::fs::write(&tokens, file).context("writing the bench's token file")?;
        let mut child = Command::new(std::env::current_exe().context("this binary's path")?)
            .arg("serve")
            .args(["--listen", "127.0.0.1:0", "--log-every-s", "3600"])
            .arg("--cluster")
            .arg(&args.cluster)
            .arg("--jobs-per-s")
            .arg(args.jobs_per_s.to_string())
            .arg("--data-dir")
            .arg(data.path().join("data"))
            .arg("--tokens")
            .arg(&tokens)
            .envs(
                args.plugins
                    .plugin_dir
                    .as_ref()
                    .map(|dir| ("GANTRY_PLUGIN_DIR", dir.clone())),
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting gantry serve")?;
        let stdout = child.stdout.take().context("the server's stdout")?;
        // Its last lines of stderr, to say why it stopped if it does.
        let stderr = child.stderr.take().context("the server's stderr")?;
        let last_words = std::thread::spawn(move || {
            let mut lines: Vec<String> = BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
                .collect();
            let keep = lines.len().saturating_sub(5);
            lines.drain(..keep);
            lines.join("\n")
        });
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(rest) = line.trim().strip_prefix("API on ") {
                    let url = rest.split_whitespace().next().unwrap_or_default();
                    let addr = url
                        .trim_start_matches("http://")
                        .trim_end_matches("/api")
                        .to_string();
                    let _ = tx.send(addr);
                }
            }
        });
        let addr = match rx.recv_timeout(Duration::from_secs(120)) {
            Ok(addr) => addr,
            Err(_) => {
                let _ = child.kill();
                let status = child.wait().context("waiting for gantry serve")?;
                let said = last_words.join().unwrap_or_default();
                bail!("gantry serve gave no API address ({status}); its stderr ended:\n{said}");
            }
        };
        let served = Self {
            child,
            addr,
            _data: data,
        };
        let deadline = Instant::now() + Duration::from_secs(120);
        while served.get("/readyz", None).map(|(s, _)| s) != Some(200) {
            if Instant::now() > deadline {
                bail!("gantry serve was not ready within 120 s");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(served)
    }

    fn rss_mib(&self) -> f64 {
        rss_kib(self.child.id()) as f64 / 1024.0
    }

    /// One GET on the server (see [`get`]).
    fn get(&self, path: &str, token: Option<&str>) -> Option<(u16, usize)> {
        get(&self.addr, path, token)
    }

    /// `count` `/healthz` round trips, one after another: their times in ms (a failed one
    /// counts as `f64::INFINITY`).
    fn probe_ms(&self, count: usize, pause: Duration) -> Vec<f64> {
        (0..count)
            .map(|_| {
                let started = Instant::now();
                let ok = self.get("/healthz", None).is_some_and(|(s, _)| s == 200);
                let ms = started.elapsed().as_secs_f64() * 1e3;
                std::thread::sleep(pause);
                if ok { ms } else { f64::INFINITY }
            })
            .collect()
    }
}

/// VmRSS of process `pid`, in KiB (0 if unreadable).
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// p50, p99 and max of times in ms, and how many failed or passed the probe deadline.
fn summary(mut ms: Vec<f64>) -> serde_json::Value {
    ms.sort_by(f64::total_cmp);
    let at = |q: f64| {
        let v = ms[((ms.len() - 1) as f64 * q).round() as usize];
        v.is_finite().then(|| (v * 100.0).round() / 100.0)
    };
    let deadline_ms = PROBE_DEADLINE.as_secs_f64() * 1e3;
    json!({
        "count": ms.len(),
        "p50_ms": at(0.5),
        "p99_ms": at(0.99),
        "max_ms": at(1.0),
        "missed_deadline": ms.iter().filter(|&&v| v > deadline_ms).count(),
        "deadline_ms": deadline_ms,
    })
}

/// Runs `gantry bench server`.
pub fn run(args: ServerBenchArgs) -> anyhow::Result<()> {
    if args.probes == 0 {
        bail!("--probes must be at least 1");
    }
    let served = Served::start(&args)?;
    let idle = summary(served.probe_ms(args.probes, Duration::from_millis(5)));
    let uploads = viewer_uploads(&served, &args);
    let slow = slow_requests(&served, &args);
    let reads = heavy_reads(&served, &args);
    let report = json!({
        "cluster": args.cluster.display().to_string(),
        "probes_idle": idle,
        "viewer_uploads": uploads,
        "slow_requests": slow,
        "heavy_reads": reads,
        "rss_mib_at_end": (served.rss_mib() * 10.0).round() / 10.0,
    });
    let text = if args.json {
        serde_json::to_string(&report)?
    } else {
        serde_json::to_string_pretty(&report)?
    };
    outln!("{text}");
    Ok(())
}

/// Viewers announce `upload_mib` each, read the answer, then send all they announced for as
/// long as the server takes it; the server's RSS is sampled throughout.
fn viewer_uploads(served: &Served, args: &ServerBenchArgs) -> serde_json::Value {
    let body = args.upload_mib << 20;
    let before = served.rss_mib();
    let done = Arc::new(AtomicBool::new(false));
    let peak_kib = Arc::new(AtomicU64::new(0));
    let sampler = {
        let (done, peak_kib, pid) = (done.clone(), peak_kib.clone(), served.child.id());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                peak_kib.fetch_max(rss_kib(pid), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let started = Instant::now();
    let clients: Vec<_> = (0..args.uploads)
        .map(|i| {
            let addr = served.addr.clone();
            let token = viewer(i % VIEWERS);
            std::thread::spawn(move || -> (String, usize) {
                let Ok(mut stream) = TcpStream::connect(&addr) else {
                    return ("connect failed".into(), 0);
                };
                let _ = stream.set_read_timeout(Some(Duration::from_secs(60)));
                let headers = format!(
                    "POST /api/policies HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nContent-Type: application/wasm\r\nContent-Length: {body}\r\n\r\n"
                );
                if stream.write_all(headers.as_bytes()).is_err() {
                    return ("write failed".into(), 0);
                }
                let mut answer = [0u8; 64];
                let status = match stream.read(&mut answer) {
                    Ok(n) => String::from_utf8_lossy(&answer[..n])
                        .lines()
                        .next()
                        .unwrap_or_default()
                        .to_string(),
                    Err(e) => format!("no answer: {e}"),
                };
                let chunk = vec![0u8; 1 << 20];
                let mut sent = 0;
                while sent < body && stream.write_all(&chunk).is_ok() {
                    sent += chunk.len();
                }
                (status, sent)
            })
        })
        .collect();
    let results: Vec<(String, usize)> = clients
        .into_iter()
        .map(|c| c.join().unwrap_or_else(|_| ("client panicked".into(), 0)))
        .collect();
    // Let whatever the server buffered show in its RSS before the last sample.
    std::thread::sleep(Duration::from_millis(200));
    done.store(true, Ordering::Relaxed);
    let _ = sampler.join();
    let peak = (peak_kib.load(Ordering::Relaxed) as f64 / 1024.0).max(before);
    let mut statuses = std::collections::BTreeMap::<String, usize>::new();
    for (status, _) in &results {
        *statuses.entry(status.clone()).or_default() += 1;
    }
    json!({
        "uploads": args.uploads,
        "mib_each": args.upload_mib,
        "statuses": statuses,
        "mib_the_server_took": results.iter().map(|(_, sent)| sent >> 20).sum::<usize>(),
        "rss_mib_before": (before * 10.0).round() / 10.0,
        "rss_mib_peak": (peak * 10.0).round() / 10.0,
        "rss_growth_mib": ((peak - before) * 10.0).round() / 10.0,
        "wall_s": (started.elapsed().as_secs_f64() * 100.0).round() / 100.0,
    })
}

/// `slow` viewer POSTs that each send one byte of a body and then hold the connection, spread
/// over the viewer tokens; with them open, probes and an admin call are timed.
fn slow_requests(served: &Served, args: &ServerBenchArgs) -> serde_json::Value {
    let open: Vec<TcpStream> = (0..args.slow)
        .filter_map(|i| {
            let mut stream = TcpStream::connect(&served.addr).ok()?;
            let token = viewer(i % VIEWERS);
            write!(
                stream,
                "POST /api/whatif HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n{{",
                served.addr
            )
            .ok()?;
            Some(stream)
        })
        .collect();
    // Give the server a moment to take them all in, then see which it answered at once (the
    // rest are still open, waiting on their bodies).
    std::thread::sleep(Duration::from_millis(500));
    let mut answered = std::collections::BTreeMap::<String, usize>::new();
    for mut stream in open.iter() {
        let mut answer = [0u8; 64];
        if stream.set_nonblocking(true).is_ok()
            && let Ok(n) = stream.read(&mut answer)
            && n > 0
        {
            let status = String::from_utf8_lossy(&answer[..n])
                .lines()
                .next()
                .unwrap_or_default()
                .to_string();
            *answered.entry(status).or_default() += 1;
        }
    }
    let started = Instant::now();
    let probes = summary(served.probe_ms(args.probes, Duration::from_millis(5)));
    let admin_started = Instant::now();
    let admin = served.get("/api/whoami", Some(ADMIN));
    let admin_ms = admin_started.elapsed().as_secs_f64() * 1e3;
    let held_s = started.elapsed().as_secs_f64();
    let opened = open.len();
    drop(open);
    json!({
        "requests_sent": opened,
        "answered_at_once": answered,
        "viewer_tokens": VIEWERS,
        "probes": probes,
        "admin_whoami_status": admin.map(|(s, _)| s),
        "admin_whoami_ms": (admin_ms * 100.0).round() / 100.0,
        "measured_within_s": (held_s * 100.0).round() / 100.0,
    })
}

/// `readers` viewers loop `GET /api/decisions?limit=…` for `read_s` seconds while a probe
/// runs every 250 ms.
fn heavy_reads(served: &Served, args: &ServerBenchArgs) -> serde_json::Value {
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicU64::new(0));
    let read_bytes = Arc::new(AtomicU64::new(0));
    let path = format!("/api/decisions?limit={}", args.read_limit);
    let readers: Vec<_> = (0..args.readers)
        .map(|i| {
            let (stop, reads, read_bytes) = (stop.clone(), reads.clone(), read_bytes.clone());
            let addr = served.addr.clone();
            let path = path.clone();
            std::thread::spawn(move || {
                let token = viewer(i % VIEWERS);
                while !stop.load(Ordering::Relaxed) {
                    if let Some((200, bytes)) = get(&addr, &path, Some(&token)) {
                        reads.fetch_add(1, Ordering::Relaxed);
                        read_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    let probes_wanted = (args.read_s * 4).max(1) as usize;
    let probes = summary(served.probe_ms(probes_wanted, Duration::from_millis(250)));
    stop.store(true, Ordering::Relaxed);
    for reader in readers {
        let _ = reader.join();
    }
    let reads = reads.load(Ordering::Relaxed);
    json!({
        "readers": args.readers,
        "limit": args.read_limit,
        "reads_answered": reads,
        "mean_read_mib": if reads == 0 { 0.0 } else {
            (read_bytes.load(Ordering::Relaxed) as f64 / reads as f64 / 1048576.0 * 100.0).round() / 100.0
        },
        "probes": probes,
    })
}

/// One GET on its own connection to `addr`: the status and the answer's length, or `None`
/// if it failed or took over a minute.
fn get(addr: &str, path: &str, token: Option<&str>) -> Option<(u16, usize)> {
    let mut stream = TcpStream::connect(addr).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .ok()?;
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Connection: close\r\n\r\n"
    )
    .ok()?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).ok()?;
    let status = String::from_utf8_lossy(answer.get(..12)?)
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some((status, answer.len()))
}

//! A real `gantry serve` for the API tests: the binary on a free loopback port, with its own
//! data directory and known tokens, stopped (SIGTERM, then kill) when dropped.
#![allow(dead_code)]

pub mod kube;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const ADMIN: &str = "admin-token-0123456789abcdef";
pub const VIEWER: &str = "viewer-token-0123456789abcdef";

pub fn plugin_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../target")))
        .join("wasm32-wasip2/plugin")
}

pub fn plugin(file: &str) -> PathBuf {
    plugin_dir().join(file)
}

pub struct Server {
    child: Child,
    pub base: String,
    pub data: tempfile::TempDir,
    /// Everything the server printed so far.
    pub stdout: Arc<Mutex<String>>,
    /// Everything it logged so far (also passed on to the test's stderr).
    pub stderr: Arc<Mutex<String>>,
}

/// Writes the tokens file the tests use.
pub fn write_tokens(dir: &Path) -> PathBuf {
    let path = dir.join("test-tokens.yaml");
    std::fs::write(
        &path,
        format!(
            "tokens:\n  - {{name: alice, role: admin, token: {ADMIN}}}\n  - {{name: bob, role: viewer, token: {VIEWER}}}\n"
        ),
    )
    .expect("write tokens");
    path
}

/// The base URL in `gantry serve`'s "API on http://…/api" line, if `line` is that line.
pub fn api_base(line: &str) -> Option<String> {
    let rest = line.trim().strip_prefix("API on ")?;
    let url = rest.split_whitespace().next().unwrap_or_default();
    Some(url.trim_end_matches("/api").to_string())
}

impl Server {
    /// Starts `gantry serve` with `extra` arguments and waits until it is ready.
    pub fn start(extra: &[&str]) -> Server {
        Self::start_with_env(extra, &[])
    }

    /// [`Server::start`] with environment variables set for the server (`GANTRY_LOG`, say).
    pub fn start_with_env(extra: &[&str], env: &[(&str, &str)]) -> Server {
        Self::start_on(tempfile::tempdir().expect("tempdir"), extra, env)
    }

    /// [`Server::start_with_env`] on `data`, which may hold what an earlier server left there
    /// (its store in `data/data/store`): see [`Server::into_data`].
    pub fn start_on(data: tempfile::TempDir, extra: &[&str], env: &[(&str, &str)]) -> Server {
        let tokens = write_tokens(data.path());
        let mut child = Command::new(env!("CARGO_BIN_EXE_gantry"))
            .arg("serve")
            .args(["--listen", "127.0.0.1:0", "--log-every-s", "3600"])
            .arg("--data-dir")
            .arg(data.path().join("data"))
            .arg("--tokens")
            .arg(&tokens)
            .args(extra)
            .env("GANTRY_PLUGIN_DIR", plugin_dir())
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn gantry serve");
        let stderr = Arc::new(Mutex::new(String::new()));
        let log_pipe = child.stderr.take().expect("stderr");
        let log_sink = stderr.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(log_pipe).lines().map_while(Result::ok) {
                eprintln!("{line}");
                let mut s = log_sink.lock().unwrap_or_else(|e| e.into_inner());
                s.push_str(&line);
                s.push('\n');
            }
        });
        let stdout = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let pipe = child.stdout.take().expect("stdout");
        let sink = stdout.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                if let Some(base) = api_base(&line) {
                    let _ = tx.send(base);
                }
                let mut s = sink.lock().unwrap_or_else(|e| e.into_inner());
                s.push_str(&line);
                s.push('\n');
            }
        });
        let base = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("gantry serve printed its API address");
        let server = Server {
            child,
            base,
            data,
            stdout,
            stderr,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(r) = server.get_as("/readyz", None)
                && r.0 == 200
            {
                break;
            }
            assert!(Instant::now() < deadline, "server never became ready");
            std::thread::sleep(Duration::from_millis(100));
        }
        server
    }

    /// The server process's resident set, in bytes (Linux).
    pub fn rss_bytes(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .expect("/proc/PID/status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .expect("VmRSS")
            * 1024
    }

    fn agent() -> ureq::Agent {
        ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(60)))
            .build()
            .into()
    }

    /// GET with an optional token: (status, body).
    pub fn get_as(&self, path: &str, token: Option<&str>) -> Result<(u16, String), ureq::Error> {
        let mut req = Self::agent().get(format!("{}{path}", self.base));
        if let Some(t) = token {
            req = req.header("Authorization", format!("Bearer {t}"));
        }
        let mut resp = req.call()?;
        Ok((
            resp.status().as_u16(),
            resp.body_mut()
                .with_config()
                .limit(64 << 20)
                .read_to_string()
                .unwrap_or_default(),
        ))
    }

    /// GET `path` with the admin token (the audit log is admin-only): (status, JSON body).
    pub fn get_admin(&self, path: &str) -> (u16, serde_json::Value) {
        let (status, body) = self.get_as(path, Some(ADMIN)).expect("GET");
        (
            status,
            serde_json::from_str(&body).unwrap_or(serde_json::Value::String(body)),
        )
    }

    pub fn get(&self, path: &str) -> (u16, serde_json::Value) {
        let (status, body) = self.get_as(path, Some(VIEWER)).expect("GET");
        (
            status,
            serde_json::from_str(&body).unwrap_or(serde_json::Value::String(body)),
        )
    }

    /// POST (JSON body, raw bytes, or nothing) with a token: (status, JSON body).
    pub fn post(&self, path: &str, token: Option<&str>, body: Body) -> (u16, serde_json::Value) {
        let mut req = Self::agent().post(format!("{}{path}", self.base));
        if let Some(t) = token {
            req = req.header("Authorization", format!("Bearer {t}"));
        }
        let resp = match body {
            Body::Json(v) => req.send_json(v),
            Body::Bytes(b) => req.header("Content-Type", "application/wasm").send(&b[..]),
            Body::None => req.send_empty(),
        };
        let mut resp = resp.expect("POST");
        let status = resp.status().as_u16();
        let text = resp.body_mut().read_to_string().unwrap_or_default();
        (
            status,
            serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)),
        )
    }

    pub fn delete(&self, path: &str, token: Option<&str>) -> (u16, serde_json::Value) {
        let mut req = Self::agent().delete(format!("{}{path}", self.base));
        if let Some(t) = token {
            req = req.header("Authorization", format!("Bearer {t}"));
        }
        let mut resp = req.call().expect("DELETE");
        let status = resp.status().as_u16();
        let text = resp.body_mut().read_to_string().unwrap_or_default();
        (
            status,
            serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)),
        )
    }

    /// Runs the `gantry` CLI against this server with the admin token.
    pub fn cli(&self, args: &[&str]) -> std::process::Output {
        Command::new(env!("CARGO_BIN_EXE_gantry"))
            .args(args)
            .env("GANTRY_SERVER", &self.base)
            .env("GANTRY_TOKEN", ADMIN)
            .output()
            .expect("run gantry")
    }

    /// The store directory, for reading after the server stopped.
    pub fn store_dir(&self) -> PathBuf {
        self.data.path().join("data/store")
    }

    /// Asks the server to stop (SIGTERM) and waits for it to exit: true when it exited cleanly.
    pub fn stop(&mut self) -> bool {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status.success();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        false
    }
}

impl Server {
    /// Stops the server (as [`Server::stop`]) and hands back its folder, for a server started
    /// on it again.
    pub fn into_data(mut self) -> tempfile::TempDir {
        assert!(self.stop(), "gantry serve did not exit cleanly");
        std::mem::replace(&mut self.data, tempfile::tempdir().expect("tempdir"))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

pub enum Body {
    Json(serde_json::Value),
    Bytes(Vec<u8>),
    None,
}

/// The sha256 of the stored policy named `name`.
pub fn sha_of(server: &Server, name: &str) -> String {
    let (_, policies) = server.get("/api/policies");
    policies
        .as_array()
        .expect("list")
        .iter()
        .find(|m| m["name"] == name)
        .and_then(|m| m["sha256"].as_str())
        .unwrap_or_else(|| panic!("no stored policy {name}"))
        .to_string()
}

//! The test control plane (tests/cluster/: kube-apiserver, etcd, kwok) and what the e2e tests
//! share to drive it: start and stop by PID, a kube client, pods and PodGroups as a user writes
//! them, and waits that fail with what they waited for.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{ApiResource, GroupVersionKind};
use serde_json::json;

/// The binaries `tests/cluster/build.sh` printed. The tests that need the control plane are
/// `#[ignore]`d, so a bare `cargo test` leaves them out and says so; run with
/// `--include-ignored` (as `scripts/test.sh` does, having set `GANTRY_CLUSTER_BIN`), one fails,
/// naming how to get it, when the variable is unset: it never passes without having run.
pub fn cluster_bin(test: &str) -> String {
    std::env::var("GANTRY_CLUSTER_BIN").unwrap_or_else(|_| {
        panic!(
            "{test} needs the test control plane: set GANTRY_CLUSTER_BIN=$(tests/cluster/build.sh) \
             (scripts/test.sh does)"
        )
    })
}

/// A client for the control plane's admin kubeconfig.
pub async fn client(kubeconfig: &Path) -> Client {
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(kubeconfig).unwrap(),
        &Default::default(),
    )
    .await
    .unwrap();
    Client::try_from(config).unwrap()
}

/// A failure guard for waits, never a performance bound. Generous: kube_e2e runs five control
/// planes and five schedulers at once, and on a 2-core CI machine under load 90 s was once not
/// enough for four pods to bind.
pub const PATIENCE: Duration = Duration::from_secs(180);

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The control plane, stopped by PID when dropped.
pub struct ControlPlane {
    pub dir: String,
}

impl ControlPlane {
    pub fn start(bin: &str) -> Self {
        let out = Command::new(repo().join("tests/cluster/start.sh"))
            .env("GANTRY_CLUSTER_BIN", bin)
            .stderr(Stdio::inherit())
            .output()
            .expect("cannot run tests/cluster/start.sh");
        assert!(
            out.status.success(),
            "tests/cluster/start.sh failed (its output above says why)"
        );
        let dir = String::from_utf8(out.stdout).unwrap().trim().to_string();
        Self { dir }
    }

    pub fn kubeconfig(&self) -> PathBuf {
        Path::new(&self.dir).join("kubeconfig")
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        let _ = Command::new(repo().join("tests/cluster/stop.sh"))
            .arg(&self.dir)
            .status();
    }
}

/// A child process killed when dropped.
pub struct Running(pub Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `gantry serve --kubeconfig KUBECONFIG` with no policies, its data in `data`, logging
/// gantry_kube's progress: the scheduler the kube e2e tests run against.
pub fn serve_kube(kubeconfig: &Path, data: &Path) -> Running {
    serve_kube_with(kubeconfig, data, &[])
}

/// [`serve_kube`] with more flags of `gantry serve`.
pub fn serve_kube_with(kubeconfig: &Path, data: &Path, flags: &[&str]) -> Running {
    Running(
        gantry(&[
            "serve",
            "--no-policies",
            "--listen",
            "127.0.0.1:0",
            "--kubeconfig",
        ])
        .arg(kubeconfig)
        .arg("--data-dir")
        .arg(data)
        .args(flags)
        .env("GANTRY_LOG", "warn,gantry_kube=info")
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap(),
    )
}

pub fn gantry(args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_gantry"));
    command.args(args);
    command
}

pub fn pod(name: &str, gpus: u32, labels: serde_json::Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "schedulerName": "gantry",
            "containers": [{
                "name": "main",
                "image": "trainer",
                "resources": {"limits": {"nvidia.com/gpu": gpus.to_string()}}
            }]
        }
    }))
    .unwrap()
}

pub fn pod_group_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("scheduling.x-k8s.io", "v1alpha1", "PodGroup"),
        "podgroups",
    )
}

/// scheduler-plugins' PodGroup CRD, reduced to what the test uses.
/// Installs the PodGroup CRD and creates `name` (minMember `min`) once the API serves it.
/// Call it before starting Gantry, which discovers the API once, at start.
pub async fn create_first_pod_group(client: &Client, name: &str, min: u32) {
    use kube::api::{DynamicObject, PostParams};
    kube::Api::<CustomResourceDefinition>::all(client.clone())
        .create(&PostParams::default(), &pod_group_crd())
        .await
        .expect("create the PodGroup CRD");
    let groups: kube::Api<DynamicObject> =
        kube::Api::namespaced_with(client.clone(), "default", &pod_group_resource());
    until("the PodGroup API to serve", || async {
        let mut object = DynamicObject::new(name, &pod_group_resource());
        object.data = json!({"spec": {"minMember": min}});
        groups.create(&PostParams::default(), &object).await.ok()
    })
    .await;
}

pub fn pod_group_crd() -> CustomResourceDefinition {
    serde_json::from_value(json!({
        "metadata": {"name": "podgroups.scheduling.x-k8s.io"},
        "spec": {
            "group": "scheduling.x-k8s.io",
            "names": {"kind": "PodGroup", "plural": "podgroups", "singular": "podgroup", "shortNames": ["pg"]},
            "scope": "Namespaced",
            "versions": [{
                "name": "v1alpha1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": {"minMember": {"type": "integer", "format": "int32"}}},
                    "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
                }}},
                "subresources": {"status": {}}
            }]
        }
    }))
    .unwrap()
}

pub async fn until<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "gave up after {PATIENCE:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub fn node_of(pod: &Pod) -> Option<String> {
    pod.spec.as_ref()?.node_name.clone()
}

pub fn scheduled_condition(pod: &Pod) -> Option<(String, String, String)> {
    let c = pod
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "PodScheduled")?;
    Some((
        c.status.clone(),
        c.reason.clone().unwrap_or_default(),
        c.message.clone().unwrap_or_default(),
    ))
}

/// Events about `pod` with `reason`, by note.
pub fn notes(events: &[Event], pod: &str, reason: &str) -> Vec<String> {
    events
        .iter()
        .filter(|e| {
            e.reason.as_deref() == Some(reason)
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(pod)
        })
        .filter_map(|e| e.note.clone())
        .collect()
}

/// Creates the GPU nodes of `../shared/clusters/{spec}` with `gantry kube create-nodes`.
pub fn create_nodes(kubeconfig: &Path, spec: &str) {
    let created = gantry(&["kube", "create-nodes", "--spec"])
        .arg(repo().join("../shared/clusters").join(spec))
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .output()
        .expect("run gantry kube create-nodes");
    assert!(
        created.status.success(),
        "gantry kube create-nodes failed: {}",
        String::from_utf8_lossy(&created.stderr)
    );
}

/// A two-thread runtime for a test's kube calls.
pub fn test_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// Creates `pod`, retrying while the API server is away; "already exists" counts as created
/// (an earlier try may have landed with its answer lost).
pub async fn create_retrying(pods: &kube::Api<Pod>, pod: &Pod) {
    let name = pod.metadata.name.clone().unwrap_or_default();
    until(&format!("the API server to accept pod {name}"), || async {
        match pods.create(&kube::api::PostParams::default(), pod).await {
            Ok(_) => Some(()),
            Err(kube::Error::Api(status)) if status.code == 409 => Some(()),
            Err(_) => None,
        }
    })
    .await
}

/// Creates `count` fake nodes named `{prefix}-{i}` with `gpus` GPUs each, in one rack, for the
/// tests that need a cluster small enough to fill (kwok keeps them Ready).
pub fn create_gpu_nodes(kubeconfig: &Path, prefix: &str, count: u32, gpus: u32) {
    let config = gantry_kube::KubeConfig::default();
    let nodes = (0..count)
        .map(|i| {
            gantry_kube::nodes::node_object(
                &gantry_kube::nodes::NodeDef {
                    name: format!("{prefix}-{i}"),
                    gpus,
                    gpu_type: Some("H100".into()),
                    cpu_milli: 64_000,
                    memory_mib: 512 * 1024,
                    topology: vec![("rack".into(), "rack-0".into())],
                    taints: vec![],
                },
                &config,
            )
        })
        .collect();
    gantry_kube::nodes::create_nodes(kubeconfig, nodes).expect("create the GPU nodes");
}

/// A `scheduling.k8s.io/v1` PriorityClass: pods name it, the Priority admission plugin sets
/// their `spec.priority` from it.
pub async fn create_priority_class(client: &Client, name: &str, value: i32) {
    use k8s_openapi::api::scheduling::v1::PriorityClass;
    let class: PriorityClass = serde_json::from_value(json!({
        "metadata": {"name": name},
        "value": value,
    }))
    .unwrap();
    kube::Api::<PriorityClass>::all(client.clone())
        .create(&kube::api::PostParams::default(), &class)
        .await
        .expect("create the PriorityClass");
    // The Priority admission plugin reads PriorityClasses from an informer, which on a busy
    // machine lags a create: until it has the class, a pod naming it is refused ("no
    // PriorityClass with name … was found"). Wait until a dry run of such a pod is admitted.
    let probe: Pod = serde_json::from_value(json!({
        "metadata": {"name": format!("priority-probe-{name}")},
        "spec": {"priorityClassName": name, "containers": [{"name": "c", "image": "probe"}]},
    }))
    .unwrap();
    let pods = kube::Api::<Pod>::namespaced(client.clone(), "default");
    let dry_run = kube::api::PostParams {
        dry_run: true,
        ..Default::default()
    };
    until(&format!("PriorityClass {name} to be admitted"), || async {
        match pods.create(&dry_run, &probe).await {
            Ok(_) => Some(()),
            Err(kube::Error::Api(status)) if status.code == 403 => None,
            Err(e) => panic!("a dry run of a pod of PriorityClass {name} failed: {e}"),
        }
    })
    .await;
}

/// `pod` with a PriorityClass and a termination grace period (0: evicted pods go at once,
/// since no kubelet runs to finish a graceful termination).
pub fn with_priority(mut pod: Pod, class: Option<&str>, grace_s: i64) -> Pod {
    let spec = pod.spec.as_mut().unwrap();
    spec.priority_class_name = class.map(str::to_string);
    spec.termination_grace_period_seconds = Some(grace_s);
    pod
}

/// Pods of `pods` that exist, by name, with their node.
pub async fn nodes_by_pod(
    pods: &kube::Api<Pod>,
) -> std::collections::BTreeMap<String, Option<String>> {
    pods.list(&Default::default())
        .await
        .map(|list| {
            list.items
                .iter()
                .map(|p| (p.metadata.name.clone().unwrap_or_default(), node_of(p)))
                .collect()
        })
        .unwrap_or_default()
}

/// A `gantry serve --kubeconfig` child with its stdout collected and its API address known,
/// killed (SIGKILL) when dropped. For tests that run several replicas or kill one.
pub struct Replica {
    pub process: Running,
    pub base: String,
    pub stdout: std::sync::Arc<std::sync::Mutex<String>>,
    pub data: tempfile::TempDir,
}

impl Replica {
    /// Starts `gantry serve --kubeconfig KUBECONFIG` with `extra` arguments and the tests'
    /// tokens (see `common::write_tokens`), on a loopback port it chooses itself (a port the
    /// test picked and let go could be taken by the next replica before this one binds it),
    /// and waits until it prints its API address.
    pub fn start(kubeconfig: &Path, extra: &[&str]) -> Self {
        use std::io::BufRead;
        let data = tempfile::tempdir().unwrap();
        let tokens = super::write_tokens(data.path());
        let mut child = gantry(&["serve", "--no-policies", "--kubeconfig"])
            .arg(kubeconfig)
            .args(["--listen", "127.0.0.1:0"])
            .arg("--data-dir")
            .arg(data.path().join("data"))
            .arg("--tokens")
            .arg(&tokens)
            .args(extra)
            .env("GANTRY_LOG", "warn,gantry_kube=info")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let pipe = child.stdout.take().unwrap();
        let sink = stdout.clone();
        let (base_tx, base_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(pipe).lines().map_while(Result::ok) {
                if let Some(base) = super::api_base(&line) {
                    let _ = base_tx.send(base);
                }
                let mut s = sink.lock().unwrap_or_else(|e| e.into_inner());
                s.push_str(&line);
                s.push('\n');
            }
        });
        let process = Running(child);
        let base = base_rx
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| {
                panic!(
                    "gantry serve printed no API address; it printed:\n{}",
                    stdout.lock().unwrap_or_else(|e| e.into_inner())
                )
            });
        Self {
            process,
            base,
            stdout,
            data,
        }
    }

    /// GET `path` with the viewer token: (status, body), or `None` while it does not answer.
    pub fn get(&self, path: &str) -> Option<(u16, String)> {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(10)))
            .build()
            .into();
        let mut response = agent
            .get(format!("{}{path}", self.base))
            .header("Authorization", format!("Bearer {}", super::VIEWER))
            .call()
            .ok()?;
        let status = response.status().as_u16();
        Some((
            status,
            response.body_mut().read_to_string().unwrap_or_default(),
        ))
    }

    /// The text after `prefix` on the first stdout line that has it.
    pub fn printed(&self, prefix: &str) -> Option<String> {
        let out = self.stdout.lock().unwrap_or_else(|e| e.into_inner());
        out.lines()
            .find_map(|l| l.trim().strip_prefix(prefix).map(|s| s.trim().to_string()))
    }
}

/// Runs the control plane's `kubectl` (built by tests/cluster/build.sh) with `args` against
/// `kubeconfig`; panics with its output when it fails.
pub fn kubectl(bin: &str, kubeconfig: &Path, args: &[&str]) -> String {
    let out = Command::new(Path::new(bin).join("kubectl"))
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .current_dir(repo())
        .output()
        .expect("run kubectl (is it in GANTRY_CLUSTER_BIN? re-run tests/cluster/build.sh)");
    assert!(
        out.status.success(),
        "kubectl {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A kubeconfig like `admin` (same server and CA) that authenticates with `token` only.
pub fn kubeconfig_with_token(admin: &Path, token: &str, out: &Path) {
    let text = std::fs::read_to_string(admin).unwrap();
    let mut config: serde_json::Value = serde_yaml::from_str(&text).unwrap();
    config["users"] = json!([{"name": "token-user", "user": {"token": token}}]);
    config["contexts"][0]["context"]["user"] = json!("token-user");
    std::fs::write(out, serde_yaml::to_string(&config).unwrap()).unwrap();
}

/// `kubectl apply -k deploy/`, then waits for its CRDs and applies `deploy/examples`, as
/// `deploy/README.md` says to. Returns what the first apply printed.
pub fn apply_deploy(bin: &str, admin: &Path) -> String {
    let applied = kubectl(bin, admin, &["apply", "-k", "deploy/"]);
    kubectl(
        bin,
        admin,
        &[
            "wait",
            "--for=condition=established",
            "--timeout=60s",
            "crd/queues.gantry.dev",
            "crd/podgroups.scheduling.x-k8s.io",
        ],
    );
    kubectl(bin, admin, &["apply", "-k", "deploy/examples"]);
    applied
}

/// Creates the example Job's two pods from its template, as its controller would (none runs
/// here), waits until both are bound and returns their nodes.
pub async fn bind_example_gang(client: &Client) -> (String, String) {
    use k8s_openapi::api::batch::v1::Job;
    use kube::api::PostParams;
    let template = kube::Api::<Job>::namespaced(client.clone(), "default")
        .get("train-example")
        .await
        .unwrap()
        .spec
        .unwrap()
        .template;
    let pods: kube::Api<Pod> = kube::Api::namespaced(client.clone(), "default");
    for i in 0..2 {
        let mut pod = Pod {
            metadata: template.metadata.clone().unwrap_or_default(),
            spec: template.spec.clone(),
            status: None,
        };
        pod.metadata.name = Some(format!("train-example-{i}"));
        pods.create(&PostParams::default(), &pod).await.unwrap();
    }
    until("the example gang to bind", || async {
        let a = node_of(&pods.get("train-example-0").await.ok()?)?;
        let b = node_of(&pods.get("train-example-1").await.ok()?)?;
        Some((a, b))
    })
    .await
}

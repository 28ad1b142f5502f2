//! The image (`deploy/Containerfile`, built by `scripts/image.sh` with buildah) against a real
//! control plane. Containers cannot run on these machines (crun and runc fail with "setrlimit:
//! Operation not permitted"), so the test does what a kubelet and runtime would, by hand:
//!
//! - unpacks the image's layers (OCI layout, `GANTRY_IMAGE`) into a root filesystem;
//! - "mounts" what the Deployment mounts: the tokens Secret's keys, the store's folder, and a
//!   ServiceAccount token from the TokenRequest API with the CA and namespace beside it, where
//!   the kubelet puts them;
//! - runs the image's entrypoint chrooted there, as the image's user, with the Deployment's own
//!   arguments and environment, and nothing else of the host's environment.
//!
//! That process must take the Lease and bind the example gang. The test also checks what the
//! Containerfile promises: a static binary, a user that is not root, the UI and the example
//! policies inside, and no write outside the store (the Deployment's root filesystem is
//! read-only).

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::{PermissionsExt, chown};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::kube::*;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use serde_json::Value;

/// What the test reads of an image: its unpacked root and its config's run settings.
struct Image {
    rootfs: PathBuf,
    /// `org.opencontainers.image.ref.name`, e.g. `0.1.0`.
    tag: String,
    user: String,
    entrypoint: Vec<String>,
    env: Vec<(String, String)>,
}

fn read_json(path: &Path) -> Value {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("parse {}: {e}", path.display()))
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// Unpacks the OCI layout at `oci` (its first manifest) into `root`, layer by layer.
fn unpack(oci: &Path, root: &Path) -> Image {
    let blob = |digest: &str| oci.join("blobs").join(digest.replacen(':', "/", 1));
    let index = read_json(&oci.join("index.json"));
    let described = &index["manifests"][0];
    let manifest = read_json(&blob(described["digest"].as_str().unwrap()));
    let config = read_json(&blob(manifest["config"]["digest"].as_str().unwrap()));
    let rootfs = root.join("rootfs");
    std::fs::create_dir_all(&rootfs).unwrap();
    for layer in manifest["layers"].as_array().unwrap() {
        // GNU tar finds the compression itself, and as root keeps the layer's owners.
        let out = Command::new("tar")
            .arg("-xf")
            .arg(blob(layer["digest"].as_str().unwrap()))
            .arg("-C")
            .arg(&rootfs)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "tar: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // One stage FROM scratch: no layer deletes anything, so there is no whiteout to apply.
    let listed = files(&rootfs);
    assert!(
        !listed.keys().any(|p| p.contains(".wh.")),
        "whiteouts in the image: this test does not apply them"
    );
    let run = &config["config"];
    Image {
        rootfs,
        tag: described["annotations"]["org.opencontainers.image.ref.name"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        user: run["User"].as_str().unwrap_or_default().to_string(),
        entrypoint: strings(&run["Entrypoint"]),
        env: strings(&run["Env"])
            .into_iter()
            .filter_map(|kv| kv.split_once('=').map(|(k, v)| (k.into(), v.into())))
            .collect(),
    }
}

/// Every file and folder under `root` (relative path → size and modification time).
fn files(root: &Path) -> BTreeMap<String, (u64, std::time::SystemTime)> {
    let mut out = BTreeMap::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(dir) = todo.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let entry = entry.unwrap();
            let meta = entry.metadata().unwrap();
            let path = entry.path();
            let relative = path.strip_prefix(root).unwrap().display().to_string();
            out.insert(relative, (meta.len(), meta.modified().unwrap()));
            if meta.is_dir() {
                todo.push(path);
            }
        }
    }
    out
}

/// Whether the ELF executable at `path` names a program interpreter (a dynamic loader).
fn has_interpreter(path: &Path) -> bool {
    let elf = std::fs::read(path).unwrap();
    assert_eq!(
        &elf[..4],
        b"\x7fELF",
        "{} is not an ELF file",
        path.display()
    );
    assert_eq!(elf[4], 2, "not a 64-bit ELF file");
    let u16_at = |at: usize| u16::from_le_bytes([elf[at], elf[at + 1]]) as usize;
    let phoff = u64::from_le_bytes(elf[0x20..0x28].try_into().unwrap()) as usize;
    let (entry_size, count) = (u16_at(0x36), u16_at(0x38));
    const PT_INTERP: u32 = 3;
    (0..count).any(|i| {
        let at = phoff + i * entry_size;
        u32::from_le_bytes(elf[at..at + 4].try_into().unwrap()) == PT_INTERP
    })
}

/// Prints the chrooted process's output when the test fails, and kills it when dropped.
struct Chrooted {
    _process: Running,
    log: PathBuf,
}

impl Chrooted {
    fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Chrooted {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- the chrooted gantry printed:\n{}", self.output());
        }
    }
}

#[test]
#[ignore = "needs tests/cluster and the image: scripts/test.sh runs it with --include-ignored"]
fn the_image_runs_chrooted_with_the_deployments_arguments_takes_the_lease_and_binds() {
    let bin = cluster_bin("kube image e2e");
    let oci = std::env::var("GANTRY_IMAGE").unwrap_or_else(|_| {
        panic!(
            "the image e2e test needs the image: set GANTRY_IMAGE=$(scripts/image.sh) \
             (scripts/test.sh does)"
        )
    });
    let dir = tempfile::tempdir().unwrap();
    let image = unpack(Path::new(&oci), dir.path());
    let rootfs = &image.rootfs;

    // What the Containerfile promises.
    assert_eq!(image.user, "65532:65532", "the image's user");
    let passwd = std::fs::read_to_string(rootfs.join("etc/passwd")).unwrap();
    assert!(passwd.contains(":65532:65532:"), "/etc/passwd: {passwd}");
    let entry = image
        .entrypoint
        .first()
        .expect("the image has an entrypoint");
    let binary = rootfs.join(entry.trim_start_matches('/'));
    assert!(
        !has_interpreter(&binary),
        "{entry} is dynamically linked: the image has no libc to load it"
    );
    let plugin_dir = image
        .env
        .iter()
        .find(|(k, _)| k == "GANTRY_PLUGIN_DIR")
        .map(|(_, v)| v.clone())
        .expect("the image sets GANTRY_PLUGIN_DIR");
    for policy in ["gpu_fit.wasm", "gpu_binpack.wasm", "team_quota.wasm"] {
        let path = rootfs.join(plugin_dir.trim_start_matches('/')).join(policy);
        assert!(path.is_file(), "{} is not in the image", path.display());
    }

    let plane = ControlPlane::start(&bin);
    let admin = plane.kubeconfig();
    create_gpu_nodes(&admin, "gpu", 2, 8);
    apply_deploy(&bin, &admin);
    // The Secret deploy/README.md asks for, with the tests' tokens.
    let tokens = common::write_tokens(dir.path());
    kubectl(
        &bin,
        &admin,
        &[
            "-n",
            "gantry-system",
            "create",
            "secret",
            "generic",
            "gantry-tokens",
            &format!("--from-file=tokens.yaml={}", tokens.display()),
        ],
    );
    let token = kubectl(
        &bin,
        &admin,
        &[
            "-n",
            "gantry-system",
            "create",
            "token",
            "gantry",
            "--duration=1h",
        ],
    );

    let runtime = test_runtime();
    let admin_client = runtime.block_on(client(&admin));
    let deployment = runtime.block_on(async {
        Api::<Deployment>::namespaced(admin_client.clone(), "gantry-system")
            .get("gantry")
            .await
            .unwrap()
    });
    let pod_spec = deployment.spec.unwrap().template.spec.unwrap();
    let container = &pod_spec.containers[0];
    assert_eq!(
        container.image.as_deref(),
        Some(format!("gantry:{}", image.tag).as_str()),
        "the Deployment runs the image built"
    );
    let nonroot = 65532;
    let security = pod_spec.security_context.clone().unwrap_or_default();
    assert_eq!(security.run_as_user, Some(nonroot));
    let group = security.fs_group.unwrap_or(nonroot) as u32;

    // The kubelet's part: the ServiceAccount token, CA and namespace, and the pod's volumes.
    let account = rootfs.join("var/run/secrets/kubernetes.io/serviceaccount");
    std::fs::create_dir_all(&account).unwrap();
    std::fs::write(account.join("token"), token.trim()).unwrap();
    std::fs::copy(Path::new(&plane.dir).join("ca.crt"), account.join("ca.crt")).unwrap();
    std::fs::write(account.join("namespace"), "gantry-system").unwrap();
    let volumes = pod_spec.volumes.clone().unwrap_or_default();
    let mut mounted = Vec::new();
    for mount in container.volume_mounts.clone().unwrap_or_default() {
        let volume = volumes.iter().find(|v| v.name == mount.name).unwrap();
        let at = rootfs.join(mount.mount_path.trim_start_matches('/'));
        std::fs::create_dir_all(&at).unwrap();
        if let Some(secret) = &volume.secret {
            assert_eq!(secret.secret_name.as_deref(), Some("gantry-tokens"));
            let file = at.join("tokens.yaml");
            std::fs::copy(&tokens, &file).unwrap();
            // defaultMode with the pod's fsGroup, as the kubelet writes it.
            chown(&file, Some(0), Some(group)).unwrap();
            let mode = secret.default_mode.unwrap_or(0o644) as u32 | 0o040;
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).unwrap();
        } else {
            assert!(
                volume.persistent_volume_claim.is_some(),
                "volume {}: only the PVC and the Secret are emulated",
                volume.name
            );
            chown(&at, Some(nonroot as u32), Some(group)).unwrap();
        }
        mounted.push(mount.mount_path.trim_start_matches('/').to_string());
    }
    let before = files(rootfs);

    // The Deployment's environment: plain values and the pod's namespace (downward API).
    let mut env: Vec<(String, String)> = image.env.clone();
    for var in container.env.clone().unwrap_or_default() {
        let value = match (var.value, var.value_from) {
            (Some(value), _) => value,
            (None, Some(from)) => {
                let path = from.field_ref.map(|f| f.field_path).unwrap_or_default();
                assert_eq!(path, "metadata.namespace", "env {}: not emulated", var.name);
                "gantry-system".to_string()
            }
            (None, None) => String::new(),
        };
        env.push((var.name, value));
    }
    // The API server's address, as the kubelet hands it over: KUBERNETES_SERVICE_HOST/PORT.
    let kubeconfig = kube::config::Kubeconfig::read_from(&admin).unwrap();
    let server = kubeconfig.clusters[0]
        .cluster
        .as_ref()
        .unwrap()
        .server
        .clone();
    let (host, port) = server
        .as_deref()
        .and_then(|s| s.strip_prefix("https://"))
        .and_then(|s| s.rsplit_once(':'))
        .map(|(h, p)| (h.to_string(), p.to_string()))
        .expect("the admin kubeconfig's server is https://HOST:PORT");
    let mut args = container.args.clone().unwrap_or_default();
    let deployed_port = args
        .iter()
        .find_map(|a| a.strip_prefix("--listen=0.0.0.0:"))
        .expect("the Deployment's --listen")
        .to_string();
    let container_ports: Vec<String> = container
        .ports
        .iter()
        .flatten()
        .map(|p| p.container_port.to_string())
        .collect();
    assert!(
        container_ports.contains(&deployed_port),
        "the Deployment listens on {deployed_port} but declares ports {container_ports:?}"
    );
    // A pod has its own network namespace and a chroot does not: the Deployment's port (7070,
    // the demo's too) may be taken on this machine, so the chrooted process gets a free one.
    let listen = std::net::TcpListener::bind("0.0.0.0:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    for arg in &mut args {
        if arg.starts_with("--listen=") {
            *arg = format!("--listen=0.0.0.0:{listen}");
        }
    }
    let log = dir.path().join("gantry.log");
    let output = std::fs::File::create(&log).unwrap();
    let child = Command::new("chroot")
        .arg(format!("--userspec={}", image.user))
        .arg(rootfs)
        .args(&image.entrypoint)
        .args(&args)
        .env_clear()
        .envs(env)
        .env("KUBERNETES_SERVICE_HOST", host)
        .env("KUBERNETES_SERVICE_PORT", port)
        .stdout(output.try_clone().unwrap())
        .stderr(output)
        .stdin(Stdio::null())
        .spawn()
        .expect("run chroot");
    let gantry = Chrooted {
        _process: Running(child),
        log,
    };

    runtime.block_on(async {
        let nodes = bind_example_gang(&admin_client).await;
        assert_ne!(nodes.0, nodes.1, "two 8-GPU pods on two 8-GPU nodes");
        let leases: Api<Lease> = Api::namespaced(admin_client.clone(), "gantry-system");
        let holder = until("the chrooted gantry to hold the Lease", || async {
            leases.get_opt("gantry").await.ok()??.spec?.holder_identity
        })
        .await;
        assert!(
            gantry.output().contains(&format!(
                "leader election: lease gantry-system/gantry as {holder}"
            )),
            "the Lease is held by {holder}, not by the chrooted gantry"
        );
    });

    // The UI is inside the binary, and the example policies were loaded from the image.
    let http = |path: &str, auth: bool| {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(std::time::Duration::from_secs(10)))
            .build()
            .into();
        let mut request = agent.get(format!("http://127.0.0.1:{listen}{path}"));
        if auth {
            request = request.header("Authorization", format!("Bearer {}", common::VIEWER));
        }
        let mut response = request.call().expect("the chrooted gantry's API answers");
        (
            response.status().as_u16(),
            response.body_mut().read_to_string().unwrap_or_default(),
        )
    };
    // The Deployment's probes: /healthz (liveness and startup) and /readyz.
    for probe in ["/healthz", "/readyz"] {
        let (status, body) = http(probe, false);
        assert_eq!(status, 200, "GET {probe}: {body}");
    }
    let (status, page) = http("/", false);
    assert!(
        status == 200 && page.contains("<title>Gantry</title>"),
        "GET /: {status} {page}"
    );
    let (status, policies) = http("/api/policies", true);
    assert_eq!(status, 200, "GET /api/policies: {policies}");
    for policy in ["gpu-fit", "gpu-binpack", "team-quota"] {
        assert!(
            policies.contains(&format!("\"name\":\"{policy}\"")),
            "{policy} was not loaded from the image: {policies}"
        );
    }

    drop(gantry);
    // Nothing written outside the mounted folders: the root filesystem could be read-only.
    let after = files(rootfs);
    let outside = |path: &String| !mounted.iter().any(|m| path.starts_with(m.as_str()));
    let changed: Vec<&String> = after
        .iter()
        .filter(|(path, meta)| outside(path) && before.get(*path) != Some(meta))
        .map(|(path, _)| path)
        .collect();
    assert!(
        changed.is_empty(),
        "written outside the volumes: {changed:?}"
    );
    let store = rootfs.join("var/lib/gantry");
    assert!(
        std::fs::read_dir(&store).unwrap().next().is_some(),
        "the store at /var/lib/gantry is empty"
    );
}

//! The runtime and the clients every call to the API server goes through: one small tokio
//! runtime the synchronous loop blocks on, and clients with or without kube-rs' retries, each
//! call bounded by [`CALL_TIMEOUT`] where it is a write.

use std::path::Path;

use kube::Client;

use crate::{Error, Result};

/// Bindings and status patches in flight at once (the cluster bench binds with the same).
pub const CONCURRENCY: usize = 16;

/// A small runtime for the caches and calls; the scheduling loop blocks on it.
pub fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("gantry-kube")
        .enable_all()
        .build()
        .map_err(|e| Error::Runtime(e.to_string()))
}

/// The `--kubeconfig` value that means "the pod's own service account" (in a Deployment).
pub const IN_CLUSTER: &str = "in-cluster";

/// A client from the kubeconfig at `path` (its current context), or from the pod's service
/// account when `path` is [`IN_CLUSTER`].
pub fn client(runtime: &tokio::runtime::Runtime, path: &Path) -> Result<Client> {
    client_with(runtime, path, true, None)
}

/// How long one write to the API server (a binding, an eviction, an Event, a status) may take
/// before it fails: a slow or vanished API server never holds the scheduling loop longer.
/// Watches keep the client default, since a watch is a long poll.
pub const CALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// [`client`], with kube-rs's retries of 429/503/504 on or off. Every write turns them off:
/// a 429 to an eviction is a PodDisruptionBudget's answer, and retrying it in place
/// (Retry-After 10 s, 15 times) would stall the scheduling loop; and a binding retried in
/// place could land after the Lease it was sent under ran out.
///
/// With `timeout`, every request (connect, send, read) fails after that long.
pub(crate) fn client_with(
    runtime: &tokio::runtime::Runtime,
    path: &Path,
    retry: bool,
    timeout: Option<std::time::Duration>,
) -> Result<Client> {
    let bounded = |cfg: &mut kube::Config| {
        if let Some(timeout) = timeout {
            cfg.connect_timeout = Some(timeout);
            cfg.read_timeout = Some(timeout);
            cfg.write_timeout = Some(timeout);
        }
    };
    let unreadable = |message: String| Error::Kubeconfig {
        path: path.display().to_string(),
        message,
    };
    if path == Path::new(IN_CLUSTER) {
        let mut cfg = kube::Config::incluster().map_err(|e| unreadable(e.to_string()))?;
        cfg.default_retry = retry;
        bounded(&mut cfg);
        let _guard = runtime.enter();
        return Client::try_from(cfg).map_err(|e| Error::Connect(e.to_string()));
    }
    let kubeconfig =
        kube::config::Kubeconfig::read_from(path).map_err(|e| unreadable(e.to_string()))?;
    runtime.block_on(async {
        let options = kube::config::KubeConfigOptions::default();
        let mut cfg = kube::Config::from_custom_kubeconfig(kubeconfig, &options)
            .await
            .map_err(|e| unreadable(e.to_string()))?;
        cfg.default_retry = retry;
        bounded(&mut cfg);
        Client::try_from(cfg).map_err(|e| Error::Connect(e.to_string()))
    })
}

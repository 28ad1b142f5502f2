//! What comes in: the watch caches ([`cache`]), the optional kinds found by discovery, and
//! the sync that applies what the caches changed to the tracker ([`apply`]). Nothing here
//! writes to the API server.

mod apply;
mod cache;

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice,
};
use kube::Client;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::reflector::Store;
use kube::runtime::watcher;

use cache::{Reflectors, SharedLog};

use crate::config::KubeConfig;
use crate::{Error, Result};

/// Kueue's API group, and the versions of `LocalQueue` Gantry reads, preferred first (only
/// `spec.clusterQueue` is read, which both have).
const KUEUE_GROUP: &str = "kueue.x-k8s.io";

const KUEUE_VERSIONS: [&str; 2] = ["v1beta2", "v1beta1"];

/// The upstream gang API's group, and the versions of its `PodGroup` Gantry reads, preferred
/// first: alpha in 1.35 (v1alpha1, a different shape, not read), v1alpha2 in 1.36, beta (and
/// v1alpha3) in 1.37. All three have `spec.schedulingPolicy` and `status.conditions` as read
/// here; only the condition's name changed (see [`scheduled_condition_type`]).
const WORKLOAD_GROUP: &str = "scheduling.k8s.io";

const WORKLOAD_VERSIONS: [&str; 3] = ["v1beta1", "v1alpha3", "v1alpha2"];

/// Dynamic Resource Allocation's API, GA since Kubernetes 1.34; the beta versions before it
/// are not read.
const DRA_VERSION: &str = "resource.k8s.io/v1";

/// How often kinds the cluster did not serve are looked for again.
const DISCOVER_EVERY: Duration = Duration::from_secs(30);
/// How soon discovery is asked again while it has never answered whether Queues are served:
/// pods that name a queue wait until it has.
const DISCOVER_RETRY: Duration = Duration::from_secs(2);

/// The caches of Dynamic Resource Allocation (`resource.k8s.io/v1`), watched once the API
/// server serves it.
pub(crate) struct DraStores {
    /// The devices drivers publish: the inventory, and the GPUs in the node table.
    pub(crate) slices: Store<ResourceSlice>,
    /// What a claim's request names: the class's selectors and configuration.
    pub(crate) classes: Store<DeviceClass>,
    /// The claims pods name, with their allocation and reservations.
    pub(crate) claims: Store<ResourceClaim>,
    /// The templates pods name: checked before kube-controller-manager creates their claims.
    pub(crate) templates: Store<ResourceClaimTemplate>,
}

/// What each cache changed since the last sync: one log per kind (both pod caches share one,
/// and the slices and DeviceClasses another, since the inventory is read again whole).
#[derive(Default)]
struct Logs {
    nodes: SharedLog,
    pods: SharedLog,
    groups: SharedLog,
    queues: SharedLog,
    namespaces: SharedLog,
    local_queues: SharedLog,
    slices: SharedLog,
    claims: SharedLog,
    templates: SharedLog,
    /// Never taken: the preflight pods are read whole at each sync (they are few).
    preflight: SharedLog,
}

/// The watch caches, and what the last sync made of them.
pub(crate) struct Watch {
    /// Starts each cache.
    reflectors: Reflectors,
    /// The client discovery asks with: each call bounded, so a vanished API server holds no
    /// sync for long.
    discovery_client: Client,
    nodes: Store<Node>,
    /// Our pods with no node yet.
    pending: Store<Pod>,
    /// Every pod bound to a node and not finished.
    bound: Store<Pod>,
    /// Preflight pods (label `gantry.dev/preflight=true`), finished ones too: their results
    /// are read here. `None` when no preflight is configured.
    preflight: Option<Store<Pod>>,
    /// scheduler-plugins' PodGroups; `None` when the cluster has no such CRD.
    pod_groups: Option<Store<DynamicObject>>,
    /// Upstream `scheduling.k8s.io` PodGroups (KEP-4671), in the version the API server
    /// serves (kept for the status writes); `None` while it serves none.
    workload_groups: Option<(Store<DynamicObject>, ApiResource)>,
    /// Gantry's `Queue` objects; `None` when the cluster has no such CRD.
    queues: Option<Store<DynamicObject>>,
    /// Every namespace: their labels decide which Queues their pods may use.
    namespaces: Store<Namespace>,
    /// Kueue's `LocalQueue`s, through which `kueue.x-k8s.io/queue-name` names a queue; `None`
    /// when the cluster has no such CRD.
    local_queues: Option<Store<DynamicObject>>,
    /// The DRA caches; `None` while the cluster does not serve `resource.k8s.io/v1`.
    dra: Option<DraStores>,
    /// What each cache changed since the last sync.
    logs: Logs,
    /// When the optional kinds were last looked for.
    last_discovery: Instant,
    /// Whether the PodGroup and Queue caches hold a full list: until then (a kind found after
    /// start is still listing) what they hold is not applied.
    groups_ready: bool,
    queues_ready: bool,
    local_queues_ready: bool,
    /// Whether the DRA caches hold full lists: until then pods with claims wait.
    dra_ready: bool,
    /// Whether the tracker has been built once.
    built: bool,
    /// The Queue problems logged last, so each is logged when it appears, not every cycle.
    queue_problems: Vec<String>,
    /// Whether discovery has answered once whether Queues are served, and while it has not,
    /// why (its error): the tracker fails closed on pods that name a queue until then.
    queues_known: bool,
    queues_unknown: Option<String>,
    /// When the Queue kind was last looked for.
    queues_asked: Instant,
}

impl Watch {
    /// Starts the caches every cluster has (nodes, our unbound pods, bound pods, namespaces)
    /// on `handle`'s runtime, watching through `client`, and the optional kinds the cluster
    /// serves; discovery asks through `discovery_client`.
    pub(crate) fn start(
        handle: tokio::runtime::Handle,
        client: Client,
        discovery_client: Client,
        config: &KubeConfig,
    ) -> Self {
        let reflectors = Reflectors::new(handle, client);
        let logs = Logs::default();
        let all = watcher::Config::default;
        let nodes = reflectors.typed::<Node>("nodes", all(), &logs.nodes);
        let pending = reflectors.typed::<Pod>(
            "unbound pods",
            all().fields(&format!(
                "spec.schedulerName={},spec.nodeName=",
                config.scheduler_name
            )),
            &logs.pods,
        );
        let bound = reflectors.typed::<Pod>(
            "bound pods",
            all().fields("spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"),
            &logs.pods,
        );
        let namespaces = reflectors.typed::<Namespace>("namespaces", all(), &logs.namespaces);
        let preflight = config.health.preflight.as_ref().map(|_| {
            let selector = format!("{}=true", crate::preflight::POD_LABEL);
            reflectors.typed::<Pod>("preflight pods", all().labels(&selector), &logs.preflight)
        });
        let mut watch = Self {
            reflectors,
            discovery_client,
            nodes,
            pending,
            bound,
            preflight,
            pod_groups: None,
            workload_groups: None,
            queues: None,
            namespaces,
            local_queues: None,
            dra: None,
            logs,
            last_discovery: Instant::now(),
            groups_ready: false,
            queues_ready: false,
            local_queues_ready: false,
            dra_ready: false,
            built: false,
            queue_problems: Vec::new(),
            queues_known: false,
            queues_unknown: None,
            queues_asked: Instant::now(),
        };
        // The optional kinds: a kind the cluster does not serve is not watched (its cache
        // would never sync), and is looked for again every DISCOVER_EVERY, so a CRD installed
        // later is picked up without a restart.
        for (kind, found) in watch.discover() {
            if !found {
                tracing::info!("{kind}");
            }
        }
        watch
    }

    /// Looks for the optional kinds again, every [`DISCOVER_EVERY`] while one is missing,
    /// logging each found.
    pub(crate) fn discover_if_due(&mut self) {
        if (self.pod_groups.is_none()
            || self.workload_groups.is_none()
            || self.queues.is_none()
            || self.local_queues.is_none()
            || self.dra.is_none())
            && self.last_discovery.elapsed() >= DISCOVER_EVERY
        {
            for (what, found) in self.discover() {
                if found {
                    tracing::info!("{what}");
                }
            }
        } else if self.queues_unknown.is_some() && self.queues_asked.elapsed() >= DISCOVER_RETRY {
            // Only the Queue kind: one bounded call, not one per missing kind.
            if let (what, true) = self.discover_queues() {
                tracing::info!("{what}");
            }
        }
    }

    /// Looks for the optional kinds not watched yet (scheduler-plugins' PodGroup, Gantry's
    /// Queue) and starts a cache for each the cluster now serves. A kind is absent when the
    /// API server says its group or resource is not there (404); any other answer is an error,
    /// logged and tried again next time. Returns, per kind still or newly looked for, what
    /// it means for scheduling and whether it was found.
    fn discover(&mut self) -> Vec<(&'static str, bool)> {
        self.last_discovery = Instant::now();
        let mut found = Vec::new();
        if self.pod_groups.is_none() {
            let resource = self.served_resource(
                "scheduling.x-k8s.io",
                &["v1alpha1"],
                "PodGroup",
                "podgroups",
            );
            if let Some(resource) = &resource {
                self.pod_groups = Some(self.reflectors.dynamic(
                    "pod groups",
                    resource,
                    &self.logs.groups,
                ));
            }
            found.push(said(
                resource.is_some(),
                "scheduling.x-k8s.io/v1alpha1 PodGroup found: gangs follow their PodGroups",
                "no scheduling.x-k8s.io/v1alpha1 PodGroup in this cluster (yet): gangs come from Gantry's labels",
            ));
        }
        if self.workload_groups.is_none() {
            let resource =
                self.served_resource(WORKLOAD_GROUP, &WORKLOAD_VERSIONS, "PodGroup", "podgroups");
            if let Some(resource) = &resource {
                let store =
                    self.reflectors
                        .dynamic("workload pod groups", resource, &self.logs.groups);
                self.workload_groups = Some((store, resource.clone()));
            }
            found.push(said(
                resource.is_some(),
                "scheduling.k8s.io PodGroup found: pods naming one in spec.schedulingGroup follow its gang policy",
                "no scheduling.k8s.io PodGroup in this cluster (yet; the GenericWorkload feature gate): spec.schedulingGroup is not read",
            ));
        }
        if self.queues.is_none() {
            found.push(self.discover_queues());
        }
        if self.local_queues.is_none() {
            let resource =
                self.served_resource(KUEUE_GROUP, &KUEUE_VERSIONS, "LocalQueue", "localqueues");
            if let Some(resource) = &resource {
                self.local_queues = Some(self.reflectors.dynamic(
                    "local queues",
                    resource,
                    &self.logs.local_queues,
                ));
            }
            found.push(said(
                resource.is_some(),
                "kueue.x-k8s.io LocalQueue found: kueue.x-k8s.io/queue-name names a LocalQueue in the pod's namespace",
                "no kueue.x-k8s.io LocalQueue in this cluster (yet): while Queues are declared, pods labelled kueue.x-k8s.io/queue-name are refused",
            ));
        }
        if self.dra.is_none() {
            let served = [
                "resourceslices",
                "deviceclasses",
                "resourceclaims",
                "resourceclaimtemplates",
            ]
            .iter()
            .all(|plural| self.serves(DRA_VERSION, plural));
            if served {
                let (reflectors, logs, all) =
                    (&self.reflectors, &self.logs, watcher::Config::default);
                self.dra = Some(DraStores {
                    slices: reflectors.typed::<ResourceSlice>(
                        "resource slices",
                        all(),
                        &logs.slices,
                    ),
                    classes: reflectors.typed::<DeviceClass>("device classes", all(), &logs.slices),
                    claims: reflectors.typed::<ResourceClaim>(
                        "resource claims",
                        all(),
                        &logs.claims,
                    ),
                    templates: reflectors.typed::<ResourceClaimTemplate>(
                        "resource claim templates",
                        all(),
                        &logs.templates,
                    ),
                });
            }
            found.push(said(
                served,
                "resource.k8s.io/v1 found: GPUs published in ResourceSlices count, and pods' ResourceClaims are allocated at bind",
                "no resource.k8s.io/v1 in this cluster (yet): pods with spec.resourceClaims wait",
            ));
        }
        found
    }

    /// Looks for Gantry's Queue kind and starts its cache if the cluster serves it; notes
    /// whether the API server answered (see [`Watch::queues_unknown`]).
    fn discover_queues(&mut self) -> (&'static str, bool) {
        self.queues_asked = Instant::now();
        // Until the API server has answered once whether it serves Queues, pods that name
        // a queue wait (the tracker fails closed); a later failure changes nothing known.
        let answer = self.answers("gantry.dev/v1alpha1", "queues");
        if let Err(error) = &answer
            && !self.queues_known
        {
            self.queues_unknown = Some(format!(
                "the API server has not answered whether it serves gantry.dev/v1alpha1 \
                 Queue ({error}); asked again every {} s",
                DISCOVER_RETRY.as_secs()
            ));
        } else if answer.is_ok() {
            self.queues_known = true;
            self.queues_unknown = None;
        }
        let served = answer.unwrap_or(false);
        if served {
            let resource = crate::queues::resource();
            self.queues = Some(
                self.reflectors
                    .dynamic("queues", &resource, &self.logs.queues),
            );
        }
        said(
            served,
            "gantry.dev/v1alpha1 Queue found: its quotas apply",
            "no gantry.dev/v1alpha1 Queue in this cluster (yet): every queue may use the whole cluster",
        )
    }

    /// The resource `kind` (`plural`) of `group` at the first of `versions` the cluster
    /// serves (newest first), if it serves one.
    fn served_resource(
        &self,
        group: &str,
        versions: &[&str],
        kind: &str,
        plural: &str,
    ) -> Option<ApiResource> {
        let version = versions
            .iter()
            .find(|v| self.serves(&format!("{group}/{v}"), plural))?;
        Some(ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(group, version, kind),
            plural,
        ))
    }

    /// Whether the API server serves `plural` in `group_version`: `false` when it says the
    /// group is not there (404) or lists it without the resource; an error is logged and
    /// counts as not yet.
    fn serves(&self, group_version: &str, plural: &str) -> bool {
        self.answers(group_version, plural).unwrap_or(false)
    }

    /// [`Watch::serves`], telling an answer (served or not) from a failed call (logged, and
    /// its error returned).
    fn answers(&self, group_version: &str, plural: &str) -> std::result::Result<bool, String> {
        let answer = self.reflectors.handle().block_on(
            self.discovery_client
                .list_api_group_resources(group_version),
        );
        match answer {
            Ok(list) => Ok(list.resources.iter().any(|r| r.name == plural)),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(false),
            Err(error) => {
                tracing::warn!(%group_version, %error, "API discovery failed; trying again later");
                Err(error.to_string())
            }
        }
    }

    /// Why it is not known yet whether Queues are declared (discovery has not answered once),
    /// for the tracker to fail closed on; `None` once it has.
    pub(crate) fn queues_unknown(&self) -> Option<String> {
        self.queues_unknown.clone()
    }

    /// Waits until every cache holds a full list. Schedule nothing before: a half-filled
    /// bound-pod cache would make used GPUs look free.
    pub(crate) fn wait_synced(&self, timeout: Duration) -> Result<()> {
        self.reflectors.handle().block_on(async {
            let all = async {
                let _ = self.nodes.wait_until_ready().await;
                let _ = self.pending.wait_until_ready().await;
                let _ = self.bound.wait_until_ready().await;
                if let Some(groups) = &self.pod_groups {
                    let _ = groups.wait_until_ready().await;
                }
                if let Some((groups, _)) = &self.workload_groups {
                    let _ = groups.wait_until_ready().await;
                }
                if let Some(queues) = &self.queues {
                    let _ = queues.wait_until_ready().await;
                }
                let _ = self.namespaces.wait_until_ready().await;
                if let Some(preflight) = &self.preflight {
                    let _ = preflight.wait_until_ready().await;
                }
                if let Some(local_queues) = &self.local_queues {
                    let _ = local_queues.wait_until_ready().await;
                }
                if let Some(dra) = &self.dra {
                    let _ = dra.slices.wait_until_ready().await;
                    let _ = dra.classes.wait_until_ready().await;
                    let _ = dra.claims.wait_until_ready().await;
                    let _ = dra.templates.wait_until_ready().await;
                }
            };
            tokio::time::timeout(timeout, all)
                .await
                .map_err(|_| Error::SyncTimeout(timeout.as_secs()))
        })
    }

    /// The preflight pods in the cache (none when no preflight is configured).
    pub(crate) fn preflight_pods(&self) -> Vec<std::sync::Arc<Pod>> {
        self.preflight
            .as_ref()
            .map(Store::state)
            .unwrap_or_default()
    }

    /// What the writer reads of the caches.
    pub(crate) fn watched(&self) -> crate::write::Watched<'_> {
        crate::write::Watched {
            groups: self.workload_groups.as_ref(),
            queues: self.queues.as_ref(),
            queue_problems: &self.queue_problems,
        }
    }

    /// Counts watch events; equal values mean the caches have not changed.
    pub(crate) fn generation(&self) -> u64 {
        self.reflectors.generation()
    }

    /// Nodes in the cache.
    pub(crate) fn node_count(&self) -> usize {
        self.nodes.state().len()
    }
}

/// What discovering an optional kind says in the log: `found` or `missing`, and whether it
/// was found.
fn said(served: bool, found: &'static str, missing: &'static str) -> (&'static str, bool) {
    (if served { found } else { missing }, served)
}

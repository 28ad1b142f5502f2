//! One reflector setup for every watch cache ([`Reflectors`]): each cache counts its events
//! in one shared generation and notes the keys it changed in a [`ChangeLog`], which a sync
//! takes.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};

use crate::tracker::PodKey;

/// The keys one watch cache changed since the last sync; `relisted` when it had to list
/// again (its first list included), so every key may have changed.
#[derive(Debug, Default)]
pub(crate) struct ChangeLog {
    pub(crate) keys: HashSet<PodKey>,
    pub(crate) relisted: bool,
}

/// Shared between a reflector's task (which writes) and the sync (which takes).
pub(crate) type SharedLog = Arc<Mutex<ChangeLog>>;

/// Takes what one cache changed since the last take.
pub(crate) fn take(log: &SharedLog) -> ChangeLog {
    std::mem::take(&mut *log.lock().unwrap_or_else(|e| e.into_inner()))
}

/// Starts watch caches on one runtime and client: every cache is set up the same way, so a
/// kind is one line where it is watched.
pub(crate) struct Reflectors {
    /// The runtime the reflectors' tasks run on.
    handle: tokio::runtime::Handle,
    /// The client the watches use (the default one: a watch is a long poll).
    client: Client,
    /// Bumped by every watch event (any cache), so an idle loop can tell nothing happened.
    generation: Arc<AtomicU64>,
}

impl Reflectors {
    /// Reflectors on `handle`'s runtime, watching through `client`.
    pub(crate) fn new(handle: tokio::runtime::Handle, client: Client) -> Self {
        Self {
            handle,
            client,
            generation: Arc::new(AtomicU64::new(0)),
        }
    }

    /// The runtime the caches run on, which discovery and the sync block on too.
    pub(crate) fn handle(&self) -> &tokio::runtime::Handle {
        &self.handle
    }

    /// Counts watch events; equal values mean the caches have not changed.
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Relaxed)
    }

    /// A cache of every `K` that `config` selects, noting its changes in `log`.
    pub(crate) fn typed<K>(
        &self,
        what: &'static str,
        config: watcher::Config,
        log: &SharedLog,
    ) -> Store<K>
    where
        K: Resource<DynamicType = ()>
            + Clone
            + std::fmt::Debug
            + serde::de::DeserializeOwned
            + Send
            + Sync
            + 'static,
    {
        self.reflect(Api::all(self.client.clone()), config, log, what, ())
    }

    /// A cache of every object of the dynamic kind `resource`, noting its changes in `log`.
    pub(crate) fn dynamic(
        &self,
        what: &'static str,
        resource: &ApiResource,
        log: &SharedLog,
    ) -> Store<DynamicObject> {
        self.reflect(
            Api::all_with(self.client.clone(), resource),
            watcher::Config::default(),
            log,
            what,
            resource.clone(),
        )
    }

    /// Starts a reflector over `api` and returns its cache.
    fn reflect<K>(
        &self,
        api: Api<K>,
        config: watcher::Config,
        log: &SharedLog,
        what: &'static str,
        dyntype: K::DynamicType,
    ) -> Store<K>
    where
        K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
        K::DynamicType: Eq + std::hash::Hash + Clone + Send + Sync,
    {
        let writer = reflector::store::Writer::new(dyntype);
        let reader = writer.as_reader();
        let stream = watcher(api, config)
            .default_backoff()
            // Nobody reads managedFields, and they are often the largest part of an object.
            .modify(|object: &mut K| object.managed_fields_mut().clear())
            .reflect(writer);
        let (generation, log) = (self.generation.clone(), log.clone());
        self.handle.spawn(async move {
            let mut stream = std::pin::pin!(stream);
            // Full lists so far: the first fills the cache; any later one means the watch could
            // not resume (the API server answered 410 Gone: it no longer had the resource version
            // the cache had reached), so the cache was rebuilt from a fresh list.
            let mut lists = 0u64;
            while let Some(event) = stream.next().await {
                generation.fetch_add(1, Ordering::Relaxed);
                {
                    let mut log = log.lock().unwrap_or_else(|e| e.into_inner());
                    match &event {
                        Ok(
                            watcher::Event::Apply(o)
                            | watcher::Event::Delete(o)
                            | watcher::Event::InitApply(o),
                        ) => {
                            log.keys
                                .insert((o.namespace().unwrap_or_default(), o.name_any()));
                        }
                        Ok(watcher::Event::InitDone) => log.relisted = true,
                        _ => {}
                    }
                }
                match event {
                    Ok(watcher::Event::Init) => {
                        lists += 1;
                        if lists > 1 {
                            tracing::info!(
                                cache = what,
                                relists = lists - 1,
                                "watch expired; relisting"
                            );
                        }
                    }
                    Ok(_) => {}
                    Err(error) => {
                        tracing::warn!(%error, cache = what, "watch failed; retrying with backoff");
                    }
                }
            }
        });
        reader
    }
}

//! Leader election with a `coordination.k8s.io/v1` Lease, as kube-scheduler does it (client-go's
//! `leaderelection`): one replica holds the Lease and schedules; the others keep their watch
//! caches warm and serve the API read-only, and take over when the holder stops renewing.
//!
//! - Every write is a resourceVersion-guarded create or replace, so two candidates can never
//!   both win one round: the loser gets a 409 and reads again.
//! - The holder renews every [`LeaderSettings::retry`]. It counts as leader only while its last
//!   successful renewal is younger than [`LeaderSettings::renew_deadline`], timed from before
//!   the renewal request was sent: a leader cut off from the API server (or slowed) stops
//!   binding before anyone else may take the Lease (renew deadline < lease duration; the gap,
//!   5 s by default, is the clock skew tolerated). The binder checks it before every write.
//! - A replica whose scheduling loop stopped going round stops renewing.
//! - A candidate takes a Lease whose `renewTime + leaseDurationSeconds` has passed, waking at
//!   that moment rather than on its next retry tick, so failover takes about one lease
//!   duration after the holder's last renewal.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::PostParams;
use kube::{Api, Client};

/// Where the Lease lives and how it is timed. The defaults are kube-scheduler's.
#[derive(Debug, Clone)]
pub struct LeaderSettings {
    pub name: String,
    pub namespace: String,
    /// Who this replica is: the hostname and a random suffix, unique per process.
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry: Duration,
}

impl LeaderSettings {
    pub fn new(name: &str, namespace: &str) -> Self {
        Self {
            name: name.into(),
            namespace: namespace.into(),
            identity: identity(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry: Duration::from_secs(2),
        }
    }
}

/// `hostname_suffix`: the pod name in a Deployment, plus 8 hex digits so two processes on one
/// host (or a restarted pod) never share an identity.
pub fn identity() -> String {
    use std::hash::{BuildHasher, Hasher};
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "gantry".into());
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    format!("{host}_{:08x}", hasher.finish() as u32)
}

/// What the election loop shares with the scheduling loop.
#[derive(Debug)]
pub struct Leadership {
    pub settings: LeaderSettings,
    /// Set after each successful acquire or renew, cleared when a renewal fails or the Lease
    /// is someone else's.
    holding: AtomicBool,
    /// When this replica last acquired or renewed the Lease.
    renewed: Mutex<Option<Instant>>,
    /// The holder the last read saw (this replica included), for the status line.
    holder: Mutex<Option<String>>,
    /// Set to stop the loop; it then releases the Lease if it holds it.
    stop: AtomicBool,
    /// When the scheduling loop last went round: a wedged loop stops renewing, so a healthy
    /// replica takes over. `None` until its first pass.
    loop_beat: Mutex<Option<Instant>>,
}

impl Leadership {
    /// Whether this replica may schedule and bind now.
    pub fn is_leader(&self) -> bool {
        self.holding.load(Ordering::Acquire)
            && self
                .renewed
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_some_and(|at| at.elapsed() < self.settings.renew_deadline)
    }

    /// How long this replica may still write: what is left of the renew deadline since its
    /// last renewal, or `None` when it does not lead. Each write attempt is bounded by it,
    /// so none can land after another replica may have taken the Lease.
    pub fn time_left(&self) -> Option<Duration> {
        if !self.holding.load(Ordering::Acquire) {
            return None;
        }
        let renewed = (*self.renewed.lock().unwrap_or_else(|e| e.into_inner()))?;
        self.settings
            .renew_deadline
            .checked_sub(renewed.elapsed())
            .filter(|left| !left.is_zero())
    }

    /// The Lease's holder as last seen.
    pub fn holder(&self) -> Option<String> {
        self.holder
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The scheduling loop went round (see [`Leadership::loop_alive`]).
    pub fn beat(&self) {
        *self.loop_beat.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
    }

    /// Whether the scheduling loop went round within the renew deadline (or has not started):
    /// only then is the Lease renewed.
    pub fn loop_alive(&self) -> bool {
        self.loop_beat
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_none_or(|at| at.elapsed() < self.settings.renew_deadline)
    }

    /// Asks the loop to stop (and release the Lease).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
    }

    fn set_holder(&self, holder: Option<String>) {
        *self.holder.lock().unwrap_or_else(|e| e.into_inner()) = holder;
    }
}

#[cfg(test)]
impl Leadership {
    /// A Lease held (or not) without an election loop: what the writes it fences see.
    pub(crate) fn held(holding: bool) -> Arc<Self> {
        Self::held_for(
            holding,
            LeaderSettings::new("gantry", "gantry-system").renew_deadline,
        )
    }

    /// [`Leadership::held`], renewed just now with `renew_deadline` to run.
    pub(crate) fn held_for(holding: bool, renew_deadline: Duration) -> Arc<Self> {
        let settings = LeaderSettings {
            renew_deadline,
            ..LeaderSettings::new("gantry", "gantry-system")
        };
        Arc::new(Self {
            settings,
            holding: AtomicBool::new(holding),
            renewed: Mutex::new(Some(Instant::now())),
            holder: Mutex::new(None),
            stop: AtomicBool::new(false),
            loop_beat: Mutex::new(None),
        })
    }

    /// The Lease is lost: a renewal failed, or another replica holds it.
    pub(crate) fn lose(&self) {
        self.holding.store(false, Ordering::Release);
    }
}

fn now() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

/// Starts the election loop on `runtime`.
pub fn start(
    runtime: &tokio::runtime::Runtime,
    client: Client,
    settings: LeaderSettings,
) -> Arc<Leadership> {
    let leadership = Arc::new(Leadership {
        settings,
        holding: AtomicBool::new(false),
        renewed: Mutex::new(None),
        holder: Mutex::new(None),
        stop: AtomicBool::new(false),
        loop_beat: Mutex::new(None),
    });
    let shared = leadership.clone();
    runtime.spawn(async move {
        let s = &shared.settings;
        let api: Api<Lease> = Api::namespaced(client, &s.namespace);
        tracing::info!(identity = %s.identity, lease = %format!("{}/{}", s.namespace, s.name), "leader election: candidate");
        while !shared.stop.load(Ordering::Acquire) {
            if !shared.loop_alive() {
                // The scheduling loop is wedged: stop renewing, and stop counting as leader
                // once the last renewal is older than the deadline.
                if shared.holding.load(Ordering::Acquire) && !shared.is_leader() {
                    shared.holding.store(false, Ordering::Release);
                    tracing::error!("leader election: the scheduling loop is stuck; not renewing the lease");
                }
                tokio::time::sleep(s.retry).await;
                continue;
            }
            // The validity clock starts before the request: the Lease the server records
            // is at least this old.
            let attempt = Instant::now();
            let wait = match try_acquire_or_renew(&api, s).await {
                Ok(Round::Holding) => {
                    let was = shared.holding.swap(true, Ordering::AcqRel);
                    *shared.renewed.lock().unwrap_or_else(|e| e.into_inner()) = Some(attempt);
                    shared.set_holder(Some(s.identity.clone()));
                    if !was {
                        tracing::info!(identity = %s.identity, "leader election: acquired the lease; leading");
                    }
                    s.retry
                }
                Ok(Round::HeldBy { holder, expires_in }) => {
                    if shared.holding.swap(false, Ordering::AcqRel) {
                        tracing::warn!(%holder, "leader election: the lease was taken; following");
                    }
                    shared.set_holder(Some(holder));
                    // Wake when the lease runs out, not a retry tick later.
                    s.retry.min(expires_in + Duration::from_millis(50))
                }
                Err(error) => {
                    let since = shared
                        .renewed
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .map(|at| at.elapsed());
                    if shared.holding.load(Ordering::Acquire)
                        && since.is_none_or(|since| since >= s.renew_deadline)
                    {
                        shared.holding.store(false, Ordering::Release);
                        tracing::error!(%error, "leader election: could not renew within the deadline; stopped leading");
                    } else {
                        tracing::warn!(%error, "leader election: cannot read or write the lease");
                    }
                    s.retry
                }
            };
            tokio::time::sleep(wait).await;
        }
        if shared.holding.swap(false, Ordering::AcqRel) {
            release(&api, s).await;
        }
    });
    leadership
}

/// The outcome of one round.
enum Round {
    Holding,
    HeldBy {
        holder: String,
        expires_in: Duration,
    },
}

async fn try_acquire_or_renew(api: &Api<Lease>, s: &LeaderSettings) -> Result<Round, kube::Error> {
    let duration_s = s.lease_duration.as_secs() as i32;
    let current = match api.get_opt(&s.name).await? {
        Some(lease) => lease,
        None => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(s.name.clone()),
                    namespace: Some(s.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(s.identity.clone()),
                    lease_duration_seconds: Some(duration_s),
                    acquire_time: Some(now()),
                    renew_time: Some(now()),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            api.create(&PostParams::default(), &lease).await?;
            return Ok(Round::Holding);
        }
    };
    let spec = current.spec.clone().unwrap_or_default();
    let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
    let mine = holder.as_deref() == Some(s.identity.as_str());
    if !mine && let Some(holder) = holder.clone() {
        let duration = Duration::from_secs(
            u64::try_from(spec.lease_duration_seconds.unwrap_or(duration_s)).unwrap_or(0),
        );
        let renewed = spec
            .renew_time
            .as_ref()
            .or(spec.acquire_time.as_ref())
            .map(|t| t.0);
        let age = renewed.map_or(Duration::MAX, |t| {
            let age = k8s_openapi::jiff::Timestamp::now().duration_since(t);
            Duration::try_from(age).unwrap_or(Duration::ZERO)
        });
        if age < duration {
            return Ok(Round::HeldBy {
                holder,
                expires_in: duration - age,
            });
        }
        tracing::info!(%holder, "leader election: the lease expired; taking it");
    }
    let mut lease = current;
    let transitions = spec.lease_transitions.unwrap_or(0);
    lease.spec = Some(LeaseSpec {
        holder_identity: Some(s.identity.clone()),
        lease_duration_seconds: Some(duration_s),
        acquire_time: if mine { spec.acquire_time } else { Some(now()) },
        renew_time: Some(now()),
        lease_transitions: Some(if mine { transitions } else { transitions + 1 }),
        ..spec
    });
    // The resourceVersion read above guards the replace: a 409 means someone else wrote first.
    match api.replace(&s.name, &PostParams::default(), &lease).await {
        Ok(_) => Ok(Round::Holding),
        Err(kube::Error::Api(status)) if status.code == 409 => {
            let holder = api
                .get_opt(&s.name)
                .await?
                .and_then(|l| l.spec?.holder_identity)
                .unwrap_or_default();
            Ok(Round::HeldBy {
                holder,
                expires_in: s.retry,
            })
        }
        Err(error) => Err(error),
    }
}

/// Stops the loop and gives the Lease up now if this replica holds it (a clean shutdown).
pub async fn resign(client: Client, leadership: &Leadership) {
    leadership.stop();
    if leadership.holding.swap(false, Ordering::AcqRel) {
        let s = &leadership.settings;
        release(&Api::namespaced(client, &s.namespace), s).await;
    }
}

/// Gives the Lease up on a clean stop, as client-go's ReleaseOnCancel does, so a successor
/// need not wait out the lease duration.
async fn release(api: &Api<Lease>, s: &LeaderSettings) {
    let Ok(Some(mut lease)) = api.get_opt(&s.name).await else {
        return;
    };
    let Some(spec) = lease.spec.as_mut() else {
        return;
    };
    if spec.holder_identity.as_deref() != Some(s.identity.as_str()) {
        return;
    }
    spec.holder_identity = None;
    spec.lease_duration_seconds = Some(1);
    spec.renew_time = Some(now());
    match api.replace(&s.name, &PostParams::default(), &lease).await {
        Ok(_) => tracing::info!("leader election: released the lease"),
        Err(error) => tracing::warn!(%error, "leader election: cannot release the lease"),
    }
}

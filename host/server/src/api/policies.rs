//! Policies and policy sets: upload, validate, list, compose, activate, roll back, and
//! shadow a candidate set.

use super::*;

#[utoipa::path(
    get, path = "/api/policies", summary = "stored policies",
    responses((status = 200, description = "manifests", body = Vec<PolicyManifest>))
)]
pub(crate) async fn list_policies(
    State(state): St,
    Extension(_who): Extension<Caller>,
) -> Result<Json<Vec<gantry_store::PolicyManifest>>> {
    Ok(Json(state.live.store.list_policies()?))
}

#[utoipa::path(
    get, path = "/api/policies/{sha256}", summary = "one policy's manifest",
    params(("sha256" = String, Path, description = "the .wasm bytes' sha256, or any unique prefix of 8 or more hex characters")),
    responses(
        (status = 200, description = "manifest", body = PolicyManifest),
        (status = 400, description = "not a sha256 or a prefix of 8 or more hex characters, or a prefix several policies share", body = ErrorBody),
        (status = 404, description = "no such policy", body = ErrorBody),
    )
)]
pub(crate) async fn get_policy(
    State(state): St,
    Extension(_who): Extension<Caller>,
    Path(sha256): Path<String>,
) -> Result<Json<gantry_store::PolicyManifest>> {
    let store = &state.live.store;
    let sha256 = store.resolve_policy(&sha256)?;
    store
        .policy_manifest(&sha256)?
        .map(Json)
        .ok_or_else(|| ApiError::NotFound(format!("no policy with sha256 {sha256} is stored")))
}

/// The body of an upload, with an oversized one refused in our own words.
pub(super) fn upload_body(
    state: &AppState,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<Bytes> {
    let limit = state.live.config.max_upload_bytes;
    match body {
        Ok(bytes) if bytes.len() > limit => Err(ApiError::TooLarge {
            size: bytes.len(),
            limit,
        }),
        Ok(bytes) if bytes.is_empty() => Err(ApiError::BadRequest(
            "the request body is empty: send the policy's .wasm bytes".into(),
        )),
        Ok(bytes) => Ok(bytes),
        Err(rejection) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            Err(ApiError::TooLargeStream { limit })
        }
        Err(rejection) => Err(ApiError::BadRequest(rejection.body_text())),
    }
}

#[utoipa::path(
    post, path = "/api/policies",
    summary = "upload a policy: compile, check its world, init with config, self-test on the current snapshot, store",
    params(ConfigQuery),
    request_body(content = WasmModule, content_type = "application/octet-stream", description = "the policy's `.wasm` bytes"),
    responses(
        (status = 201, description = "stored", body = Upload),
        (status = 200, description = "these bytes were already stored", body = Upload),
        (status = 400, description = "empty or unreadable body", body = ErrorBody),
        (status = 403, description = "a viewer token", body = ErrorBody),
        (status = 413, description = "over the upload limit", body = ErrorBody),
        (status = 422, description = "the policy failed validation", body = ErrorBody),
    )
)]
pub(crate) async fn upload_policy(
    State(state): St,
    Extension(Peer(from)): Extension<Peer>,
    Extension(who): Extension<Caller>,
    Query(query): Query<ConfigQuery>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<Response> {
    let bytes = upload_body(&state, body)?;
    let config = query.config.unwrap_or_else(|| "{}".into());
    let live = state.live.clone();
    let actor = Actor::new(&who.name, from);
    let deadline_ms = query.deadline_ms;
    let upload =
        tokio::task::spawn_blocking(move || live.upload(&actor, &bytes, &config, deadline_ms))
            .await
            .map_err(|e| ApiError::Unavailable(format!("the upload task failed: {e}")))??;
    let status = if upload.already_stored {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok((status, Json(upload)).into_response())
}

#[utoipa::path(
    post, path = "/api/policies/validate", summary = "validate a policy without storing it",
    params(ConfigQuery),
    request_body(content = WasmModule, content_type = "application/octet-stream", description = "the policy's `.wasm` bytes"),
    responses(
        (status = 200, description = "valid", body = Validation),
        (status = 400, description = "empty or unreadable body", body = ErrorBody),
        (status = 403, description = "a viewer token", body = ErrorBody),
        (status = 413, description = "over the upload limit", body = ErrorBody),
        (status = 422, description = "the policy failed validation", body = ErrorBody),
    )
)]
pub(crate) async fn validate_policy(
    State(state): St,
    Extension(Peer(from)): Extension<Peer>,
    Extension(who): Extension<Caller>,
    Query(query): Query<ConfigQuery>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<Json<gantry_engine::Validation>> {
    let bytes = upload_body(&state, body)?;
    let config = query.config.unwrap_or_else(|| "{}".into());
    let live = state.live.clone();
    let size = bytes.len();
    let deadline_ms = query.deadline_ms;
    let validated =
        tokio::task::spawn_blocking(move || live.validate(&bytes, &config, deadline_ms))
            .await
            .map_err(|e| ApiError::Unavailable(format!("the validation task failed: {e}")))?
            .map_err(ApiError::from);
    // Validations run admins' code in the sandbox, so they are in the audit log too.
    let detail = match &validated {
        Ok((_, v)) => format!(
            "{} {} ({}, sha256 {}, {size} bytes): passed",
            v.name, v.version, v.role, v.sha256
        ),
        Err(error) => format!("{size} bytes: refused: {error}"),
    };
    state.live.store.audit(
        &Actor::new(&who.name, from),
        "policy.validate",
        &detail,
        gantry_engine::now_ms(),
    )?;
    let (_, validation) = validated?;
    Ok(Json(validation))
}

#[utoipa::path(
    get, path = "/api/sets", summary = "every policy-set version, and the active one",
    responses((status = 200, description = "sets", body = SetList))
)]
pub(crate) async fn list_sets(
    State(state): St,
    Extension(_who): Extension<Caller>,
) -> Result<Json<SetList>> {
    let set = state.live.active_set();
    let running = set
        .entries()
        .iter()
        .map(|e| {
            let (policy, info) = (&e.policy, e.policy.info());
            let health = policy.health();
            RunningPolicy {
                name: info.name.clone(),
                version: info.version.clone(),
                role: info.role.to_string(),
                sha256: info.sha256.clone(),
                calls: policy
                    .stats
                    .calls
                    .load(std::sync::atomic::Ordering::Relaxed),
                faults: policy
                    .stats
                    .faults
                    .load(std::sync::atomic::Ordering::Relaxed),
                consecutive_faults: health.consecutive_faults,
                quarantined: health.quarantined,
                probe_in_ms: health.probe_in.map(|d| d.as_millis() as u64),
                quarantines: health.quarantines,
                last_fault: health.last_fault.map(|f| f.to_string()),
            }
        })
        .collect();
    Ok(Json(SetList {
        active: set.version(),
        sets: state.live.store.list_sets()?,
        running,
    }))
}

#[utoipa::path(
    get, path = "/api/sets/{version}", summary = "one set version",
    params(("version" = u64, Path, minimum = 1, description = "a policy-set version")),
    responses(
        (status = 200, description = "set", body = PolicySet),
        (status = 400, description = "not a version number", body = ErrorBody),
        (status = 404, description = "no such version", body = ErrorBody),
    )
)]
pub(crate) async fn get_set(
    State(state): St,
    Extension(_who): Extension<Caller>,
    Path(version): Path<u64>,
) -> Result<Json<gantry_store::PolicySet>> {
    state
        .live
        .store
        .get_set(version)?
        .map(Json)
        .ok_or(ApiError::Store(
            gantry_store::StoreError::UnknownSetVersion(version),
        ))
}

#[utoipa::path(
    post, path = "/api/sets", summary = "create a set version (not activated); every entry is loaded first",
    request_body = NewSet,
    responses(
        (status = 201, description = "created", body = PolicySet),
        (status = 400, description = "malformed set, or an entry's sha256 prefix is too short or shared", body = ErrorBody),
        (status = 403, description = "a viewer token", body = ErrorBody),
        (status = 404, description = "an entry names no stored policy", body = ErrorBody),
        (status = 413, description = "a body over 64 KiB", body = ErrorBody),
        (status = 422, description = "an entry cannot load", body = ErrorBody),
    )
)]
pub(crate) async fn create_set(
    State(state): St,
    Extension(Peer(from)): Extension<Peer>,
    Extension(who): Extension<Caller>,
    body: std::result::Result<Json<NewSet>, axum::extract::rejection::JsonRejection>,
) -> Result<Response> {
    let Json(mut new) = body.map_err(json_error)?;
    if new.entries.len() > 64 {
        return Err(ApiError::BadRequest(format!(
            "a policy set holds at most 64 entries; this one has {}",
            new.entries.len()
        )));
    }
    let live = state.live.clone();
    let set = tokio::task::spawn_blocking(move || -> Result<gantry_store::PolicySet> {
        // Entries may name policies by a unique sha256 prefix; the set stores the full hash.
        for entry in &mut new.entries {
            entry.sha256 = live.store.resolve_policy(&entry.sha256)?;
        }
        // Load every entry first: a set that cannot run is refused before it is stored.
        for entry in &new.entries {
            if serde_json::from_str::<serde_json::Value>(&entry.config).is_err() {
                return Err(ApiError::BadRequest(format!(
                    "the config of entry {} is not valid JSON",
                    entry.sha256
                )));
            }
        }
        let probe = gantry_store::PolicySet {
            version: 0,
            entries: new.entries.clone(),
            created_by: String::new(),
            created_at_ms: 0,
            note: String::new(),
        };
        live.build_set(&probe)?;
        Ok(live.store.put_set(
            &gantry_store::Actor::new(&who.name, &from),
            new.entries,
            &new.note,
            gantry_engine::now_ms(),
        )?)
    })
    .await
    .map_err(|e| ApiError::Unavailable(format!("the task failed: {e}")))??;
    Ok((StatusCode::CREATED, Json(set)).into_response())
}

pub(super) async fn switch_set(
    state: Arc<AppState>,
    from: String,
    who: Caller,
    version: u64,
    rollback: bool,
) -> Result<Json<gantry_store::PolicySet>> {
    let live = state.live.clone();
    let actor = Actor::new(&who.name, from);
    let set = tokio::task::spawn_blocking(move || live.activate(&actor, version, rollback))
        .await
        .map_err(|e| ApiError::Unavailable(format!("the task failed: {e}")))??;
    Ok(Json(set))
}

#[utoipa::path(
    post, path = "/api/sets/{version}/activate", summary = "make a set version active: the next cycle runs on it",
    params(("version" = u64, Path, minimum = 1, description = "a policy-set version")),
    responses(
        (status = 200, description = "now active", body = PolicySet),
        (status = 400, description = "not a version number", body = ErrorBody),
        (status = 403, description = "a viewer token", body = ErrorBody),
        (status = 404, description = "no such version", body = ErrorBody),
        (status = 422, description = "an entry cannot load", body = ErrorBody),
    )
)]
pub(crate) async fn activate_set(
    State(state): St,
    Extension(Peer(from)): Extension<Peer>,
    Extension(who): Extension<Caller>,
    Path(version): Path<u64>,
) -> Result<Json<gantry_store::PolicySet>> {
    switch_set(state, from, who, version, false).await
}

#[utoipa::path(
    post, path = "/api/sets/{version}/rollback", summary = "roll back to an earlier set version (audited as a rollback)",
    params(("version" = u64, Path, minimum = 1, description = "a policy-set version")),
    responses(
        (status = 200, description = "now active", body = PolicySet),
        (status = 400, description = "not a version number", body = ErrorBody),
        (status = 403, description = "a viewer token", body = ErrorBody),
        (status = 404, description = "no such version", body = ErrorBody),
        (status = 409, description = "the version is already active", body = ErrorBody),
        (status = 422, description = "an entry cannot load", body = ErrorBody),
    )
)]
pub(crate) async fn rollback_set(
    State(state): St,
    Extension(Peer(from)): Extension<Peer>,
    Extension(who): Extension<Caller>,
    Path(version): Path<u64>,
) -> Result<Json<gantry_store::PolicySet>> {
    switch_set(state, from, who, version, true).await
}

#[utoipa::path(
    get, path = "/api/shadow", summary = "the running shadow report",
    responses(
        (status = 200, description = "report", body = ShadowReport),
        (status = 404, description = "no shadow run", body = ErrorBody),
    )
)]
pub(crate) async fn shadow_report(
    State(state): St,
    Extension(_who): Extension<Caller>,
) -> Result<Json<gantry_engine::ShadowReport>> {
    state
        .live
        .shadow_report()
        .map(Json)
        .ok_or_else(|| ApiError::NotFound("no shadow run is active".into()))
}

#[utoipa::path(
    post, path = "/api/shadow", summary = "run a set version in shadow beside the active set; binds nothing",
    request_body = ShadowStart,
    responses(
        (status = 201, description = "started", body = ShadowReport),
        (status = 400, description = "malformed request", body = ErrorBody),
        (status = 403, description = "a viewer token", body = ErrorBody),
        (status = 404, description = "no such version", body = ErrorBody),
        (status = 413, description = "a body over 64 KiB", body = ErrorBody),
        (status = 422, description = "an entry cannot load", body = ErrorBody),
    )
)]
pub(crate) async fn shadow_start(
    State(state): St,
    Extension(Peer(from)): Extension<Peer>,
    Extension(who): Extension<Caller>,
    body: std::result::Result<Json<ShadowStart>, axum::extract::rejection::JsonRejection>,
) -> Result<Response> {
    let Json(start) = body.map_err(json_error)?;
    let live = state.live.clone();
    let actor = Actor::new(&who.name, from);
    let report = tokio::task::spawn_blocking(move || live.shadow_start(&actor, start.version))
        .await
        .map_err(|e| ApiError::Unavailable(format!("the task failed: {e}")))??;
    Ok((StatusCode::CREATED, Json(report)).into_response())
}

#[utoipa::path(
    delete, path = "/api/shadow", summary = "stop the shadow run and return its report",
    responses(
        (status = 200, description = "final report", body = ShadowReport),
        (status = 403, description = "a viewer token", body = ErrorBody),
        (status = 404, description = "no shadow run", body = ErrorBody),
    )
)]
pub(crate) async fn shadow_stop(
    State(state): St,
    Extension(Peer(from)): Extension<Peer>,
    Extension(who): Extension<Caller>,
) -> Result<Json<gantry_engine::ShadowReport>> {
    Ok(Json(state.live.shadow_stop(&Actor::new(&who.name, from))?))
}

//! The OpenAPI 3.0 document served at `/api/openapi.json`: what the CLI, the web UI and
//! schemathesis read. Written out here, beside the routes, so that one review sees both.

use std::sync::LazyLock;

use serde_json::{Value, json};

/// The document, rendered once.
pub static DOCUMENT: LazyLock<String> = LazyLock::new(|| document().to_string());

fn error_responses(extra: &[(&str, &str)]) -> Value {
    let mut responses = serde_json::Map::new();
    responses.insert(
        "401".into(),
        json!({"description": "missing or unknown token", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}),
    );
    for (code, description) in extra {
        responses.insert(
            (*code).into(),
            json!({"description": description, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}),
        );
    }
    Value::Object(responses)
}

fn ok(description: &str, schema: Value) -> Value {
    json!({"description": description, "content": {"application/json": {"schema": schema}}})
}

fn with(mut responses: Value, code: &str, response: Value) -> Value {
    responses
        .as_object_mut()
        .expect("object")
        .insert(code.into(), response);
    responses
}

fn path_param(name: &str, schema: Value, description: &str) -> Value {
    json!({"name": name, "in": "path", "required": true, "schema": schema, "description": description})
}

fn query_param(name: &str, schema: Value, description: &str) -> Value {
    json!({"name": name, "in": "query", "required": false, "schema": schema, "description": description})
}

fn document() -> Value {
    let obj = json!({"type": "object"});
    let arr = |items: Value| json!({"type": "array", "items": items});
    let r = |name: &str| json!({"$ref": format!("#/components/schemas/{name}")});
    let limit = query_param(
        "limit",
        json!({"type": "integer", "minimum": 1, "maximum": 10000}),
        "at most this many (default 100)",
    );
    let from_ms = query_param(
        "from_ms",
        json!({"type": "integer", "minimum": 0}),
        "from this time, ms since the epoch",
    );
    let to_ms = query_param(
        "to_ms",
        json!({"type": "integer", "minimum": 0}),
        "until this time (exclusive)",
    );
    let version = path_param(
        "version",
        json!({"type": "integer", "minimum": 1}),
        "a policy-set version",
    );
    let config = query_param(
        "config",
        json!({"type": "string"}),
        "JSON config for the policy's init (default `{}`)",
    );
    let deadline_ms = query_param(
        "deadline_ms",
        json!({"type": "integer", "minimum": 1, "maximum": 10000}),
        "the policy's own call deadline for the self-test, ms (the server's 50 ms when absent)",
    );
    let wasm_body = json!({"required": true, "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}});
    let admin = |code_desc: &[(&str, &str)]| {
        let mut extra = vec![("403", "a viewer token")];
        extra.extend_from_slice(code_desc);
        error_responses(&extra)
    };
    json!({
        "openapi": "3.0.3",
        "info": {
            "title": "Gantry",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "A GPU scheduler with sandboxed WebAssembly policies: decisions and their reasons, policy hot swap, shadow mode and rollback."
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Error": {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}},
                "Estimate": {"type": "object", "required": ["p10_ms", "p50_ms", "p90_ms", "text"], "properties": {
                    "p10_ms": {"type": "integer"}, "p50_ms": {"type": "integer"}, "p90_ms": {"type": "integer"},
                    "reservation": {"type": "string", "nullable": true}, "text": {"type": "string"}}},
                "WhatIfOutcome": {"type": "object", "required": ["change", "job", "runtime", "text"], "properties": {
                    "change": {"type": "string"},
                    "job": {"type": "object", "required": ["queue", "pods", "gpus_per_pod", "gpu_type"], "properties": {
                        "queue": {"type": "string"}, "pods": {"type": "integer"}, "gpus_per_pod": {"type": "integer"}, "gpu_type": {"type": "string"}}},
                    "estimate": {"allOf": [{"$ref": "#/components/schemas/Estimate"}], "nullable": true}, "nodes": {"type": "string", "nullable": true},
                    "runtime": {"type": "object", "required": ["p10_s", "p50_s", "p90_s", "source"], "properties": {
                        "p10_s": {"type": "number"}, "p50_s": {"type": "number"}, "p90_s": {"type": "number"}, "source": {"type": "object"}}},
                    "text": {"type": "string"}}},
                "Caller": {"type": "object", "required": ["name", "role"], "properties": {"name": {"type": "string"}, "role": {"type": "string", "enum": ["viewer", "admin"]}}},
                "PolicyManifest": {"type": "object", "required": ["sha256", "name", "role", "version", "config", "size", "uploaded_by", "uploaded_at_ms"], "properties": {
                    "sha256": {"type": "string"}, "name": {"type": "string"}, "role": {"type": "string", "enum": ["filter", "score", "quota"]},
                    "version": {"type": "string"}, "config": {"type": "string"}, "size": {"type": "integer"},
                    "uploaded_by": {"type": "string"}, "uploaded_at_ms": {"type": "integer"}}},
                "Validation": {"type": "object", "required": ["name", "version", "role", "sha256", "size", "reasons", "self_test"], "properties": {
                    "name": {"type": "string"}, "version": {"type": "string"}, "role": {"type": "string"}, "sha256": {"type": "string"},
                    "size": {"type": "integer"}, "reasons": {"type": "array"}, "self_test": {"type": "string"}}},
                "Upload": {"type": "object", "required": ["manifest", "already_stored", "validation"], "properties": {
                    "manifest": {"$ref": "#/components/schemas/PolicyManifest"}, "already_stored": {"type": "boolean"},
                    "validation": {"$ref": "#/components/schemas/Validation"}}},
                "SetEntry": {"type": "object", "required": ["sha256", "weight", "config"], "additionalProperties": false, "properties": {
                    "sha256": {"type": "string"}, "weight": {"type": "integer", "minimum": 0, "maximum": 4294967295_u64},
                    "failure": {"type": "string", "enum": ["default", "fail-open", "fail-closed"]}, "config": {"type": "string"},
                    "deadline_ms": {"type": "integer", "minimum": 1, "maximum": 10000, "nullable": true, "description": "this entry's own call deadline; the server's when null"}}},
                "PolicySet": {"type": "object", "required": ["version", "entries", "created_by", "created_at_ms", "note"], "properties": {
                    "version": {"type": "integer"}, "entries": {"type": "array", "items": {"$ref": "#/components/schemas/SetEntry"}},
                    "created_by": {"type": "string"}, "created_at_ms": {"type": "integer"}, "note": {"type": "string"}}},
                "NewSet": {"type": "object", "required": ["entries"], "additionalProperties": false, "properties": {
                    "entries": {"type": "array", "items": {"$ref": "#/components/schemas/SetEntry"}}, "note": {"type": "string"}}},
                "ShadowReport": {"type": "object", "required": ["candidate_version", "cycles", "decisions_compared", "counts", "recent"], "properties": {
                    "candidate_version": {"type": "integer"}, "started_ms": {"type": "integer"}, "started_by": {"type": "string"},
                    "cycles": {"type": "integer"}, "decisions_compared": {"type": "integer"},
                    "counts": {"type": "object", "additionalProperties": {"type": "integer"}}, "recent": {"type": "array"}}},
                "AuditEntry": {"type": "object", "required": ["id", "at_ms", "who", "from", "action", "detail"], "properties": {
                    "id": {"type": "integer"}, "at_ms": {"type": "integer"}, "who": {"type": "string"}, "from": {"type": "string"},
                    "action": {"type": "string"}, "detail": {"type": "string"}}},
                "Decision": {"type": "object", "required": ["time_ms", "seq", "explanation"], "properties": {
                    "time_ms": {"type": "integer"}, "seq": {"type": "integer"}, "explanation": {"type": "object"}}},
                "Queue": {"type": "object", "required": ["name", "nominal_gpus", "used_gpus", "borrowed_gpus", "lendable_gpus", "lent_gpus", "fair_share"], "properties": {
                    "name": {"type": "string"}, "parent": {"type": "string", "nullable": true}, "nominal_gpus": {"type": "integer"},
                    "used_gpus": {"type": "integer"}, "borrowed_gpus": {"type": "integer", "description": "GPUs used beyond the nominal quota"},
                    "lendable_gpus": {"type": "integer", "description": "idle nominal GPUs others may borrow, within the lending limit"},
                    "lent_gpus": {"type": "integer", "description": "nominal GPUs other queues use now by borrowing them (the borrowers' total split over the lenders in proportion to what each may lend)"},
                    "borrowing_limit_gpus": {"type": "integer", "nullable": true}, "lending_limit_gpus": {"type": "integer", "nullable": true},
                    "weight": {"type": "integer"}, "fair_share": {"type": "number"}, "fair_share_key": {"type": "number"},
                    "pending_jobs": {"type": "integer"}, "running_jobs": {"type": "integer"}}},
                "QueueSeries": {"type": "object", "description": "one queue's samples as columns of equal length, oldest first",
                    "required": ["name", "at_ms", "used_gpus", "nominal_gpus", "borrowed_gpus", "lent_gpus", "fair_share", "fair_share_key", "pending_jobs"], "properties": {
                    "name": {"type": "string"}, "at_ms": arr(json!({"type": "integer"})), "used_gpus": arr(json!({"type": "integer"})),
                    "nominal_gpus": arr(json!({"type": "integer"})), "borrowed_gpus": arr(json!({"type": "integer"})), "lent_gpus": arr(json!({"type": "integer"})),
                    "fair_share": arr(json!({"type": "number"})), "fair_share_key": arr(json!({"type": "number"})), "pending_jobs": arr(json!({"type": "integer"}))}},
                "QueueHistory": {"type": "object", "required": ["interval_ms", "keep_ms", "queues"], "properties": {
                    "interval_ms": {"type": "integer"}, "keep_ms": {"type": "integer"}, "queues": arr(r("QueueSeries"))}}
            }
        },
        "security": [{"bearer": []}],
        "paths": {
            "/healthz": {"get": {"summary": "liveness: fails when the scheduling loop is wedged", "security": [], "responses": {"200": {"description": "alive", "content": {"text/plain": {"schema": {"type": "string"}}}}, "503": {"description": "the loop has not gone round for too long", "content": {"application/json": {"schema": r("Error")}}}}}},
            "/readyz": {"get": {"summary": "readiness: the loop has published a snapshot", "security": [], "responses": {
                "200": {"description": "ready", "content": {"text/plain": {"schema": {"type": "string"}}}},
                "503": {"description": "not ready", "content": {"application/json": {"schema": r("Error")}}}}}},
            "/metrics": {"get": {"summary": "Prometheus metrics", "security": [], "responses": {"200": {"description": "text exposition format", "content": {"text/plain": {"schema": {"type": "string"}}}}}}},
            "/api/openapi.json": {"get": {"summary": "this document", "security": [], "responses": {"200": ok("OpenAPI 3.0", obj.clone())}}},
            "/api/whoami": {"get": {"summary": "the caller's name and role", "responses": with(error_responses(&[]), "200", ok("caller", r("Caller")))}},
            "/api/policies": {
                "get": {"summary": "stored policies", "responses": with(error_responses(&[]), "200", ok("manifests", arr(r("PolicyManifest"))))},
                "post": {"summary": "upload a policy: compile, check its world, init with config, self-test on the current snapshot, store",
                    "parameters": [config.clone(), deadline_ms.clone()], "requestBody": wasm_body.clone(),
                    "responses": with(with(admin(&[("400", "empty or unreadable body"), ("413", "over the upload limit"), ("422", "the policy failed validation")]),
                        "201", ok("stored", r("Upload"))), "200", ok("these bytes were already stored", r("Upload")))}
            },
            "/api/policies/validate": {"post": {"summary": "validate a policy without storing it", "parameters": [config, deadline_ms], "requestBody": wasm_body,
                "responses": with(admin(&[("400", "empty or unreadable body"), ("413", "over the upload limit"), ("422", "the policy failed validation")]), "200", ok("valid", r("Validation")))}},
            "/api/policies/{sha256}": {"get": {"summary": "one policy's manifest",
                "parameters": [path_param("sha256", json!({"type": "string"}), "the .wasm bytes' sha256, or any unique prefix of 8 or more hex characters")],
                "responses": with(error_responses(&[("400", "not a sha256 or a prefix of 8 or more hex characters, or a prefix several policies share"), ("404", "no such policy")]), "200", ok("manifest", r("PolicyManifest")))}},
            "/api/sets": {
                "get": {"summary": "every policy-set version, and the active one", "responses": with(error_responses(&[]), "200", ok("sets",
                    json!({"type": "object", "required": ["active", "sets", "running"], "properties": {"active": {"type": "integer"}, "sets": arr(r("PolicySet")),
                        "running": arr(json!({"type": "object", "required": ["name", "version", "role", "sha256", "calls", "faults", "consecutive_faults", "quarantined", "quarantines"],
                            "properties": {"name": {"type": "string"}, "version": {"type": "string"}, "role": {"type": "string"}, "sha256": {"type": "string"},
                                "calls": {"type": "integer"}, "faults": {"type": "integer"}, "consecutive_faults": {"type": "integer"}, "quarantined": {"type": "boolean"},
                                "probe_in_ms": {"type": ["integer", "null"]}, "quarantines": {"type": "integer"}, "last_fault": {"type": ["string", "null"]}}}))}})))},
                "post": {"summary": "create a set version (not activated); every entry is loaded first",
                    "requestBody": {"required": true, "content": {"application/json": {"schema": r("NewSet")}}},
                    "responses": with(admin(&[("400", "malformed set, or an entry's sha256 prefix is too short or shared"), ("404", "an entry names no stored policy"), ("413", "a body over 64 KiB"), ("422", "an entry cannot load")]), "201", ok("created", r("PolicySet")))}
            },
            "/api/sets/{version}": {"get": {"summary": "one set version", "parameters": [version.clone()],
                "responses": with(error_responses(&[("400", "not a version number"), ("404", "no such version")]), "200", ok("set", r("PolicySet")))}},
            "/api/sets/{version}/activate": {"post": {"summary": "make a set version active: the next cycle runs on it", "parameters": [version.clone()],
                "responses": with(admin(&[("400", "not a version number"), ("404", "no such version"), ("422", "an entry cannot load")]), "200", ok("now active", r("PolicySet")))}},
            "/api/sets/{version}/rollback": {"post": {"summary": "roll back to an earlier set version (audited as a rollback)", "parameters": [version],
                "responses": with(admin(&[("400", "not a version number"), ("404", "no such version"), ("409", "the version is already active"), ("422", "an entry cannot load")]), "200", ok("now active", r("PolicySet")))}},
            "/api/shadow": {
                "get": {"summary": "the running shadow report", "responses": with(error_responses(&[("404", "no shadow run")]), "200", ok("report", r("ShadowReport")))},
                "post": {"summary": "run a set version in shadow beside the active set; binds nothing",
                    "requestBody": {"required": true, "content": {"application/json": {"schema": {"type": "object", "required": ["version"], "additionalProperties": false, "properties": {"version": {"type": "integer", "minimum": 1}}}}}},
                    "responses": with(admin(&[("400", "malformed request"), ("404", "no such version"), ("422", "an entry cannot load")]), "201", ok("started", r("ShadowReport")))},
                "delete": {"summary": "stop the shadow run and return its report", "responses": with(admin(&[("404", "no shadow run")]), "200", ok("final report", r("ShadowReport")))}
            },
            "/api/audit": {"get": {"summary": "the newest audit entries, newest first (admin only)", "parameters": [limit.clone()],
                "responses": with(error_responses(&[("400", "bad query"), ("403", "a viewer token")]), "200", ok("entries", arr(r("AuditEntry"))))}},
            "/api/decisions": {"get": {"summary": "decisions in a time range, in time order", "parameters": [from_ms.clone(), to_ms.clone(), limit.clone()],
                "responses": with(error_responses(&[("400", "bad range")]), "200", ok("decisions", arr(r("Decision"))))}},
            "/api/decisions/stream": {"get": {"summary": "server-sent events: one `decision` event per decision", "responses": with(error_responses(&[]), "200",
                json!({"description": "event stream", "content": {"text/event-stream": {"schema": {"type": "string"}}}}))}},
            "/api/decisions/job/{job}": {"get": {"summary": "a job's decisions, oldest first (the newest `limit`)",
                "parameters": [path_param("job", json!({"type": "string"}), "job name"), limit.clone()],
                "responses": with(error_responses(&[("400", "bad query"), ("404", "no decisions about this job")]), "200", ok("decisions", arr(r("Decision"))))}},
            "/api/decisions/pod/{pod}": {"get": {"summary": "the decisions about a pod's job (a single-pod job's pod has the job's name)",
                "parameters": [path_param("pod", json!({"type": "string"}), "pod name"), limit.clone()],
                "responses": with(error_responses(&[("400", "bad query"), ("404", "unknown pod")]), "200", ok("decisions", arr(r("Decision"))))}},
            "/api/decisions/node/{node}": {"get": {"summary": "placements on a node, in time order",
                "parameters": [path_param("node", json!({"type": "string"}), "node name"), from_ms, to_ms, limit.clone()],
                "responses": with(error_responses(&[("400", "bad query")]), "200", ok("decisions", arr(r("Decision"))))}},
            "/api/explain/{name}": {"get": {"summary": "why a pod or job is pending now, or where it went",
                "parameters": [path_param("name", json!({"type": "string"}), "pod or job name")],
                "responses": with(error_responses(&[("404", "no such job or pod")]), "200", ok("explanation", json!({"type": "object", "required": ["name", "kind", "job", "state", "queue_name", "pods", "gpus_per_pod", "priority", "why", "latest"],
                    "properties": {"name": {"type": "string"}, "kind": {"type": "string", "enum": ["job", "pod"]}, "job": {"type": "string"},
                        "state": {"type": "string", "enum": ["pending", "running", "done"]}, "queue_position": {"type": "integer", "nullable": true},
                        "queue": {"allOf": [r("Queue")], "nullable": true}, "why": {"type": "string"}, "waiting_for": {"type": "string", "nullable": true},
                        "estimate": {"allOf": [r("Estimate")], "nullable": true},
                        "queue_name": {"type": "string"}, "pods": {"type": "integer"}, "gpus_per_pod": {"type": "integer"}, "priority": {"type": "integer"},
                        "latest": {"allOf": [r("Decision")], "nullable": true}, "attempts": {"type": "integer"},
                        "history": arr(json!({"type": "object", "required": ["time_ms", "kind", "text"], "properties": {
                            "time_ms": {"type": "integer"}, "kind": {"type": "string", "enum": ["placed", "preempted", "pending"]},
                            "text": {"type": "string"}, "by": {"type": "string", "nullable": true}}}))}})))}},
            "/api/cluster": {"get": {"summary": "cluster totals and GPU use per topology domain", "responses": with(error_responses(&[]), "200", ok("summary", obj.clone()))}},
            "/api/cluster/nodes": {"get": {"summary": "every node, as columns", "responses": with(error_responses(&[]), "200", ok("nodes", obj.clone()))}},
            "/api/cluster/nodes/{node}": {"get": {"summary": "one node, its jobs and its recent placements",
                "parameters": [path_param("node", json!({"type": "string"}), "node name"), limit.clone()],
                "responses": with(error_responses(&[("400", "bad query"), ("404", "no such node")]), "200", ok("node", obj))}},
            "/api/queues": {"get": {"summary": "quota, usage, borrowing and fair share per queue", "responses": with(error_responses(&[]), "200", ok("queues", arr(r("Queue"))))}},
            "/api/queues/history": {"get": {"summary": "each queue's usage, quota, lending, fair share and pending jobs over the last hour, sampled every 5 s",
                "parameters": [query_param("since", json!({"type": "integer", "minimum": 0}), "only samples taken after this time, ms since the epoch")],
                "responses": with(error_responses(&[("400", "bad query")]), "200", ok("history", r("QueueHistory")))}},
            "/api/jobs": {"get": {"summary": "jobs pending or running now (balloons left out): pending first, by queue and place in it",
                "parameters": [
                    query_param("q", json!({"type": "string"}), "part of the job's name, case-insensitive"),
                    query_param("queue", json!({"type": "string"}), "only this queue's jobs"),
                    query_param("state", json!({"type": "string", "enum": ["pending", "running"]}), "only jobs in this state"),
                    query_param("namespace", json!({"type": "string"}), "only jobs of this namespace (the part of the name before `/`)"),
                    query_param("sort", json!({"type": "string", "enum": ["position", "wait"]}), "by queue and position (default), or longest waiting first"),
                    limit],
                "responses": with(error_responses(&[("400", "bad state or sort")]), "200", ok("jobs", arr(json!({"type": "object", "required": ["name", "queue", "state"], "properties": {
                    "name": {"type": "string"}, "queue": {"type": "string"}, "state": {"type": "string"},
                    "pods": {"type": "integer"}, "gpus_per_pod": {"type": "integer"}, "priority": {"type": "integer"},
                    "submitted_s": {"type": "number"}, "submitted_ms": {"type": "integer"}, "queue_position": {"type": "integer", "nullable": true},
                    "balloon": {"type": "boolean"}, "estimate": {"allOf": [r("Estimate")], "nullable": true}}}))))}},
            "/api/whatif": {"post": {"summary": "when a job of this shape would start, from the plan, without submitting it; with `variations`, also for half the GPUs per pod, 3/4 of the pods, each other queue and GPU type",
                "requestBody": {"required": true, "content": {"application/json": {"schema": {"type": "object", "additionalProperties": false, "properties": {
                    "like": {"type": "string", "description": "a pending job whose shape to start from"},
                    "queue": {"type": "string"}, "pods": {"type": "integer", "minimum": 1, "maximum": 100000},
                    "gpus_per_pod": {"type": "integer", "minimum": 0, "maximum": 64}, "gpu_type": {"type": "string"},
                    "expected_runtime_s": {"type": "number", "minimum": 0, "exclusiveMinimum": true}, "variations": {"type": "boolean"}}}}}},
                "responses": with(error_responses(&[("400", "a field is wrong: the message names it"), ("503", "the loop did not answer in time")]), "200", ok("answer",
                    json!({"type": "object", "required": ["at_ms", "jobs_ahead", "answer", "variations"], "properties": {
                        "at_ms": {"type": "integer"}, "jobs_ahead": {"type": "integer"}, "answer": r("WhatIfOutcome"), "variations": arr(r("WhatIfOutcome"))}})))}}
        }
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_document_is_json_with_every_route() {
        let doc: serde_json::Value = serde_json::from_str(&super::DOCUMENT).expect("json");
        let paths = doc["paths"].as_object().expect("paths");
        for path in [
            "/api/policies",
            "/api/sets/{version}/rollback",
            "/api/shadow",
            "/api/explain/{name}",
            "/api/decisions/stream",
            "/api/jobs",
            "/api/whatif",
            "/api/queues/history",
            "/metrics",
        ] {
            assert!(paths.contains_key(path), "{path} missing");
        }
    }
    /// OpenAPI 3.0 is JSON Schema draft 5: `exclusiveMinimum` and `exclusiveMaximum` are booleans
    /// beside `minimum`/`maximum`, not numbers as in 3.1. Schemathesis refuses the whole
    /// operation otherwise, so the shape is checked here, where it fails in seconds.
    #[test]
    fn exclusive_bounds_use_the_3_0_form() {
        fn walk(value: &serde_json::Value, at: &str, bad: &mut Vec<String>) {
            match value {
                serde_json::Value::Object(map) => {
                    for (bound, plain) in [
                        ("exclusiveMinimum", "minimum"),
                        ("exclusiveMaximum", "maximum"),
                    ] {
                        if let Some(v) = map.get(bound)
                            && (!v.is_boolean() || !map.contains_key(plain))
                        {
                            bad.push(format!("{at}: {bound} = {v}"));
                        }
                    }
                    for (key, child) in map {
                        walk(child, &format!("{at}/{key}"), bad);
                    }
                }
                serde_json::Value::Array(items) => {
                    for (i, child) in items.iter().enumerate() {
                        walk(child, &format!("{at}/{i}"), bad);
                    }
                }
                _ => {}
            }
        }
        let doc: serde_json::Value = serde_json::from_str(&super::DOCUMENT).expect("json");
        assert_eq!(doc["openapi"], "3.0.3");
        let mut bad = Vec::new();
        walk(&doc, "", &mut bad);
        assert!(
            bad.is_empty(),
            "3.1-style bounds in a 3.0 document: {bad:?}"
        );
    }
}

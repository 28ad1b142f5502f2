//! The OpenAPI 3.1 document served at `/api/openapi.json`: what the web UI's types are generated
//! from, and what schemathesis fuzzes. It is derived (utoipa) from the handlers' `#[utoipa::path]`
//! attributes and the contract's types (`gantry-contract`), never written by hand, so it cannot
//! drift from what the handlers take and answer.
//!
//! A copy is checked in at `web/src/generated/openapi.json` for the UI build; the test
//! `the_checked_in_document_is_current` fails when that copy is stale and says how to rewrite it.

use std::sync::LazyLock;

use gantry_contract::{DecisionEvent, ErrorBody, JobSort, JobState};
use utoipa::openapi::path::Operation;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder};
use utoipa::{Modify, OpenApi};

use crate::api;

/// The document, rendered once: the same bytes as the checked-in copy.
pub static DOCUMENT: LazyLock<String> = LazyLock::new(render);

/// Routes anyone may call: the probes, the metrics (unless `--metrics-need-token`) and this
/// document.
const PUBLIC: [&str; 4] = ["/healthz", "/readyz", "/metrics", "/api/openapi.json"];

/// The whole API, from the handlers' own declarations.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "Gantry",
        description = "A GPU scheduler with sandboxed WebAssembly policies: decisions and their reasons, policy hot swap, shadow mode and rollback."
    ),
    paths(
        api::healthz,
        api::readyz,
        api::metrics,
        api::openapi,
        api::whoami,
        api::list_policies,
        api::upload_policy,
        api::validate_policy,
        api::get_policy,
        api::list_sets,
        api::create_set,
        api::get_set,
        api::activate_set,
        api::rollback_set,
        api::shadow_report,
        api::shadow_start,
        api::shadow_stop,
        api::audit,
        api::decisions_between,
        api::decision_stream,
        api::decisions_by_job,
        api::decisions_by_pod,
        api::decisions_by_node,
        api::explain,
        api::cluster,
        api::nodes,
        api::node,
        api::queues,
        api::queue_history,
        api::jobs,
        api::what_if,
        api::health,
        api::reset_breaker,
        api::node_health,
    ),
    // The feed's events are not a response body, but the UI reads them; the job list's filters
    // are named by their parameters only.
    components(schemas(DecisionEvent, ErrorBody, JobSort, JobState)),
    modifiers(&FrontDoor),
    security(("bearer" = []))
)]
struct ApiDoc;

/// What the front door adds to every operation, so no handler repeats it: the bearer scheme,
/// no security on the public routes, and a 401 with the error body on every other one.
struct FrontDoor;

impl Modify for FrontDoor {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        doc.components
            .get_or_insert_with(Default::default)
            .add_security_scheme(
                "bearer",
                SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
            );
        let unauthorized = ResponseBuilder::new()
            .description("missing or unknown token")
            .content(
                "application/json",
                ContentBuilder::new()
                    .schema(Some(Ref::from_schema_name("Error")))
                    .build(),
            )
            .build();
        for (path, item) in doc.paths.paths.iter_mut() {
            let public = PUBLIC.contains(&path.as_str());
            let operations: [&mut Option<Operation>; 8] = [
                &mut item.get,
                &mut item.put,
                &mut item.post,
                &mut item.delete,
                &mut item.options,
                &mut item.head,
                &mut item.patch,
                &mut item.trace,
            ];
            for operation in operations.into_iter().flatten() {
                if public {
                    operation.security = Some(Vec::new());
                } else {
                    operation
                        .responses
                        .responses
                        .entry("401".into())
                        .or_insert_with(|| unauthorized.clone().into());
                }
            }
        }
    }
}

/// The document as served and checked in: pretty JSON with a final newline.
fn render() -> String {
    let mut text = ApiDoc::openapi()
        .to_pretty_json()
        .expect("the OpenAPI document serialises");
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where the checked-in copy lives, from the workspace root.
    const CHECKED_IN: &str = "web/src/generated/openapi.json";

    fn document() -> serde_json::Value {
        serde_json::from_str(&DOCUMENT).expect("json")
    }

    /// The UI's types are generated from the checked-in copy: a change to the API's types
    /// must come with the copy regenerated, or the UI is built against the old API.
    #[test]
    fn the_checked_in_document_is_current() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../..")
            .join(CHECKED_IN);
        if std::env::var("GANTRY_WRITE_GENERATED").is_ok_and(|v| v == "1") {
            std::fs::write(&path, DOCUMENT.as_str()).expect("write the generated document");
            return;
        }
        let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
        let first_difference = checked_in
            .lines()
            .zip(DOCUMENT.lines())
            .position(|(a, b)| a != b)
            .map_or_else(String::new, |line| format!(" (first at line {})", line + 1));
        assert!(
            checked_in == *DOCUMENT,
            "{CHECKED_IN} is not the document the API's types make now{first_difference}.\n\
             Regenerate it and commit it with the change:\n  \
             GANTRY_WRITE_GENERATED=1 cargo test --release -p gantry-server openapi\n\
             then scripts/ui-build.sh regenerates the UI's types from it."
        );
    }

    #[test]
    fn every_route_is_documented_and_guarded() {
        let doc = document();
        assert_eq!(doc["openapi"], "3.1.0");
        assert_eq!(
            doc["components"]["securitySchemes"]["bearer"]["scheme"],
            "bearer"
        );
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
            "/api/health",
            "/api/health/reset",
            "/api/nodes/{name}/health",
            "/metrics",
        ] {
            assert!(paths.contains_key(path), "{path} missing");
        }
        for (path, item) in paths {
            for (method, operation) in item.as_object().expect("path item") {
                let security = operation["security"].as_array().map(Vec::len);
                if PUBLIC.contains(&path.as_str()) {
                    assert_eq!(security, Some(0), "{method} {path} is public");
                } else {
                    assert_eq!(security, None, "{method} {path} takes the global bearer");
                    assert_eq!(
                        operation["responses"]["401"]["content"]["application/json"]["schema"]["$ref"],
                        "#/components/schemas/Error",
                        "{method} {path}"
                    );
                }
            }
        }
        // What the hand-written document carried: bounds, and the upload's raw body.
        let version = &paths["/api/sets/{version}"]["get"]["parameters"][0];
        assert_eq!(version["schema"]["minimum"], 1);
        let upload = &paths["/api/policies"]["post"];
        assert!(
            upload["requestBody"]["content"]
                .get("application/octet-stream")
                .is_some(),
            "{upload}"
        );
        let limit = limit_schema(&paths["/api/audit"]["get"]);
        assert_eq!(
            (limit["minimum"].clone(), limit["maximum"].clone()),
            (1.into(), 10_000.into())
        );
    }

    fn limit_schema(operation: &serde_json::Value) -> serde_json::Value {
        operation["parameters"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["name"] == "limit")
            .map(|p| p["schema"].clone())
            .expect("a limit parameter")
    }

    /// OpenAPI 3.1 is JSON Schema 2020-12: `exclusiveMinimum` and `exclusiveMaximum` are
    /// numbers, not the booleans of 3.0. Schemathesis refuses an operation with the wrong
    /// form, so the shape is checked here, where it fails in seconds.
    #[test]
    fn exclusive_bounds_use_the_3_1_form() {
        fn walk(value: &serde_json::Value, at: &str, bad: &mut Vec<String>) {
            match value {
                serde_json::Value::Object(map) => {
                    for bound in ["exclusiveMinimum", "exclusiveMaximum"] {
                        if let Some(v) = map.get(bound)
                            && !v.is_number()
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
        let mut bad = Vec::new();
        walk(&document(), "", &mut bad);
        assert!(
            bad.is_empty(),
            "3.0-style bounds in a 3.1 document: {bad:?}"
        );
    }
}

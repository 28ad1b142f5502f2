//! The web UI, embedded at build time from `web/dist/` (see build.rs), served at `/`. It is a
//! single page with hash routes, so only `/` and its asset files are served; everything under
//! `/api` stays the API's, and an unknown API path is a JSON 404 like any other API error.

use axum::http::{StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;

include!(concat!(env!("OUT_DIR"), "/ui_assets.rs"));

/// Shown when the binary was built before the UI: a fresh clone builds without npm.
const NOT_BUILT: &str = "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
<title>Gantry</title></head><body><main><h1>Gantry</h1><p>The web UI was not built into this \
binary. Run <code>scripts/ui-build.sh</code> (npm and Vite, in <code>web/</code>), then \
<code>cargo build --release</code> again. The API is at <a href=\"/api/openapi.json\">\
/api/openapi.json</a>.</p></main></body></html>";

fn content_type(path: &str) -> &'static str {
    match path.rsplit('.').next().unwrap_or("") {
        "html" => "text/html; charset=utf-8",
        "js" => "text/javascript; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "svg" => "image/svg+xml",
        "json" => "application/json",
        "png" => "image/png",
        "ico" => "image/x-icon",
        "woff2" => "font/woff2",
        _ => "application/octet-stream",
    }
}

/// Serves the UI for every path the router does not know.
pub async fn serve(uri: Uri) -> Response {
    let path = uri.path();
    if path == "/api" || path.starts_with("/api/") {
        return ApiError::NotFound(format!("no API route {path}")).into_response();
    }
    let wanted = match path.trim_start_matches('/') {
        "" => "index.html",
        p => p,
    };
    if let Some((name, bytes)) = ASSETS.iter().find(|(p, _)| *p == wanted) {
        // Vite names assets by content hash, so they may be cached for good; the page itself
        // is revalidated so a new binary's UI shows at once.
        let cache = if name.starts_with("assets/") {
            "public, max-age=31536000, immutable"
        } else {
            "no-cache"
        };
        return (
            [
                (header::CONTENT_TYPE, content_type(name)),
                (header::CACHE_CONTROL, cache),
            ],
            *bytes,
        )
            .into_response();
    }
    if wanted == "index.html" {
        return (
            [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
            NOT_BUILT,
        )
            .into_response();
    }
    (StatusCode::NOT_FOUND, "not found").into_response()
}

#[cfg(test)]
mod tests {
    #[test]
    fn content_types_by_extension() {
        assert_eq!(
            super::content_type("index.html"),
            "text/html; charset=utf-8"
        );
        assert_eq!(
            super::content_type("assets/a-1.js"),
            "text/javascript; charset=utf-8"
        );
        assert_eq!(super::content_type("x"), "application/octet-stream");
    }
}

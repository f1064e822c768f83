//! The chat page at `/` (`server/webui/`: one HTML file, its script, style sheet and icon,
//! embedded in the binary, so the page works with no network beyond this server). The page and
//! its assets answer without the API key — they hold nothing; the page asks for the key and
//! sends it with its API calls. `--no-webui` leaves these routes out (404).
//!
//! The page never inserts model output as HTML (its markdown renderer builds text nodes), and
//! the responses carry a Content-Security-Policy that allows only this origin's script, style
//! and connections, so neither a model's answer nor a pasted message can run script.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

const INDEX: &str = include_str!("../../webui/index.html");
const SCRIPT: &str = include_str!("../../webui/app.js");
const STYLE: &str = include_str!("../../webui/app.css");
const ICON: &str = include_str!("../../webui/icon.svg");

/// The page and its assets, by path.
const PATHS: [&str; 4] = ["/", "/webui/app.js", "/webui/app.css", "/webui/icon.svg"];

/// The paths the page is served from: these answer without the API key (any other path still
/// needs it, so an unknown one reveals nothing).
pub(super) fn is_page_path(path: &str) -> bool {
    PATHS.contains(&path)
}

/// Only this origin's script, style, images and API; no frames, no plugins, no inline script.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

fn asset(kind: &'static str, body: &'static str) -> Response {
    let mut res = (StatusCode::OK, body).into_response();
    let h = res.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(kind));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    // The assets change with the binary: a browser checks again on each load.
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    res
}

/// The page's routes, to merge into the server's router.
pub(super) fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route(
            PATHS[0],
            get(|| async { asset("text/html; charset=utf-8", INDEX) }),
        )
        .route(
            PATHS[1],
            get(|| async { asset("text/javascript; charset=utf-8", SCRIPT) }),
        )
        .route(
            PATHS[2],
            get(|| async { asset("text/css; charset=utf-8", STYLE) }),
        )
        .route(PATHS[3], get(|| async { asset("image/svg+xml", ICON) }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hooks tests and tools drive the page by are in it.
    #[test]
    fn the_page_carries_its_test_ids_and_loads_only_its_own_assets() {
        for id in ["prompt", "send", "stop", "model", "api-key", "new-chat"] {
            assert!(
                INDEX.contains(&format!("data-testid=\"{id}\"")),
                "no data-testid {id}"
            );
        }
        assert!(SCRIPT.contains("'assistant-message'") && SCRIPT.contains("dataset.done"));
        // Every URL the page loads is one of its routes (no CDN).
        for src in ["webui/app.js", "webui/app.css", "webui/icon.svg"] {
            assert!(INDEX.contains(src) && is_page_path(&format!("/{src}")));
        }
        assert!(!INDEX.contains("http://") && !INDEX.contains("https://"));
        // Model text is never parsed as HTML.
        for sink in [
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
            "eval(",
        ] {
            assert!(!SCRIPT.contains(sink), "app.js uses {sink}");
        }
    }
}

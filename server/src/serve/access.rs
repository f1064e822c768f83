//! Who may call the server: a keyless server on loopback answers only loopback hosts and JSON
//! bodies (no DNS rebinding, no form posts); with `--api-key`, every route but `/health`, the
//! chat page's (it asks for the key) and `/metrics` under `--public-metrics` needs the key,
//! compared in constant time.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::AppState;
use crate::serve::request::ApiError;

/// A keyless server on loopback answers only requests addressed to a loopback host, and
/// takes only JSON bodies: a web page cannot reach it by DNS rebinding or a form post.
pub(super) async fn guard_loopback(
    State(state): State<Arc<AppState>>,
    req: Request,
    next: Next,
) -> Response {
    if state.loopback_only {
        if let Some(refused) = loopback_refusal(&req) {
            return refused;
        }
    }
    next.run(req).await
}

/// Why a keyless loopback server refuses `req` (a Host that is not a loopback name, a POST
/// body that is not JSON), or `None`.
pub(super) fn loopback_refusal(req: &Request) -> Option<Response> {
    let host = req
        .headers()
        .get(axum::http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("");
    if !is_loopback_host(host) {
        return Some(
            ApiError::status(
                StatusCode::FORBIDDEN,
                format!("Host {host:?} is not a loopback name; this server answers local clients only (set --api-key to serve others)"),
            )
            .into_response(),
        );
    }
    let json = req
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|h| h.to_str().ok())
        .and_then(|c| c.split(';').next())
        .is_some_and(|c| c.trim().eq_ignore_ascii_case("application/json"));
    if req.method() == axum::http::Method::POST && !json {
        return Some(
            ApiError::status(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "request bodies must be Content-Type: application/json",
            )
            .into_response(),
        );
    }
    None
}

/// `localhost`, `*.localhost`, a loopback IPv4 address or `[::1]`, with or without a port.
fn is_loopback_host(host: &str) -> bool {
    if let Ok(ip) = host.parse::<std::net::IpAddr>() {
        return ip.is_loopback();
    }
    let name = if let Some(rest) = host.strip_prefix('[') {
        rest.split(']').next().unwrap_or("")
    } else {
        host.rsplit_once(':').map_or(host, |(h, p)| {
            if p.chars().all(|c| c.is_ascii_digit()) {
                h
            } else {
                host
            }
        })
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    name == "localhost"
        || name.ends_with(".localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// With an API key set, every route but `/health` (and `/metrics` under `--public-metrics`)
/// needs it; unknown routes too, so they reveal nothing.
pub(super) async fn require_key(
    State(state): State<Arc<AppState>>,
    req: Request,
    next: Next,
) -> Response {
    let path = req.uri().path();
    let open = path == "/health"
        || (path == "/metrics" && state.public_metrics)
        || (state.webui && super::webui::is_page_path(path));
    if !open {
        if let Err(e) = authorize(&state, req.headers()) {
            return e.into_response();
        }
    }
    next.run(req).await
}

/// Constant-time comparison of the presented key with the configured one.
fn key_matches(given: &[u8], want: &[u8]) -> bool {
    let mut diff = (given.len() ^ want.len()) as u8 | u8::from(given.len() != want.len());
    for (i, w) in want.iter().enumerate() {
        diff |= given.get(i).copied().unwrap_or(0) ^ w;
    }
    diff == 0
}

fn authorize(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    authorize_key(state.api_key.as_deref(), headers)
}

/// The request carries `key` (always true without one).
pub(super) fn authorize_key(key: Option<&str>, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(key) = key else {
        return Ok(());
    };
    // The scheme is case-insensitive (RFC 9110 §11.1).
    // Anthropic's clients send the key as `x-api-key`.
    let given = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, key)| key.trim())
        .or_else(|| headers.get("x-api-key").and_then(|v| v.to_str().ok()))
        .unwrap_or("");
    if key_matches(given.as_bytes(), key.as_bytes()) {
        Ok(())
    } else {
        Err(ApiError {
            status: StatusCode::UNAUTHORIZED,
            message: "invalid or missing API key (Authorization: Bearer <key>, or x-api-key)"
                .into(),
            param: None,
            code: Some("invalid_api_key"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{is_loopback_host, key_matches};

    #[test]
    fn loopback_hosts() {
        for h in [
            "localhost",
            "localhost:8080",
            "LOCALHOST.",
            "api.localhost:1",
            "127.0.0.1",
            "127.0.0.1:8080",
            "127.1.2.3",
            "[::1]",
            "[::1]:8080",
            "::1",
        ] {
            assert!(is_loopback_host(h), "{h}");
        }
        for h in [
            "",
            "evil.example",
            "evil.example:8080",
            "localhost.evil.example",
            "10.0.0.1",
            "[::2]:80",
            "127.0.0.1.nip.io",
        ] {
            assert!(!is_loopback_host(h), "{h}");
        }
    }

    #[test]
    fn api_keys_compare_exactly() {
        assert!(key_matches(b"secret", b"secret"));
        assert!(!key_matches(b"secreT", b"secret"));
        assert!(!key_matches(b"secret1", b"secret"));
        assert!(!key_matches(b"secre", b"secret"));
        assert!(!key_matches(b"", b"secret"));
    }
}

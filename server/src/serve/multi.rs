//! Router mode: `kiln serve --models-dir DIR [--models-max N]` serves every GGUF file and
//! Hugging Face model directory in DIR (and kiln's aliases whose files are in its cache) by
//! the request's `model`. A model loads on its first request, on a blocking thread, so
//! requests to the models already loaded go on meanwhile; past N loaded models the least
//! recently used one is unloaded first (its engine ends when its last request does). A request
//! for a model still loading waits up to `--models-load-wait` seconds, then gets 503 with
//! `Retry-After`. Each loaded model is a whole single-model server (`AppState` and its routes)
//! that router mode hands the request to, so every endpoint behaves as it does with `--model`.
//!
//! What router mode answers itself: the chat page, `/health`, `/v1/models` (every model with its
//! state: unloaded, loading, loaded, failed) and `/metrics` (its own counters and the
//! vLLM-named gauges of each loaded model, labelled by `model_name`). `/props`, `/slots` and
//! a model's full `/metrics` take `?model=NAME` (or go to the only loaded model). The API key
//! and the loopback guard apply before anything loads.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use kiln_core::engine::RunnerConfig;
use serde_json::{json, Value};
use tower::ServiceExt;

use super::access::{authorize_key, loopback_refusal};
use super::request::ApiError;
use super::{router, state_with, AppState, ServeOptions};
use crate::load::{load, ModelArgs};

/// Entries a models directory may have (more are not listed: the directory is scanned
/// once, at start).
const MAX_ENTRIES: usize = 10_000;

/// What router mode needs to load a model.
pub struct ModelsConfig {
    pub dir: PathBuf,
    /// Models loaded at once at most.
    pub max_loaded: usize,
    /// How long a request waits for its model to load before a 503.
    pub load_wait: Duration,
    /// The model flags every model loads with (`model` is set per model).
    pub args: ModelArgs,
    pub cfg: RunnerConfig,
    /// The server options each model's state gets (the chat page is router mode's).
    pub opts: ServeOptions,
}

enum Slot {
    Unloaded,
    Loading,
    Loaded {
        state: Arc<AppState>,
        app: Router,
    },
    /// Why the last load failed, and when: it is tried again only after [`RETRY_FAILED`].
    Failed(String, std::time::Instant),
}

/// How long a model whose load failed answers with that failure before a request tries it
/// again (a broken or oversized model does not evict a working one on every request).
const RETRY_FAILED: Duration = Duration::from_secs(30);

impl Slot {
    fn name(&self) -> &'static str {
        match self {
            Slot::Unloaded => "unloaded",
            Slot::Loading => "loading",
            Slot::Loaded { .. } => "loaded",
            Slot::Failed(..) => "failed",
        }
    }
}

struct Entry {
    name: String,
    path: PathBuf,
    /// Other names of this model (kiln's aliases of its file).
    aliases: Vec<String>,
    slot: Slot,
    /// When it was last asked for (a tick of the shared clock), for least-recently-used.
    used: u64,
}

pub struct Models {
    cfg: ModelsConfig,
    entries: Mutex<Vec<Entry>>,
    /// Woken whenever a load ends.
    changed: tokio::sync::Notify,
    clock: AtomicU64,
    loads: AtomicU64,
    unloads: AtomicU64,
    failures: AtomicU64,
}

/// The models in `dir`: `*.gguf` files (named by their stem) and directories with a
/// `config.json` (named as the directory), sorted by name; then kiln's aliases, as other names
/// of a listed file or, when their file is in kiln's cache but not in `dir`, as models of
/// their own.
pub fn discover(dir: &Path) -> anyhow::Result<Vec<(String, PathBuf, Vec<String>)>> {
    let rd = std::fs::read_dir(dir)
        .map_err(|e| anyhow::anyhow!("--models-dir {}: {e}", dir.display()))?;
    let mut found: BTreeMap<String, PathBuf> = BTreeMap::new();
    for entry in rd.take(MAX_ENTRIES).flatten() {
        let path = entry.path();
        let Some(fname) = path.file_name().and_then(|n| n.to_str()) else {
            continue; // a name that is not UTF-8 cannot be asked for
        };
        if fname.starts_with('.') {
            continue;
        }
        let name = if path.is_file()
            && path
                .extension()
                .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
        {
            path.file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or(fname)
                .to_string()
        } else if kiln_core::load::hf::is_model_dir(&path) {
            fname.to_string()
        } else {
            continue;
        };
        if let Some(old) = found.get(&name) {
            tracing::warn!(
                "--models-dir: {} and {} are both named {name:?}; serving the first",
                old.display(),
                path.display()
            );
            continue;
        }
        found.insert(name, path);
    }
    let mut out: Vec<(String, PathBuf, Vec<String>)> =
        found.into_iter().map(|(n, p)| (n, p, Vec::new())).collect();
    for a in crate::models::ALIASES {
        let cached = crate::models::cache_dir().join(a.file);
        let canon = |p: &Path| std::fs::canonicalize(p).ok();
        let Some(target) = canon(&cached) else {
            continue; // not downloaded: a request never fetches
        };
        if let Some(e) = out.iter_mut().find(|e| canon(&e.1) == Some(target.clone())) {
            e.2.push(a.name.to_string());
        } else if !out.iter().any(|e| e.0 == a.name) {
            out.push((a.name.to_string(), cached, Vec::new()));
        }
    }
    Ok(out)
}

impl Models {
    pub fn new(cfg: ModelsConfig) -> anyhow::Result<Arc<Models>> {
        let models = discover(&cfg.dir)?;
        if models.is_empty() {
            anyhow::bail!(
                "--models-dir {}: no .gguf file and no model directory (one with a config.json) in it",
                cfg.dir.display()
            );
        }
        let entries = models
            .into_iter()
            .map(|(name, path, aliases)| Entry {
                name,
                path,
                aliases,
                slot: Slot::Unloaded,
                used: 0,
            })
            .collect();
        Ok(Arc::new(Models {
            cfg,
            entries: Mutex::new(entries),
            changed: tokio::sync::Notify::new(),
            clock: AtomicU64::new(1),
            loads: AtomicU64::new(0),
            unloads: AtomicU64::new(0),
            failures: AtomicU64::new(0),
        }))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Entry>> {
        // A panic while holding the lock leaves plain data behind: go on with it.
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Each model's name, with its aliases, for the start-up line.
    pub fn listing(&self) -> Vec<String> {
        self.lock()
            .iter()
            .map(|e| match e.aliases.is_empty() {
                true => e.name.clone(),
                false => format!("{} = {}", e.name, e.aliases.join(" = ")),
            })
            .collect()
    }

    /// The names a request may use, for messages.
    fn names(&self) -> Vec<String> {
        self.lock().iter().map(|e| e.name.clone()).collect()
    }

    /// The entry a request's `model` names (its name or an alias, exactly).
    fn find(entries: &[Entry], model: &str) -> Option<usize> {
        entries
            .iter()
            .position(|e| e.name == model || e.aliases.iter().any(|a| a == model))
    }

    /// The loaded model's routes for `model`, loading it first if need be (waiting at most
    /// the configured time).
    /// Only a request that generates (`may_load`: a POST) starts a load; others reach
    /// loaded models only, so a page's stray GET cannot make the server load and evict.
    async fn get(
        self: &Arc<Self>,
        model: &str,
        may_load: bool,
    ) -> Result<(String, Router), Response> {
        let deadline = tokio::time::Instant::now() + self.cfg.load_wait;
        loop {
            // Registered before the state is looked at, so a load that ends in between wakes it.
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut entries = self.lock();
                let Some(i) = Self::find(&entries, model) else {
                    return Err(ApiError {
                        status: StatusCode::NOT_FOUND,
                        message: format!(
                            "the model {model:?} does not exist; this server has {:?}",
                            entries.iter().map(|e| e.name.as_str()).collect::<Vec<_>>()
                        ),
                        param: Some("model"),
                        code: Some("model_not_found"),
                    }
                    .into_response());
                };
                entries[i].used = self.clock.fetch_add(1, Ordering::Relaxed);
                match &entries[i].slot {
                    Slot::Loaded { app, .. } => return Ok((entries[i].name.clone(), app.clone())),
                    Slot::Loading => {}
                    Slot::Failed(why, at) if at.elapsed() < RETRY_FAILED || !may_load => {
                        return Err(load_failed(model, why));
                    }
                    Slot::Unloaded if !may_load => {
                        return Err(ApiError::status(
                            StatusCode::SERVICE_UNAVAILABLE,
                            format!("the model {model:?} is not loaded (a completion request for it loads it)"),
                        )
                        .into_response());
                    }
                    Slot::Unloaded | Slot::Failed(..) => {
                        self.start_load(&mut entries, i)
                            .map_err(|busy| retry_later(busy, 5))?;
                    }
                }
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                let entries = self.lock();
                return Err(
                    match Self::find(&entries, model).map(|i| &entries[i].slot) {
                        Some(Slot::Failed(why, _)) => load_failed(model, why),
                        _ => retry_later(
                            format!(
                                "the model {model:?} is still loading (waited {} s)",
                                self.cfg.load_wait.as_secs_f64()
                            ),
                            5,
                        ),
                    },
                );
            }
            // A load ended (this one or another): look again. A failed load of this model
            // answers now rather than being retried in a loop.
            let entries = self.lock();
            if let Some(Slot::Failed(why, _)) =
                Self::find(&entries, model).map(|i| &entries[i].slot)
            {
                return Err(load_failed(model, why));
            }
        }
    }

    /// Starts loading entry `i` on a blocking thread, unloading the least recently used
    /// loaded models first so that at most `max_loaded` are loaded or loading.
    /// Err: why no place is free (every one is taken by a model that is loading).
    fn start_load(self: &Arc<Self>, entries: &mut [Entry], i: usize) -> Result<(), String> {
        let busy = |e: &Entry| matches!(e.slot, Slot::Loaded { .. } | Slot::Loading);
        while entries.iter().filter(|e| busy(e)).count() >= self.cfg.max_loaded.max(1) {
            let lru = entries
                .iter()
                .enumerate()
                .filter(|(_, e)| matches!(e.slot, Slot::Loaded { .. }))
                .min_by_key(|(_, e)| e.used)
                .map(|(j, _)| j);
            let Some(j) = lru else {
                // Every place is taken by a model that is loading.
                return Err(format!(
                    "{} model(s) are loading and --models-max is {}; try again shortly",
                    entries.iter().filter(|e| busy(e)).count(),
                    self.cfg.max_loaded
                ));
            };
            let old = std::mem::replace(&mut entries[j].slot, Slot::Unloaded);
            self.unloads.fetch_add(1, Ordering::Relaxed);
            tracing::info!(
                "unloading {} (least recently used; --models-max {})",
                entries[j].name,
                self.cfg.max_loaded
            );
            eprintln!(
                "kiln: unloaded {} (least recently used; --models-max {})",
                entries[j].name, self.cfg.max_loaded
            );
            // Its engine thread is joined when the last request holding it ends; dropping
            // here, off the async workers, waits for nothing else.
            tokio::task::spawn_blocking(move || drop(old));
        }
        entries[i].slot = Slot::Loading;
        let name = entries[i].name.clone();
        let mut args = self.cfg.args.clone();
        args.model = Some(entries[i].path.display().to_string());
        let cfg = self.cfg.cfg.clone();
        let opts = ServeOptions {
            webui: false,
            name: Some(name.clone()),
            ..self.cfg.opts.clone()
        };
        let ms = self.clone();
        eprintln!("kiln: loading {name} ({})", entries[i].path.display());
        tokio::task::spawn_blocking(move || {
            let t = std::time::Instant::now();
            // A panic while loading fails the load instead of leaving it loading forever.
            let loaded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                load(&args, cfg).and_then(|m| state_with(m, opts))
            }))
            .unwrap_or_else(|_| {
                Err(anyhow::anyhow!(
                    "the load panicked (a bug: please report it)"
                ))
            });
            let mut entries = ms.lock();
            if let Some(e) = entries.iter_mut().find(|e| e.name == name) {
                e.slot = match loaded {
                    Ok(state) => {
                        ms.loads.fetch_add(1, Ordering::Relaxed);
                        eprintln!("kiln: loaded {name} in {:.1} s", t.elapsed().as_secs_f64());
                        let app = router(state.clone());
                        Slot::Loaded { state, app }
                    }
                    Err(err) => {
                        ms.failures.fetch_add(1, Ordering::Relaxed);
                        let why = format!("{err:#}");
                        eprintln!("kiln: loading {name} failed: {why}");
                        Slot::Failed(why, std::time::Instant::now())
                    }
                };
            }
            drop(entries);
            ms.changed.notify_waiters();
        });
        Ok(())
    }

    /// The only loaded model's name, when exactly one is loaded.
    fn only_loaded(&self) -> Option<String> {
        let entries = self.lock();
        let mut loaded = entries
            .iter()
            .filter(|e| matches!(e.slot, Slot::Loaded { .. }));
        match (loaded.next(), loaded.next()) {
            (Some(e), None) => Some(e.name.clone()),
            _ => None,
        }
    }
}

/// 503: the model's last load failed, and why.
fn load_failed(model: &str, why: &str) -> Response {
    ApiError::status(
        StatusCode::SERVICE_UNAVAILABLE,
        format!("the model {model:?} failed to load: {why}"),
    )
    .into_response()
}

/// 503 with `Retry-After: secs`.
fn retry_later(message: String, secs: u32) -> Response {
    let mut res = ApiError::status(StatusCode::SERVICE_UNAVAILABLE, message).into_response();
    res.headers_mut()
        .insert(axum::http::header::RETRY_AFTER, HeaderValue::from(secs));
    res
}

/// Router mode's routes: the page, /health, /v1/models and /metrics itself, every other path
/// handed to the model the request names.
pub fn models_router(ms: Arc<Models>) -> Router {
    let page = if ms.cfg.opts.webui {
        super::webui::routes()
    } else {
        Router::new()
    };
    Router::new()
        .route(
            "/health",
            get(|| async { Json(json!({"status": "ok"})).into_response() }),
        )
        .route("/v1/models", get(models))
        .route("/metrics", get(metrics))
        .merge(page)
        .fallback(dispatch)
        .method_not_allowed_fallback(|| async {
            ApiError::status(
                StatusCode::METHOD_NOT_ALLOWED,
                "method not allowed on this route",
            )
            .into_response()
        })
        .layer(middleware::from_fn_with_state(ms.clone(), access))
        .with_state(ms)
}

/// The key and the loopback guard, before any model loads for a request.
async fn access(State(ms): State<Arc<Models>>, req: Request, next: Next) -> Response {
    let o = &ms.cfg.opts;
    if o.loopback_only {
        if let Some(refused) = loopback_refusal(&req) {
            return refused;
        }
    }
    let path = req.uri().path();
    let open = path == "/health"
        || (path == "/metrics" && o.public_metrics && !has_model_query(&req))
        || (o.webui && super::webui::is_page_path(path));
    if !open {
        if let Err(e) = authorize_key(o.api_key.as_deref(), req.headers()) {
            return e.into_response();
        }
    }
    next.run(req).await
}

fn has_model_query(req: &Request) -> bool {
    model_of_query(req.uri().query()).is_some()
}

/// `model=NAME` of a URL's query, percent-decoded (absent or empty: `None`).
fn model_of_query(query: Option<&str>) -> Option<String> {
    query?.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == "model" && !v.is_empty()).then(|| percent_decode(v))
    })
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match b[i] {
            b'%' if i + 2 < b.len() => match (hex(b[i + 1]), hex(b[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push((h * 16 + l) as u8);
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            b'+' => out.push(b' '),
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

async fn models(State(ms): State<Arc<Models>>) -> Response {
    let entries = ms.lock();
    let data: Vec<Value> = entries
        .iter()
        .map(|e| {
            let mut v = json!({"id": e.name, "object": "model", "created": super::now(),
                               "owned_by": "kiln", "status": {"value": e.slot.name()},
                               "aliases": e.aliases});
            if let Slot::Failed(why, _) = &e.slot {
                v["status"]["failure"] = json!(why);
            }
            v
        })
        .collect();
    Json(json!({"object": "list", "data": data})).into_response()
}

/// Router mode's own counters, then each loaded model's vLLM-named gauges (one HELP and TYPE a
/// family, a sample a model); `?model=NAME` is that model's whole /metrics instead.
async fn metrics(State(ms): State<Arc<Models>>, req: Request) -> Response {
    if has_model_query(&req) {
        return dispatch(State(ms), req).await;
    }
    let (mut counts, mut states) = (BTreeMap::<&str, usize>::new(), Vec::new());
    {
        let entries = ms.lock();
        for e in entries.iter() {
            *counts.entry(e.slot.name()).or_insert(0) += 1;
            if let Slot::Loaded { state, .. } = &e.slot {
                states.push(state.clone());
            }
        }
    }
    let mut out = String::new();
    out.push_str("# HELP kiln_models Models in --models-dir by state.\n# TYPE kiln_models gauge\n");
    for s in ["unloaded", "loading", "loaded", "failed"] {
        out.push_str(&format!(
            "kiln_models{{state=\"{s}\"}} {}\n",
            counts.get(s).copied().unwrap_or(0)
        ));
    }
    for (name, help, v) in [
        ("kiln_model_loads_total", "Models loaded.", &ms.loads),
        (
            "kiln_model_unloads_total",
            "Models unloaded to stay within --models-max.",
            &ms.unloads,
        ),
        (
            "kiln_model_load_failures_total",
            "Model loads that failed.",
            &ms.failures,
        ),
    ] {
        out.push_str(&format!(
            "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}\n",
            v.load(Ordering::Relaxed)
        ));
    }
    // vLLM's gauges of every loaded model, grouped by family.
    let mut families: BTreeMap<String, (Vec<String>, Vec<String>)> = BTreeMap::new();
    for st in &states {
        let text = st.metrics.render(&st.engine.snapshot(), &st.model);
        for line in text.lines() {
            let (meta, name) = match line
                .strip_prefix("# HELP ")
                .or(line.strip_prefix("# TYPE "))
            {
                Some(rest) => (true, rest.split_whitespace().next().unwrap_or("")),
                None => (false, line.split(['{', ' ']).next().unwrap_or("")),
            };
            if !name.starts_with("vllm:") {
                continue;
            }
            let f = families.entry(name.to_string()).or_default();
            let list = if meta { &mut f.0 } else { &mut f.1 };
            if !meta || !list.iter().any(|l| l == line) {
                list.push(line.to_string());
            }
        }
    }
    for (_, (meta, samples)) in families {
        for l in meta.iter().chain(&samples) {
            out.push_str(l);
            out.push('\n');
        }
    }
    ([("content-type", "text/plain; version=0.0.4")], out).into_response()
}

/// Hands the request to the model it names: the `model` field of a POST's JSON body, or
/// `?model=` (or the only loaded model) for a GET.
async fn dispatch(State(ms): State<Arc<Models>>, req: Request) -> Response {
    let (mut parts, body) = req.into_parts();
    let mut named = model_of_query(parts.uri.query());
    let mut bytes = Bytes::new();
    if parts.method == Method::POST {
        bytes = match super::read_body(body, ms.cfg.opts.read_timeout).await {
            Ok(b) => b,
            Err(res) => return res,
        };
        // A body that is not JSON goes to the model's route for its usual 400, when there is
        // a model to send it to.
        if let Ok(Value::Object(o)) = serde_json::from_slice::<Value>(&bytes) {
            match o.get("model") {
                Some(Value::String(m)) if !m.is_empty() => named = Some(m.clone()),
                Some(Value::String(_)) | Some(Value::Null) | None => {}
                Some(_) => {
                    return ApiError::bad("model must be a string", Some("model")).into_response()
                }
            }
        }
    }
    let model = match named.or_else(|| ms.only_loaded()) {
        Some(m) => m,
        None => {
            let names = ms.names();
            if names.len() == 1 {
                names[0].clone()
            } else {
                return ApiError::bad(
                    format!("name the model (\"model\" in the body, or ?model= on a GET): one of {names:?}"),
                    Some("model"),
                )
                .into_response();
            }
        }
    };
    let may_load = parts.method == Method::POST;
    let (name, app) = match ms.get(&model, may_load).await {
        Ok(x) => x,
        Err(res) => return res,
    };
    // The model's routes know it by its listed name: an alias in the body becomes that name.
    if parts.method == Method::POST && model != name {
        if let Ok(Value::Object(mut o)) = serde_json::from_slice::<Value>(&bytes) {
            o.insert("model".into(), Value::String(name.clone()));
            if let Ok(b) = serde_json::to_vec(&Value::Object(o)) {
                parts.headers.remove(axum::http::header::CONTENT_LENGTH);
                bytes = Bytes::from(b);
            }
        }
    }
    let req = Request::from_parts(parts, Body::from(bytes));
    match app.oneshot(req).await {
        Ok(res) => res,
        Err(never) => match never {},
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_decoding_keeps_what_it_cannot_decode() {
        assert_eq!(percent_decode("a%20b+c"), "a b c");
        assert_eq!(percent_decode("100%"), "100%");
        assert_eq!(percent_decode("%zz%4"), "%zz%4");
        assert_eq!(percent_decode("gemma-3-270m-q4_k_m"), "gemma-3-270m-q4_k_m");
    }

    #[test]
    fn a_models_dir_lists_gguf_files_and_model_directories() {
        let dir = std::env::temp_dir().join(format!("kiln-ms-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("hf-model")).expect("mkdir");
        std::fs::create_dir_all(dir.join("empty-dir")).expect("mkdir");
        std::fs::write(dir.join("hf-model/config.json"), "{}").expect("write");
        std::fs::write(dir.join("b.Q4_K_M.gguf"), b"GGUF").expect("write");
        std::fs::write(dir.join("a.GGUF"), b"GGUF").expect("write");
        std::fs::write(dir.join("notes.txt"), b"x").expect("write");
        std::fs::write(dir.join(".hidden.gguf"), b"GGUF").expect("write");
        let found = discover(&dir).expect("discover");
        let names: Vec<&str> = found
            .iter()
            .map(|f| f.0.as_str())
            .filter(|n| crate::models::alias(n).is_none())
            .collect();
        assert_eq!(names, ["a", "b.Q4_K_M", "hf-model"]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

//! `kiln serve`: an OpenAI-compatible HTTP server over the continuous-batching engine.
//!
//! Endpoints: POST /v1/completions and /v1/chat/completions (streamed as server-sent events or
//! not), GET /v1/models, /health, /props (the model and the server's settings), /slots (the
//! requests the engine holds and their KV use) and /metrics (Prometheus text). Requests are
//! parsed by hand from the body bytes so every malformed request gets an OpenAI-style error
//! JSON with a 4xx status. A client that goes away is noticed within a few milliseconds, and
//! the engine cancels its request at its next step.

mod access;
pub mod multi;
use access::{guard_loopback, require_key};
mod compat;
mod metrics;
mod prepare;
pub mod request;
mod respond;
mod utility;
mod webui;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use kiln_core::chat::parse::Syntax;
use kiln_core::chat::{ChatTemplate, RenderLimits};
use kiln_core::engine::Pooling;
use kiln_core::engine::RunnerConfig;
use kiln_core::engine::{spawn, Engine, EngineHandle};
use kiln_core::grammar::Grammars;
use kiln_core::sample::SamplingParams;
use kiln_core::tokenizer::Tokenizer;
use serde_json::{json, Value};

use crate::load::{load, Loaded, ModelArgs};
use metrics::Metrics;
use prepare::check_template;
pub(crate) use prepare::prepare_blocking;
use request::{body_json, chat_prompt, common, completion_prompt, ApiError, GenSpec, Kind};

/// Largest request body, in bytes.
pub const MAX_BODY: usize = 1 << 20;

#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Require `Authorization: Bearer <KEY>` on every /v1 request.
    #[arg(long, env = "KILN_API_KEY")]
    pub api_key: Option<String>,
    #[command(flatten)]
    pub spec: crate::spec::SpecArgs,
    /// Requests decoded together (resident in the KV cache) at once.
    #[arg(long, default_value_t = 8)]
    pub max_batch: usize,
    /// KV cache blocks (16 tokens each); default enough for --max-batch full contexts.
    #[arg(long)]
    pub kv_blocks: Option<usize>,
    /// With --api-key: let /metrics answer without the key (for a scraper on a private
    /// network). Off by default: its counters say things about other users' requests.
    #[arg(long)]
    pub public_metrics: bool,
    /// Requests that may wait beyond the running batch (default: 4 × --max-batch); past it a
    /// request gets 429 with Retry-After.
    #[arg(long)]
    pub max_queue: Option<usize>,
    /// Requests in flight at most, running and queued (default: --max-batch + --max-queue).
    #[arg(long)]
    pub max_concurrent: Option<usize>,
    /// Seconds a client may leave its output unread (a stalled stream) before it is dropped
    /// and its request cancelled, freeing its KV blocks.
    #[arg(long, default_value_t = 60.0)]
    pub stream_stall_timeout: f64,
    /// Open connections at most; more are closed at once.
    #[arg(long, default_value_t = 1024)]
    pub max_connections: usize,
    /// Seconds a connection may take to send a request's headers (and may stay idle between
    /// requests) before it is closed; a request's body has as long again (408).
    #[arg(long, default_value_t = 30.0)]
    pub header_timeout: f64,
    /// How /v1/embeddings pools a text's hidden states: mean, cls (the first token) or last.
    /// Default: what the model's config names (GGUF `pooling_type`, a sentence-transformers
    /// `1_Pooling/config.json`), else last.
    #[arg(long, value_name = "POOLING", value_parser = ["mean", "cls", "last"])]
    pub pooling: Option<String>,
    /// Instructions a chat-template render may run (the model's template is code from the
    /// model file; a request whose render runs out gets 400).
    #[arg(long, default_value_t = RenderLimits::default().fuel)]
    pub template_fuel: u64,
    /// Seconds a chat-template render may take (it runs in a child process, killed at this).
    #[arg(long, default_value_t = RenderLimits::default().timeout.as_secs_f64())]
    pub template_timeout: f64,
    /// MiB of memory a chat-template render may allocate (its child process's limit).
    #[arg(long, default_value_t = RenderLimits::default().max_memory >> 20)]
    pub template_max_memory: usize,
    /// Bytes a rendered chat prompt may have.
    #[arg(long, default_value_t = RenderLimits::default().max_output)]
    pub template_max_output: usize,
    /// Let browser pages from this origin call the API (CORS; repeatable; `*` for any).
    /// Off by default: a page on another origin cannot read the server's answers.
    #[arg(long, value_name = "ORIGIN")]
    pub cors_origin: Vec<String>,
    /// Do not serve the chat page at / (it asks for --api-key when one is set; its
    /// conversations stay in the browser).
    #[arg(long)]
    pub no_webui: bool,
    /// Router mode: serve every .gguf file and Hugging Face model directory in DIR (and the
    /// aliases whose files are in kiln's cache) by each request's `model`, loading a model on
    /// its first request. Instead of --model.
    #[arg(long, value_name = "DIR")]
    pub models_dir: Option<std::path::PathBuf>,
    /// Fetch http(s) image URLs from these hosts (repeatable; `*.example.com`: a domain).
    #[arg(long, value_name = "HOST")]
    pub image_url_allow: Vec<String>,
    /// With --models-dir: models loaded at once at most; past it the least recently used one
    /// is unloaded.
    #[arg(long, default_value_t = 2, value_name = "N")]
    pub models_max: usize,
    /// With --models-dir: seconds a request waits for its model to load before it gets 503
    /// with Retry-After (requests to loaded models never wait on a load).
    #[arg(long, default_value_t = 120.0, value_name = "SECS")]
    pub models_load_wait: f64,
}

/// What the handlers share.
pub struct AppState {
    pub engine: EngineHandle,
    pub tokenizer: Tokenizer,
    /// The vision tower and its soft token's id, for a model that takes images.
    pub vision: Option<(Arc<kiln_core::model::VisionTower>, u32)>,
    /// Hosts whose image URLs are fetched (`--image-url-allow`); none by default.
    pub image_urls: crate::images::ImageUrls,
    pub template: Option<ChatTemplate>,
    /// Why the model's chat template is not usable, when it has one that does not compile.
    pub template_error: Option<String>,
    /// What the chat template shows the model writes: reasoning, tool calls.
    syntax: Syntax,
    pub model: String,
    pub ctx: usize,
    pub api_key: Option<String>,
    /// `/metrics` answers without the key.
    pub public_metrics: bool,
    /// See [`ServeOptions::loopback_only`].
    pub loopback_only: bool,
    /// A streaming client that takes no piece for this long is dropped.
    pub stall_timeout: std::time::Duration,
    /// See [`ServeOptions::wedged_after`].
    pub wedged_after: std::time::Duration,
    /// See [`ServeOptions::read_timeout`].
    pub read_timeout: std::time::Duration,
    metrics: Metrics,
    /// Settings /props reports.
    props: Value,
    /// The model's logit rows.
    vocab: usize,
    /// How /v1/embeddings pools hidden states, and their width.
    pub pooling: Pooling,
    pub embedding_width: usize,
    /// See [`ServeOptions::cors_origins`].
    cors_origins: Vec<String>,
    /// The vocabulary's token trie for grammars, made on the first request with one.
    grammars: std::sync::OnceLock<Result<Grammars, String>>,
    /// The model generates by block diffusion.
    pub diffusion: bool,
    /// Choices admitted and not yet finished, and the most there may be.
    in_flight: Arc<std::sync::atomic::AtomicUsize>,
    max_in_flight: usize,
    /// What one chat-template render may use.
    pub template_limits: RenderLimits,
    /// The chat page is served at `/`.
    pub webui: bool,
}

/// How `kiln serve` treats its clients, beside the model.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// Requests decoded together.
    pub max_batch: usize,
    pub api_key: Option<String>,
    pub public_metrics: bool,
    /// Requests that may wait beyond the running batch; more get 429.
    pub max_queue: usize,
    /// Requests in flight at most (running and queued); more get 429.
    pub max_concurrent: Option<usize>,
    /// Refuse requests whose `Host` is not a loopback name or address, and POST bodies that
    /// are not `application/json` (against DNS rebinding and browser "simple" requests):
    /// what a keyless server on a loopback address does.
    pub loopback_only: bool,
    /// A client that takes none of its output for this long is dropped and its request
    /// cancelled.
    pub stall_timeout: std::time::Duration,
    /// An engine with work that has not finished a step for this long is wedged: /health
    /// and new requests get 503 until it moves again.
    pub wedged_after: std::time::Duration,
    /// A request body must arrive within this long (408 past it).
    pub read_timeout: std::time::Duration,
    /// Speculative decoding (`--spec`), when asked for.
    pub spec: Option<crate::spec::SpecArgs>,
    /// `--pooling`; `None`: the model's config, else last.
    pub pooling: Option<Pooling>,
    /// Origins browser pages may call from (`--cors-origin`); empty: no CORS headers.
    pub cors_origins: Vec<String>,
    /// What one chat-template render may use (`--template-*`).
    pub template_limits: RenderLimits,
    /// Serve the chat page at `/` (off with `--no-webui`).
    pub webui: bool,
    /// The model's name in the API (`model` fields, /v1/models); default the file's stem.
    pub name: Option<String>,
    pub image_urls: crate::images::ImageUrls,
}

impl ServeOptions {
    /// Defaults for `max_batch` requests at once: a queue of four batches.
    pub fn new(max_batch: usize) -> ServeOptions {
        ServeOptions {
            max_batch: max_batch.max(1),
            api_key: None,
            public_metrics: false,
            max_queue: 4 * max_batch.max(1),
            max_concurrent: None,
            loopback_only: false,
            stall_timeout: std::time::Duration::from_secs(60),
            wedged_after: std::time::Duration::from_secs(30),
            read_timeout: std::time::Duration::from_secs(30),
            spec: None,
            pooling: None,
            cors_origins: Vec::new(),
            template_limits: RenderLimits::default(),
            webui: true,
            name: None,
            image_urls: crate::images::ImageUrls::default(),
        }
    }
}

/// A request's share of the admission limit (one per choice), given back when dropped.
pub(crate) struct Admitted {
    count: Arc<std::sync::atomic::AtomicUsize>,
    n: usize,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.count
            .fetch_sub(self.n, std::sync::atomic::Ordering::AcqRel);
    }
}

impl AppState {
    /// The grammar compiler over this model's vocabulary (built once, on first use).
    pub fn grammars(&self) -> Result<&Grammars, String> {
        self.grammars
            .get_or_init(|| {
                let t = std::time::Instant::now();
                let g = Grammars::new(&self.tokenizer, self.vocab).map_err(|e| e.to_string());
                tracing::info!("grammar token trie built in {:.0?}", t.elapsed());
                g
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// Why the engine cannot take work now, if it cannot: its thread has ended, or it has had
    /// work and made no step for [`ServeOptions::wedged_after`].
    pub fn unhealthy(&self) -> Option<&'static str> {
        if !self.engine.is_alive() {
            return Some("the engine has stopped");
        }
        let s = self.engine.snapshot();
        let busy = s.waiting + s.running > 0;
        if busy && s.last_step.is_some_and(|t| t.elapsed() > self.wedged_after) {
            return Some("the engine has made no progress for a while (wedged)");
        }
        None
    }

    /// Admits `n` choices, or says why not (429: over the limits; 503: the engine is
    /// unhealthy).
    pub(crate) fn admit(&self, n: usize) -> Result<Admitted, ApiError> {
        use std::sync::atomic::Ordering;
        if let Some(why) = self.unhealthy() {
            return Err(ApiError::status(StatusCode::SERVICE_UNAVAILABLE, why));
        }
        let before = self.in_flight.fetch_add(n, Ordering::AcqRel);
        let admitted = Admitted {
            count: self.in_flight.clone(),
            n,
        };
        if before + n > self.max_in_flight {
            drop(admitted);
            return Err(ApiError {
                status: StatusCode::TOO_MANY_REQUESTS,
                message: format!(
                    "the server is at its limit of {} requests in flight; retry shortly",
                    self.max_in_flight
                ),
                param: None,
                code: Some("rate_limit_exceeded"),
            });
        }
        Ok(admitted)
    }
}

pub fn run(a: &ServeArgs) -> Result<()> {
    // The chat-template sandbox's helper process forks now, while this process is small and
    // has no threads.
    #[cfg(unix)]
    if let Err(e) = kiln_core::chat::sandbox::start() {
        anyhow::bail!("starting the chat-template sandbox: {e}");
    }
    if !(a.template_timeout > 0.0 && a.template_timeout.is_finite()) {
        anyhow::bail!("--template-timeout must be a positive number of seconds");
    }
    let template_limits = RenderLimits {
        fuel: a.template_fuel.max(1),
        timeout: std::time::Duration::from_secs_f64(a.template_timeout.min(3600.0)),
        max_memory: a.template_max_memory.max(1).saturating_mul(1 << 20),
        max_output: a.template_max_output.max(1),
    };
    let mut cfg = RunnerConfig {
        max_seqs: a.max_batch.max(1),
        kv_blocks: a.kv_blocks,
        // Every family: sliding windows keep the blocks a cached prefix needs, recurrent
        // models resume from state snapshots.
        prefix_caching: true,
        ..RunnerConfig::default()
    };
    a.spec.prepare(&mut cfg)?;
    let addr = listen_addr(&a.host, a.port)?;
    let opts = ServeOptions {
        image_urls: crate::images::ImageUrls::new(&a.image_url_allow)?,
        api_key: a.api_key.clone(),
        public_metrics: a.public_metrics,
        max_queue: a.max_queue.unwrap_or(4 * a.max_batch.max(1)),
        max_concurrent: a.max_concurrent,
        loopback_only: addr.ip().is_loopback() && a.api_key.is_none(),
        stall_timeout: std::time::Duration::from_secs_f64(a.stream_stall_timeout.max(0.1)),
        read_timeout: std::time::Duration::from_secs_f64(a.header_timeout.max(0.1)),
        spec: a.spec.spec.is_some().then(|| a.spec.clone()),
        pooling: a.pooling.as_deref().and_then(Pooling::parse),
        cors_origins: a.cors_origin.clone(),
        template_limits,
        webui: !a.no_webui,
        ..ServeOptions::new(a.max_batch)
    };
    let limits = ConnLimits {
        max_connections: a.max_connections.max(1),
        header_timeout: std::time::Duration::from_secs_f64(a.header_timeout.max(0.1)),
    };
    let (app, what) = match &a.models_dir {
        Some(dir) => {
            if a.model.model.is_some() {
                anyhow::bail!("--model and --models-dir: give one (--models-dir serves every model in the directory)");
            }
            if a.spec.spec.is_some() {
                anyhow::bail!(
                    "--spec is not available with --models-dir (a draft belongs to one model)"
                );
            }
            if !(a.models_load_wait >= 0.0 && a.models_load_wait.is_finite()) {
                anyhow::bail!("--models-load-wait must be a number of seconds");
            }
            let cors = utility::cors(&opts.cors_origins);
            let models = multi::Models::new(multi::ModelsConfig {
                dir: dir.clone(),
                max_loaded: a.models_max.max(1),
                load_wait: std::time::Duration::from_secs_f64(a.models_load_wait.min(3600.0)),
                args: a.model.clone(),
                cfg,
                opts: opts.clone(),
            })?;
            let names = models.listing();
            let app = multi::models_router(models);
            let app = match cors {
                Some(c) => app.layer(c),
                None => app,
            };
            (
                app,
                format!(
                    "{} model(s) from {} ({})",
                    names.len(),
                    dir.display(),
                    names.join(", ")
                ),
            )
        }
        None => {
            let state = state_with(load(&a.model, cfg)?, opts.clone())?;
            let what = state.model.clone();
            (router(state), what)
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("listening on {addr}"))?;
        eprintln!("kiln: serving {what} on http://{addr}/v1");
        if opts.webui {
            eprintln!("kiln: chat page at http://{addr}/ (--no-webui to turn it off)");
        }
        serve_connections(listener, app, limits).await;
        Ok(())
    })
}

/// Limits on the connections themselves, beside the requests.
#[derive(Clone, Copy, Debug)]
pub struct ConnLimits {
    /// Open connections at most; one more is closed as soon as it is accepted.
    pub max_connections: usize,
    /// A connection must deliver a request's headers within this long of opening (or of its
    /// previous response), else it is closed: slow or idle clients do not hold sockets.
    pub header_timeout: std::time::Duration,
}

/// Accepts connections on `listener` and serves `app` on each (HTTP/1.1), under `limits`.
/// Runs until the listener fails for good.
pub async fn serve_connections(listener: tokio::net::TcpListener, app: Router, limits: ConnLimits) {
    use hyper_util::rt::{TokioIo, TokioTimer};
    use hyper_util::service::TowerToHyperService;
    let open = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                // Out of file descriptors and the like: wait a little rather than spin.
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = open.clone().try_acquire_owned() else {
            tracing::warn!("connection refused: {} open", limits.max_connections);
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let svc = TowerToHyperService::new(app.clone());
        tokio::spawn(async move {
            let _permit = permit;
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                .serve_connection(TokioIo::new(stream), svc)
                .with_upgrades();
            if let Err(e) = conn.await {
                tracing::debug!("connection ended: {e}");
            }
        });
    }
}

/// The address `--host` and `--port` name: an IP address (v4, or v6 with or without
/// brackets) or a host name resolved now (`localhost`), first address first.
pub fn listen_addr(host: &str, port: u16) -> Result<SocketAddr> {
    use std::net::{IpAddr, ToSocketAddrs};
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    (bare, port)
        .to_socket_addrs()
        .with_context(|| format!("cannot resolve --host {host}"))?
        .next()
        .with_context(|| format!("--host {host} resolves to no address"))
}

/// The server's state over a loaded model: the engine thread, the tokenizer and the chat
/// template.
pub fn state(m: Loaded, max_batch: usize, api_key: Option<String>) -> Result<Arc<AppState>> {
    state_with(
        m,
        ServeOptions {
            api_key,
            ..ServeOptions::new(max_batch)
        },
    )
}

/// The server's state over a loaded model, with these options.
pub fn state_with(m: Loaded, o: ServeOptions) -> Result<Arc<AppState>> {
    let (max_batch, api_key, public_metrics) = (o.max_batch, o.api_key, o.public_metrics);
    let max_in_flight = o
        .max_concurrent
        .unwrap_or(usize::MAX)
        .min(max_batch + o.max_queue)
        .max(1);
    let cfg = m.runner.config().clone();
    let ctx = cfg.ctx;
    let model = o.name.clone().unwrap_or_else(|| {
        m.path
            .file_stem()
            .map(|s| s.to_string_lossy().to_string())
            .unwrap_or_else(|| "kiln".into())
    });
    let source = m.tokenizer.chat_template().map(str::to_string);
    let mut template_error = None;
    let template = match &source {
        Some(src) => {
            let piece = |id: Option<u32>| id.map(|i| m.tokenizer.decode(&[i])).unwrap_or_default();
            // A template kiln cannot compile costs the chat endpoint only.
            // Compiled in the sandbox only: compiling folds constants, which untrusted source
            // can make take gigabytes.
            match ChatTemplate::sandboxed(
                src,
                &piece(m.tokenizer.bos()),
                &piece(m.tokenizer.eos()),
                &o.template_limits,
            ) {
                Ok(t) => Some(t),
                Err(e) => {
                    tracing::warn!(
                        "the chat template does not compile ({e}); /v1/chat/completions is off"
                    );
                    eprintln!("kiln: the model's chat template does not compile ({e}); serving /v1/completions only");
                    template_error = Some(e.to_string());
                    None
                }
            }
        }
        None => None,
    };
    if let Some(t) = &template {
        check_template(t, &o.template_limits);
    }
    let syntax = source
        .as_deref()
        .map(Syntax::of_template)
        .unwrap_or_default();
    let info = m.runner.model().info().clone();
    let kv_total = m
        .runner
        .kv_managers()
        .first()
        .map_or(0, |k| k.pool().num_blocks() - 1);
    let defaults = SamplingParams::default();
    let props = json!({
        "model": model,
        "architecture": info.architecture,
        "backend": m.runner.executor().backend().name(),
        "context_length": ctx,
        "vocab_size": info.vocab,
        "parameters": info.n_params,
        "max_batch": max_batch,
        "max_batch_tokens": cfg.max_batch_tokens,
        "kv_block_size": cfg.block_size,
        "kv_blocks_total": kv_total,
        "kv_cache_type": cfg.kv_types.to_string(),
        "kv_cache_type_k": cfg.kv_types.k.name(),
        "kv_cache_type_v": cfg.kv_types.v.name(),
        "kv_bytes_per_token": cfg.kv_types.bytes_per_token(m.runner.model().kv_groups()),
        "kv_tokens_capacity": m
            .runner
            .kv_managers()
            .iter()
            .map(|k| (k.pool().num_blocks() - 1) * cfg.block_size)
            .max()
            .unwrap_or(0),
        "prefix_caching": cfg.prefix_caching,
        "chat_template": source,
        "reasoning": syntax.reasoning,
        "tool_calls": syntax.tool_calls,
        "api_key_required": api_key.is_some(),
        "default_generation_settings": {
            "temperature": defaults.temperature,
            "top_k": defaults.top_k,
            "top_p": defaults.top_p,
            "min_p": defaults.min_p,
            "max_tokens_completions": 16,
            "max_tokens_chat": "the rest of the context",
        },
    });
    let pooling = o
        .pooling
        .unwrap_or_else(|| utility::config_pooling(&m.path, &m.file));
    let mut engine = crate::load::with_vision(Engine::new(m.runner, max_batch), &m.vision);
    if let Some(spec) = &o.spec {
        engine = spec.attach(engine)?;
    }
    let diffusion = engine.forward().model().canvas_length().is_some();
    // A diffusion model denoises with its checkpoint's settings.
    if diffusion {
        let p = crate::diffusion::DiffusionArgs::default().params(&m.path, None)?;
        engine.set_diffusion_defaults(p)?;
    }
    Ok(Arc::new(AppState {
        vision: m.vision.clone(),
        image_urls: o.image_urls.clone(),
        engine: spawn(engine),
        diffusion,
        tokenizer: m.tokenizer,
        template,
        template_error,
        syntax,
        model,
        ctx,
        api_key,
        public_metrics,
        loopback_only: o.loopback_only,
        stall_timeout: o.stall_timeout,
        wedged_after: o.wedged_after,
        read_timeout: o.read_timeout,
        in_flight: Default::default(),
        max_in_flight,
        template_limits: o.template_limits,
        metrics: Metrics::default(),
        props,
        vocab: info.vocab,
        grammars: std::sync::OnceLock::new(),
        pooling,
        embedding_width: info.n_embd,
        cors_origins: o.cors_origins,
        webui: o.webui,
    }))
}

/// The HTTP routes over `state`.
pub fn router(state: Arc<AppState>) -> Router {
    let cors = utility::cors(&state.cors_origins);
    let page = if state.webui {
        webui::routes()
    } else {
        Router::new()
    };
    let app = Router::new()
        .route("/health", get(health))
        .route("/v1/models", get(models))
        .route("/props", get(props))
        .route("/slots", get(slots))
        .route("/metrics", get(metrics))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/embeddings", post(utility::embeddings))
        .route("/v1/messages", post(compat::messages))
        .route("/v1/responses", post(compat::responses))
        .route("/tokenize", post(utility::tokenize))
        .route("/detokenize", post(utility::detokenize))
        .route("/apply-template", post(utility::apply_template))
        .merge(page)
        .fallback(|| async {
            ApiError::status(StatusCode::NOT_FOUND, "no such route").into_response()
        })
        .method_not_allowed_fallback(|| async {
            ApiError::status(
                StatusCode::METHOD_NOT_ALLOWED,
                "method not allowed on this route",
            )
            .into_response()
        })
        // Innermost first: the body is read only for a request that passed the checks.
        .layer(middleware::from_fn_with_state(
            state.clone(),
            read_body_in_time,
        ))
        .layer(middleware::from_fn_with_state(state.clone(), require_key))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            guard_loopback,
        ))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .layer(middleware::from_fn_with_state(state.clone(), count_status))
        .with_state(state);
    // Outermost: a browser's preflight carries no key and gets its answer here.
    match cors {
        Some(c) => app.layer(c),
        None => app,
    }
}

/// Counts every response by status for /metrics.
async fn count_status(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let res = next.run(req).await;
    let code = res.status().as_u16();
    state
        .metrics
        .with(|m| *m.http.entry(code).or_insert(0) += 1);
    res
}

/// 200 while the engine takes work; 503 when its thread has ended or it is wedged.
async fn health(State(state): State<Arc<AppState>>) -> Response {
    match state.unhealthy() {
        None => Json(json!({"status": "ok"})).into_response(),
        Some(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "error", "message": why})),
        )
            .into_response(),
    }
}

/// Reads a request's body within the read timeout (a client that trickles its body does not
/// hold a connection and a handler): 408 past it, 413 over [`MAX_BODY`].
async fn read_body_in_time(
    State(state): State<Arc<AppState>>,
    req: Request,
    next: Next,
) -> Response {
    let (parts, body) = req.into_parts();
    match read_body(body, state.read_timeout).await {
        Ok(bytes) => {
            next.run(Request::from_parts(parts, axum::body::Body::from(bytes)))
                .await
        }
        Err(res) => res,
    }
}

/// A request's body, read within `timeout` and [`MAX_BODY`]: 408 past the time, 413 over the
/// size, 400 when it cannot be read.
pub(crate) async fn read_body(
    body: axum::body::Body,
    timeout: std::time::Duration,
) -> std::result::Result<Bytes, Response> {
    match tokio::time::timeout(timeout, axum::body::to_bytes(body, MAX_BODY)).await {
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(e)) if e.to_string().contains("length limit") => Err(ApiError::status(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the request body is over the limit of {MAX_BODY} bytes"),
        )
        .into_response()),
        Ok(Err(e)) => {
            Err(ApiError::bad(format!("cannot read the request body: {e}"), None).into_response())
        }
        Err(_) => Err(ApiError::status(
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "the request body did not arrive within {} s",
                timeout.as_secs_f64()
            ),
        )
        .into_response()),
    }
}

async fn models(State(state): State<Arc<AppState>>) -> Response {
    Json(json!({"object": "list", "data": [
        {"id": state.model, "object": "model", "created": now(), "owned_by": "kiln"}
    ]}))
    .into_response()
}

/// The model and the server's settings.
async fn props(State(state): State<Arc<AppState>>) -> Response {
    Json(state.props.clone()).into_response()
}

/// The requests the engine holds (running first, then queued) and the KV pool.
async fn slots(State(state): State<Arc<AppState>>) -> Response {
    let s = state.engine.snapshot();
    let slots: Vec<Value> = s
        .slots
        .iter()
        .map(|x| {
            json!({"id": x.id, "state": x.state.name(), "prompt_tokens": x.prompt_tokens,
                   "generated_tokens": x.generated, "computed_tokens": x.computed,
                   "kv_blocks": x.kv_blocks, "preemptions": x.preemptions})
        })
        .collect();
    Json(json!({
        "slots": slots,
        "kv_blocks": {"total": s.kv_total, "free": s.kv_free, "cached": s.kv_cached,
                      "used": s.kv_total.saturating_sub(s.kv_free)},
        "waiting": s.waiting,
        "running": s.running,
    }))
    .into_response()
}

/// Prometheus text format.
async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    let out = state.metrics.render(&state.engine.snapshot(), &state.model);
    ([("content-type", "text/plain; version=0.0.4")], out).into_response()
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The body, or an OpenAI-style error (413 when it is over the size limit).
pub(crate) fn body_bytes(body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|e| ApiError {
        status: e.status(),
        message: format!("cannot read the request body: {}", e.body_text()),
        param: None,
        code: None,
    })
}

/// Runs a request's preparation (JSON, template, tokens, fetched images: work that grows with
/// the prompt) on a blocking thread, off the async workers that answer other connections.
async fn prepared(
    state: Arc<AppState>,
    body: Result<Bytes, BytesRejection>,
    prepare: fn(&AppState, &Bytes) -> Result<GenSpec, ApiError>,
) -> Response {
    let bytes = match body_bytes(body) {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    match prepare_blocking(&state, move |st| prepare(st, &bytes)).await {
        Ok(spec) => respond::respond(state, spec).await,
        Err(e) => e.into_response(),
    }
}

async fn completions(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    prepared(state, body, |state, bytes| {
        let b = body_json(bytes)?;
        let prompt = completion_prompt(state, &b)?;
        let echo = request::echo_text(state, &b, &prompt)?;
        let mut spec = common(state, Kind::Text, &b, prompt, 16)?;
        spec.echo = echo;
        request::constrain(state, &mut spec)?;
        Ok(spec)
    })
    .await
}

async fn chat_completions(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    prepared(state, body, |state, bytes| {
        chat_spec(state, &body_json(bytes)?)
    })
    .await
}

/// A chat request's generation settings: the prompt rendered and tokenized, the sampling
/// settings, and the grammar (`response_format`, `grammar`, or a forced tool call) compiled.
pub(crate) fn chat_spec(state: &AppState, b: &request::Body) -> Result<GenSpec, ApiError> {
    let chat = chat_prompt(state, b)?;
    let room = state.ctx.saturating_sub(chat.ids.len() + 1).max(1);
    let mut spec = common(state, Kind::Chat, b, chat.ids, room)?;
    spec.syntax = chat.syntax;
    spec.in_reasoning = chat.in_reasoning;
    spec.tools = chat.tools;
    spec.images = chat.images;
    if let Some(g) = chat.grammar {
        if spec.grammar.is_some() {
            return Err(ApiError::bad(
                "a forced tool call and response_format or grammar cannot be combined",
                Some("tool_choice"),
            ));
        }
        spec.grammar = Some(g);
    } else if chat.in_reasoning {
        // The prompt opened `<think>`: a JSON answer comes after closing it.
        let close = request::lark_tag(state, chat.syntax.format.think_close());
        spec.grammar = spec.grammar.map(|g| g.after_reasoning(&close));
    }
    request::constrain(state, &mut spec)?;
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::listen_addr;

    #[test]
    fn host_names_and_v6_addresses_are_listen_addresses() {
        for (host, loopback) in [
            ("127.0.0.1", true),
            ("::1", true),
            ("[::1]", true),
            ("localhost", true),
            ("0.0.0.0", false),
        ] {
            let a = listen_addr(host, 8080).unwrap_or_else(|e| panic!("{host}: {e}"));
            assert_eq!(a.port(), 8080);
            assert_eq!(a.ip().is_loopback(), loopback, "{host} → {a}");
        }
        assert!(listen_addr("not an address!", 1).is_err());
    }
}

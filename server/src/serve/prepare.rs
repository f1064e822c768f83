//! A request's preparation: run on a blocking thread inside the admission limits, with the
//! model's chat template rendered in the sandbox under the server's template limits,
//! counted in `/metrics`, and stopped when the client leaves.

use std::sync::Arc;

use kiln_core::chat::{ChatTemplate, RenderLimits};
use serde_json::{json, Value};

use super::request::ApiError;
use super::AppState;

impl AppState {
    /// The model's chat template rendered over a request's messages within
    /// [`AppState::template_limits`] (in the sandbox process on Unix), counted in `/metrics`;
    /// a limit or a failing template is a 400 that says which, and a render whose client
    /// left is stopped.
    pub fn render_template(
        &self,
        tpl: &ChatTemplate,
        messages: &[Value],
        tools: Option<&Value>,
        kwargs: &serde_json::Map<String, Value>,
    ) -> Result<String, ApiError> {
        use kiln_core::chat::RenderError;
        self.metrics.with(|c| c.renders_active += 1);
        let t = std::time::Instant::now();
        let r = tpl.render_limited(
            messages,
            tools,
            true,
            kwargs,
            &self.template_limits,
            &client_left,
        );
        let outcome = match &r {
            Ok(_) => "ok",
            Err(RenderError::Limit(l, _)) => l.name(),
            Err(RenderError::Template(_)) => "error",
            Err(RenderError::Cancelled) => "cancelled",
            Err(RenderError::Sandbox(_)) => "sandbox",
        };
        self.metrics.with(|c| {
            c.renders_active = c.renders_active.saturating_sub(1);
            *c.renders.entry(outcome).or_insert(0) += 1;
            c.render_seconds.observe(t.elapsed().as_secs_f64());
        });
        r.map_err(|e| match e {
            RenderError::Limit(..) | RenderError::Template(_) => {
                ApiError::bad(format!("chat template: {e}"), Some("messages"))
            }
            RenderError::Cancelled => ApiError::bad("the client left", None),
            RenderError::Sandbox(m) => {
                tracing::error!("chat-template sandbox: {m}");
                ApiError::internal(format!("the chat template could not be rendered: {m}"))
            }
        })
    }
}

/// Renders the model's template once over a representative conversation (a system prompt,
/// a tool, two user turns and an answer) under the server's limits, and warns when it is slow
/// or goes over a limit: a template that does either on a short chat fails real requests.
pub(super) fn check_template(tpl: &ChatTemplate, limits: &RenderLimits) {
    use kiln_core::chat::RenderError;
    let messages = [
        json!({"role": "system", "content": "You are a helpful assistant."}),
        json!({"role": "user", "content": "What is the capital of France?"}),
        json!({"role": "assistant", "content": "Paris."}),
        json!({"role": "user", "content": "And of Italy? Answer in one word."}),
    ];
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}]);
    let t = std::time::Instant::now();
    let r = tpl.render_limited(
        &messages,
        Some(&tools),
        true,
        &serde_json::Map::new(),
        limits,
        &|| false,
    );
    let took = t.elapsed();
    match r {
        Ok(_) if took > std::time::Duration::from_millis(250) => {
            let m = format!("the model's chat template took {took:.0?} to render a four-message chat; chat requests will be slow");
            tracing::warn!("{m}");
            eprintln!("kiln: {m}");
        }
        Ok(_) => tracing::info!("chat template renders a four-message chat in {took:.1?}"),
        Err(RenderError::Limit(_, m)) | Err(RenderError::Sandbox(m)) => {
            tracing::warn!("chat template check: {m}");
            eprintln!("kiln: the model's chat template failed a four-message chat: {m}");
        }
        // A template may refuse tools or roles; real requests tell.
        Err(e) => tracing::info!("chat template check: {e}"),
    }
}

thread_local! {
    /// Set while a request is prepared on this blocking thread: true once its client has
    /// left (the handler's future was dropped).
    static LEFT: std::cell::RefCell<Option<Arc<std::sync::atomic::AtomicBool>>> =
        const { std::cell::RefCell::new(None) };
}

/// Whether the client of the request prepared on this thread has left.
fn client_left() -> bool {
    LEFT.with(|l| {
        l.borrow()
            .as_ref()
            .is_some_and(|f| f.load(std::sync::atomic::Ordering::Relaxed))
    })
}

/// Runs `f` (a request's preparation) on a blocking thread, holding one admission slot
/// meanwhile (preparation counts against `--max-concurrent`: 429 past it); when the future
/// is dropped because the client left, a chat-template render under way is stopped.
pub(crate) async fn prepare_blocking<T: Send + 'static>(
    state: &Arc<AppState>,
    f: impl FnOnce(&AppState) -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    struct SetOnDrop(Arc<std::sync::atomic::AtomicBool>);
    impl Drop for SetOnDrop {
        fn drop(&mut self) {
            self.0.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }
    let slot = state.admit(1)?;
    let left = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let _guard = SetOnDrop(left.clone());
    let st = state.clone();
    tokio::task::spawn_blocking(move || {
        let _slot = slot;
        LEFT.with(|l| *l.borrow_mut() = Some(left));
        let r = f(&st);
        LEFT.with(|l| l.borrow_mut().take());
        r
    })
    .await
    .unwrap_or_else(|e| {
        Err(ApiError::internal(format!(
            "preparing the request failed: {e}"
        )))
    })
}

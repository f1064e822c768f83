//! Running a request's choices on the engine and answering: one JSON body, or server-sent
//! events in OpenAI's chunk format.
//!
//! Each choice is one engine request, drained by a task that hands the events to a blocking
//! thread to turn tokens into text (whole characters only, stop strings held back) and split
//! chat output into content, reasoning and tool calls, and measures latencies. The task
//! watches its outgoing channel: when the response is dropped (the client left, or stopped
//! reading for the stall timeout) it drops the engine request, which cancels it at the
//! engine's next step.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use crate::timings::Timings;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Json, Response};
use kiln_core::chat::parse::{Delta, OutputParser, ToolCall};
use kiln_core::engine::{Event, EventSink, Finish, GenRequest};
use kiln_core::sample::{StopMatcher, TokenLogprobs};
use kiln_core::tokenizer::StreamDecoder;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::request::{ApiError, GenSpec, Kind};
use super::{now, AppState};

/// One token's log-probabilities, with the text of each token.
pub(super) struct TokenLp {
    token: String,
    bytes: Vec<u8>,
    logprob: f32,
    top: Vec<(String, Vec<u8>, f32)>,
}

/// What a choice's thread sends.
pub(super) enum Piece {
    Out {
        index: usize,
        content: String,
        reasoning: String,
        calls: Vec<ToolCall>,
        logprobs: Vec<TokenLp>,
    },
    End {
        index: usize,
        finish: &'static str,
        completion: usize,
        /// Prompt tokens served from the prefix cache.
        cached: usize,
        timings: Timings,
        /// A block-diffusion model's canvases and steps.
        denoised: Option<Denoised>,
        /// The stop string that ended the output, if one did.
        stop_sequence: Option<String>,
    },
    /// A block-diffusion model's denoising step (streamed with `stream_drafts`): the text of
    /// its argmax canvas.
    Draft {
        index: usize,
        canvas: usize,
        step: usize,
        text: String,
    },
    Failed(String),
}

/// What a block-diffusion choice took: canvases, denoising steps, and seconds from the
/// request's start to its end.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Denoised {
    canvases: usize,
    steps: usize,
    seconds: f64,
}

impl Denoised {
    /// The choices' canvases and steps together, over the longest one's time.
    fn add(self, o: Denoised) -> Denoised {
        Denoised {
            canvases: self.canvases + o.canvases,
            steps: self.steps + o.steps,
            seconds: self.seconds.max(o.seconds),
        }
    }
}

impl Piece {
    fn is_empty(&self) -> bool {
        matches!(self, Piece::Out { content, reasoning, calls, logprobs, .. }
            if content.is_empty() && reasoning.is_empty() && calls.is_empty() && logprobs.is_empty())
    }
}

/// Turns one choice's engine events into pieces.
struct Choice {
    index: usize,
    dec: StreamDecoder,
    stop: StopMatcher,
    parser: Option<OutputParser>,
    generated: usize,
    calls: usize,
    /// Prompt tokens the engine took from the prefix cache.
    cached: usize,
    timings: Timings,
    /// Canvases committed and their denoising steps (block-diffusion models).
    canvases: usize,
    steps: usize,
    started: Instant,
}

impl Choice {
    fn new(index: usize, spec: &GenSpec) -> Choice {
        Choice {
            index,
            dec: StreamDecoder::new(),
            stop: StopMatcher::new(&spec.stop),
            parser: (spec.kind == Kind::Chat)
                .then(|| OutputParser::new(spec.syntax, spec.in_reasoning).with_tools(&spec.tools)),
            generated: 0,
            calls: 0,
            cached: 0,
            timings: Timings::start(spec.prompt.len()),
            canvases: 0,
            steps: 0,
            started: Instant::now(),
        }
    }

    /// Text after stop-string matching → a piece (split by the chat parser).
    fn piece(&mut self, text: &str, end: bool, logprobs: Vec<TokenLp>) -> Piece {
        let mut deltas = match &mut self.parser {
            Some(p) => p.push(text),
            None => vec![Delta::Content(text.to_string())],
        };
        if end {
            if let Some(p) = &mut self.parser {
                deltas.extend(p.finish());
            }
        }
        let (mut content, mut reasoning, mut calls) = (String::new(), String::new(), Vec::new());
        for d in deltas {
            match d {
                Delta::Content(s) => content.push_str(&s),
                Delta::Reasoning(s) => reasoning.push_str(&s),
                Delta::ToolCall(c) => calls.push(c),
            }
        }
        self.calls += calls.len();
        Piece::Out {
            index: self.index,
            content,
            reasoning,
            calls,
            logprobs,
        }
    }

    fn token(&mut self, state: &AppState, t: u32, lp: Option<TokenLogprobs>) -> Vec<Piece> {
        self.generated += 1;
        self.timings.token();
        let text = self.stop.push(&self.dec.push(&state.tokenizer, t));
        let lps = lp.map(|l| token_lp(state, &l)).into_iter().collect();
        if self.stop.stopped() {
            return vec![self.piece(&text, true, lps), self.end("stop")];
        }
        vec![self.piece(&text, false, lps)]
    }

    /// The pieces of a run of events, up to the one that ends the choice.
    fn events(&mut self, state: &AppState, events: Vec<Event>) -> Vec<Piece> {
        let mut out = Vec::new();
        for ev in events {
            let pieces = match ev {
                Event::Token(t, lp) => self.token(state, t, lp),
                Event::Cached(n) => {
                    self.cached = n;
                    Vec::new()
                }
                Event::Done { finish, .. } => self.done(finish),
                Event::Error(e) => vec![Piece::Failed(e)],
                Event::Draft {
                    canvas,
                    step,
                    tokens,
                } => vec![Piece::Draft {
                    index: self.index,
                    canvas,
                    step,
                    text: state.tokenizer.decode(&tokens),
                }],
                Event::Canvas { steps } => {
                    self.canvases += 1;
                    self.steps += steps;
                    Vec::new()
                }
                // Embeddings are served by /v1/embeddings, never as a choice.
                Event::Embedding(_) => Vec::new(),
            };
            let ends = pieces
                .iter()
                .any(|p| matches!(p, Piece::End { .. } | Piece::Failed(_)));
            out.extend(pieces);
            if ends {
                break;
            }
        }
        out
    }

    fn done(&mut self, finish: Finish) -> Vec<Piece> {
        let mut tail = self.stop.push(&self.dec.finish());
        tail.push_str(&self.stop.finish());
        let stopped = finish == Finish::Stop || self.stop.stopped();
        let piece = self.piece(&tail, true, Vec::new());
        vec![piece, self.end(if stopped { "stop" } else { "length" })]
    }

    fn end(&self, finish: &'static str) -> Piece {
        Piece::End {
            index: self.index,
            finish: if finish == "stop" && self.calls > 0 {
                "tool_calls"
            } else {
                finish
            },
            completion: self.generated,
            cached: self.cached,
            timings: self.timings,
            denoised: (self.canvases > 0).then(|| Denoised {
                canvases: self.canvases,
                steps: self.steps,
                seconds: self.started.elapsed().as_secs_f64(),
            }),
            stop_sequence: self.stop.matched().map(str::to_string),
        }
    }
}

fn token_lp(state: &AppState, l: &TokenLogprobs) -> TokenLp {
    let text = |t: u32| {
        (
            state.tokenizer.decode(&[t]),
            state.tokenizer.token_bytes(t).unwrap_or_default(),
        )
    };
    let (token, bytes) = text(l.token);
    TokenLp {
        token,
        bytes,
        logprob: l.logprob,
        top: l
            .top
            .iter()
            .map(|&(t, lp)| {
                let (s, b) = text(t);
                (s, b, lp)
            })
            .collect(),
    }
}

/// Starts every choice of `spec` on the engine; their pieces arrive on one channel.
/// Each choice's thread holds `admitted` until its choice ends.
fn start(
    state: &Arc<AppState>,
    spec: &GenSpec,
    admitted: &Arc<super::Admitted>,
) -> mpsc::Receiver<Piece> {
    let (tx, rx) = mpsc::channel::<Piece>(64);
    let arrived = Instant::now();
    state
        .metrics
        .with(|m| m.prompt_tokens += spec.prompt.len() as u64);
    for index in 0..spec.n {
        let mut params = spec.params.clone();
        // Choices differ; a seeded request stays reproducible.
        params.seed = params.seed.map(|s| s.wrapping_add(index as u64));
        let (etx, mut events) = tokio::sync::mpsc::unbounded_channel::<Event>();
        let cancel = state.engine.submit_to(
            GenRequest {
                prompt: spec.prompt.clone(),
                params,
                max_tokens: spec.max_tokens,
                stop_ids: if spec.ignore_eos {
                    Vec::new()
                } else {
                    state.tokenizer.eog_ids().to_vec()
                },
                logprobs: spec.logprobs,
                drafts: spec.drafts,
                init_canvas: None,
                autoregressive: spec.autoregressive,
                constraint: spec.constraint.clone(),
                images: spec.images.clone(),
            },
            Box::new(ToTask(etx)),
        );
        let st = state.clone();
        let tx = tx.clone();
        let choice = Choice::new(index, spec);
        if let Some(text) = &spec.echo {
            // The channel is empty: the echoed prompt goes first without waiting.
            let _ = tx.try_send(Piece::Out {
                index,
                content: text.clone(),
                reasoning: String::new(),
                calls: Vec::new(),
                logprobs: Vec::new(),
            });
        }
        let admitted = admitted.clone();
        let stall = state.stall_timeout;
        // One task per choice: it waits on the engine's events and on the client, never on a
        // thread; a client that takes none of its pieces for `stall` is dropped. Turning
        // tokens into text (detokenizing, stop strings, the chat parser) runs on a blocking
        // thread, over every event that has arrived by then.
        tokio::spawn(async move {
            let _admitted = admitted;
            // Dropping it cancels the request if it is still running.
            let _cancel = cancel;
            let mut last: Option<Instant> = None;
            let mut choice = Some(choice);
            let unrecorded: Option<&'static str> = loop {
                let ev = tokio::select! {
                    ev = events.recv() => ev,
                    _ = tx.closed() => break Some("cancelled"),
                };
                let Some(ev) = ev else {
                    break Some("error");
                };
                let mut batch = vec![ev];
                while batch.len() < MAX_BATCH {
                    match events.try_recv() {
                        Ok(ev) => batch.push(ev),
                        Err(_) => break,
                    }
                }
                for ev in &batch {
                    if let Event::Token(..) = ev {
                        let at = Instant::now();
                        st.metrics.with(|m| match last {
                            None => m.ttft.observe((at - arrived).as_secs_f64()),
                            Some(prev) => m.itl.observe((at - prev).as_secs_f64()),
                        });
                        last = Some(at);
                    }
                }
                let Some(mut c) = choice.take() else {
                    break Some("error");
                };
                let s2 = st.clone();
                let worked = tokio::task::spawn_blocking(move || {
                    let pieces = c.events(&s2, batch);
                    (c, pieces)
                })
                .await;
                let pieces = match worked {
                    Ok((c, pieces)) => {
                        choice = Some(c);
                        pieces
                    }
                    Err(e) => vec![Piece::Failed(format!(
                        "turning tokens into text failed: {e}"
                    ))],
                };
                let generated = choice.as_ref().map_or(0, |c| c.generated);
                let mut outcome = None;
                for p in pieces {
                    let ends = match &p {
                        Piece::End { finish, .. } => Some(*finish),
                        Piece::Failed(_) => Some("error"),
                        _ => None,
                    };
                    // The outcome is counted before the last piece goes out, so a client that
                    // has its answer finds it in /metrics.
                    if let Some(o) = ends {
                        record(&st, o, generated);
                        outcome = Some(o);
                    }
                    if p.is_empty() {
                        continue;
                    }
                    let gone = match tokio::time::timeout(stall, tx.send(p)).await {
                        Ok(Ok(())) => None,
                        Ok(Err(_)) => Some("cancelled"),
                        Err(_) => Some("stalled"),
                    };
                    if let Some(g) = gone {
                        if outcome.is_none() {
                            record(&st, g, generated);
                        }
                        outcome = Some(g);
                        break;
                    }
                }
                if outcome.is_some() {
                    break None;
                }
            };
            if let Some(o) = unrecorded {
                record(&st, o, choice.as_ref().map_or(0, |c| c.generated));
            }
        });
    }
    rx
}

/// Most engine events turned into text in one go.
const MAX_BATCH: usize = 256;

/// Hands the engine's events to a choice's task (an unbounded channel: the engine never
/// waits; a request produces at most `max_tokens` events).
struct ToTask(tokio::sync::mpsc::UnboundedSender<Event>);

impl EventSink for ToTask {
    fn send(&mut self, ev: Event) -> bool {
        self.0.send(ev).is_ok()
    }
}

/// Counts a finished choice in /metrics.
fn record(st: &AppState, outcome: &'static str, generated: usize) {
    st.metrics.with(|m| {
        *m.finished.entry(outcome).or_insert(0) += 1;
        m.generated_tokens += generated as u64;
    });
}

/// The usage object; a block-diffusion model's adds its canvases, denoising steps, steps per
/// canvas and generated tokens per second (from the request's start).
fn usage(prompt: usize, completion: usize, cached: usize, denoised: Option<Denoised>) -> Value {
    let mut u = json!({"prompt_tokens": prompt, "completion_tokens": completion,
           "total_tokens": prompt + completion,
           "prompt_tokens_details": {"cached_tokens": cached}});
    if let Some(d) = denoised {
        u["canvases"] = json!(d.canvases);
        u["denoising_steps"] = json!(d.steps);
        u["steps_per_canvas"] = json!(d.steps as f64 / d.canvases.max(1) as f64);
        u["tokens_per_second"] = json!(completion as f64 / d.seconds.max(1e-9));
    }
    u
}

fn tool_calls_json(calls: &[ToolCall], id: &str, index: usize) -> Value {
    Value::Array(
        calls
            .iter()
            .map(|c| {
                json!({"index": c.index, "id": format!("call_{id}_{index}_{}", c.index),
                       "type": "function",
                       "function": {"name": c.name, "arguments": c.arguments}})
            })
            .collect(),
    )
}

/// Log-probabilities in the endpoint's format. Completions use the legacy lists, with text
/// offsets counted from `offset` (the bytes of text before these tokens).
fn logprobs_json(kind: Kind, lps: &[TokenLp], offset: &mut usize) -> Value {
    match kind {
        Kind::Chat => json!({"content": lps.iter().map(|l| json!({
            "token": l.token, "logprob": l.logprob, "bytes": l.bytes,
            "top_logprobs": l.top.iter().map(|(t, b, lp)|
                json!({"token": t, "logprob": lp, "bytes": b})).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(), "refusal": null}),
        Kind::Text => {
            let mut offsets = Vec::with_capacity(lps.len());
            for l in lps {
                offsets.push(*offset);
                *offset += l.token.len();
            }
            json!({
                "tokens": lps.iter().map(|l| &l.token).collect::<Vec<_>>(),
                "token_logprobs": lps.iter().map(|l| l.logprob).collect::<Vec<_>>(),
                "top_logprobs": lps.iter().map(|l| l.top.iter()
                    .map(|(t, _, lp)| (t.clone(), json!(lp)))
                    .collect::<serde_json::Map<String, Value>>()).collect::<Vec<_>>(),
                "text_offset": offsets,
            })
        }
    }
}

/// One choice of a non-streamed response, as it is gathered.
#[derive(Default)]
struct Gathered {
    content: String,
    reasoning: String,
    calls: Vec<ToolCall>,
    logprobs: Vec<TokenLp>,
    finish: Option<&'static str>,
    cached: usize,
    timings: Option<Timings>,
    completion: usize,
    denoised: Option<Denoised>,
}

/// Admits `spec` (its choices count against the limit until they end) and starts it: the
/// pieces of its choices arrive on the receiver.
pub(super) fn launch(
    state: &Arc<AppState>,
    spec: &GenSpec,
) -> Result<mpsc::Receiver<Piece>, ApiError> {
    let admitted = Arc::new(state.admit(spec.n)?);
    Ok(start(state, spec, &admitted))
}

pub async fn respond(state: Arc<AppState>, spec: GenSpec) -> Response {
    let admitted = match state.admit(spec.n) {
        Ok(a) => Arc::new(a),
        Err(e) => return e.into_response(),
    };
    let prompt_len = spec.prompt.len();
    let kind = spec.kind;
    let rx = start(&state, &spec, &admitted);
    let id = format!(
        "{}-{:x}",
        if kind == Kind::Chat {
            "chatcmpl"
        } else {
            "cmpl"
        },
        now() ^ (prompt_len as u64) << 32 ^ rand_bits()
    );
    if spec.stream {
        stream(state, spec, rx, id)
    } else {
        whole(state, spec, rx, id).await
    }
}

async fn whole(
    state: Arc<AppState>,
    spec: GenSpec,
    mut rx: mpsc::Receiver<Piece>,
    id: String,
) -> Response {
    let kind = spec.kind;
    let mut choices: Vec<Gathered> = (0..spec.n).map(|_| Gathered::default()).collect();
    let mut ended = 0;
    while ended < spec.n {
        let Some(p) = rx.recv().await else {
            return ApiError::internal("the engine ended the request without a result")
                .into_response();
        };
        match p {
            Piece::Out {
                index,
                content,
                reasoning,
                calls,
                logprobs,
            } => {
                if let Some(g) = choices.get_mut(index) {
                    g.content.push_str(&content);
                    g.reasoning.push_str(&reasoning);
                    g.calls.extend(calls);
                    g.logprobs.extend(logprobs);
                }
            }
            Piece::End {
                index,
                finish,
                completion,
                cached,
                timings,
                denoised,
                ..
            } => {
                if let Some(g) = choices.get_mut(index) {
                    g.denoised = denoised;
                    g.timings = Some(timings);
                    g.finish = Some(finish);
                    g.completion = completion;
                    g.cached = cached;
                    ended += 1;
                }
            }
            // Drafts are streamed only.
            Piece::Draft { .. } => {}
            Piece::Failed(e) => return ApiError::internal(e).into_response(),
        }
    }
    let completion: usize = choices.iter().map(|g| g.completion).sum();
    let denoised = choices
        .iter()
        .filter_map(|g| g.denoised)
        .reduce(Denoised::add);
    let cached = choices.iter().map(|g| g.cached).max().unwrap_or(0);
    let timings = choices.first().and_then(|g| g.timings).map(|t| t.json());
    let choices: Vec<Value> = choices
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let logprobs = match spec.logprobs {
                Some(_) => logprobs_json(kind, &g.logprobs, &mut 0),
                None => Value::Null,
            };
            let finish = g.finish.unwrap_or("stop");
            match kind {
                Kind::Text => json!({"index": i, "text": g.content, "logprobs": logprobs,
                                     "finish_reason": finish}),
                Kind::Chat => {
                    let mut msg = json!({"role": "assistant", "content": g.content});
                    if !g.calls.is_empty() {
                        msg["tool_calls"] = tool_calls_json(&g.calls, &id, i);
                        if g.content.trim().is_empty() {
                            msg["content"] = Value::Null;
                        }
                    }
                    if !g.reasoning.is_empty() {
                        msg["reasoning_content"] = Value::String(g.reasoning.clone());
                    }
                    json!({"index": i, "message": msg, "logprobs": logprobs,
                           "finish_reason": finish})
                }
            }
        })
        .collect();
    let object = match kind {
        Kind::Chat => "chat.completion",
        Kind::Text => "text_completion",
    };
    let mut body = json!({"id": id, "object": object, "created": now(), "model": state.model,
        "choices": choices, "usage": usage(spec.prompt.len(), completion, cached, denoised),
        "timings": timings});
    if spec.return_token_ids {
        body["prompt_token_ids"] = json!(spec.prompt);
    }
    Json(body).into_response()
}

/// The SSE response: a role chunk per chat choice, then a chunk per piece, a finishing chunk
/// per choice, the usage chunk when asked for, and `[DONE]`.
fn stream(state: Arc<AppState>, spec: GenSpec, rx: mpsc::Receiver<Piece>, id: String) -> Response {
    let kind = spec.kind;
    let model = state.model.clone();
    let created = now();
    let call_id = id.clone();
    let chunk = move |choices: Value| -> Value {
        let object = match kind {
            Kind::Text => "text_completion",
            Kind::Chat => "chat.completion.chunk",
        };
        json!({"id": id, "object": object, "created": created, "model": model,
               "choices": choices})
    };
    let first: Vec<String> = match kind {
        Kind::Chat => (0..spec.n)
            .map(|i| {
                chunk(
                    json!([{"index": i, "delta": {"role": "assistant", "content": ""},
                               "logprobs": null, "finish_reason": null}]),
                )
                .to_string()
            })
            .collect(),
        Kind::Text => Vec::new(),
    };
    struct St {
        rx: mpsc::Receiver<Piece>,
        ended: usize,
        completion: usize,
        cached: usize,
        denoised: Option<Denoised>,
        offsets: Vec<usize>,
        done: bool,
    }
    let n = spec.n;
    let include_usage = spec.include_usage;
    let want_lp = spec.logprobs.is_some();
    let prompt_len = spec.prompt.len();
    let st = St {
        rx,
        ended: 0,
        cached: 0,
        completion: 0,
        denoised: None,
        offsets: vec![0; n],
        done: false,
    };
    let body = futures_util::stream::unfold(st, move |mut st| {
        let chunk = chunk.clone();
        let call_id = call_id.clone();
        async move {
            if st.done {
                return None;
            }
            let out = match st.rx.recv().await {
                Some(Piece::Out {
                    index,
                    content,
                    reasoning,
                    calls,
                    logprobs,
                }) => {
                    let lp = match want_lp {
                        true => logprobs_json(kind, &logprobs, &mut st.offsets[index]),
                        false => Value::Null,
                    };
                    let choice = match kind {
                        Kind::Text => json!({"index": index, "text": content,
                                             "logprobs": lp, "finish_reason": null}),
                        Kind::Chat => {
                            let mut delta = json!({});
                            if !content.is_empty() {
                                delta["content"] = Value::String(content);
                            }
                            if !reasoning.is_empty() {
                                delta["reasoning_content"] = Value::String(reasoning);
                            }
                            if !calls.is_empty() {
                                delta["tool_calls"] = tool_calls_json(&calls, &call_id, index);
                            }
                            json!({"index": index, "delta": delta, "logprobs": lp,
                                   "finish_reason": null})
                        }
                    };
                    vec![chunk(json!([choice])).to_string()]
                }
                Some(Piece::End {
                    index,
                    finish,
                    completion,
                    cached,
                    denoised,
                    ..
                }) => {
                    st.ended += 1;
                    st.completion += completion;
                    st.cached = st.cached.max(cached);
                    st.denoised = match (st.denoised, denoised) {
                        (Some(a), Some(b)) => Some(a.add(b)),
                        (a, b) => a.or(b),
                    };
                    let empty = match kind {
                        Kind::Text => json!({"index": index, "text": "", "logprobs": null,
                                             "finish_reason": finish}),
                        Kind::Chat => json!({"index": index, "delta": {}, "logprobs": null,
                                             "finish_reason": finish}),
                    };
                    let mut v = vec![chunk(json!([empty])).to_string()];
                    if st.ended == n {
                        if include_usage {
                            let mut u = chunk(json!([]));
                            u["usage"] = usage(prompt_len, st.completion, st.cached, st.denoised);
                            v.push(u.to_string());
                        }
                        v.push("[DONE]".into());
                        st.done = true;
                    }
                    v
                }
                Some(Piece::Draft {
                    index,
                    canvas,
                    step,
                    text,
                }) => {
                    let draft = json!({"canvas": canvas, "step": step, "text": text});
                    let choice = match kind {
                        Kind::Text => json!({"index": index, "text": "", "logprobs": null,
                                             "finish_reason": null, "draft": draft}),
                        Kind::Chat => json!({"index": index, "delta": {}, "logprobs": null,
                                             "finish_reason": null, "draft": draft}),
                    };
                    vec![chunk(json!([choice])).to_string()]
                }
                Some(Piece::Failed(e)) => {
                    st.done = true;
                    vec![
                        json!({"error": {"message": e, "type": "server_error"}}).to_string(),
                        "[DONE]".into(),
                    ]
                }
                None => return None,
            };
            Some((out, st))
        }
    });
    let body = futures_util::StreamExt::chain(futures_util::stream::iter(vec![first]), body);
    let events = futures_util::StreamExt::flat_map(body, |v| {
        futures_util::stream::iter(
            v.into_iter()
                .map(|d| Ok::<_, Infallible>(SseEvent::default().data(d))),
        )
    });
    Sse::new(events).into_response()
}

/// A few bits that differ between requests, for response ids.
pub(super) fn rand_bits() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

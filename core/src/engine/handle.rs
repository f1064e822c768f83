//! A batching engine on a thread of its own ([`spawn`]): requests reach it over a channel,
//! numbered by the [`EngineHandle`] so that dropping a request's guard can cancel it by id; a
//! panic inside a step fails that step's requests, not the engine.

use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::sync::Arc;
use std::thread::JoinHandle;

use super::batching::{Engine, EngineStats, Snapshot};
use super::request::{Event, EventSink, GenRequest};
use crate::error::Error;
use crate::runner::embed::Pooling;
use crate::sched::ReqId;

/// A spawned engine's requests, numbered by its handle.
struct Submit(ReqId, GenRequest, Box<dyn EventSink>);

/// What the engine thread is sent.
enum Cmd {
    Generate(Submit),
    /// Tokens to embed under an id, and where the vector goes.
    Embed(
        ReqId,
        Vec<u32>,
        Pooling,
        Sender<crate::error::Result<Vec<f32>>>,
    ),
}

/// An embedding's events as the one result its caller waits for.
struct EmbedReply(Sender<crate::error::Result<Vec<f32>>>);

impl EventSink for EmbedReply {
    fn send(&mut self, ev: Event) -> bool {
        match ev {
            Event::Embedding(v) => self.0.send(Ok(v)).is_ok(),
            Event::Error(e) => self.0.send(Err(Error::Model(e))).is_ok(),
            _ => true,
        }
    }
}

/// Cancels its request at the engine's next step when dropped ([`EngineHandle::submit_to`]):
/// the id goes to the engine, which finds the request by it (no scan over the requests).
pub struct CancelOnDrop {
    id: ReqId,
    cancel: Option<Sender<ReqId>>,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(c) = &self.cancel {
            // An engine that has stopped has nothing left to cancel.
            let _ = c.send(self.id);
        }
    }
}

/// A request's events, as [`EngineHandle::submit`] returns them (it dereferences to the
/// receiver). Dropping it cancels the request at the engine's next step, whether it is
/// queued, prefilling or decoding.
pub struct Stream {
    rx: Receiver<Event>,
    _cancel: CancelOnDrop,
}

impl std::ops::Deref for Stream {
    type Target = Receiver<Event>;
    fn deref(&self) -> &Receiver<Event> {
        &self.rx
    }
}

/// An engine running on its own thread. Dropping the handle stops the thread after the
/// requests in flight end.
pub struct EngineHandle {
    tx: Option<Sender<Cmd>>,
    cancel: Sender<ReqId>,
    next_id: std::sync::atomic::AtomicU64,
    thread: Option<JoinHandle<EngineStats>>,
    snapshot: std::sync::Arc<std::sync::Mutex<Snapshot>>,
}

/// Starts `engine` on a thread of its own.
pub fn spawn(mut engine: Engine) -> EngineHandle {
    let (tx, rx) = mpsc::channel::<Cmd>();
    let (cancel, cancels) = mpsc::channel::<ReqId>();
    let snapshot = Arc::new(std::sync::Mutex::new(engine.snapshot()));
    engine.published = Some(snapshot.clone());
    let next_id = std::sync::atomic::AtomicU64::new(engine.next_id);
    let thread = std::thread::Builder::new()
        .name("kiln-engine".into())
        .spawn(move || {
            serve(&mut engine, &rx, &cancels);
            engine.stats.clone()
        })
        .ok();
    EngineHandle {
        tx: Some(tx),
        cancel,
        next_id,
        thread,
        snapshot,
    }
}

fn accept(engine: &mut Engine, cmd: Cmd) {
    let Submit(id, req, mut out) = match cmd {
        Cmd::Generate(s) => s,
        Cmd::Embed(id, tokens, pooling, reply) => {
            let sink = Box::new(EmbedReply(reply.clone()));
            if let Err(e) = engine.submit_embedding(id, &tokens, pooling, sink) {
                let _ = reply.send(Err(e));
            }
            return;
        }
    };
    let ok = match engine.active.contains_key(&id) {
        true => Err(Error::Model(format!("request id {id} is in use"))),
        false => engine.check(&req),
    };
    match ok {
        Ok(()) => {
            if let Err(e) = engine.submit_as(id, req, out) {
                tracing::warn!("a checked request was refused: {e}");
            }
        }
        Err(e) => {
            out.send(Event::Error(e.to_string()));
        }
    }
}

/// The engine thread: take requests (blocking only when idle), then step.
fn serve(engine: &mut Engine, rx: &Receiver<Cmd>, cancels: &Receiver<ReqId>) {
    let mut open = true;
    loop {
        engine.publish();
        if engine.is_idle() {
            if !open {
                return;
            }
            match rx.recv() {
                Ok(cmd) => {
                    // Idle time is not a stall.
                    engine.last_step = crate::time::Instant::now();
                    accept(engine, cmd)
                }
                Err(_) => return,
            }
        }
        while open {
            match rx.try_recv() {
                Ok(cmd) => accept(engine, cmd),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => open = false,
            }
        }
        // After the submissions: a request cancelled at once is known by now.
        for id in cancels.try_iter() {
            if let Err(e) = engine.cancel(id) {
                tracing::warn!("cancelling request {id}: {e}");
            }
        }
        // Watchers see the requests just taken before a step that may be long.
        engine.publish();
        // A panic inside a step (a model or kernel bug) fails the requests of that step, not
        // the engine: the queued ones and later requests are still served.
        let step = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| engine.step()));
        let failure = match step {
            Ok(Ok(_)) => None,
            Ok(Err(e)) => Some((format!("engine error: {e}"), false)),
            Err(panic) => {
                let msg = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a panic".into());
                Some((format!("engine step panicked: {msg}"), true))
            }
        };
        if let Some((msg, running_only)) = failure {
            tracing::error!("{msg}");
            let ids: Vec<ReqId> = if running_only {
                engine.sched.running().map(|s| s.id).collect()
            } else {
                engine.active.keys().copied().collect()
            };
            for id in ids {
                let _ = engine.fail(id, msg.clone());
            }
        }
    }
}

impl EngineHandle {
    /// Sends a request to the engine under a fresh id; a stopped engine hands the sink back.
    fn send(
        &self,
        req: GenRequest,
        sink: Box<dyn EventSink>,
    ) -> std::result::Result<ReqId, Box<dyn EventSink>> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        match &self.tx {
            Some(t) => match t.send(Cmd::Generate(Submit(id, req, sink))) {
                Ok(()) => Ok(id),
                Err(mpsc::SendError(Cmd::Generate(Submit(_, _, sink)))) => Err(sink),
                Err(_) => unreachable!("a generation request comes back as one"),
            },
            None => Err(sink),
        }
    }

    fn guard(&self, id: Option<ReqId>) -> CancelOnDrop {
        CancelOnDrop {
            id: id.unwrap_or(0),
            cancel: id.map(|_| self.cancel.clone()),
        }
    }

    /// Queues a request; its events arrive on the returned stream. Dropping the stream
    /// cancels the request at the engine's next step.
    pub fn submit(&self, req: GenRequest) -> Stream {
        let (tx, rx) = mpsc::channel();
        let id = match self.send(req, Box::new(tx)) {
            Ok(id) => Some(id),
            Err(mut sink) => {
                sink.send(Event::Error("the engine has stopped".into()));
                None
            }
        };
        Stream {
            rx,
            _cancel: self.guard(id),
        }
    }

    /// Queues a request whose events go to `sink` (which the engine never blocks on).
    /// Dropping the returned guard cancels the request at the engine's next step.
    pub fn submit_to(&self, req: GenRequest, sink: Box<dyn EventSink>) -> CancelOnDrop {
        let id = match self.send(req, sink) {
            Ok(id) => Some(id),
            Err(mut sink) => {
                sink.send(Event::Error("the engine has stopped".into()));
                None
            }
        };
        self.guard(id)
    }

    /// The embedding of `tokens` (scheduled by the engine like any request's prompt, beside
    /// the others); a receiver of the result, so an async caller can wait without blocking.
    /// Dropping the receiver does not cancel it (an embedding is one prefill).
    pub fn embed(
        &self,
        tokens: Vec<u32>,
        pooling: Pooling,
    ) -> Receiver<crate::error::Result<Vec<f32>>> {
        let (reply, rx) = mpsc::channel();
        let sent = self.tx.as_ref().is_some_and(|t| {
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            t.send(Cmd::Embed(id, tokens, pooling, reply.clone()))
                .is_ok()
        });
        if !sent {
            let _ = reply.send(Err(Error::Model("the engine has stopped".into())));
        }
        rx
    }

    /// Whether the engine thread is still running (it ends only on shutdown, or on a panic).
    pub fn is_alive(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| !t.is_finished())
    }

    /// The engine's state after its latest step.
    pub fn snapshot(&self) -> Snapshot {
        self.snapshot.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Stops taking requests, waits for those in flight, and returns the engine's counters.
    pub fn shutdown(mut self) -> Option<EngineStats> {
        self.tx = None;
        self.thread.take().and_then(|t| t.join().ok())
    }
}

impl Drop for EngineHandle {
    fn drop(&mut self) {
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

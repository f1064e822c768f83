//! Chat templates rendered in child processes, where a template that loops or grows without
//! end costs a killed child and a 400, never the server.
//!
//! A small helper process (the *zygote*) is forked once — by `kiln serve` at its start,
//! before it has threads or a model in memory ([`start`]); otherwise on first use. The
//! zygote never runs a template: for each render it forks a child that sets its own memory
//! limit (`RLIMIT_AS`: its address space at the fork plus [`RenderLimits::max_memory`]) and
//! a CPU-time backstop, compiles and renders the template with fuel and an output cap, writes
//! the result to a pipe and exits. The zygote waits on the children's pipes with `poll`,
//! kills a child at its deadline or when the caller cancels, and answers the server over
//! one pipe; renders run side by side. A child that dies (out of memory: an allocation
//! fails and it aborts) is a memory-limit answer; nothing it did reaches the server.
//!
//! Frames on the pipes are `u64 job id, u8 kind, u32 length, bytes`, little-endian.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{FromRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use super::limits::{Limit, RenderError, RenderLimits};

/// Requests to the zygote.
const RENDER: u8 = 1;
const CANCEL: u8 = 2;
/// Answers (and the first byte of a child's output).
const OK: u8 = 0;
const TEMPLATE: u8 = 1;
const LIMIT: u8 = 2;
const FAILED: u8 = 3;

/// The largest frame either side accepts beyond a render's own output cap.
const SLACK: usize = 64 << 10;
/// The largest output cap a render may have (its answer's length is a u32).
const MAX_OUTPUT: usize = 1 << 30;

/// Renders waiting for their answer, by job id: the channel the answer goes to.
type Pending = Arc<Mutex<HashMap<u64, mpsc::Sender<(u8, Vec<u8>)>>>>;

/// The server's handle on the zygote.
struct Zygote {
    pid: libc::pid_t,
    to: Mutex<File>,
    pending: Pending,
    alive: Arc<AtomicBool>,
    next: AtomicU64,
}

static ZYGOTE: Mutex<Option<Arc<Zygote>>> = Mutex::new(None);

impl Zygote {
    /// Writes `bytes` to the zygote by `deadline` (the pipe is non-blocking: a zygote that
    /// stops reading cannot hold the caller); false if it could not.
    fn send(&self, bytes: &[u8], deadline: Instant) -> bool {
        use std::os::fd::AsRawFd;
        let to = lock(&self.to);
        let fd = to.as_raw_fd();
        let mut off = 0;
        while off < bytes.len() {
            let rest = &bytes[off..];
            // SAFETY: writing from a live buffer of the length given to our own pipe.
            let n = unsafe { libc::write(fd, rest.as_ptr().cast(), rest.len()) };
            if n > 0 {
                off += n as usize;
                continue;
            }
            match std::io::Error::last_os_error().kind() {
                std::io::ErrorKind::Interrupted => {}
                std::io::ErrorKind::WouldBlock => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return false;
                    }
                    let mut p = libc::pollfd {
                        fd,
                        events: libc::POLLOUT,
                        revents: 0,
                    };
                    // SAFETY: one valid pollfd.
                    unsafe {
                        libc::poll(&mut p, 1, left.as_millis().min(1000) as libc::c_int + 1);
                    }
                }
                _ => return false,
            }
        }
        true
    }

    /// Ends a zygote that is stuck or whose request stream broke (a frame half written); the
    /// next render forks a fresh one.
    fn stop(&self) {
        self.alive.store(false, Ordering::Release);
        // SAFETY: our own child, reaped only by its reader thread once its pipe closes, so
        // its pid is not reused before this.
        unsafe {
            libc::kill(self.pid, libc::SIGKILL);
        }
    }
}

/// Forks the zygote now, if it is not running. Call it early — before threads start and
/// before large allocations, so that the zygote (and every child) is small and shares
/// nothing else with the server.
pub fn start() -> Result<(), String> {
    get().map(|_| ())
}

fn get() -> Result<Arc<Zygote>, String> {
    let mut z = ZYGOTE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(z) = z.as_ref().filter(|z| z.alive.load(Ordering::Acquire)) {
        return Ok(z.clone());
    }
    if z.is_some() {
        tracing::warn!("the template sandbox stopped; starting it again");
    }
    let fresh = Arc::new(spawn()?);
    *z = Some(fresh.clone());
    Ok(fresh)
}

fn frame(id: u64, kind: u8, body: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(13 + body.len());
    f.extend_from_slice(&id.to_le_bytes());
    f.push(kind);
    f.extend_from_slice(&(body.len() as u32).to_le_bytes());
    f.extend_from_slice(body);
    f
}

/// Reads one frame; `None` at end of file, on an error, or when it is longer than `max`.
fn read_frame(r: &mut impl Read, max: usize) -> Option<(u64, u8, Vec<u8>)> {
    let mut head = [0u8; 13];
    r.read_exact(&mut head).ok()?;
    let id = u64::from_le_bytes(head[..8].try_into().ok()?);
    let len = u32::from_le_bytes(head[9..13].try_into().ok()?) as usize;
    if len > max {
        return None;
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).ok()?;
    Some((id, head[8], body))
}

/// Renders `source` over `ctx` in a sandboxed child within `limits`; `cancelled` is asked
/// every few milliseconds and stops the child when it says so.
pub fn render(
    source: &str,
    ctx: &serde_json::Value,
    limits: &RenderLimits,
    cancelled: &dyn Fn() -> bool,
) -> Result<String, RenderError> {
    let z = get().map_err(RenderError::Sandbox)?;
    // Answers are framed with a u32 length.
    let limits = &RenderLimits {
        max_output: limits.max_output.min(MAX_OUTPUT),
        ..*limits
    };
    let ctx = serde_json::to_vec(ctx).map_err(|e| RenderError::Sandbox(e.to_string()))?;
    let mut job = Vec::with_capacity(40 + source.len() + ctx.len());
    job.extend_from_slice(&limits.fuel.to_le_bytes());
    job.extend_from_slice(&(limits.max_output as u64).to_le_bytes());
    job.extend_from_slice(&(limits.max_memory as u64).to_le_bytes());
    job.extend_from_slice(&(limits.timeout.as_millis() as u64).to_le_bytes());
    job.extend_from_slice(&(source.len() as u64).to_le_bytes());
    job.extend_from_slice(source.as_bytes());
    job.extend_from_slice(&ctx);
    if job.len() > u32::MAX as usize {
        return Err(RenderError::Limit(
            Limit::Output,
            "the conversation is too large to render".into(),
        ));
    }
    let id = z.next.fetch_add(1, Ordering::Relaxed);
    let (tx, rx) = mpsc::channel();
    lock(&z.pending).insert(id, tx);
    let t0 = Instant::now();
    // The zygote answers at the deadline; past it by this much, it is not answering.
    let give_up = limits.timeout + Duration::from_secs(5);
    if !z.send(&frame(id, RENDER, &job), t0 + give_up) {
        lock(&z.pending).remove(&id);
        z.stop();
        return Err(RenderError::Sandbox(
            "the sandbox process does not take requests".into(),
        ));
    }
    loop {
        match rx.recv_timeout(Duration::from_millis(5)) {
            Ok((kind, body)) => return answer(kind, body, limits),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if t0.elapsed() > give_up {
                    lock(&z.pending).remove(&id);
                    z.stop();
                    return Err(RenderError::Sandbox(
                        "the sandbox process does not answer".into(),
                    ));
                }
                if cancelled() {
                    lock(&z.pending).remove(&id);
                    let by = Instant::now() + Duration::from_secs(5);
                    if !z.send(&frame(id, CANCEL, &[]), by) {
                        z.stop();
                    }
                    return Err(RenderError::Cancelled);
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(RenderError::Sandbox("the sandbox process stopped".into()))
            }
        }
    }
}

/// Compiles `source` in a sandboxed child within `limits` (minijinja folds constant
/// expressions as it compiles, so compiling untrusted source can take any amount of memory).
pub fn compile_check(source: &str, limits: &RenderLimits) -> Result<(), RenderError> {
    render(source, &serde_json::Value::Null, limits, &|| false).map(|_| ())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn answer(kind: u8, body: Vec<u8>, limits: &RenderLimits) -> Result<String, RenderError> {
    let text = |b: Vec<u8>| String::from_utf8_lossy(&b).into_owned();
    match kind {
        OK => String::from_utf8(body)
            .map_err(|_| RenderError::Template("chat template: output is not UTF-8".into())),
        TEMPLATE => Err(RenderError::Template(text(body))),
        LIMIT => {
            let l = body
                .first()
                .and_then(|&c| Limit::from_code(c))
                .unwrap_or(Limit::Memory);
            Err(RenderError::Limit(l, l.describe(limits)))
        }
        _ => Err(RenderError::Sandbox(text(body))),
    }
}

/// Forks the zygote and starts the thread that reads its answers.
fn spawn() -> Result<Zygote, String> {
    let (to_z_read, to_z_write) = pipe()?;
    let (from_z_read, from_z_write) = pipe()?;
    // SAFETY: the child runs only `zygote`, which keeps to async-signal-safe calls and the
    // allocator (fork-safe in glibc and the BSD libcs: they reset the allocator's locks in
    // the child); it never returns.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(format!("fork: {}", std::io::Error::last_os_error()));
    }
    if pid == 0 {
        // SAFETY: closing the parent's ends in the child.
        unsafe {
            libc::close(to_z_write);
            libc::close(from_z_read);
        }
        // A panic must not unwind into the copy of the server's stack.
        let _ = std::panic::catch_unwind(|| zygote(to_z_read, from_z_write));
        // SAFETY: ending the forked process without running the server's exit handlers.
        unsafe { libc::_exit(1) }
    }
    // SAFETY: the parent owns these descriptors from here on; its requests are written
    // without blocking (`Zygote::send`).
    let (to, from) = unsafe {
        libc::close(to_z_read);
        libc::close(from_z_write);
        let flags = libc::fcntl(to_z_write, libc::F_GETFL);
        libc::fcntl(to_z_write, libc::F_SETFL, flags | libc::O_NONBLOCK);
        (
            File::from_raw_fd(to_z_write),
            File::from_raw_fd(from_z_read),
        )
    };
    let pending: Pending = Arc::default();
    let alive = Arc::new(AtomicBool::new(true));
    let (p, a) = (pending.clone(), alive.clone());
    std::thread::Builder::new()
        .name("kiln-template-sandbox".into())
        .spawn(move || {
            let mut from = std::io::BufReader::new(from);
            while let Some((id, kind, body)) = read_frame(&mut from, usize::MAX >> 1) {
                if let Some(tx) = lock(&p).remove(&id) {
                    let _ = tx.send((kind, body));
                }
            }
            a.store(false, Ordering::Release);
            lock(&p).clear();
            // Reap the zygote.
            // SAFETY: waiting on our own child.
            unsafe {
                libc::waitpid(pid, std::ptr::null_mut(), 0);
            }
        })
        .map_err(|e| format!("sandbox reader thread: {e}"))?;
    Ok(Zygote {
        pid,
        to: Mutex::new(to),
        pending,
        alive,
        next: AtomicU64::new(1),
    })
}

/// A pipe whose ends close on `exec` (no program the server starts inherits them).
fn pipe() -> Result<(RawFd, RawFd), String> {
    let mut fds = [0 as RawFd; 2];
    // Atomically close-on-exec where the system can (no window for a concurrent exec).
    #[cfg(any(target_os = "linux", target_os = "android", target_os = "freebsd"))]
    // SAFETY: `fds` is a valid out-array of two descriptors.
    let r = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    #[cfg(not(any(target_os = "linux", target_os = "android", target_os = "freebsd")))]
    // SAFETY: as above; the flag is set right after.
    let r = unsafe {
        let r = libc::pipe(fds.as_mut_ptr());
        if r == 0 {
            for fd in fds {
                libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
            }
        }
        r
    };
    if r != 0 {
        return Err(format!("pipe: {}", std::io::Error::last_os_error()));
    }
    Ok((fds[0], fds[1]))
}

/// One render the zygote is running.
struct Job {
    pid: libc::pid_t,
    /// The read end of the child's output pipe.
    fd: RawFd,
    out: Vec<u8>,
    cap: usize,
    deadline: Instant,
}

/// Closes every descriptor but `keep` and the standard ones (the server's sockets and
/// model files are not the zygote's to hold).
fn close_others(keep: &[RawFd]) {
    let listed: Option<Vec<RawFd>> = std::fs::read_dir("/proc/self/fd").ok().map(|d| {
        d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .collect()
    });
    let all = listed.unwrap_or_else(|| (3..4096).collect());
    for fd in all {
        if fd > 2 && !keep.contains(&fd) {
            // SAFETY: closing a descriptor this process no longer uses.
            unsafe {
                libc::close(fd);
            }
        }
    }
}

/// The zygote's loop: forks a child per render and relays its answer.
fn zygote(cmd: RawFd, answers: RawFd) -> ! {
    close_others(&[cmd, answers]);
    // No core files: a child killed at its memory or CPU limit would write one per render.
    let none = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a limit on this process (inherited by its children).
    unsafe {
        libc::setrlimit(libc::RLIMIT_CORE, &none);
    }
    // SAFETY: the descriptors are ours (kept open above).
    let (mut cmd_file, mut out) = unsafe { (File::from_raw_fd(cmd), File::from_raw_fd(answers)) };
    let mut jobs: HashMap<u64, Job> = HashMap::new();
    let reply = |out: &mut File, id: u64, kind: u8, body: &[u8]| {
        if out.write_all(&frame(id, kind, body)).is_err() {
            // The server is gone.
            // SAFETY: ending the process.
            unsafe { libc::_exit(0) }
        }
    };
    loop {
        let now = Instant::now();
        let wait = jobs
            .values()
            .map(|j| j.deadline.saturating_duration_since(now))
            .min()
            .unwrap_or(Duration::from_secs(60))
            .min(Duration::from_secs(60));
        let ids: Vec<u64> = jobs.keys().copied().collect();
        let mut fds: Vec<libc::pollfd> = std::iter::once(cmd)
            .chain(ids.iter().map(|id| jobs[id].fd))
            .map(|fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // SAFETY: `fds` is a valid array of pollfd of the length given.
        let n = unsafe {
            libc::poll(
                fds.as_mut_ptr(),
                fds.len() as libc::nfds_t,
                wait.as_millis().min(60_000) as libc::c_int + 1,
            )
        };
        if n < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            kill_all(&mut jobs);
            // SAFETY: ending the process.
            unsafe { libc::_exit(1) }
        }
        if fds[0].revents != 0 {
            match read_frame(&mut cmd_file, usize::MAX >> 1) {
                None => {
                    // The server closed its end: it has exited.
                    kill_all(&mut jobs);
                    // SAFETY: ending the process.
                    unsafe { libc::_exit(0) }
                }
                Some((id, RENDER, body)) => match fork_child(&body, cmd, answers, &jobs) {
                    Ok(job) => {
                        jobs.insert(id, job);
                    }
                    Err(e) => reply(&mut out, id, FAILED, e.as_bytes()),
                },
                Some((id, CANCEL, _)) => {
                    if let Some(j) = jobs.remove(&id) {
                        kill(&j);
                    }
                }
                Some(_) => {}
            }
        }
        for (k, id) in ids.iter().enumerate() {
            let ready = fds[k + 1].revents != 0;
            let Some(j) = jobs.get_mut(id) else { continue };
            if ready {
                let mut buf = [0u8; 65536];
                // SAFETY: reading into a buffer of the length given.
                let got = unsafe { libc::read(j.fd, buf.as_mut_ptr().cast(), buf.len()) };
                if got > 0 {
                    j.out.extend_from_slice(&buf[..got as usize]);
                    if j.out.len() > j.cap.saturating_add(SLACK) {
                        if let Some(j) = jobs.remove(id) {
                            kill(&j);
                        }
                        reply(&mut out, *id, LIMIT, &[Limit::Output.code()]);
                    }
                    continue;
                }
                if got < 0
                    && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
                {
                    continue;
                }
                // End of the child's output: it has finished or died.
                let Some(j) = jobs.remove(id) else { continue };
                let status = reap(&j);
                let (kind, body) = finished(status, &j.out);
                reply(&mut out, *id, kind, body);
            }
        }
        let now = Instant::now();
        let late: Vec<u64> = jobs
            .iter()
            .filter(|(_, j)| now >= j.deadline)
            .map(|(id, _)| *id)
            .collect();
        for id in late {
            if let Some(j) = jobs.remove(&id) {
                kill(&j);
            }
            reply(&mut out, id, LIMIT, &[Limit::Time.code()]);
        }
    }
}

/// What a finished child's exit status and output say.
fn finished(status: libc::c_int, out: &[u8]) -> (u8, &[u8]) {
    let exited_ok = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
    match out.split_first() {
        Some((&k, rest)) if exited_ok && matches!(k, OK | TEMPLATE | LIMIT) => (k, rest),
        _ if libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGXCPU => (LIMIT, &[3]),
        // Killed by an abort (an allocation over its memory limit) or a fault.
        _ => (LIMIT, &[2]),
    }
}

fn kill(j: &Job) {
    // SAFETY: the child is ours and not yet reaped, so its pid is still its own.
    unsafe {
        libc::kill(j.pid, libc::SIGKILL);
    }
    reap(j);
}

fn kill_all(jobs: &mut HashMap<u64, Job>) {
    for (_, j) in jobs.drain() {
        kill(&j);
    }
}

/// Waits for the child and closes its pipe; its exit status.
fn reap(j: &Job) -> libc::c_int {
    let mut status = 0;
    // SAFETY: waiting on our own child; closing our end of its pipe.
    unsafe {
        while libc::waitpid(j.pid, &mut status, 0) < 0
            && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
        {}
        libc::close(j.fd);
    }
    status
}

/// The little-endian u64 at `at` of `b`.
fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// Forks the child for one render job (`body`: fuel, output cap, memory, timeout in ms,
/// source length, source, context JSON).
fn fork_child(
    body: &[u8],
    cmd: RawFd,
    answers: RawFd,
    jobs: &HashMap<u64, Job>,
) -> Result<Job, String> {
    let bad = || "a malformed render request".to_string();
    let limits = RenderLimits {
        fuel: u64_at(body, 0).ok_or_else(bad)?,
        max_output: u64_at(body, 8).ok_or_else(bad)? as usize,
        max_memory: u64_at(body, 16).ok_or_else(bad)? as usize,
        timeout: Duration::from_millis(u64_at(body, 24).ok_or_else(bad)?),
    };
    let src_len = u64_at(body, 32).ok_or_else(bad)? as usize;
    let rest = body.get(40..).ok_or_else(bad)?;
    if src_len > rest.len() {
        return Err(bad());
    }
    let (read_end, write_end) = pipe()?;
    // SAFETY: the child below runs only the render and `_exit`s; the zygote is
    // single-threaded, so nothing is held by another thread at the fork.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        let e = std::io::Error::last_os_error();
        // SAFETY: closing the pipe we just made.
        unsafe {
            libc::close(read_end);
            libc::close(write_end);
        }
        return Err(format!("fork: {e}"));
    }
    if pid == 0 {
        // SAFETY: in the child: dropping descriptors that are not its own.
        unsafe {
            libc::close(read_end);
            libc::close(cmd);
            libc::close(answers);
            for j in jobs.values() {
                libc::close(j.fd);
            }
        }
        child(write_end, &rest[..src_len], &rest[src_len..], &limits);
    }
    // SAFETY: the write end is the child's.
    unsafe {
        libc::close(write_end);
    }
    Ok(Job {
        pid,
        fd: read_end,
        out: Vec::new(),
        cap: limits.max_output,
        deadline: Instant::now() + limits.timeout,
    })
}

/// The render child: limits itself, renders, writes `kind, bytes` and exits.
fn child(fd: RawFd, source: &[u8], ctx: &[u8], limits: &RenderLimits) -> ! {
    // SAFETY: standard error to /dev/null (an allocation failure prints there before the
    // abort); limits on this process only.
    unsafe {
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_WRONLY);
        if null >= 0 {
            libc::dup2(null, 2);
            libc::close(null);
        }
        let cpu = limits.timeout.as_secs() + 2;
        let r = libc::rlimit {
            rlim_cur: cpu as libc::rlim_t,
            rlim_max: cpu as libc::rlim_t + 1,
        };
        libc::setrlimit(libc::RLIMIT_CPU, &r);
        if let Some(now) = address_space() {
            let cap = now.saturating_add(limits.max_memory) as libc::rlim_t;
            let r = libc::rlimit {
                rlim_cur: cap,
                rlim_max: cap,
            };
            libc::setrlimit(libc::RLIMIT_AS, &r);
        }
    }
    let result = std::panic::catch_unwind(|| {
        let source = std::str::from_utf8(source)
            .map_err(|_| RenderError::Template("chat template: not UTF-8".into()))?;
        let ctx: serde_json::Value = serde_json::from_slice(ctx)
            .map_err(|e| RenderError::Sandbox(format!("render request: {e}")))?;
        super::render_source(source, &ctx, limits)
    });
    let msg = match result {
        Ok(Ok(text)) => [&[OK][..], text.as_bytes()].concat(),
        Ok(Err(RenderError::Limit(l, _))) => vec![LIMIT, l.code()],
        Ok(Err(e)) => [&[TEMPLATE][..], e.to_string().as_bytes()].concat(),
        Err(_) => [&[TEMPLATE][..], b"chat template: the renderer failed on it"].concat(),
    };
    // SAFETY: the write end is this process's; `_exit` skips the server's exit handlers.
    unsafe {
        let mut f = File::from_raw_fd(fd);
        let code = if f.write_all(&msg).is_ok() { 0 } else { 1 };
        libc::_exit(code)
    }
}

/// This process's address-space size in bytes (Linux: `/proc/self/statm`), so the memory
/// limit counts only what the render adds.
fn address_space() -> Option<usize> {
    let s = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: usize = s.split_whitespace().next()?.parse().ok()?;
    // SAFETY: a read-only query.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages.saturating_mul(usize::try_from(page).ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One test at a time: one of them kills the zygote the others share.
    static ONE: Mutex<()> = Mutex::new(());

    fn ctx() -> serde_json::Value {
        serde_json::json!({"messages": [{"role": "user", "content": "hi"}]})
    }

    #[test]
    fn a_template_renders_in_the_sandbox() {
        let _one = lock(&ONE);
        let l = RenderLimits::default();
        let out = render(
            "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}",
            &ctx(),
            &l,
            &|| false,
        );
        assert_eq!(out, Ok("<user>hi".to_string()));
        let e = render("{{ raise_exception('nope') }}", &ctx(), &l, &|| false).unwrap_err();
        assert!(
            matches!(&e, RenderError::Template(m) if m.contains("nope")),
            "{e:?}"
        );
    }

    #[test]
    fn growth_loops_and_cancellation_end_in_their_limits() {
        let _one = lock(&ONE);
        let l = RenderLimits {
            fuel: 2_000_000,
            max_memory: 64 << 20,
            timeout: Duration::from_secs(2),
            ..RenderLimits::default()
        };
        // A string doubled 40 times: the memory limit, long before 2^40 bytes.
        let grow = "{% set s = namespace(v='ab') %}{% for i in range(40) %}{% set s.v = s.v ~ s.v %}{% endfor %}{{ s.v | length }}";
        let t = Instant::now();
        let e = render(grow, &ctx(), &l, &|| false).unwrap_err();
        // On a loaded machine the clock can come first; either bounds it.
        assert!(
            matches!(e, RenderError::Limit(Limit::Memory | Limit::Time, _)),
            "{e:?}"
        );
        assert!(t.elapsed() < Duration::from_secs(10));
        // Nested loops: the fuel limit.
        let spin =
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";
        let e = render(spin, &ctx(), &l, &|| false).unwrap_err();
        assert!(matches!(e, RenderError::Limit(Limit::Fuel, _)), "{e:?}");
        // With fuel to spare, the clock.
        let unfuelled = RenderLimits {
            fuel: u64::MAX >> 2,
            timeout: Duration::from_millis(500),
            ..l
        };
        let t = Instant::now();
        let e = render(spin, &ctx(), &unfuelled, &|| false).unwrap_err();
        assert!(matches!(e, RenderError::Limit(Limit::Time, _)), "{e:?}");
        assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
        // Cancelled by its caller.
        let t = Instant::now();
        let e = render(spin, &ctx(), &unfuelled, &|| {
            t.elapsed() > Duration::from_millis(100)
        })
        .unwrap_err();
        assert_eq!(e, RenderError::Cancelled);
        // The sandbox still renders.
        assert_eq!(render("ok", &ctx(), &l, &|| false), Ok("ok".into()));
    }

    #[test]
    fn constant_folding_is_compiled_in_the_sandbox() {
        let _one = lock(&ONE);
        let l = RenderLimits {
            max_memory: 256 << 20,
            ..RenderLimits::default()
        };
        // 100 MB folded at compile time, doubled three times: 800 MB before any render.
        let a = "('x' * 100000000)";
        let b = format!("({a} ~ {a})");
        let c = format!("({b} ~ {b})");
        let d = format!("{{{{ ({c} ~ {c}) | length }}}}");
        let e = compile_check(&d, &l).unwrap_err();
        assert!(
            matches!(e, RenderError::Limit(Limit::Memory | Limit::Time, _)),
            "{e:?}"
        );
        assert_eq!(compile_check("{{ messages }}", &l), Ok(()));
        let e = compile_check("{% for %}", &l).unwrap_err();
        assert!(
            matches!(&e, RenderError::Template(m) if m.contains("does not compile")),
            "{e:?}"
        );
    }

    #[test]
    fn a_dead_zygote_is_replaced() {
        let _one = lock(&ONE);
        let l = RenderLimits::default();
        assert_eq!(render("a", &ctx(), &l, &|| false), Ok("a".into()));
        let z = get().expect("zygote");
        // SAFETY: killing the zygote this process forked.
        unsafe {
            libc::kill(z.pid, libc::SIGKILL);
        }
        let t = Instant::now();
        while z.alive.load(Ordering::Acquire) {
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "the death went unnoticed"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(render("b", &ctx(), &l, &|| false), Ok("b".into()));
        assert_ne!(get().expect("zygote").pid, z.pid);
        // A zygote that stops answering (stopped here) costs the render in flight a
        // "does not answer" after its deadline and five seconds; the next gets a fresh one.
        let z = get().expect("zygote");
        // SAFETY: stopping the zygote this process forked.
        unsafe {
            libc::kill(z.pid, libc::SIGSTOP);
        }
        let short = RenderLimits {
            timeout: Duration::from_millis(100),
            ..l
        };
        let t = Instant::now();
        let e = render("c", &ctx(), &short, &|| false).unwrap_err();
        assert!(
            matches!(&e, RenderError::Sandbox(m) if m.contains("answer")),
            "{e:?}"
        );
        assert!(t.elapsed() < Duration::from_secs(8), "{:?}", t.elapsed());
        assert_eq!(render("d", &ctx(), &l, &|| false), Ok("d".into()));
        assert_ne!(get().expect("zygote").pid, z.pid);
    }
}

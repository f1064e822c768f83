//! The CPU backend's worker pool: fork/join in about a microsecond.
//!
//! A decode step runs hundreds of small ops; each one splits its rows over the cores and joins
//! before the next can start. rayon's `install` from a thread outside its pool parks the caller
//! and wakes a worker through the OS for every op (tens of microseconds each). Here the caller
//! is worker 0, the other workers spin on a job counter for a while after each job (long
//! enough to span the gap between two ops) and only then sleep on a condition variable, so
//! back-to-back ops never touch the OS.
//!
//! Tasks are handed out dynamically (an atomic counter), so a core slowed by something else
//! on the machine takes fewer of them and both still finish together.

use std::cell::UnsafeCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::time::Instant;

/// How long an idle worker spins before it sleeps.
const SPIN: Duration = Duration::from_millis(2);

/// A job as the workers see it: a type-erased `&dyn Fn(usize)` valid while the job runs.
#[derive(Copy, Clone)]
struct JobRef {
    f: *const (dyn Fn(usize) + Sync),
    n_tasks: usize,
}

struct Shared {
    /// Bumped once per job; a worker runs each epoch it sees once.
    epoch: AtomicU64,
    job: UnsafeCell<Option<JobRef>>,
    /// Next task index to hand out.
    next: AtomicUsize,
    /// Workers (not counting the caller) still inside the current job.
    busy: AtomicUsize,
    /// Set when a task panicked; the caller re-raises it.
    panicked: AtomicBool,
    stop: AtomicBool,
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
}

// SAFETY: `job` is written only by the thread in `Pool::run` (which holds `run_lock`) before
// the epoch is bumped (SeqCst, so a release), and read by workers after they observe the new
// epoch with Acquire; the closure it points to is `Sync` and outlives
// the job because `run` waits for every worker to leave it before returning.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

/// A fixed set of worker threads plus the caller.
pub(crate) struct Pool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// Serialises `run` calls from different threads (the backend's gate normally does).
    run_lock: Mutex<()>,
}

impl Pool {
    /// A pool of `threads` threads in all: the caller and `threads - 1` workers (fewer if the
    /// OS refuses to start some; [`Pool::threads`] says how many run).
    pub fn new(threads: usize) -> Pool {
        let shared = Arc::new(Shared {
            epoch: AtomicU64::new(0),
            job: UnsafeCell::new(None),
            next: AtomicUsize::new(0),
            busy: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        });
        let mut workers = Vec::new();
        for i in 1..threads.max(1) {
            let s = shared.clone();
            match std::thread::Builder::new()
                .name(format!("kiln-cpu-{i}"))
                .spawn(move || worker(s))
            {
                Ok(h) => workers.push(h),
                Err(_) => break,
            }
        }
        Pool {
            shared,
            workers,
            run_lock: Mutex::new(()),
        }
    }

    /// Threads that run tasks: the workers and the caller.
    pub fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Runs `f(0) … f(n_tasks - 1)` over the pool's threads and returns when all are done.
    /// Each index runs exactly once. A panic in a task is re-raised here.
    pub fn run<F: Fn(usize) + Sync>(&self, n_tasks: usize, f: F) {
        if n_tasks == 0 {
            return;
        }
        if n_tasks == 1 || self.workers.is_empty() {
            for i in 0..n_tasks {
                f(i);
            }
            return;
        }
        let _g = self.run_lock.lock().unwrap_or_else(|p| p.into_inner());
        let s = &*self.shared;
        let f_dyn: &(dyn Fn(usize) + Sync) = &f;
        // SAFETY: the lifetime is erased only for the duration of this call: `run` does not
        // return before `busy` is back to 0, i.e. before every worker has stopped using `f`.
        let f_static: &'static (dyn Fn(usize) + Sync) = unsafe { std::mem::transmute(f_dyn) };
        unsafe {
            *s.job.get() = Some(JobRef {
                f: f_static,
                n_tasks,
            })
        };
        s.next.store(0, Ordering::Relaxed);
        s.busy.store(self.workers.len(), Ordering::Relaxed);
        s.epoch.fetch_add(1, Ordering::SeqCst);
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            let _l = s.lock.lock().unwrap_or_else(|p| p.into_inner());
            s.wake.notify_all();
        }
        let caller = catch_unwind(AssertUnwindSafe(|| take_tasks(s, &f, n_tasks)));
        let mut spins = 0u32;
        while s.busy.load(Ordering::Acquire) != 0 {
            backoff(&mut spins);
        }
        unsafe { *s.job.get() = None };
        if let Err(p) = caller {
            std::panic::resume_unwind(p);
        }
        if s.panicked.swap(false, Ordering::Relaxed) {
            panic!("a CPU worker task panicked");
        }
    }
}

thread_local! {
    /// The pool of the backend whose op is running on this thread, if any.
    static CURRENT: std::cell::Cell<*const Pool> = const { std::cell::Cell::new(std::ptr::null()) };
}

/// Makes `pool` (or none, for a null pointer) this thread's current pool until the returned
/// guard drops, which puts the previous one back.
fn set_current(pool: *const Pool) -> impl Drop {
    struct Restore(*const Pool);
    impl Drop for Restore {
        fn drop(&mut self) {
            CURRENT.with(|c| c.set(self.0));
        }
    }
    Restore(CURRENT.with(|c| c.replace(pool)))
}

/// Runs `f` with `pool` as this thread's current pool: [`par`] and [`par_ranges`] inside it
/// use it. Elsewhere (inside another pool's task, in tests) they run serially.
pub(crate) fn with_pool<R>(pool: &Pool, f: impl FnOnce() -> R) -> R {
    let _current = set_current(pool);
    f()
}

fn current<R>(f: impl FnOnce(Option<&Pool>) -> R) -> R {
    let p = CURRENT.with(|c| c.get());
    // SAFETY: `with_pool` sets the pointer only while it borrows the pool, and resets it
    // before returning.
    f(unsafe { p.as_ref() })
}

/// Threads the current pool runs tasks on (1 outside one).
pub(crate) fn threads() -> usize {
    current(|p| p.map_or(1, |p| p.threads()))
}

/// [`Pool::run`] on the current pool, or serially. Tasks must not start nested `par` work
/// expecting parallelism (it runs serially inside them).
pub(crate) fn par<F: Fn(usize) + Sync>(n_tasks: usize, f: F) {
    current(|p| match p {
        Some(p) => {
            // Inside the tasks no pool is current, so nested calls run serially.
            let _none = set_current(std::ptr::null());
            p.run(n_tasks, f)
        }
        None => (0..n_tasks).for_each(f),
    })
}

/// Splits `0..n` into about `per_thread` pieces per thread of the current pool, each a
/// multiple of `align` long (but the last), and runs `f(range)` for each; serially outside a pool.
pub(crate) fn par_ranges<F: Fn(std::ops::Range<usize>) + Sync>(
    n: usize,
    align: usize,
    per_thread: usize,
    f: F,
) {
    let t = threads();
    if t <= 1 {
        if n > 0 {
            f(0..n);
        }
        return;
    }
    let align = align.max(1);
    let units = n.div_ceil(align);
    let pieces = (t * per_thread.max(1)).clamp(1, units.max(1));
    let per = units.div_ceil(pieces) * align;
    let tasks = n.div_ceil(per.max(1));
    par(tasks, |i| {
        let lo = i * per;
        f(lo..(lo + per).min(n))
    });
}

/// Runs `f(first_row, rows)` over `y` in pieces of whole rows of `row` elements, in parallel
/// when `y` has at least `min_par` elements.
pub(crate) fn par_rows<T: Send, F: Fn(usize, &mut [T]) + Sync>(
    y: &mut [T],
    row: usize,
    min_par: usize,
    f: F,
) {
    par_rows_in(y, row, min_par, 2, f)
}

/// [`par_rows`] in about `per_thread` pieces per thread: more, smaller pieces for rows whose
/// costs differ (causal attention: a row costs its position), so the threads finish together.
pub(crate) fn par_rows_in<T: Send, F: Fn(usize, &mut [T]) + Sync>(
    y: &mut [T],
    row: usize,
    min_par: usize,
    per_thread: usize,
    f: F,
) {
    let row = row.max(1);
    let n = y.len() / row;
    if y.len() < min_par || threads() <= 1 {
        f(0, y);
        return;
    }
    let base = SendPtr(y.as_mut_ptr());
    par_ranges(n, 1, per_thread, |r| {
        let b = &base;
        // SAFETY: the ranges are disjoint, so each task gets its own rows of `y`.
        let part = unsafe { std::slice::from_raw_parts_mut(b.0.add(r.start * row), r.len() * row) };
        f(r.start, part)
    });
}

/// A raw pointer that tasks may share; each task touches only its own part.
pub(crate) struct SendPtr<T>(pub *mut T);
unsafe impl<T> Sync for SendPtr<T> {}
unsafe impl<T> Send for SendPtr<T> {}

/// One round of waiting: a pause instruction for the first few thousand rounds (a worker on
/// another core answers within that), then a yield to the OS scheduler each round, so that
/// when there are more busy threads than cores (tests in parallel, other programs) the thread
/// we wait for gets the core instead of us burning it.
#[inline]
fn backoff(spins: &mut u32) {
    *spins = spins.wrapping_add(1);
    if *spins < 4096 {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}

fn take_tasks(s: &Shared, f: &(dyn Fn(usize) + Sync), n_tasks: usize) {
    loop {
        let i = s.next.fetch_add(1, Ordering::Relaxed);
        if i >= n_tasks {
            break;
        }
        f(i);
    }
}

/// A worker's loop. It starts from epoch 0 (the pool's epoch when it was created), not from
/// what it reads when the thread first runs: a job published before the thread got going
/// would otherwise be skipped, and `run` would wait for it forever.
fn worker(s: Arc<Shared>) {
    let mut seen = 0u64;
    loop {
        // Wait for the next job: spin, then sleep.
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            let e = s.epoch.load(Ordering::Acquire);
            if e != seen {
                seen = e;
                break;
            }
            if s.stop.load(Ordering::Relaxed) {
                return;
            }
            backoff(&mut spins);
            if spins.is_multiple_of(1024) && start.elapsed() > SPIN {
                let g = s.lock.lock().unwrap_or_else(|p| p.into_inner());
                s.sleepers.fetch_add(1, Ordering::SeqCst);
                // Re-check under the lock: `run` notifies while holding it.
                let g = if s.epoch.load(Ordering::SeqCst) == seen && !s.stop.load(Ordering::SeqCst)
                {
                    s.wake
                        .wait_timeout(g, Duration::from_millis(100))
                        .map(|(g, _)| g)
                        .unwrap_or_else(|p| p.into_inner().0)
                } else {
                    g
                };
                s.sleepers.fetch_sub(1, Ordering::SeqCst);
                drop(g);
                spins = 0;
                continue;
            }
        }
        // SAFETY: the epoch was published after `job` was set (Release/Acquire), and the job
        // stays valid until this worker decrements `busy`.
        if let Some(job) = unsafe { *s.job.get() } {
            let f = unsafe { &*job.f };
            if catch_unwind(AssertUnwindSafe(|| take_tasks(&s, f, job.n_tasks))).is_err() {
                s.panicked.store(true, Ordering::Relaxed);
            }
        }
        s.busy.fetch_sub(1, Ordering::Release);
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        {
            let _l = self.shared.lock.lock().unwrap_or_else(|p| p.into_inner());
            self.shared.wake.notify_all();
        }
        for h in self.workers.drain(..) {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_task_runs_once_across_many_jobs() {
        let pool = Pool::new(3);
        for n in [1usize, 2, 5, 64, 1000] {
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            pool.run(n, |i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            });
            assert!(
                hits.iter().all(|h| h.load(Ordering::Relaxed) == 1),
                "n = {n}"
            );
        }
    }

    #[test]
    fn ranges_cover_exactly_once_and_respect_alignment() {
        let pool = Pool::new(2);
        for (n, align) in [(0usize, 1usize), (1, 4), (7, 4), (100, 16), (1023, 32)] {
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            with_pool(&pool, || {
                par_ranges(n, align, 4, |r| {
                    assert!(r.start % align == 0);
                    for i in r {
                        hits[i].fetch_add(1, Ordering::Relaxed);
                    }
                })
            });
            assert!(
                hits.iter().all(|h| h.load(Ordering::Relaxed) == 1),
                "n = {n}"
            );
        }
    }

    #[test]
    fn a_panicking_task_is_reraised_and_the_pool_still_works() {
        let pool = Pool::new(2);
        let r = catch_unwind(AssertUnwindSafe(|| {
            pool.run(16, |i| {
                if i == 11 {
                    panic!("task 11");
                }
            })
        }));
        assert!(r.is_err());
        let sum = AtomicUsize::new(0);
        pool.run(10, |i| {
            sum.fetch_add(i, Ordering::Relaxed);
        });
        assert_eq!(sum.load(Ordering::Relaxed), 45);
    }

    #[test]
    fn workers_wake_after_sleeping() {
        let pool = Pool::new(2);
        std::thread::sleep(SPIN * 3);
        let sum = AtomicUsize::new(0);
        pool.run(8, |i| {
            sum.fetch_add(i, Ordering::Relaxed);
        });
        assert_eq!(sum.load(Ordering::Relaxed), 28);
    }
}

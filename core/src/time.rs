//! The clock kiln times its work with: `std::time::{Instant, SystemTime}`, except on the web
//! (wasm32), where std has no clock and `web_time`'s read `performance.now()` and `Date.now()`.

#[cfg(not(target_arch = "wasm32"))]
pub use std::time::{Instant, SystemTime, UNIX_EPOCH};
#[cfg(target_arch = "wasm32")]
pub use web_time::{Instant, SystemTime, UNIX_EPOCH};

/// CPU time the calling thread has used, where the platform says (`CLOCK_THREAD_CPUTIME_ID`
/// on Unix): host work without the time a call sleeps in, say, a driver waiting for the GPU.
pub fn thread_cpu_time() -> Option<std::time::Duration> {
    #[cfg(unix)]
    {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid timespec for the call to fill.
        let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        if rc != 0 || ts.tv_sec < 0 || ts.tv_nsec < 0 {
            return None;
        }
        Some(std::time::Duration::new(
            ts.tv_sec as u64,
            ts.tv_nsec as u32,
        ))
    }
    #[cfg(not(unix))]
    {
        None
    }
}

#[cfg(test)]
mod tests {
    /// The thread's CPU time grows with work done on it and not with time slept.
    #[test]
    fn thread_cpu_time_counts_work_not_sleep() {
        let Some(t0) = super::thread_cpu_time() else {
            return;
        };
        std::thread::sleep(std::time::Duration::from_millis(50));
        let t1 = super::thread_cpu_time().expect("still readable");
        // Work until the thread's CPU time moves by 20 ms (within 20 s of wall time, however
        // busy the machine is).
        let mut x = 1u64;
        let start = std::time::Instant::now();
        let mut t2 = t1;
        while t2 - t1 < std::time::Duration::from_millis(20)
            && start.elapsed() < std::time::Duration::from_secs(20)
        {
            for _ in 0..10_000 {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
            }
            t2 = super::thread_cpu_time().expect("still readable");
        }
        std::hint::black_box(x);
        assert!(
            t1 - t0 < std::time::Duration::from_millis(25),
            "slept: {:?}",
            t1 - t0
        );
        assert!(
            t2 - t1 >= std::time::Duration::from_millis(20),
            "worked: {:?}",
            t2 - t1
        );
    }
}

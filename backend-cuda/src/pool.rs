//! The caching allocator: device allocations are rounded up to a size class and, when a
//! tensor is dropped, kept in a free list for the next allocation of that class instead of
//! going back to the driver (`cuMemAlloc`/`cuMemFree` synchronise the device and cost tens of
//! microseconds; a decode step allocates dozens of activations).
//!
//! All work runs on one stream, so a block freed while kernels still read it can be handed out
//! at once: whatever the new owner enqueues runs after those kernels. When the driver is out of
//! memory the pool gives every cached block back and tries again.
//!
//! The pool is generic over the raw allocator so its bookkeeping is tested without a GPU.

use std::collections::HashMap;
use std::sync::Mutex;

/// The driver's side: raw allocations of exactly `bytes`.
pub trait RawAlloc: Send + Sync {
    /// A new allocation, or `None` when the device is out of memory.
    fn alloc(&self, bytes: usize) -> Result<u64, String>;
    fn free(&self, ptr: u64, bytes: usize);
    /// Whether an error from `alloc` means out of memory (worth emptying the cache for).
    fn is_oom(&self, err: &str) -> bool;
}

/// The size class of a request: at least 256 bytes, then steps of an eighth of the power of
/// two below, so at most 12.5% is wasted and a freed block fits any request of its class.
pub fn size_class(bytes: usize) -> usize {
    let b = bytes.max(1);
    if b <= 256 {
        return 256;
    }
    let pow = usize::BITS - 1 - (b - 1).leading_zeros(); // 2^pow < b <= 2^(pow+1)
    let step = (1usize << pow) / 8;
    b.div_ceil(step) * step
}

#[derive(Default)]
struct State {
    free: HashMap<usize, Vec<u64>>,
    cached_bytes: usize,
    live_bytes: usize,
    driver_allocs: u64,
}

/// Live and cached bytes, and how often the driver was asked.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct PoolStats {
    pub live_bytes: usize,
    pub cached_bytes: usize,
    pub driver_allocs: u64,
}

pub struct Pool<A: RawAlloc> {
    raw: A,
    state: Mutex<State>,
}

impl<A: RawAlloc> Pool<A> {
    pub fn new(raw: A) -> Self {
        Pool {
            raw,
            state: Mutex::new(State::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // The bookkeeping stays consistent across a panic elsewhere.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn raw(&self) -> &A {
        &self.raw
    }

    /// A block of at least `bytes`: (device address, the class size it really has).
    pub fn alloc(&self, bytes: usize) -> Result<(u64, usize), String> {
        let class = size_class(bytes);
        {
            let mut s = self.lock();
            if let Some(ptr) = s.free.get_mut(&class).and_then(|v| v.pop()) {
                s.cached_bytes -= class;
                s.live_bytes += class;
                return Ok((ptr, class));
            }
        }
        let ptr = match self.raw.alloc(class) {
            Ok(p) => p,
            Err(e) if self.raw.is_oom(&e) => {
                self.release_cached();
                self.raw.alloc(class)?
            }
            Err(e) => return Err(e),
        };
        let mut s = self.lock();
        s.live_bytes += class;
        s.driver_allocs += 1;
        Ok((ptr, class))
    }

    /// Takes back a block `alloc` handed out with its class size.
    pub fn free(&self, ptr: u64, class: usize) {
        let mut s = self.lock();
        s.live_bytes = s.live_bytes.saturating_sub(class);
        s.cached_bytes += class;
        s.free.entry(class).or_default().push(ptr);
    }

    /// Gives every cached block back to the driver.
    pub fn release_cached(&self) {
        let blocks: Vec<(usize, Vec<u64>)> = {
            let mut s = self.lock();
            s.cached_bytes = 0;
            s.free.drain().collect()
        };
        for (class, ptrs) in blocks {
            for p in ptrs {
                self.raw.free(p, class);
            }
        }
    }

    pub fn stats(&self) -> PoolStats {
        let s = self.lock();
        PoolStats {
            live_bytes: s.live_bytes,
            cached_bytes: s.cached_bytes,
            driver_allocs: s.driver_allocs,
        }
    }
}

impl<A: RawAlloc> Drop for Pool<A> {
    fn drop(&mut self) {
        self.release_cached();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// A fake device of `capacity` bytes handing out non-overlapping address ranges.
    struct Fake {
        capacity: usize,
        inner: Mutex<(u64, BTreeMap<u64, usize>)>,
    }

    impl Fake {
        fn new(capacity: usize) -> Self {
            Fake {
                capacity,
                inner: Mutex::new((0x1000, BTreeMap::new())),
            }
        }
        fn used(&self) -> usize {
            self.inner.lock().unwrap().1.values().sum()
        }
    }

    impl RawAlloc for Fake {
        fn alloc(&self, bytes: usize) -> Result<u64, String> {
            let mut g = self.inner.lock().unwrap();
            if g.1.values().sum::<usize>() + bytes > self.capacity {
                return Err("out of memory".into());
            }
            let p = g.0;
            g.0 += bytes as u64;
            g.1.insert(p, bytes);
            Ok(p)
        }
        fn free(&self, ptr: u64, bytes: usize) {
            let mut g = self.inner.lock().unwrap();
            assert_eq!(
                g.1.remove(&ptr),
                Some(bytes),
                "freed what was not allocated"
            );
        }
        fn is_oom(&self, err: &str) -> bool {
            err.contains("out of memory")
        }
    }

    #[test]
    fn size_classes_cover_the_request_and_waste_at_most_an_eighth() {
        let mut rng = kiln_core::rng::Rng::new(7);
        let mut sizes: Vec<usize> = (0..20_000).map(|_| 1 + rng.below(1 << 30)).collect();
        sizes.extend([1, 255, 256, 257, 511, 512, 513, 1 << 20, (1 << 20) + 1]);
        for b in sizes {
            let c = size_class(b);
            assert!(c >= b, "{b} -> {c}");
            assert!(b <= 256 || (c - b) as f64 <= b as f64 / 8.0, "{b} -> {c}");
            assert_eq!(size_class(c), c, "a class is its own class ({b} -> {c})");
            assert!(size_class(b + 1) >= c, "classes grow with the request");
        }
    }

    #[test]
    fn freed_blocks_are_reused_and_the_cache_empties_when_memory_runs_out() {
        let pool = Pool::new(Fake::new((1 << 20) + 2048));
        let (a, ca) = pool.alloc(1000).unwrap();
        let (b, cb) = pool.alloc(1000).unwrap();
        assert_eq!((ca, cb), (1024, 1024));
        assert_ne!(a, b);
        pool.free(a, ca);
        // The same class comes back from the cache, not the driver.
        let (c, _) = pool.alloc(990).unwrap();
        assert_eq!(c, a);
        assert_eq!(pool.stats().driver_allocs, 2);
        pool.free(c, ca);
        pool.free(b, cb);
        assert_eq!(pool.stats().cached_bytes, 2048);
        assert_eq!(pool.stats().live_bytes, 0);
        // The device is now full: a 1 MiB block beside the two cached ones.
        let (big, cbig) = pool.alloc(1 << 20).unwrap();
        assert_eq!(pool.raw().used(), (1 << 20) + 2048);
        // A new class does not fit even after the cache is given back...
        assert!(pool.alloc(4096).is_err());
        assert_eq!(pool.stats().cached_bytes, 0, "the cache was emptied trying");
        assert_eq!(
            pool.raw().used(),
            1 << 20,
            "only the big block is still held"
        );
        // ...but the room the cache held is there for what fits it.
        let (d, cd) = pool.alloc(2000).expect("fits in what the cache gave back");
        pool.free(d, cd);
        pool.free(big, cbig);
        drop(pool);
    }

    #[test]
    fn dropping_the_pool_gives_everything_cached_back() {
        let fake = Fake::new(1 << 20);
        let pool = Pool::new(fake);
        let blocks: Vec<_> = (0..10)
            .map(|i| pool.alloc(100 * (i + 1)).unwrap())
            .collect();
        for (p, c) in blocks {
            pool.free(p, c);
        }
        assert!(pool.raw().used() > 0);
        pool.release_cached();
        assert_eq!(pool.raw().used(), 0);
    }
}

//! The clock kiln times its work with: `std::time::{Instant, SystemTime}`, except on the web
//! (wasm32), where std has no clock and `web_time`'s read `performance.now()` and `Date.now()`.

#[cfg(not(target_arch = "wasm32"))]
pub use std::time::{Instant, SystemTime, UNIX_EPOCH};
#[cfg(target_arch = "wasm32")]
pub use web_time::{Instant, SystemTime, UNIX_EPOCH};

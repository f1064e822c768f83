//! The clock kiln times its work with: `std::time::Instant`, except on the web (wasm32), where
//! std has no clock and `web_time::Instant` reads `performance.now()`.

#[cfg(not(target_arch = "wasm32"))]
pub use std::time::Instant;
#[cfg(target_arch = "wasm32")]
pub use web_time::Instant;

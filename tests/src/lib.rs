//! Shared helpers of kiln's cross-backend tests.

use std::sync::Arc;

use kiln_core::backend::Backend;

/// Whether CI demands this capability (`KILN_REQUIRE_<NAME>=1`), turning skips into failures.
pub fn required(name: &str) -> bool {
    std::env::var(format!("KILN_REQUIRE_{name}"))
        .is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"))
}

/// Opens an optional backend: `Some` when available; `None` with a printed reason when not
/// (a panic instead when `KILN_REQUIRE_<NAME>` is set).
pub fn optional_backend(
    name: &str,
    open: impl FnOnce() -> kiln_core::Result<Arc<dyn Backend>>,
) -> Option<Arc<dyn Backend>> {
    match open() {
        Ok(b) => Some(b),
        Err(e) => {
            if required(&name.to_ascii_uppercase()) {
                panic!(
                    "KILN_REQUIRE_{} is set but the backend is not available: {e}",
                    name.to_ascii_uppercase()
                );
            }
            println!("skipping {name}: {e}");
            None
        }
    }
}

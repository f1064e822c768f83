//! Paged KV: the block pool (vLLM semantics), block hashes for prefix caching, per-sequence block tables.

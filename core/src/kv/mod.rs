//! Paged KV: the block pool (vLLM semantics), block hashes for prefix caching, per-sequence
//! block tables, and recurrent-state slots with checkpoints and prefix snapshots.

pub mod block_hash;
pub mod block_pool;
pub mod error;
pub mod manager;
pub mod state;

pub use block_hash::{hash_block, BlockHash};
pub use block_pool::{BlockId, BlockPool, NULL_BLOCK};
pub use error::KvError;
pub use manager::{KvManager, PrefixCacheStats, SeqId, PAD_SLOT};
pub use state::{StatePool, StateStats};

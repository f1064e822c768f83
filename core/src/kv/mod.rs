//! Paged KV: the block pool (vLLM semantics), block hashes for prefix caching, per-sequence
//! block tables, and recurrent-state slots with checkpoints and prefix snapshots.

pub mod block_hash;
pub mod block_pool;
pub mod eigen;
pub mod error;
pub mod key_fit;
pub mod manager;
pub mod rope_moments;
pub mod state;
pub mod types;

pub use block_hash::{hash_block, BlockHash, ContentSpan};
pub use block_pool::BlockPool;
pub use error::KvError;
pub use manager::{KvManager, PrefixCacheStats, PAD_SLOT};
pub use state::{StatePool, StateStats};
pub use types::{KvGroup, KvTypes, LayerTypes};

/// Identifies a sequence (request) in the KV managers and the state pool.
pub type SeqId = u64;

/// Index of a KV block in a pool.
pub type BlockId = u32;

/// The null block: padding in block tables, never allocated or freed.
pub const NULL_BLOCK: BlockId = 0;

//! The error type of the paged-KV bookkeeping. Every misuse is a value that names the block or
//! sequence involved; nothing in `kv` panics on bad input.

use super::{BlockId, SeqId};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KvError {
    #[error("invalid KV pool config (num_blocks {num_blocks}, block_size {block_size}): {reason}")]
    InvalidConfig {
        num_blocks: usize,
        block_size: usize,
        reason: &'static str,
    },
    #[error("out of KV blocks: {requested} requested, {free} free")]
    OutOfBlocks { requested: usize, free: usize },
    #[error("double free of KV block {block}: it is already in the free queue")]
    DoubleFree { block: BlockId },
    #[error("ref count underflow: KV block {block} freed more times in one call than the {held} ref(s) it held")]
    RefUnderflow { block: BlockId, held: usize },
    #[error("ref count overflow on KV block {block}")]
    RefOverflow { block: BlockId },
    #[error("{op}: block 0 is the null block and is never allocated, freed or touched")]
    NullBlock { op: &'static str },
    #[error("{op}: unknown KV block {block} (pool has blocks 0..{num_blocks})")]
    UnknownBlock {
        op: &'static str,
        block: BlockId,
        num_blocks: usize,
    },
    #[error("cannot cache KV block {block}: it is free (ref count 0)")]
    NotInUse { block: BlockId },
    #[error(
        "cannot cache KV block {block}: it is already cached under a different hash or content"
    )]
    AlreadyCached { block: BlockId },
    #[error("a full KV block has {expected} tokens, got {got}")]
    WrongBlockLength { expected: usize, got: usize },
    #[error("out of recurrent-state slots: all {slots} hold a sequence's state")]
    OutOfStateSlots { slots: usize },
    #[error("sequence {seq} has no step in flight")]
    NoStepInFlight { seq: SeqId },
    #[error("sequence {seq}: cannot roll back to {to} tokens: {reason}")]
    Rollback {
        seq: SeqId,
        to: usize,
        reason: &'static str,
    },
    #[error("unknown sequence {seq}")]
    UnknownSequence { seq: SeqId },
    #[error("sequence {seq} already exists")]
    SequenceExists { seq: SeqId },
    #[error("sequence {seq}: committing {count} token(s) after {computed} computed passes its {len} slots")]
    CommitPastEnd {
        seq: SeqId,
        computed: usize,
        count: usize,
        len: usize,
    },
    #[error("sequence {seq}: committed token {got} at position {pos} differs from the known token {expected}")]
    TokenMismatch {
        seq: SeqId,
        pos: usize,
        expected: u32,
        got: u32,
    },
}

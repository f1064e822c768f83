//! Chained block hashes for prefix caching.
//!
//! The hash of full block `i` of a sequence covers the hash of block `i - 1` (its parent), the
//! token ids of block `i` and an optional extra key (a LoRA adapter or model id, anything that
//! changes what the KV of the same tokens is). So equal hashes mean "same tokens from the start of
//! the sequence up to the end of this block", and a block that differs changes every later hash.
//!
//! # The hash
//! SHA-256 of this byte string, all integers little-endian; the whole 32-byte digest is the
//! block's hash (and the next block's parent):
//!
//! | field  | bytes                                                   |
//! |--------|---------------------------------------------------------|
//! | parent | `0x00` for the first block, else `0x01` + 32 bytes      |
//! | extra  | `0x00` for none, else `0x01` + 8 bytes u64              |
//! | count  | number of tokens, 8 bytes u64                           |
//! | tokens | each token id, 4 bytes u32                              |
//! | content| only for a block an image overlaps: `0x01` + 32 bytes  |
//!
//! An image's soft tokens all carry the same id, and the KV they make depends on the image
//! (and, where the image's tokens see each other both ways, every one of them on the whole
//! image). So a block that any [`ContentSpan`] overlaps also covers its content key: SHA-256
//! of, per overlapping span in order, its start and length (8 bytes u64 each) and its
//! 32-byte digest. Two different images never share a block; the same image at the same
//! place after the same tokens always can.
//! It is deterministic across runs, processes and machines (no random seed).
//!
//! # Collisions
//! A cryptographic hash chained over the whole prefix: a client cannot craft two prefixes
//! with the same hash to read another's cached KV (vLLM moved to SHA-256 for this after
//! CVE-2025-25183; kiln used FNV-1a before). The block pool also stores the token ids of
//! every cached block and a lookup only hits when they are equal.

use sha2::{Digest, Sha256};

/// The chained hash of one full block (see the module docs for the exact definition).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockHash(pub [u8; 32]);

impl BlockHash {
    /// A hash with these leading bytes (for tests and fixtures).
    pub fn from_u128(v: u128) -> BlockHash {
        let mut b = [0u8; 32];
        b[..16].copy_from_slice(&v.to_le_bytes());
        BlockHash(b)
    }
}

/// Positions `start..start + len` of a sequence stand for content beyond their token ids
/// (an image's soft tokens), identified by `digest` (SHA-256 of the image's file).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ContentSpan {
    pub start: usize,
    pub len: usize,
    pub digest: [u8; 32],
}

/// The content key of block `i` (positions `i·bs..(i+1)·bs`): `None` when no span of `spans`
/// overlaps it (see the module docs).
pub fn block_content(spans: &[ContentSpan], i: usize, bs: usize) -> Option<[u8; 32]> {
    let (a, b) = (i * bs, (i + 1) * bs);
    let mut h: Option<Sha256> = None;
    for s in spans.iter().filter(|s| s.start < b && s.start + s.len > a) {
        let h = h.get_or_insert_with(Sha256::new);
        h.update((s.start as u64).to_le_bytes());
        h.update((s.len as u64).to_le_bytes());
        h.update(s.digest);
    }
    h.map(|h| h.finalize().into())
}

/// Hash of one full block: `parent` is the hash of the previous block (`None` for the first),
/// `tokens` the block's token ids, `extra` an optional key such as a LoRA or model id.
pub fn hash_block(parent: Option<BlockHash>, tokens: &[u32], extra: Option<u64>) -> BlockHash {
    hash_block_with(parent, tokens, extra, None)
}

/// [`hash_block`] of a block with a content key ([`block_content`]).
pub fn hash_block_with(
    parent: Option<BlockHash>,
    tokens: &[u32],
    extra: Option<u64>,
    content: Option<[u8; 32]>,
) -> BlockHash {
    let mut h = Sha256::new();
    match parent {
        None => h.update([0]),
        Some(p) => {
            h.update([1]);
            h.update(p.0);
        }
    }
    match extra {
        None => h.update([0]),
        Some(e) => {
            h.update([1]);
            h.update(e.to_le_bytes());
        }
    }
    h.update((tokens.len() as u64).to_le_bytes());
    let mut bytes = Vec::with_capacity(tokens.len() * 4);
    for t in tokens {
        bytes.extend_from_slice(&t.to_le_bytes());
    }
    h.update(&bytes);
    if let Some(c) = content {
        h.update([1]);
        h.update(c);
    }
    BlockHash(h.finalize().into())
}

/// Chained hashes of every *full* block of `tokens` (a trailing partial block is not hashed).
pub fn hash_full_blocks(tokens: &[u32], block_size: usize, extra: Option<u64>) -> Vec<BlockHash> {
    hash_full_blocks_with(tokens, &[], block_size, extra)
}

/// [`hash_full_blocks`] of a sequence with content spans.
pub fn hash_full_blocks_with(
    tokens: &[u32],
    spans: &[ContentSpan],
    block_size: usize,
    extra: Option<u64>,
) -> Vec<BlockHash> {
    if block_size == 0 {
        return Vec::new();
    }
    let mut out: Vec<BlockHash> = Vec::with_capacity(tokens.len() / block_size);
    for (i, block) in tokens.chunks_exact(block_size).enumerate() {
        let content = block_content(spans, i, block_size);
        out.push(hash_block_with(out.last().copied(), block, extra, content));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first block of `[1, 2]` with no extra key, against SHA-256 of its byte string as
    /// `sha256sum` gives it (`printf '\x00\x00\x02\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x02\x00\x00\x00' | sha256sum`).
    const SHA256_OF_1_2: &str = "216dcd42442e9f8a641dd6fbabe67a0c437f1a98bfff327af55988f4ffb1ce2f";

    #[test]
    fn the_hash_is_sha256_of_the_documented_bytes() {
        let h = hash_block(None, &[1, 2], None);
        let hex: String = h.0.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, SHA256_OF_1_2);
    }

    #[test]
    fn hash_is_deterministic() {
        let a = hash_block(None, &[1, 2, 3, 4], None);
        let b = hash_block(None, &[1, 2, 3, 4], None);
        assert_eq!(a, b);
        assert_ne!(a, hash_block(None, &[1, 2, 3, 5], None));
        assert_ne!(a, hash_block(None, &[4, 3, 2, 1], None));
    }

    #[test]
    fn chained_hash_differs_when_an_earlier_block_differs() {
        let x = hash_full_blocks(&[1, 2, 3, 4, 9, 9, 9, 9], 4, None);
        let y = hash_full_blocks(&[1, 2, 3, 5, 9, 9, 9, 9], 4, None);
        assert_eq!(x.len(), 2);
        assert_ne!(x[0], y[0]);
        assert_ne!(x[1], y[1], "same second block, different first block");
    }

    #[test]
    fn parent_and_extra_key_are_part_of_the_hash() {
        let t = [7, 7, 7, 7];
        let root = hash_block(None, &t, None);
        assert_ne!(root, hash_block(Some(BlockHash([0; 32])), &t, None));
        assert_ne!(root, hash_block(None, &t, Some(0)));
        assert_ne!(hash_block(None, &t, Some(1)), hash_block(None, &t, Some(2)));
    }

    /// The same tokens with different images (or the same image elsewhere) hash apart in
    /// every block the image touches and after it; blocks before it are untouched.
    #[test]
    fn images_are_part_of_the_blocks_they_touch() {
        let t = [5u32; 12];
        let img = |start, d: u8| ContentSpan {
            start,
            len: 3,
            digest: [d; 32],
        };
        let plain = hash_full_blocks(&t, 4, None);
        let a = hash_full_blocks_with(&t, &[img(5, 1)], 4, None);
        let b = hash_full_blocks_with(&t, &[img(5, 2)], 4, None);
        let c = hash_full_blocks_with(&t, &[img(4, 1)], 4, None);
        assert_eq!(a[0], plain[0]);
        assert_eq!(a[0], b[0]);
        for i in 1..3 {
            assert_ne!(a[i], b[i], "block {i}");
            assert_ne!(a[i], c[i], "block {i}");
            assert_ne!(a[i], plain[i], "block {i}");
        }
        assert_eq!(a, hash_full_blocks_with(&t, &[img(5, 1)], 4, None));
        // An image across a boundary keys both blocks, each with the whole image.
        assert!(block_content(&[img(3, 1)], 0, 4).is_some());
        assert_eq!(
            block_content(&[img(3, 1)], 0, 4),
            block_content(&[img(3, 1)], 1, 4)
        );
        assert_eq!(block_content(&[img(3, 1)], 2, 4), None);
    }

    #[test]
    fn only_full_blocks_are_hashed() {
        assert_eq!(hash_full_blocks(&[1, 2, 3, 4, 5, 6, 7], 4, None).len(), 1);
        assert_eq!(hash_full_blocks(&[1, 2, 3], 4, None).len(), 0);
        assert_eq!(hash_full_blocks(&[1, 2, 3], 0, None).len(), 0);
        let x = hash_full_blocks(&[1, 2, 3, 4, 5, 6, 7, 8], 4, None);
        assert_eq!(x[0], hash_block(None, &[1, 2, 3, 4], None));
        assert_eq!(x[1], hash_block(Some(x[0]), &[5, 6, 7, 8], None));
    }
}

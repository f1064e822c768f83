//! Chained block hashes for prefix caching.
//!
//! The hash of full block `i` of a sequence covers the hash of block `i - 1` (its parent), the
//! token ids of block `i` and an optional extra key (a LoRA adapter or model id, anything that
//! changes what the KV of the same tokens is). So equal hashes mean "same tokens from the start of
//! the sequence up to the end of this block", and a block that differs changes every later hash.
//!
//! # The hash
//! FNV-1a with 128-bit state (offset basis `0x6c62272e07bb014262b821756295c58d`, prime
//! `2^88 + 0x13b`), fed this byte string, all integers little-endian:
//!
//! | field  | bytes                                                   |
//! |--------|---------------------------------------------------------|
//! | parent | `0x00` for the first block, else `0x01` + 16 bytes u128 |
//! | extra  | `0x00` for none, else `0x01` + 8 bytes u64              |
//! | count  | number of tokens, 8 bytes u64                           |
//! | tokens | each token id, 4 bytes u32                              |
//!
//! It is deterministic across runs, processes and machines (no random seed).
//!
//! # Collisions
//! FNV-1a is not cryptographic: collisions can be constructed on purpose. The block pool therefore
//! stores the token ids of every cached block and a lookup only hits when they are equal, so a
//! collision can never return a block holding other tokens. What is *not* checked is the chain
//! before the block: a wrong hit needs two different prefixes whose 128-bit hashes collide, with
//! both blocks cached at once. For accidental collisions that chance is about `n^2 / 2^129` for `n`
//! cached blocks; a deployment that serves untrusted prompts from a shared cache and fears crafted
//! collisions should move to a keyed or cryptographic hash here.

/// The chained hash of one full block (see the module docs for the exact definition).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockHash(pub u128);

const FNV128_OFFSET: u128 = 0x6c62272e07bb014262b821756295c58d;
const FNV128_PRIME: u128 = 0x0000000001000000000000000000013b;

/// FNV-1a over a stream of bytes with 128-bit state.
#[derive(Debug, Clone, Copy)]
pub struct Fnv1a128(u128);

impl Default for Fnv1a128 {
    fn default() -> Self {
        Fnv1a128(FNV128_OFFSET)
    }
}

impl Fnv1a128 {
    pub fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= b as u128;
            self.0 = self.0.wrapping_mul(FNV128_PRIME);
        }
    }

    pub fn finish(&self) -> u128 {
        self.0
    }
}

/// Hash of one full block: `parent` is the hash of the previous block (`None` for the first),
/// `tokens` the block's token ids, `extra` an optional key such as a LoRA or model id.
pub fn hash_block(parent: Option<BlockHash>, tokens: &[u32], extra: Option<u64>) -> BlockHash {
    let mut h = Fnv1a128::default();
    match parent {
        None => h.write(&[0]),
        Some(p) => {
            h.write(&[1]);
            h.write(&p.0.to_le_bytes());
        }
    }
    match extra {
        None => h.write(&[0]),
        Some(e) => {
            h.write(&[1]);
            h.write(&e.to_le_bytes());
        }
    }
    h.write(&(tokens.len() as u64).to_le_bytes());
    for t in tokens {
        h.write(&t.to_le_bytes());
    }
    BlockHash(h.finish())
}

/// Chained hashes of every *full* block of `tokens` (a trailing partial block is not hashed).
pub fn hash_full_blocks(tokens: &[u32], block_size: usize, extra: Option<u64>) -> Vec<BlockHash> {
    if block_size == 0 {
        return Vec::new();
    }
    let mut out: Vec<BlockHash> = Vec::with_capacity(tokens.len() / block_size);
    for block in tokens.chunks_exact(block_size) {
        out.push(hash_block(out.last().copied(), block, extra));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fnv(bytes: &[u8]) -> u128 {
        let mut h = Fnv1a128::default();
        h.write(bytes);
        h.finish()
    }

    #[test]
    fn fnv1a_128_reference_vectors() {
        assert_eq!(fnv(b""), 0x6c62272e07bb014262b821756295c58d);
        assert_eq!(fnv(b"a"), 0xd228cb696f1a8caf78912b704e4a8964);
        assert_eq!(fnv(b"foobar"), 0x343e1662793c64bf6f0d3597ba446f18);
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
        assert_ne!(root, hash_block(Some(BlockHash(0)), &t, None));
        assert_ne!(root, hash_block(None, &t, Some(0)));
        assert_ne!(hash_block(None, &t, Some(1)), hash_block(None, &t, Some(2)));
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

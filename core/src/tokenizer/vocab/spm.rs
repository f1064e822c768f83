//! SentencePiece-style BPE (llama.cpp's SPM): score-ordered merges with byte fallback.

use super::{merge_syms, Sym, Vocab};
use std::cmp::Ordering;
use std::collections::BinaryHeap;

impl Vocab {
    /// llama.cpp's SPM tokenizer over one piece of (already ▁-escaped) text.
    pub(super) fn spm_tokenize(&self, text: &str, out: &mut Vec<u32>) {
        if text.is_empty() {
            return;
        }
        let mut syms: Vec<Sym> = Vec::with_capacity(text.len());
        let nchars = text.chars().count();
        for (i, (pos, c)) in text.char_indices().enumerate() {
            syms.push(Sym {
                start: pos,
                n: c.len_utf8(),
                prev: i as isize - 1,
                next: if i + 1 == nchars { -1 } else { i as isize + 1 },
            });
        }
        let mut heap: BinaryHeap<SpmBigram> = BinaryHeap::new();
        let try_add = |syms: &[Sym], heap: &mut BinaryHeap<SpmBigram>, l: isize, r: isize| {
            if l < 0 || r < 0 {
                return;
            }
            let (ls, rs) = (&syms[l as usize], &syms[r as usize]);
            let size = ls.n + rs.n;
            let piece = &text[ls.start..ls.start + size];
            if let Some(&id) = self.token_to_id.get(piece) {
                heap.push(SpmBigram {
                    score: self.scores[id as usize],
                    left: l as usize,
                    right: r as usize,
                    size,
                });
            }
        };
        for i in 1..syms.len() {
            try_add(&syms, &mut heap, i as isize - 1, i as isize);
        }
        while let Some(b) = heap.pop() {
            let Some((lprev, rnext)) = merge_syms(&mut syms, b.left, b.right, b.size) else {
                continue;
            };
            try_add(&syms, &mut heap, lprev, b.left as isize);
            try_add(&syms, &mut heap, b.left as isize, rnext);
        }
        let mut i = 0isize;
        while i != -1 {
            let s = &syms[i as usize];
            let piece = &text[s.start..s.start + s.n];
            match self.token_to_id.get(piece) {
                Some(&id) => out.push(id),
                None => {
                    for &b in piece.as_bytes() {
                        if let Some(id) = self.byte_token(b) {
                            out.push(id);
                        }
                    }
                }
            }
            i = s.next;
        }
    }
}

/// Max-heap order: highest score first, then the leftmost pair.
#[derive(Debug)]
struct SpmBigram {
    score: f32,
    left: usize,
    right: usize,
    size: usize,
}

impl PartialEq for SpmBigram {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for SpmBigram {}
impl PartialOrd for SpmBigram {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for SpmBigram {
    fn cmp(&self, o: &Self) -> Ordering {
        self.score
            .total_cmp(&o.score)
            .then_with(|| o.left.cmp(&self.left))
            .then_with(|| o.right.cmp(&self.right))
            .then_with(|| o.size.cmp(&self.size))
    }
}

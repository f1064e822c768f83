//! Unicode helpers for the GGUF tokenizers: codepoint category flags, GPT-2's byte-level
//! alphabet, and the regex pre-tokenizer (word splitting) that llama.cpp applies before BPE.
//!
//! The splitting follows llama.cpp's `unicode_regex_split`: a list of regexes applied one after
//! another, each one splitting every piece the previous one produced; text a regex does not
//! match stays a piece of its own. The two regexes nearly every model uses (GPT-2's and
//! Llama 3's) are hand-written matchers, exactly as in llama.cpp; any other regex runs on
//! Oniguruma over the same "collapsed" text llama.cpp feeds `std::regex` (every non-ASCII
//! codepoint replaced by one marker character for its category), so that `\p{L}` and friends
//! behave the same way.

use super::unicode_data::{self, RANGES};
use crate::{Error, Result};
use std::sync::OnceLock;

pub(crate) use unicode_data::{ACCENT_MARK, LETTER, NUMBER, PUNCTUATION, SYMBOL, WHITESPACE};

const fn build_ascii_flags() -> [u8; 128] {
    let mut out = [0u8; 128];
    let mut r = 0;
    while r < RANGES.len() {
        let start = RANGES[r].0;
        let end = if r + 1 < RANGES.len() {
            RANGES[r + 1].0
        } else {
            0x110000
        };
        let mut c = start;
        while c < end && c < 128 {
            out[c as usize] = RANGES[r].1;
            c += 1;
        }
        r += 1;
    }
    out
}

static ASCII_FLAGS: [u8; 128] = build_ascii_flags();

/// Category flags of a codepoint (bits from `unicode_data`); every codepoint has at least one
/// category bit (unassigned ones count as \p{C}).
#[inline]
pub(crate) fn flags(cp: u32) -> u8 {
    if cp < 128 {
        return ASCII_FLAGS[cp as usize];
    }
    if cp >= 0x110000 {
        return 0;
    }
    let i = RANGES.partition_point(|&(start, _)| start <= cp);
    RANGES[i - 1].1
}

// ---------------------------------------------------------------------------------------------
// GPT-2 byte-level alphabet
// ---------------------------------------------------------------------------------------------

struct ByteLevel {
    to_char: [char; 256],
    /// Indexed by codepoint (all mapped codepoints are below 324).
    to_byte: [i16; 324],
}

fn byte_level() -> &'static ByteLevel {
    static BL: OnceLock<ByteLevel> = OnceLock::new();
    BL.get_or_init(|| {
        let mut to_char = ['\0'; 256];
        let mut to_byte = [-1i16; 324];
        let printable =
            |b: u32| (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
        let mut n = 0u32;
        for b in 0u32..256 {
            let cp = if printable(b) {
                b
            } else {
                n += 1;
                255 + n
            };
            to_char[b as usize] = char::from_u32(cp).unwrap();
            to_byte[cp as usize] = b as i16;
        }
        ByteLevel { to_char, to_byte }
    })
}

/// GPT-2's printable stand-in for a byte.
#[inline]
pub(crate) fn byte_to_char(b: u8) -> char {
    byte_level().to_char[b as usize]
}

/// The byte a GPT-2 byte-level character stands for.
#[inline]
pub(crate) fn char_to_byte(c: char) -> Option<u8> {
    let cp = c as usize;
    let t = &byte_level().to_byte;
    if cp < t.len() && t[cp] >= 0 {
        Some(t[cp] as u8)
    } else {
        None
    }
}

/// Byte-level encoding of a word: every UTF-8 byte replaced by its stand-in character.
pub(crate) fn byte_encode(word: &str) -> String {
    let mut out = String::with_capacity(word.len() * 2);
    for &b in word.as_bytes() {
        out.push(byte_to_char(b));
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Regex pre-tokenizer
// ---------------------------------------------------------------------------------------------

/// GPT-2's regex; llama.cpp recognises this exact string and uses its hand-written matcher.
pub(crate) const RE_GPT2: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
/// Llama 3's regex (case-insensitive contractions spelled out); hand-written matcher too.
pub(crate) const RE_LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's regex (single digits); hand-written matcher.
pub(crate) const RE_QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen3.5's regex (letter runs take combining marks too); hand-written matcher.
pub(crate) const RE_QWEN35: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const RE_LLAMA3_ORIG: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

enum Rule {
    Gpt2,
    /// Llama 3 / Qwen2 / Qwen3.5 family: digit runs cut every `max_digits`; `marks`: letter
    /// runs include \p{M}.
    Llama3 {
        max_digits: usize,
        marks: bool,
    },
    /// A regex over the collapsed text (it used unicode categories).
    Collapsed(tokenizers::utils::SysRegex),
    /// A regex over the codepoints themselves (non-ASCII whitespace shown as \x0B).
    Plain(tokenizers::utils::SysRegex),
}

impl std::fmt::Debug for Rule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Rule::Gpt2 => "Gpt2",
            Rule::Llama3 { .. } => "Llama3",
            Rule::Collapsed(_) => "Collapsed",
            Rule::Plain(_) => "Plain",
        })
    }
}

/// A list of regexes applied in turn, as llama.cpp's BPE pre-tokenizer does.
#[derive(Debug)]
pub(crate) struct PreTokenizer {
    rules: Vec<Rule>,
    need_collapse: bool,
}

const UCATS: [(&str, u8); 10] = [
    (r"\p{N}", NUMBER),
    (r"\p{L}", LETTER),
    (r"\p{P}", PUNCTUATION),
    (r"\p{M}", ACCENT_MARK),
    (r"\p{S}", SYMBOL),
    (r"\p{Lu}", LETTER),
    (r"\p{Ll}", LETTER),
    (r"\p{Lt}", LETTER),
    (r"\p{Lm}", LETTER),
    (r"\p{Lo}", LETTER),
];

/// The marker character standing for a category in the collapsed text, and the ASCII members
/// that llama.cpp adds to the class (ASCII codepoints are kept as they are).
fn ucat_class(cat: u8) -> (char, &'static str) {
    match cat {
        NUMBER => ('\u{D1}', "0-9"),
        LETTER => ('\u{D2}', "A-Za-z"),
        PUNCTUATION => ('\u{D3}', r##"!-#%-*,-/:-;?-@\[-\]_\{\}"##),
        ACCENT_MARK => ('\u{D4}', ""),
        _ => ('\u{D5}', r"\$\+<-=>\^`\|\~"),
    }
}

fn uses_ucat(re: &str) -> bool {
    UCATS.iter().any(|(p, _)| re.contains(p))
}

fn compile(re: &str) -> Result<tokenizers::utils::SysRegex> {
    tokenizers::utils::SysRegex::new(re)
        .map_err(|e| Error::Tokenizer(format!("pre-tokenizer regex {re:?}: {e}")))
}

/// llama.cpp's rewrite of a regex for the collapsed text: `\p{X}` becomes a class holding X's
/// marker and X's ASCII members. Also turns an unescaped `$` into `\z`: in ECMAScript (what
/// llama.cpp's std::regex speaks) `$` is the end of the input, in Oniguruma the end of a line.
fn rewrite_regex(re: &str, collapse: bool) -> Result<String> {
    if collapse && re.chars().any(|c| c as u32 >= 128) {
        return Err(Error::Tokenizer(format!(
            "pre-tokenizer regex {re:?} mixes unicode categories and non-ASCII characters"
        )));
    }
    let b = re.as_bytes();
    let mut out = String::with_capacity(re.len() * 2);
    let mut inside = false;
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'\\' && i + 1 < b.len() {
            if collapse && b[i + 1] == b'p' && i + 2 < b.len() && b[i + 2] == b'{' {
                if let Some(close) = re[i..].find('}') {
                    let pat = &re[i..i + close + 1];
                    if let Some((_, cat)) = UCATS.iter().find(|(p, _)| *p == pat) {
                        let (marker, ascii) = ucat_class(*cat);
                        if !inside {
                            out.push('[');
                        }
                        out.push(marker);
                        out.push_str(ascii);
                        if !inside {
                            out.push(']');
                        }
                        i += close + 1;
                        continue;
                    }
                }
            }
            // copy the escape pair untouched (a whole UTF-8 char for the second part)
            out.push('\\');
            let ch = re[i + 1..].chars().next().unwrap();
            out.push(ch);
            i += 1 + ch.len_utf8();
            continue;
        }
        if c == b'[' && !inside {
            inside = true;
        } else if c == b']' && inside {
            inside = false;
        } else if c == b'$' && !inside {
            out.push_str(r"\z");
            i += 1;
            continue;
        }
        let ch = re[i..].chars().next().unwrap();
        out.push(ch);
        i += ch.len_utf8();
    }
    Ok(out)
}

impl PreTokenizer {
    pub(crate) fn new(regexes: &[&str]) -> Result<PreTokenizer> {
        let mut rules = Vec::with_capacity(regexes.len());
        for &re in regexes {
            let rule = if re == RE_GPT2 {
                Rule::Gpt2
            } else if re == RE_LLAMA3 || re == RE_LLAMA3_ORIG {
                Rule::Llama3 {
                    max_digits: 3,
                    marks: false,
                }
            } else if re == RE_QWEN2 {
                Rule::Llama3 {
                    max_digits: 1,
                    marks: false,
                }
            } else if re == RE_QWEN35 {
                Rule::Llama3 {
                    max_digits: 1,
                    marks: true,
                }
            } else if uses_ucat(re) {
                Rule::Collapsed(compile(&rewrite_regex(re, true)?)?)
            } else {
                Rule::Plain(compile(&rewrite_regex(re, false)?)?)
            };
            rules.push(rule);
        }
        let need_collapse = regexes.iter().any(|r| uses_ucat(r));
        Ok(PreTokenizer {
            rules,
            need_collapse,
        })
    }

    /// Splits `text` into words (raw UTF-8 slices of `text`, in order, covering it all).
    pub(crate) fn split<'t>(&self, text: &'t str) -> Vec<&'t str> {
        let mut cpts: Vec<u32> = Vec::with_capacity(text.len());
        let mut starts: Vec<usize> = Vec::with_capacity(text.len() + 1);
        for (i, c) in text.char_indices() {
            cpts.push(c as u32);
            starts.push(i);
        }
        starts.push(text.len());
        let n = cpts.len();
        let cflags: Vec<u8> = cpts.iter().map(|&c| flags(c)).collect();

        let mut collapsed: Option<(String, Vec<usize>)> = None;
        let mut plain: Option<(String, Vec<usize>)> = None;
        let mut offsets: Vec<usize> = vec![n];
        for rule in &self.rules {
            offsets = match rule {
                Rule::Gpt2 => split_gpt2(&cpts, &cflags, &offsets),
                Rule::Llama3 { max_digits, marks } => {
                    split_llama3(&cpts, &cflags, &offsets, *max_digits, *marks)
                }
                Rule::Collapsed(re) => {
                    debug_assert!(self.need_collapse);
                    let (s, pos) = collapsed.get_or_insert_with(|| {
                        build_text(&cpts, |cp, f| {
                            if cp < 128 {
                                char::from_u32(cp).unwrap()
                            } else if f & WHITESPACE != 0 {
                                '\u{0B}'
                            } else {
                                match f & !WHITESPACE {
                                    NUMBER => '\u{D1}',
                                    LETTER => '\u{D2}',
                                    PUNCTUATION => '\u{D3}',
                                    ACCENT_MARK => '\u{D4}',
                                    SYMBOL => '\u{D5}',
                                    _ => '\u{D0}',
                                }
                            }
                        })
                    });
                    split_regex(re, s, pos, &offsets)
                }
                Rule::Plain(re) => {
                    let (s, pos) = plain.get_or_insert_with(|| {
                        build_text(&cpts, |cp, f| {
                            if cp > 0x7F && f & WHITESPACE != 0 {
                                '\u{0B}'
                            } else {
                                char::from_u32(cp).unwrap()
                            }
                        })
                    });
                    split_regex(re, s, pos, &offsets)
                }
            };
        }

        let mut words = Vec::with_capacity(offsets.len());
        let mut start = 0;
        for len in offsets {
            if len == 0 {
                continue;
            }
            words.push(&text[starts[start]..starts[start + len]]);
            start += len;
        }
        words
    }
}

/// Text with one (possibly substituted) char per codepoint, and the byte position of each.
fn build_text(cpts: &[u32], f: impl Fn(u32, u8) -> char) -> (String, Vec<usize>) {
    let mut s = String::with_capacity(cpts.len() * 2);
    let mut pos = Vec::with_capacity(cpts.len() + 1);
    for &cp in cpts {
        pos.push(s.len());
        s.push(f(cp, flags(cp)));
    }
    pos.push(s.len());
    (s, pos)
}

fn split_regex(
    re: &tokenizers::utils::SysRegex,
    text: &str,
    pos: &[usize],
    offsets: &[usize],
) -> Vec<usize> {
    let mut out = Vec::with_capacity(offsets.len());
    let mut start = 0usize; // codepoint index
    for &len in offsets {
        let seg = &text[pos[start]..pos[start + len]];
        let base = pos[start];
        // byte offset inside the segment -> codepoint index inside the segment
        let to_cp = |b: usize| pos[start..=start + len].partition_point(|&p| p < base + b);
        let mut prev = 0usize;
        for (ms, me) in re.find_iter(seg) {
            let (cs, ce) = (to_cp(ms), to_cp(me));
            if cs > prev {
                out.push(cs - prev);
            }
            out.push(ce - cs);
            prev = ce;
        }
        if prev < len {
            out.push(len - prev);
        }
        start += len;
    }
    out
}

/// After an apostrophe, the length of a contraction `'s 't 'm 'd 're 've 'll` (2 or 3), else 0.
/// `n2` is the codepoint after `n1` (u32::MAX past the end of the piece).
fn contraction(n1: u32, n2: u32) -> usize {
    let is = |c: u32, ch: char| c == ch as u32;
    if is(n1, 's') || is(n1, 't') || is(n1, 'm') || is(n1, 'd') {
        2
    } else if (is(n1, 'r') || is(n1, 'v')) && is(n2, 'e') || is(n1, 'l') && is(n2, 'l') {
        3
    } else {
        0
    }
}

/// The hand-written matcher for GPT-2's regex
/// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`.
fn split_gpt2(cpts: &[u32], fl: &[u8], offsets: &[usize]) -> Vec<usize> {
    let mut out = Vec::with_capacity(offsets.len());
    let mut start = 0;
    for &len in offsets {
        let (ini, end) = (start, start + len);
        start = end;
        const OOR: u32 = u32::MAX;
        let cpt = |p: usize| if p >= ini && p < end { cpts[p] } else { OOR };
        let flg = |p: usize| if p >= ini && p < end { fl[p] } else { 0 };
        let mut prev_end = ini;
        let mut add = |e: usize, out: &mut Vec<usize>| -> usize {
            let l = e - prev_end;
            if l > 0 {
                out.push(l);
            }
            prev_end = e;
            l
        };
        let mut pos = ini;
        while pos < end {
            let c = cpt(pos);
            let f = flg(pos);
            if c == '\'' as u32 && pos + 1 < end {
                let n = contraction(cpt(pos + 1), cpt(pos + 2));
                if n > 0 {
                    pos += add(pos + n, &mut out);
                    continue;
                }
            }
            let sp = c == ' ' as u32;
            let mut f2 = if sp { flg(pos + 1) } else { f };
            if f2 & LETTER != 0 {
                pos += sp as usize;
                while f2 & LETTER != 0 {
                    pos += 1;
                    f2 = flg(pos);
                }
                add(pos, &mut out);
                continue;
            }
            if f2 & NUMBER != 0 {
                pos += sp as usize;
                while f2 & NUMBER != 0 {
                    pos += 1;
                    f2 = flg(pos);
                }
                add(pos, &mut out);
                continue;
            }
            let other = |f: u8| f & (WHITESPACE | LETTER | NUMBER) == 0 && f != 0;
            if other(f2) {
                pos += sp as usize;
                while other(f2) {
                    pos += 1;
                    f2 = flg(pos);
                }
                add(pos, &mut out);
                continue;
            }
            let mut nws = 0;
            while flg(pos + nws) & WHITESPACE != 0 {
                nws += 1;
            }
            if nws > 1 && cpt(pos + nws) != OOR {
                pos += nws - 1;
                add(pos, &mut out);
                continue;
            }
            if nws > 0 {
                pos += nws;
                add(pos, &mut out);
                continue;
            }
            pos += 1;
            add(pos, &mut out);
        }
    }
    out
}

/// The hand-written matcher for Llama 3's regex
/// `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`,
/// and its Qwen variants (`\p{N}` instead of `\p{N}{1,3}`; Qwen3.5: `[\p{L}\p{M}]+` letter runs).
fn split_llama3(
    cpts: &[u32],
    fl: &[u8],
    offsets: &[usize],
    max_digits: usize,
    marks: bool,
) -> Vec<usize> {
    let letter = if marks { LETTER | ACCENT_MARK } else { LETTER };
    let mut out = Vec::with_capacity(offsets.len());
    let mut start = 0;
    for &len in offsets {
        let (ini, end) = (start, start + len);
        start = end;
        const OOR: u32 = u32::MAX;
        let cpt = |p: usize| if p >= ini && p < end { cpts[p] } else { OOR };
        let flg = |p: usize| if p >= ini && p < end { fl[p] } else { 0 };
        let lower = |c: u32| {
            if (b'A' as u32..=b'Z' as u32).contains(&c) {
                c + 32
            } else {
                c
            }
        };
        let (cr, lf) = ('\r' as u32, '\n' as u32);
        let mut prev_end = ini;
        let mut add = |e: usize, out: &mut Vec<usize>| -> usize {
            let l = e - prev_end;
            if l > 0 {
                out.push(l);
            }
            prev_end = e;
            l
        };
        let mut pos = ini;
        while pos < end {
            let c = cpt(pos);
            let f = flg(pos);
            if c == '\'' as u32 && pos + 1 < end {
                let n = contraction(lower(cpt(pos + 1)), lower(cpt(pos + 2)));
                if n > 0 {
                    pos += add(pos + n, &mut out);
                    continue;
                }
            }
            // [^\r\n\p{L}\p{N}]?\p{L}+
            if !(c == cr || c == lf || f & NUMBER != 0)
                && (f & letter != 0 || flg(pos + 1) & letter != 0)
            {
                pos += 1;
                while flg(pos) & letter != 0 {
                    pos += 1;
                }
                add(pos, &mut out);
                continue;
            }
            // \p{N}{1,3}
            if f & NUMBER != 0 {
                let mut i0 = pos;
                while flg(pos) & NUMBER != 0 {
                    pos += 1;
                    if pos - i0 >= max_digits {
                        add(pos, &mut out);
                        i0 = pos;
                    }
                }
                add(pos, &mut out);
                continue;
            }
            // <space>?[^\s\p{L}\p{N}]+[\r\n]*
            let sp = c == ' ' as u32;
            let mut f2 = if sp { flg(pos + 1) } else { f };
            let other = |f: u8| f & (WHITESPACE | letter | NUMBER) == 0 && f != 0;
            if f2 & (WHITESPACE | letter | NUMBER) == 0 && f != 0 {
                pos += sp as usize;
                while other(f2) {
                    pos += 1;
                    f2 = flg(pos);
                }
                let mut c2 = cpt(pos);
                while c2 == cr || c2 == lf {
                    pos += 1;
                    c2 = cpt(pos);
                }
                add(pos, &mut out);
                continue;
            }
            let mut nws = 0;
            let mut last_rn = 0;
            while flg(pos + nws) & WHITESPACE != 0 {
                let c2 = cpt(pos + nws);
                if c2 == cr || c2 == lf {
                    last_rn = pos + nws + 1;
                }
                nws += 1;
            }
            // \s*[\r\n]+
            if last_rn > 0 {
                pos = last_rn;
                add(pos, &mut out);
                continue;
            }
            // \s+(?!\S)
            if nws > 1 && cpt(pos + nws) != OOR {
                pos += nws - 1;
                add(pos, &mut out);
                continue;
            }
            // \s+
            if nws > 0 {
                pos += nws;
                add(pos, &mut out);
                continue;
            }
            pos += 1;
            add(pos, &mut out);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_basic() {
        assert_eq!(flags('a' as u32) & LETTER, LETTER);
        assert_eq!(flags('7' as u32) & NUMBER, NUMBER);
        assert_ne!(flags(' ' as u32) & WHITESPACE, 0);
        assert_ne!(flags(0x3000) & WHITESPACE, 0);
        assert_eq!(flags('é' as u32) & LETTER, LETTER);
        assert_eq!(flags('中' as u32) & LETTER, LETTER);
        assert_eq!(flags('٣' as u32) & NUMBER, NUMBER);
        assert_ne!(flags('😀' as u32), 0);
        assert_eq!(flags('😀' as u32) & (LETTER | NUMBER | WHITESPACE), 0);
    }

    #[test]
    fn byte_level_roundtrip() {
        for b in 0..=255u8 {
            assert_eq!(char_to_byte(byte_to_char(b)), Some(b));
        }
        assert_eq!(byte_to_char(b' '), 'Ġ');
        assert_eq!(byte_to_char(b'\n'), 'Ċ');
        assert_eq!(byte_encode("a é"), "aĠÃ©");
    }

    fn split(res: &[&str], text: &str) -> Vec<String> {
        PreTokenizer::new(res)
            .unwrap()
            .split(text)
            .into_iter()
            .map(String::from)
            .collect()
    }

    #[test]
    fn gpt2_split() {
        assert_eq!(
            split(&[RE_GPT2], "Hello world, it's 2024!  ok\n"),
            vec!["Hello", " world", ",", " it", "'s", " 2024", "!", " ", " ok", "\n"]
        );
    }

    #[test]
    fn starcoder_split_digits() {
        // \p{N} first: every digit on its own, then GPT-2 on the rest
        assert_eq!(
            split(&[r"\p{N}", RE_GPT2], "abc 123 x"),
            vec!["abc", " ", "1", "2", "3", " x"]
        );
    }

    #[test]
    fn llama3_split() {
        assert_eq!(
            split(&[RE_LLAMA3], "Hello WORLD's 12345\n\n  x"),
            vec!["Hello", " WORLD", "'s", " ", "123", "45", "\n\n", " ", " x"]
        );
    }

    #[test]
    fn generic_regex_matches_custom() {
        // each hand-written matcher agrees with its regex run through Oniguruma on the
        // collapsed text (llama.cpp's general path)
        let texts = [
            "Hello WORLD's 12345\n\n  x",
            "naïve café — 東京タワー 2024年!! \t\r\n end  ",
            "emoji 😀😀 and ٣٤٥٦ digits, e\u{301}\u{301}x \u{a0}\u{3000}y  \n",
            "don't I'M you're we'll they'VE '' 'x ' 1'2",
        ];
        for re in [RE_LLAMA3, RE_QWEN2, RE_QWEN35] {
            let generic = PreTokenizer {
                rules: vec![Rule::Collapsed(
                    compile(&rewrite_regex(re, true).unwrap()).unwrap(),
                )],
                need_collapse: true,
            };
            for text in texts {
                let a: Vec<&str> = generic.split(text);
                let b = split(&[re], text);
                assert_eq!(a, b, "{re}: {text:?}");
            }
        }
    }
}

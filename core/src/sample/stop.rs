//! Stop strings over streamed text: text that could still be the start of a stop string is
//! held back, so a stop string never leaks, even in part.

/// Feeds text pieces; releases what is safe to show.
#[derive(Clone, Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
    stopped: bool,
    /// The stop string found.
    matched: Option<String>,
}

impl StopMatcher {
    pub fn new(stops: &[String]) -> Self {
        StopMatcher {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            held: String::new(),
            stopped: false,
            matched: None,
        }
    }

    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// The stop string that ended the text, once one has.
    pub fn matched(&self) -> Option<&str> {
        self.matched.as_deref()
    }

    /// Adds `piece`; returns the text that can be shown now. After a stop string is found,
    /// returns only the text before it and ignores everything after.
    pub fn push(&mut self, piece: &str) -> String {
        if self.stopped {
            return String::new();
        }
        self.held.push_str(piece);
        // A complete stop string: emit what precedes the earliest one.
        if let Some((at, s)) = self
            .stops
            .iter()
            .filter_map(|s| Some((self.held.find(s.as_str())?, s)))
            .min_by_key(|&(at, _)| at)
        {
            self.matched = Some(s.clone());
            self.stopped = true;
            let out = self.held[..at].to_string();
            self.held.clear();
            return out;
        }
        // Hold back the longest suffix that is a prefix of some stop string.
        let mut keep = 0;
        for s in &self.stops {
            for (i, _) in s.char_indices().skip(1) {
                if self.held.ends_with(&s[..i]) {
                    keep = keep.max(i);
                }
            }
        }
        let cut = self.held.len() - keep;
        let out = self.held[..cut].to_string();
        self.held.drain(..cut);
        out
    }

    /// Releases what was held back (the stream ended without a stop string).
    pub fn finish(&mut self) -> String {
        if self.stopped {
            return String::new();
        }
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], text: &str, split: usize) -> (String, bool) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut m = StopMatcher::new(&stops);
        let mut out = String::new();
        let chars: Vec<char> = text.chars().collect();
        for piece in chars.chunks(split.max(1)) {
            let p: String = piece.iter().collect();
            out.push_str(&m.push(&p));
        }
        out.push_str(&m.finish());
        (out, m.stopped())
    }

    #[test]
    fn stops_at_every_split_and_never_leaks() {
        let text = "Hello wörld! END of text";
        for split in 1..text.len() {
            assert_eq!(
                run(&["END"], text, split),
                ("Hello wörld! ".to_string(), true),
                "split {split}"
            );
            assert_eq!(
                run(&["x", "wö"], text, split),
                ("Hello ".to_string(), true),
                "split {split}"
            );
            assert_eq!(
                run(&["ENDX"], text, split),
                (text.to_string(), false),
                "split {split}"
            );
        }
    }

    #[test]
    fn a_held_prefix_is_released_when_it_turns_out_not_to_match() {
        let stops = vec!["</s>".to_string()];
        let mut m = StopMatcher::new(&stops);
        assert_eq!(m.push("a</"), "a");
        assert_eq!(m.push("b"), "</b");
        assert_eq!(m.push("<"), "");
        assert_eq!(m.finish(), "<");
    }
}

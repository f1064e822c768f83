//! Splitting a chat model's streamed output into content, reasoning and tool calls.
//!
//! Models whose templates use them write their reasoning between `<think>` and `</think>`, and
//! each tool call as `<tool_call>{"name": …, "arguments": {…}}</tool_call>` (the Hermes /
//! Qwen convention). [`OutputParser`] takes the output in whatever pieces it arrives and
//! hands back [`Delta`]s; the deltas of any split of a text add up to the same result, because
//! text that could still be the start of a tag is held back until it can be decided.

use serde_json::Value;

const THINK_OPEN: &str = "<think>";
const THINK_CLOSE: &str = "</think>";
const TOOL_OPEN: &str = "<tool_call>";
const TOOL_CLOSE: &str = "</tool_call>";

/// Which conventions the parser looks for.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Syntax {
    /// `<think>…</think>` is reasoning.
    pub reasoning: bool,
    /// `<tool_call>…</tool_call>` holds a tool call.
    pub tool_calls: bool,
}

impl Syntax {
    /// The conventions a chat template's source shows it uses.
    pub fn of_template(source: &str) -> Syntax {
        Syntax {
            reasoning: source.contains(THINK_OPEN),
            tool_calls: source.contains(TOOL_OPEN),
        }
    }
}

/// One tool call, arguments as a JSON text (OpenAI's format).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCall {
    /// 0 for the first call of the output, then 1, 2, …
    pub index: usize,
    pub name: String,
    pub arguments: String,
}

/// A piece of parsed output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Delta {
    Content(String),
    Reasoning(String),
    ToolCall(ToolCall),
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Mode {
    Content,
    Reasoning,
    Tool,
}

/// The streaming parser; see the module docs.
#[derive(Clone, Debug)]
pub struct OutputParser {
    syntax: Syntax,
    mode: Mode,
    /// Text not yet decided (a possible tag start, or a tool call's body).
    held: String,
    /// Drop leading whitespace of the content (after `</think>` or a tool call).
    trim: bool,
    calls: usize,
}

impl OutputParser {
    /// A parser for `syntax`; `in_reasoning` when the prompt already opened `<think>` (the
    /// output then starts inside the reasoning).
    pub fn new(syntax: Syntax, in_reasoning: bool) -> OutputParser {
        OutputParser {
            syntax,
            mode: if in_reasoning && syntax.reasoning {
                Mode::Reasoning
            } else {
                Mode::Content
            },
            held: String::new(),
            trim: false,
            calls: 0,
        }
    }

    /// Whether the prompt `text` leaves the model inside `<think>` (it ends with an open tag).
    pub fn prompt_opens_reasoning(text: &str) -> bool {
        let t = text.trim_end();
        t.ends_with(THINK_OPEN)
    }

    /// Adds `piece`; returns what can be decided now.
    pub fn push(&mut self, piece: &str) -> Vec<Delta> {
        self.held.push_str(piece);
        let mut out = Vec::new();
        loop {
            let tags = self.tags();
            // The earliest complete tag this mode looks for.
            let found = tags
                .iter()
                .filter_map(|&t| self.held.find(t).map(|at| (at, t)))
                .min_by_key(|&(at, _)| at);
            match found {
                Some((at, tag)) => {
                    let before: String = self.held[..at].to_string();
                    self.held.drain(..at + tag.len());
                    if self.mode == Mode::Tool {
                        self.close_call(&before, &mut out);
                    } else {
                        self.text(&before, &mut out);
                        self.switch(tag);
                    }
                }
                None => {
                    if self.mode != Mode::Tool {
                        // Keep back the longest tail that could start a tag.
                        let keep = tags
                            .iter()
                            .map(|t| partial_tag_len(&self.held, t))
                            .max()
                            .unwrap_or(0);
                        let cut = self.held.len() - keep;
                        let text: String = self.held.drain(..cut).collect();
                        self.text(&text, &mut out);
                    }
                    return out;
                }
            }
        }
    }

    /// Ends the output: whatever is held is released as it stands (an unclosed tool call
    /// becomes content, tags included).
    pub fn finish(&mut self) -> Vec<Delta> {
        let mut out = Vec::new();
        let rest = std::mem::take(&mut self.held);
        match self.mode {
            Mode::Tool => {
                self.mode = Mode::Content;
                self.text(&format!("{TOOL_OPEN}{rest}"), &mut out);
            }
            _ => self.text(&rest, &mut out),
        }
        out
    }

    /// Tags that end or change the current mode.
    fn tags(&self) -> Vec<&'static str> {
        let mut t = Vec::new();
        match self.mode {
            Mode::Content => {
                if self.syntax.reasoning {
                    t.push(THINK_OPEN);
                }
                if self.syntax.tool_calls {
                    t.push(TOOL_OPEN);
                }
            }
            Mode::Reasoning => t.push(THINK_CLOSE),
            Mode::Tool => t.push(TOOL_CLOSE),
        }
        t
    }

    /// Text in the current mode (content or reasoning; a tool call's body is held whole).
    fn text(&mut self, text: &str, out: &mut Vec<Delta>) {
        match self.mode {
            // (Tool mode never gets here: a call's body is held until its closing tag.)
            Mode::Content | Mode::Tool => {
                let text = if self.trim { text.trim_start() } else { text };
                if !text.is_empty() {
                    self.trim = false;
                    push_merged(out, Delta::Content(text.to_string()));
                }
            }
            Mode::Reasoning => {
                if !text.is_empty() {
                    push_merged(out, Delta::Reasoning(text.to_string()));
                }
            }
        }
    }

    /// An opening tag, or the end of the reasoning, was found.
    fn switch(&mut self, tag: &str) {
        match tag {
            THINK_OPEN => self.mode = Mode::Reasoning,
            THINK_CLOSE => {
                self.mode = Mode::Content;
                self.trim = true;
            }
            TOOL_OPEN => self.mode = Mode::Tool,
            _ => {}
        }
    }

    /// A tool call's closing tag: its body becomes a call, or text as written when it is not
    /// a call after all.
    fn close_call(&mut self, body: &str, out: &mut Vec<Delta>) {
        self.mode = Mode::Content;
        match parse_call(body) {
            Some((name, arguments)) => {
                out.push(Delta::ToolCall(ToolCall {
                    index: self.calls,
                    name,
                    arguments,
                }));
                self.calls += 1;
                self.trim = true;
            }
            None => self.text(&format!("{TOOL_OPEN}{body}{TOOL_CLOSE}"), out),
        }
    }
}

/// Appends `d`, merging it into the previous delta of the same kind.
fn push_merged(out: &mut Vec<Delta>, d: Delta) {
    match (out.last_mut(), d) {
        (Some(Delta::Content(a)), Delta::Content(b)) => a.push_str(&b),
        (Some(Delta::Reasoning(a)), Delta::Reasoning(b)) => a.push_str(&b),
        (_, d) => out.push(d),
    }
}

/// The length of the longest tail of `s` that is a proper prefix of `tag`.
fn partial_tag_len(s: &str, tag: &str) -> usize {
    (1..tag.len())
        .rev()
        .find(|&n| s.ends_with(&tag[..n]))
        .unwrap_or(0)
}

/// `{"name": …, "arguments": …}` → the name and the arguments as JSON text.
fn parse_call(body: &str) -> Option<(String, String)> {
    let v: Value = serde_json::from_str(body.trim()).ok()?;
    let name = v.get("name")?.as_str()?.to_string();
    let arguments = match v.get("arguments").or_else(|| v.get("parameters")) {
        None | Some(Value::Null) => "{}".to_string(),
        // Some models write the arguments already as a JSON string.
        Some(Value::String(s)) => s.clone(),
        Some(a) => a.to_string(),
    };
    Some((name, arguments))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a whole output comes to.
    #[derive(Debug, Default, PartialEq)]
    struct Parsed {
        content: String,
        reasoning: String,
        calls: Vec<ToolCall>,
    }

    fn add(p: &mut Parsed, deltas: Vec<Delta>) {
        for d in deltas {
            match d {
                Delta::Content(s) => p.content.push_str(&s),
                Delta::Reasoning(s) => p.reasoning.push_str(&s),
                Delta::ToolCall(c) => p.calls.push(c),
            }
        }
    }

    fn parse_pieces(syntax: Syntax, in_reasoning: bool, pieces: &[&str]) -> Parsed {
        let mut parser = OutputParser::new(syntax, in_reasoning);
        let mut p = Parsed::default();
        for piece in pieces {
            add(&mut p, parser.push(piece));
        }
        add(&mut p, parser.finish());
        p
    }

    /// Every split of `text` into two pieces at a character boundary, every split into
    /// three, and one character at a time all give `want`.
    fn check_every_split(syntax: Syntax, in_reasoning: bool, text: &str, want: &Parsed) {
        let cuts: Vec<usize> = text
            .char_indices()
            .map(|(i, _)| i)
            .chain([text.len()])
            .collect();
        for &i in &cuts {
            let got = parse_pieces(syntax, in_reasoning, &[&text[..i], &text[i..]]);
            assert_eq!(&got, want, "split at {i} of {text:?}");
            for &j in cuts.iter().filter(|&&j| j >= i) {
                let got =
                    parse_pieces(syntax, in_reasoning, &[&text[..i], &text[i..j], &text[j..]]);
                assert_eq!(&got, want, "splits at {i}, {j} of {text:?}");
            }
        }
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let refs: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(
            &parse_pieces(syntax, in_reasoning, &refs),
            want,
            "{text:?} char by char"
        );
    }

    const BOTH: Syntax = Syntax {
        reasoning: true,
        tool_calls: true,
    };

    fn call(index: usize, name: &str, arguments: &str) -> ToolCall {
        ToolCall {
            index,
            name: name.into(),
            arguments: arguments.into(),
        }
    }

    #[test]
    fn reasoning_then_content_at_every_split() {
        let text = "<think>\nThe user greets me; reply <b>briefly</b> — in «French».\n</think>\n\nBonjour ! <thin";
        let want = Parsed {
            content: "Bonjour ! <thin".into(),
            reasoning: "\nThe user greets me; reply <b>briefly</b> — in «French».\n".into(),
            calls: vec![],
        };
        check_every_split(BOTH, false, text, &want);
    }

    #[test]
    fn a_prompt_that_opened_think_starts_in_reasoning() {
        assert!(OutputParser::prompt_opens_reasoning(
            "<|im_start|>assistant\n<think>\n"
        ));
        assert!(!OutputParser::prompt_opens_reasoning("<think>x</think>\n"));
        let text = "2 + 2 = 4, so…</think>The answer is 4.";
        let want = Parsed {
            content: "The answer is 4.".into(),
            reasoning: "2 + 2 = 4, so…".into(),
            calls: vec![],
        };
        check_every_split(BOTH, true, text, &want);
    }

    #[test]
    fn tool_calls_after_reasoning_at_every_split() {
        let text = "<think>Need the weather.</think>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich\", \"unit\": \"c\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
        let want = Parsed {
            content: String::new(),
            reasoning: "Need the weather.".into(),
            calls: vec![
                call(0, "get_weather", r#"{"city":"Zürich","unit":"c"}"#),
                call(1, "now", "{}"),
            ],
        };
        check_every_split(BOTH, false, text, &want);
    }

    #[test]
    fn content_around_a_tool_call_and_a_broken_call_stay_text() {
        let text = "Let me check. <tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}</tool_call> Done. <tool_call>not json</tool_call>";
        let want = Parsed {
            content: "Let me check. Done. <tool_call>not json</tool_call>".into(),
            reasoning: String::new(),
            calls: vec![call(0, "f", r#"{"a": 1}"#)],
        };
        check_every_split(BOTH, false, text, &want);
        // An unclosed call is content at the end, as written.
        let text = "x <tool_call>{\"name\": \"f\"";
        let want = Parsed {
            content: text.into(),
            ..Parsed::default()
        };
        check_every_split(BOTH, false, text, &want);
    }

    #[test]
    fn without_the_syntax_tags_are_plain_text() {
        let text = "<think>a</think><tool_call>{\"name\": \"f\"}</tool_call>";
        let want = Parsed {
            content: text.into(),
            ..Parsed::default()
        };
        check_every_split(Syntax::default(), false, text, &want);
        let s = Syntax::of_template("{% if tools %}<tool_call>{% endif %}");
        assert_eq!(
            s,
            Syntax {
                reasoning: false,
                tool_calls: true
            }
        );
    }
}

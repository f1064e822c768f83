//! Splitting a chat model's streamed output into content, reasoning and tool calls.
//!
//! Two families of conventions, told apart by the chat template ([`Syntax::of_template`]):
//!
//! - Hermes/Qwen: reasoning between `<think>` and `</think>`; each tool call between
//!   `<tool_call>` and `</tool_call>`, its body either JSON (`{"name": …, "arguments": {…}}`,
//!   Qwen2.5/Qwen3) or XML (`<function=NAME><parameter=P>value</parameter></function>`,
//!   Qwen3.5/3.6 and Qwen3-Coder).
//! - Gemma 4: reasoning in a thought channel, `<|channel>thought` … `<channel|>`; each call as
//!   `<|tool_call>call:NAME{key:value,…}<tool_call|>` with strings quoted by `<|"|>`; the
//!   `<|tool_response>` the model writes after its calls is dropped.
//!
//! [`OutputParser`] takes the output in whatever pieces it arrives and hands back [`Delta`]s;
//! the deltas of any split of a text add up to the same result, because text that could still
//! be the start of a tag is held back until it can be decided.

use std::collections::{HashMap, HashSet};

use serde_json::Value;

/// Which family of tags a model writes.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub enum Format {
    /// `<think>`, `<tool_call>` with a JSON body (either body is read back).
    #[default]
    Hermes,
    /// `<think>`, `<tool_call>` with an XML body (Qwen3.5/3.6, Qwen3-Coder).
    QwenXml,
    /// `<|channel>thought`, `<|tool_call>call:…`.
    Gemma4,
}

/// The tags of a format.
struct Tags {
    think_open: &'static str,
    think_close: &'static str,
    tool_open: &'static str,
    tool_close: &'static str,
    /// Tags dropped from the content.
    dropped: &'static [&'static str],
}

const HERMES: Tags = Tags {
    think_open: "<think>",
    think_close: "</think>",
    tool_open: "<tool_call>",
    tool_close: "</tool_call>",
    dropped: &[],
};

const GEMMA4: Tags = Tags {
    think_open: "<|channel>thought",
    think_close: "<channel|>",
    tool_open: "<|tool_call>",
    tool_close: "<tool_call|>",
    dropped: &["<|tool_response>"],
};

impl Format {
    /// The tag that ends the reasoning.
    pub fn think_close(self) -> &'static str {
        self.tags().think_close
    }

    fn tags(self) -> &'static Tags {
        match self {
            Format::Hermes | Format::QwenXml => &HERMES,
            Format::Gemma4 => &GEMMA4,
        }
    }
}

/// Which conventions the parser looks for.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Syntax {
    /// The format's reasoning tags are reasoning.
    pub reasoning: bool,
    /// The format's tool-call tags hold tool calls.
    pub tool_calls: bool,
    pub format: Format,
}

impl Syntax {
    /// The conventions a chat template's source shows it uses.
    pub fn of_template(source: &str) -> Syntax {
        if source.contains(GEMMA4.tool_open) || source.contains("<|channel>") {
            return Syntax {
                reasoning: source.contains("<|channel>"),
                tool_calls: source.contains(GEMMA4.tool_open),
                format: Format::Gemma4,
            };
        }
        Syntax {
            reasoning: source.contains(HERMES.think_open),
            tool_calls: source.contains(HERMES.tool_open),
            format: if source.contains("<function=") {
                Format::QwenXml
            } else {
                Format::Hermes
            },
        }
    }

    /// Whether the prompt `text` leaves the model inside its reasoning (it ends with an open
    /// reasoning tag).
    pub fn prompt_opens_reasoning(&self, text: &str) -> bool {
        self.reasoning && {
            let t = text.trim_end();
            t.ends_with(self.format.tags().think_open)
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
    /// Per function, the parameters its schema types as strings (an XML call's values are
    /// JSON unless so typed).
    strings: HashMap<String, HashSet<String>>,
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
            strings: HashMap::new(),
        }
    }

    /// The request's tools (OpenAI's `{"type": "function", "function": {"name", "parameters"}}`):
    /// an XML call's parameter typed `string` stays text even when it reads as a number.
    pub fn with_tools(mut self, tools: &[Value]) -> OutputParser {
        for t in tools {
            let f = &t["function"];
            let (Some(name), Some(props)) = (
                f["name"].as_str(),
                f["parameters"]["properties"].as_object(),
            ) else {
                continue;
            };
            let strings = props
                .iter()
                .filter(|(_, p)| p["type"] == "string")
                .map(|(k, _)| k.clone())
                .collect();
            self.strings.insert(name.to_string(), strings);
        }
        self
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
                let open = self.syntax.format.tags().tool_open;
                self.text(&format!("{open}{rest}"), &mut out);
            }
            _ => self.text(&rest, &mut out),
        }
        out
    }

    /// Tags that end or change the current mode.
    fn tags(&self) -> Vec<&'static str> {
        let f = self.syntax.format.tags();
        let mut t = Vec::new();
        match self.mode {
            Mode::Content => {
                if self.syntax.reasoning {
                    t.push(f.think_open);
                }
                if self.syntax.tool_calls {
                    t.push(f.tool_open);
                    t.extend_from_slice(f.dropped);
                }
            }
            Mode::Reasoning => t.push(f.think_close),
            Mode::Tool => t.push(f.tool_close),
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
        let f = self.syntax.format.tags();
        if tag == f.think_open {
            self.mode = Mode::Reasoning;
        } else if tag == f.think_close {
            self.mode = Mode::Content;
            self.trim = true;
        } else if tag == f.tool_open {
            self.mode = Mode::Tool;
        }
        // A dropped tag leaves the mode as it is.
    }

    /// A tool call's closing tag: its body becomes a call, or text as written when it is not
    /// a call after all.
    fn close_call(&mut self, body: &str, out: &mut Vec<Delta>) {
        self.mode = Mode::Content;
        let parsed = match self.syntax.format {
            Format::Hermes | Format::QwenXml => {
                parse_call(body).or_else(|| parse_xml_call(body, &self.strings))
            }
            Format::Gemma4 => parse_gemma_call(body),
        };
        match parsed {
            Some((name, arguments)) => {
                out.push(Delta::ToolCall(ToolCall {
                    index: self.calls,
                    name,
                    arguments,
                }));
                self.calls += 1;
                self.trim = true;
            }
            None => {
                let f = self.syntax.format.tags();
                self.text(&format!("{}{body}{}", f.tool_open, f.tool_close), out)
            }
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

/// `<function=NAME>\n<parameter=P>\nvalue\n</parameter>\n…</function>` → the name and the
/// arguments as JSON text. A value is JSON when it reads as JSON and its parameter is not
/// typed `string` in the request's tools; text otherwise (one newline either side is the
/// format's, not the value's).
fn parse_xml_call(
    body: &str,
    strings: &HashMap<String, HashSet<String>>,
) -> Option<(String, String)> {
    let b = body.trim();
    let rest = b.strip_prefix("<function=")?;
    let (name, mut rest) = rest.split_once('>')?;
    let name = name.trim().to_string();
    if name.is_empty() {
        return None;
    }
    let typed = strings.get(&name);
    let mut args = serde_json::Map::new();
    loop {
        rest = rest.trim_start();
        if let Some(after) = rest.strip_prefix("</function>") {
            return after
                .trim()
                .is_empty()
                .then(|| (name, Value::Object(args).to_string()));
        }
        let r = rest.strip_prefix("<parameter=")?;
        let (key, r) = r.split_once('>')?;
        let (raw, r) = r.split_once("</parameter>")?;
        let raw = raw.strip_prefix('\n').unwrap_or(raw);
        let raw = raw.strip_suffix('\n').unwrap_or(raw);
        let key = key.trim().to_string();
        let is_string = typed.is_some_and(|t| t.contains(&key));
        let v = match serde_json::from_str::<Value>(raw) {
            Ok(v) if !is_string => v,
            _ => Value::String(raw.to_string()),
        };
        args.insert(key, v);
        rest = r;
    }
}

/// Gemma 4's `call:NAME{key:value,…}` → the name and the arguments as JSON text. Values:
/// `<|"|>text<|"|>`, numbers, `true`/`false`/`null`, `[…]`, and `{key:value,…}` with bare keys.
fn parse_gemma_call(body: &str) -> Option<(String, String)> {
    let b = body.trim().strip_prefix("call:")?;
    let brace = b.find('{')?;
    let name = b[..brace].trim().to_string();
    if name.is_empty() {
        return None;
    }
    let mut p = GemmaArgs {
        s: &b[brace..],
        depth: 0,
    };
    let v = p.value()?;
    if !v.is_object() || !p.s.trim().is_empty() {
        return None;
    }
    Some((name, v.to_string()))
}

/// A recursive-descent reader of Gemma 4's argument syntax.
struct GemmaArgs<'a> {
    s: &'a str,
    /// Containers open around the value being read (bounded: the text is the model's).
    depth: usize,
}

/// Deeper nesting than this is not a call (as serde_json bounds its recursion).
const MAX_DEPTH: usize = 128;

const GEMMA_QUOTE: &str = "<|\"|>";

impl GemmaArgs<'_> {
    fn eat(&mut self, t: &str) -> bool {
        match self.s.strip_prefix(t) {
            Some(r) => {
                self.s = r;
                true
            }
            None => false,
        }
    }

    fn value(&mut self) -> Option<Value> {
        if self.depth >= MAX_DEPTH {
            return None;
        }
        self.depth += 1;
        let v = self.value_inner();
        self.depth -= 1;
        v
    }

    fn value_inner(&mut self) -> Option<Value> {
        self.s = self.s.trim_start();
        if self.eat(GEMMA_QUOTE) {
            let end = self.s.find(GEMMA_QUOTE)?;
            let text = self.s[..end].to_string();
            self.s = &self.s[end + GEMMA_QUOTE.len()..];
            return Some(Value::String(text));
        }
        if self.eat("{") {
            let mut m = serde_json::Map::new();
            self.s = self.s.trim_start();
            if self.eat("}") {
                return Some(Value::Object(m));
            }
            loop {
                self.s = self.s.trim_start();
                let key = if self.eat(GEMMA_QUOTE) {
                    let end = self.s.find(GEMMA_QUOTE)?;
                    let k = self.s[..end].to_string();
                    self.s = &self.s[end + GEMMA_QUOTE.len()..];
                    k
                } else {
                    let end = self.s.find(':')?;
                    let k = self.s[..end].trim().to_string();
                    self.s = &self.s[end..];
                    k
                };
                if key.is_empty() || !self.eat(":") {
                    return None;
                }
                let v = self.value()?;
                m.insert(key, v);
                self.s = self.s.trim_start();
                if self.eat("}") {
                    return Some(Value::Object(m));
                }
                if !self.eat(",") {
                    return None;
                }
            }
        }
        if self.eat("[") {
            let mut v = Vec::new();
            self.s = self.s.trim_start();
            if self.eat("]") {
                return Some(Value::Array(v));
            }
            loop {
                v.push(self.value()?);
                self.s = self.s.trim_start();
                if self.eat("]") {
                    return Some(Value::Array(v));
                }
                if !self.eat(",") {
                    return None;
                }
            }
        }
        // A bare word: a number, true, false or null.
        let end = self
            .s
            .find(|c: char| c == ',' || c == '}' || c == ']')
            .unwrap_or(self.s.len());
        let word = self.s[..end].trim();
        let v = serde_json::from_str::<Value>(word)
            .ok()
            .filter(|v| !v.is_object() && !v.is_array())?;
        self.s = &self.s[end..];
        Some(v)
    }
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
        format: Format::Hermes,
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
        assert!(BOTH.prompt_opens_reasoning("<|im_start|>assistant\n<think>\n"));
        assert!(!BOTH.prompt_opens_reasoning("<think>x</think>\n"));
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
    fn qwen_xml_calls_at_every_split() {
        // As Qwen3.5's template writes an assistant turn (reasoning, text, two calls).
        let text = "<think>\nTwo cities.\n</think>\n\nLet me check both.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=zip>\n0150\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=search>\n<parameter=query>\nRome\nweather\n</parameter>\n<parameter=filters>\n[\"today\", \"news\"]\n</parameter>\n</function>\n</tool_call>";
        let tools = vec![
            serde_json::json!({"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                "days": {"type": "integer"}, "zip": {"type": "string"}}}}}),
        ];
        let want = Parsed {
            content: "Let me check both.\n\n".into(),
            reasoning: "\nTwo cities.\n".into(),
            calls: vec![
                call(0, "get_weather", r#"{"city":"Oslo","days":3,"zip":"0150"}"#),
                call(
                    1,
                    "search",
                    r#"{"query":"Rome\nweather","filters":["today","news"]}"#,
                ),
            ],
        };
        let cuts: Vec<usize> = text.char_indices().map(|(i, _)| i).collect();
        for &i in &cuts {
            let mut parser = OutputParser::new(BOTH, false).with_tools(&tools);
            let mut p = Parsed::default();
            add(&mut p, parser.push(&text[..i]));
            add(&mut p, parser.push(&text[i..]));
            add(&mut p, parser.finish());
            assert_eq!(p, want, "split at {i}");
        }
        // Without the schema, "0150" reads as JSON? No: a leading zero is not JSON, so text.
        let mut parser = OutputParser::new(BOTH, false);
        let mut p = Parsed::default();
        add(&mut p, parser.push(text));
        add(&mut p, parser.finish());
        assert_eq!(
            p.calls[0].arguments,
            r#"{"city":"Oslo","days":3,"zip":"0150"}"#
        );
        // A body that is neither JSON nor a whole XML call stays text.
        let broken = "<tool_call>\n<function=f>\n<parameter=a>\n1\n</function>\n</tool_call>";
        let got = parse_pieces(BOTH, false, &[broken]);
        assert_eq!(got.content, broken);
        assert!(got.calls.is_empty());
    }

    const GEMMA: Syntax = Syntax {
        reasoning: true,
        tool_calls: true,
        format: Format::Gemma4,
    };

    #[test]
    fn gemma4_thought_channel_and_calls_at_every_split() {
        let text = "<|channel>thought\nCheck <b>both</b>.<channel|>Sure.<|tool_call>call:get_weather{city:<|\"|>Oslo, NO<|\"|>,days:3,metric:true}<tool_call|><|tool_call>call:search{filters:[<|\"|>today<|\"|>,<|\"|>news<|\"|>],opts:{depth:2,exact:false},query:<|\"|>Rome {weather}<|\"|>}<tool_call|><|tool_response>";
        let want = Parsed {
            content: "Sure.".into(),
            reasoning: "\nCheck <b>both</b>.".into(),
            calls: vec![
                call(
                    0,
                    "get_weather",
                    r#"{"city":"Oslo, NO","days":3,"metric":true}"#,
                ),
                call(
                    1,
                    "search",
                    r#"{"filters":["today","news"],"opts":{"depth":2,"exact":false},"query":"Rome {weather}"}"#,
                ),
            ],
        };
        check_every_split(GEMMA, false, text, &want);
        assert!(GEMMA.prompt_opens_reasoning("<|turn>model\n<|channel>thought\n"));
        assert!(!GEMMA.prompt_opens_reasoning("<|turn>model\n<|channel>thought\n<channel|>"));
        let s = Syntax::of_template("{{ '<|tool_call>call:' }}{{ '<|channel>thought' }}");
        assert_eq!(s, GEMMA);
        let deep = format!(
            "<|tool_call>call:f{{a:{}1{}}}<tool_call|>",
            "[".repeat(100_000),
            "]".repeat(100_000)
        );
        let got = parse_pieces(GEMMA, false, &[&deep]);
        assert!(got.calls.is_empty() && got.content == deep);
        let broken = "<|tool_call>call:f{a:<|\"|>x}<tool_call|>";
        let got = parse_pieces(GEMMA, false, &[broken]);
        assert_eq!(got.content, broken);
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
                tool_calls: true,
                format: Format::Hermes,
            }
        );
    }
}

//! Grammars (llguidance's Lark dialect) that force a tool call in the format a model's
//! template uses, each call's arguments following its function's `parameters` schema:
//!
//! - Hermes: `<tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>` (a JSON schema);
//! - Qwen XML: `<tool_call>\n<function=NAME>\n<parameter=P>\nvalue\n</parameter>\n…</function>\n</tool_call>`,
//!   a string parameter's value as text, any other as JSON;
//! - Gemma 4: `<|tool_call>call:NAME{key:value,…}<tool_call|>`, strings quoted by `<|"|>`,
//!   keys sorted (as the template writes them).
//!
//! Text written to be parsed back by [`super::parse::OutputParser`], which the tests check.

use serde_json::{json, Value};

use super::parse::{Format, Syntax};

/// How many calls a forced choice allows.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Calls {
    /// Exactly one.
    One,
    /// One or more (`required` with parallel calls allowed).
    Many,
}

/// A Lark string literal.
fn lit(s: &str) -> String {
    json!(s).to_string()
}

/// Builds the grammar's rules.
struct Rules {
    rules: Vec<String>,
    /// How a tag that is a control token of the vocabulary is written (`<[id]>`).
    special: Box<dyn Fn(&str) -> Option<u32>>,
}

impl Rules {
    fn add(&mut self, body: String) -> String {
        let name = format!("r{}", self.rules.len());
        self.rules.push(format!("{name}: {body}"));
        name
    }

    /// A tag: the control token when the vocabulary has it as one, else its text.
    fn tag(&self, t: &str) -> String {
        match (self.special)(t) {
            Some(id) => format!("<[{id}]>"),
            None => lit(t),
        }
    }

    /// JSON for `schema`, written as `json.dumps` writes it.
    fn json(&mut self, schema: &Value) -> String {
        let mut s = match schema {
            Value::Object(_) => schema.clone(),
            _ => json!({}),
        };
        s["x-guidance"] = json!({
            "whitespace_flexible": false, "item_separator": ", ", "key_separator": ": ",
        });
        self.add(format!("%json {s}"))
    }

    /// Free text of the schema's length ending at `suffix` (which is written after it): any
    /// character may appear, the text ends where the suffix first does.
    fn text(&mut self, schema: &Value, suffix: &str) -> String {
        let min = schema["minLength"].as_u64().unwrap_or(0);
        let body = match schema["maxLength"].as_u64() {
            Some(max) => format!("/(?s:.{{{},{max}}})/", min.min(max)),
            None if min > 0 => format!("/(?s:.{{{min},}})/"),
            None => "/(?s:.*)/".to_string(),
        };
        let name = format!("r{}", self.rules.len());
        self.rules
            .push(format!("{name}[suffix={}]: {body}", lit(suffix)));
        name
    }

    /// A string enum's alternatives, each written by `quote`.
    fn choices(&mut self, values: &[Value], quote: impl Fn(&str) -> String) -> Option<String> {
        let alts: Vec<String> = values
            .iter()
            .map(|v| match v {
                Value::String(s) => quote(s),
                other => lit(&other.to_string()),
            })
            .collect();
        (!alts.is_empty()).then(|| self.add(alts.join(" | ")))
    }

    /// An XML parameter's value and the closing `\n</parameter>\n`: text for strings, JSON
    /// for the rest.
    fn xml_value(&mut self, schema: &Value) -> String {
        const CLOSE: &str = "\n</parameter>\n";
        if let Some(e) = schema["enum"].as_array() {
            if let Some(r) = self.choices(e, lit) {
                return format!("{r} {}", lit(CLOSE));
            }
        }
        if schema["type"] == "string" {
            return self.text(schema, CLOSE);
        }
        let j = self.json(schema);
        format!("{j} {}", lit(CLOSE))
    }

    /// A value in Gemma 4's syntax.
    fn gemma_value(&mut self, schema: &Value, depth: usize) -> String {
        let q = |s: &str| format!("\"<|\\\"|>\" {} \"<|\\\"|>\"", lit(s));
        if let Some(e) = schema["enum"].as_array() {
            if let Some(r) = self.choices(e, q) {
                return r;
            }
        }
        match schema["type"].as_str() {
            Some("string") => {
                let t = self.text(schema, "<|\"|>");
                self.add(format!("\"<|\\\"|>\" {t}"))
            }
            Some("array") if depth < 4 => {
                let item = self.gemma_value(&schema["items"], depth + 1);
                self.add(format!("\"[\" ({item} (\",\" {item})*)? \"]\""))
            }
            Some("object") if depth < 4 => match self.gemma_object(schema, depth + 1) {
                Some(body) => self.add(format!("\"{{\" {body} \"}}\"")),
                None => self.add("\"{}\"".into()),
            },
            // Numbers, booleans and null read the same as JSON.
            Some("integer" | "number" | "boolean" | "null") => self.json(schema),
            _ => self.json(&json!({"type": ["integer", "number", "boolean"]})),
        }
    }

    /// `key:value,…` of an object in Gemma 4's syntax, keys sorted, optional keys left out
    /// or not; `None` for an object without properties.
    fn gemma_object(&mut self, schema: &Value, depth: usize) -> Option<String> {
        let required: Vec<&str> = schema["required"]
            .as_array()
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let mut props: Vec<(&String, &Value)> = schema["properties"]
            .as_object()
            .map(|p| p.iter().collect())
            .unwrap_or_default();
        props.sort_by(|a, b| a.0.cmp(b.0));
        let mut parts: Vec<(String, bool)> = Vec::new();
        for (k, v) in props {
            let val = self.gemma_value(v, depth);
            let pair = self.add(format!("{} {val}", lit(&format!("{k}:"))));
            parts.push((pair, required.contains(&k.as_str())));
        }
        // From the last key back: the rule for "keys i.. when none was written yet" and
        // "… when one was" (a comma goes before every key but the first written).
        let join = |a: String, b: &Option<String>| match b {
            Some(b) => format!("{a} {b}"),
            None => a,
        };
        let alt = |a: String, b: &Option<String>| match b {
            Some(b) => format!("({a}) | ({b})"),
            None => format!("({a})?"),
        };
        let (mut first, mut more): (Option<String>, Option<String>) = (None, None);
        for (pair, req) in parts.into_iter().rev() {
            let with_first = join(pair.clone(), &more);
            let with_more = join(format!("\",\" {pair}"), &more);
            let (f, m) = if req {
                (with_first, with_more)
            } else {
                (alt(with_first, &first), alt(with_more, &more))
            };
            first = Some(self.add(f));
            more = Some(self.add(m));
        }
        first
    }
}

/// The Lark grammar forcing calls of `tools` (OpenAI's `{"type": "function", "function":
/// {…}}`; only `name` when one is named) in `syntax`'s format. `special` gives the id of a tag
/// that is a control token of the vocabulary. A prompt that opened the reasoning
/// (`in_reasoning`) gets it closed first.
pub fn tool_call_grammar(
    syntax: Syntax,
    tools: &[Value],
    only: Option<&str>,
    calls: Calls,
    in_reasoning: bool,
    special: Box<dyn Fn(&str) -> Option<u32>>,
) -> String {
    let mut r = Rules {
        rules: Vec::new(),
        special,
    };
    let chosen: Vec<&Value> = tools
        .iter()
        .filter(|t| only.is_none_or(|n| t["function"]["name"].as_str() == Some(n)))
        .collect();
    let params = |t: &Value| match t["function"].get("parameters") {
        Some(p @ Value::Object(_)) => p.clone(),
        _ => json!({"type": "object"}),
    };
    let (call, sep, think) = match syntax.format {
        Format::Hermes => {
            let schemas: Vec<Value> = chosen
                .iter()
                .map(|t| {
                    json!({
                        "type": "object",
                        "properties": {"name": {"const": t["function"]["name"]},
                                       "arguments": params(t)},
                        "required": ["name", "arguments"],
                        "additionalProperties": false,
                    })
                })
                .collect();
            let schema = if schemas.len() == 1 {
                schemas[0].clone()
            } else {
                json!({ "anyOf": schemas })
            };
            let body = r.json(&schema);
            let call = r.add(format!(
                "{} \"\\n\" {body} \"\\n\" {}",
                r.tag("<tool_call>"),
                r.tag("</tool_call>")
            ));
            (call, "\"\\n\"", format!("{} \"\\n\\n\"", r.tag("</think>")))
        }
        Format::QwenXml => {
            let mut fns = Vec::new();
            for t in &chosen {
                let name = t["function"]["name"].as_str().unwrap_or("");
                let p = params(t);
                let required: Vec<&str> = p["required"]
                    .as_array()
                    .map(|r| r.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                let mut seq = vec![lit(&format!("<function={name}>\n"))];
                for (k, v) in p["properties"].as_object().into_iter().flatten() {
                    let val = r.xml_value(v);
                    let one = r.add(format!("{} {val}", lit(&format!("<parameter={k}>\n"))));
                    seq.push(if required.contains(&k.as_str()) {
                        one
                    } else {
                        format!("{one}?")
                    });
                }
                seq.push(lit("</function>\n"));
                fns.push(r.add(seq.join(" ")));
            }
            let body = r.add(fns.join(" | "));
            let call = r.add(format!(
                "{} \"\\n\" {body} {}",
                r.tag("<tool_call>"),
                r.tag("</tool_call>")
            ));
            (call, "\"\\n\"", format!("{} \"\\n\\n\"", r.tag("</think>")))
        }
        Format::Gemma4 => {
            let mut fns = Vec::new();
            for t in &chosen {
                let name = t["function"]["name"].as_str().unwrap_or("");
                let open = lit(&format!("call:{name}{{"));
                fns.push(match r.gemma_object(&params(t), 0) {
                    Some(body) => r.add(format!("{open} {body} \"}}\"")),
                    None => r.add(format!("{open} \"}}\"")),
                });
            }
            let body = r.add(fns.join(" | "));
            let call = r.add(format!(
                "{} {body} {}",
                r.tag("<|tool_call>"),
                r.tag("<tool_call|>")
            ));
            (call, "", r.tag("<channel|>"))
        }
    };
    let more = match calls {
        Calls::Many if sep.is_empty() => format!(" ({call})*"),
        Calls::Many => format!(" ({sep} {call})*"),
        Calls::One => String::new(),
    };
    let think = if in_reasoning {
        format!("{think} ")
    } else {
        String::new()
    };
    let mut out = format!("start: {think}{call}{more}\n");
    for rule in &r.rules {
        out.push_str(rule);
        out.push('\n');
    }
    out
}

//! Chat templates: the model's own Jinja template (from `tokenizer.chat_template`), rendered
//! with minijinja and Python-compatible string methods.

pub mod calls;
pub mod limits;
pub mod parse;
#[cfg(unix)]
pub mod sandbox;

use minijinja::{Environment, Error as JinjaError, ErrorKind};
use serde::Serialize;

use crate::error::{Error, Result};

/// One chat message.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Message {
    pub role: String,
    pub content: String,
}

impl Message {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Message {
            role: role.into(),
            content: content.into(),
        }
    }
}

pub use limits::{Limit, RenderError, RenderLimits};

/// A compiled chat template.
pub struct ChatTemplate {
    /// The compiled template, made on first in-process use for a template that was only
    /// checked in the sandbox ([`ChatTemplate::sandboxed`]).
    env: std::sync::OnceLock<std::result::Result<Environment<'static>, String>>,
    source: String,
    bos: String,
    eos: String,
}

fn raise_exception(msg: String) -> std::result::Result<String, JinjaError> {
    Err(JinjaError::new(ErrorKind::InvalidOperation, msg))
}

/// Python's `json.dumps` as transformers' templates call it: `", "` and `": "` between
/// items (or newlines and `indent` spaces), keys in their order unless `sort_keys`, and no
/// escaping of non-ASCII text unless `ensure_ascii` (minijinja's own filter writes compact,
/// HTML-escaped JSON, which would change the prompt).
fn tojson(
    v: minijinja::Value,
    kwargs: minijinja::value::Kwargs,
) -> std::result::Result<minijinja::Value, JinjaError> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let sort: Option<bool> = kwargs.get("sort_keys")?;
    let ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(&v)
        .map_err(|e| JinjaError::new(ErrorKind::InvalidOperation, e.to_string()))?;
    let mut out = String::new();
    py_json(
        &json,
        indent,
        sort.unwrap_or(false),
        ascii.unwrap_or(false),
        0,
        &mut out,
    );
    Ok(minijinja::Value::from_safe_string(out))
}

fn py_string(s: &str, ascii: bool, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ascii && (c as u32) > 0x7f) => {
                let mut buf = [0u16; 2];
                for u in c.encode_utf16(&mut buf) {
                    out.push_str(&format!("\\u{u:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn py_json(
    v: &serde_json::Value,
    indent: Option<usize>,
    sort: bool,
    ascii: bool,
    level: usize,
    out: &mut String,
) {
    use serde_json::Value as J;
    let (item_sep, newline) = match indent {
        Some(n) => (
            ",".to_string(),
            format!("\n{}", " ".repeat(n * (level + 1))),
        ),
        None => (", ".to_string(), String::new()),
    };
    let close = match indent {
        Some(n) => format!("\n{}", " ".repeat(n * level)),
        None => String::new(),
    };
    match v {
        J::Null => out.push_str("null"),
        J::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        J::Number(n) => out.push_str(&n.to_string()),
        J::String(s) => py_string(s, ascii, out),
        J::Array(a) if a.is_empty() => out.push_str("[]"),
        J::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push_str(&item_sep);
                }
                out.push_str(&newline);
                py_json(x, indent, sort, ascii, level + 1, out);
            }
            out.push_str(&close);
            out.push(']');
        }
        J::Object(m) if m.is_empty() => out.push_str("{}"),
        J::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            if sort {
                keys.sort();
            }
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push_str(&item_sep);
                }
                out.push_str(&newline);
                py_string(k, ascii, out);
                out.push_str(": ");
                py_json(&m[k], indent, sort, ascii, level + 1, out);
            }
            out.push_str(&close);
            out.push('}');
        }
    }
}

/// The environment templates render in: Python-compatible string methods, transformers'
/// `raise_exception`, `strftime_now` and `tojson`, Jinja's block trimming, and `fuel`
/// instructions at most per render.
fn environment(source: &str, fuel: u64) -> std::result::Result<Environment<'static>, JinjaError> {
    let mut env = Environment::new();
    minijinja_contrib::add_to_environment(&mut env);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", |fmt: String| -> String {
        // Templates use it for "today's date"; a fixed format keeps prompts reproducible.
        let _ = fmt;
        "26 Jul 2024".to_string()
    });
    env.add_filter("tojson", tojson);
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_fuel(Some(fuel));
    env.add_template_owned("chat", source.to_string())?;
    Ok(env)
}

/// Renders the compiled template `env` over `ctx` within `limits`' fuel and output size
/// (memory and time are the sandbox's to bound).
fn render_env(
    env: &Environment<'static>,
    ctx: &serde_json::Value,
    limits: &RenderLimits,
) -> std::result::Result<String, RenderError> {
    let t = env
        .get_template("chat")
        .map_err(|e| RenderError::Template(format!("chat template: {e}")))?;
    let mut out = limits::Capped {
        buf: Vec::new(),
        cap: limits.max_output,
        over: false,
    };
    match t.render_captured_to(minijinja::Value::from_serialize(ctx), &mut out) {
        Ok(_) => String::from_utf8(out.buf)
            .map_err(|_| RenderError::Template("chat template: output is not UTF-8".into())),
        Err(_) if out.over => Err(RenderError::Limit(
            Limit::Output,
            Limit::Output.describe(limits),
        )),
        Err(e) if e.kind() == ErrorKind::OutOfFuel => Err(RenderError::Limit(
            Limit::Fuel,
            Limit::Fuel.describe(limits),
        )),
        Err(e) => Err(RenderError::Template(format!("chat template failed: {e}"))),
    }
}

/// Compiles `source` and renders it over `ctx` (what the sandbox process runs).
pub(crate) fn render_source(
    source: &str,
    ctx: &serde_json::Value,
    limits: &RenderLimits,
) -> std::result::Result<String, RenderError> {
    let env = environment(source, limits.fuel)
        .map_err(|e| RenderError::Template(format!("chat template does not compile: {e}")))?;
    // A null context asks for the compile alone ([`sandbox::compile_check`]).
    if ctx.is_null() {
        return Ok(String::new());
    }
    render_env(&env, ctx, limits)
}

impl ChatTemplate {
    /// Compiles `source`; `bos`/`eos` are the texts of the model's BOS and EOS tokens.
    pub fn new(source: &str, bos: &str, eos: &str) -> Result<ChatTemplate> {
        let env = environment(source, RenderLimits::default().fuel)
            .map_err(|e| Error::Tokenizer(format!("chat template does not compile: {e}")))?;
        Ok(ChatTemplate {
            env: std::sync::OnceLock::from(Ok(env)),
            source: source.to_string(),
            bos: bos.to_string(),
            eos: eos.to_string(),
        })
    }

    /// A template from outside (a served model's), compiled only in the sandbox, within
    /// `limits`: minijinja folds constant expressions when it compiles (`'x' * 100000000`
    /// is a 100 MB string, and concatenations of such strings double), so even compiling
    /// untrusted source can take gigabytes. Renders go through [`ChatTemplate::render_limited`];
    /// the in-process methods compile it on first use. Without Unix processes, as `new`.
    pub fn sandboxed(
        source: &str,
        bos: &str,
        eos: &str,
        limits: &RenderLimits,
    ) -> Result<ChatTemplate> {
        #[cfg(unix)]
        {
            sandbox::compile_check(source, limits).map_err(|e| match e {
                RenderError::Template(m) => Error::Tokenizer(m),
                e => Error::Tokenizer(format!("chat template does not compile: {e}")),
            })?;
            Ok(ChatTemplate {
                env: std::sync::OnceLock::new(),
                source: source.to_string(),
                bos: bos.to_string(),
                eos: eos.to_string(),
            })
        }
        #[cfg(not(unix))]
        {
            let _ = limits;
            ChatTemplate::new(source, bos, eos)
        }
    }

    /// The compiled template (compiled now if it was only checked in the sandbox).
    fn env(&self) -> Result<&Environment<'static>> {
        self.env
            .get_or_init(|| {
                environment(&self.source, RenderLimits::default().fuel).map_err(|e| e.to_string())
            })
            .as_ref()
            .map_err(|e| Error::Tokenizer(format!("chat template does not compile: {e}")))
    }

    /// The template's source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The prompt text for `messages`, ending with the assistant's turn opened when
    /// `add_generation_prompt`.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        let messages: Vec<serde_json::Value> = messages
            .iter()
            .map(|m| serde_json::json!({"role": m.role, "content": m.content}))
            .collect();
        self.render_json(&messages, None, add_generation_prompt)
    }

    /// `render` over OpenAI-style message objects as they came (so `tool_calls`,
    /// `tool_call_id`, `name` and `reasoning_content` reach the template), with the request's
    /// `tools` list when it has one.
    pub fn render_json(
        &self,
        messages: &[serde_json::Value],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<String> {
        self.render_with(
            messages,
            tools,
            add_generation_prompt,
            &serde_json::Map::new(),
        )
    }

    /// `render_json` with extra variables for the template (a request's
    /// `chat_template_kwargs`, such as `enable_thinking`); they cannot replace the messages,
    /// tools, generation prompt or special tokens.
    pub fn render_with(
        &self,
        messages: &[serde_json::Value],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
        kwargs: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String> {
        let ctx = self.context(messages, tools, add_generation_prompt, kwargs);
        render_env(self.env()?, &ctx, &RenderLimits::default())
            .map_err(|e| Error::Tokenizer(e.to_string()))
    }

    /// `render_with` under `limits`, for templates that came from outside (a served model's):
    /// on Unix in the sandbox process (memory and wall-clock bounded, stopped as soon as
    /// `cancelled` says so), elsewhere in this process with fuel and the output cap only.
    pub fn render_limited(
        &self,
        messages: &[serde_json::Value],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
        kwargs: &serde_json::Map<String, serde_json::Value>,
        limits: &RenderLimits,
        cancelled: &dyn Fn() -> bool,
    ) -> std::result::Result<String, RenderError> {
        let ctx = self.context(messages, tools, add_generation_prompt, kwargs);
        #[cfg(unix)]
        {
            sandbox::render(&self.source, &ctx, limits, cancelled)
        }
        #[cfg(not(unix))]
        {
            let _ = cancelled;
            render_source(&self.source, &ctx, limits)
        }
    }

    /// The variables a render sees: `kwargs` (a request's `chat_template_kwargs`), which
    /// cannot replace the messages, tools, generation prompt or special tokens.
    fn context(
        &self,
        messages: &[serde_json::Value],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
        kwargs: &serde_json::Map<String, serde_json::Value>,
    ) -> serde_json::Value {
        let mut ctx = kwargs.clone();
        ctx.insert(
            "messages".into(),
            serde_json::Value::from(messages.to_vec()),
        );
        ctx.insert(
            "tools".into(),
            tools.cloned().unwrap_or(serde_json::Value::Null),
        );
        ctx.insert("add_generation_prompt".into(), add_generation_prompt.into());
        ctx.insert("bos_token".into(), self.bos.clone().into());
        ctx.insert("eos_token".into(), self.eos.clone().into());
        serde_json::Value::Object(ctx)
    }
}

/// A model's chat template, opened with its tokenizer's BOS and EOS pieces, and the one rule
/// that turns a conversation into prompt ids: the template over the whole conversation with
/// the generation prompt, tokenized by [`crate::tokenizer::Tokenizer::encode_chat`], as the
/// server's chat endpoint tokenizes it (`kiln chat`, `kiln bench`'s grammar test and the
/// browser page use it).
pub struct ChatPrompter {
    tpl: ChatTemplate,
}

impl ChatPrompter {
    /// The prompter of template `src` for the model of `tok`.
    pub fn new(tok: &crate::tokenizer::Tokenizer, src: &str) -> Result<ChatPrompter> {
        let piece = |id: Option<u32>| id.map(|i| tok.decode(&[i])).unwrap_or_default();
        Ok(ChatPrompter {
            tpl: ChatTemplate::new(src, &piece(tok.bos()), &piece(tok.eos()))?,
        })
    }

    /// The rendered prompt for the reply to `messages`.
    pub fn render(&self, messages: &[Message]) -> Result<String> {
        self.tpl.render(messages, true)
    }

    /// The ids of the prompt for the reply to `messages`.
    pub fn ids(&self, tok: &crate::tokenizer::Tokenizer, messages: &[Message]) -> Result<Vec<u32>> {
        tok.encode_chat(&self.render(messages)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn renders_chatml() {
        let t = ChatTemplate::new(CHATML, "", "<|im_end|>").unwrap();
        let s = t
            .render(
                &[
                    Message::new("system", "Be brief."),
                    Message::new("user", "Hi"),
                ],
                true,
            )
            .unwrap();
        assert_eq!(s, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    }

    #[test]
    fn python_string_methods_and_raise_exception() {
        let src = "{{ bos_token }}{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no tools') }}{% endif %}{{ m.content.strip() | upper }}{% endfor %}";
        let t = ChatTemplate::new(src, "<bos>", "").unwrap();
        assert_eq!(
            t.render(&[Message::new("user", "  hi  ")], false).unwrap(),
            "<bos>HI"
        );
        let e = t.render(&[Message::new("tool", "x")], false).unwrap_err();
        assert!(e.to_string().contains("no tools"), "{e}");
    }

    #[test]
    fn tools_and_tool_calls_reach_the_template() {
        let src = "{% if tools %}{% for t in tools %}[{{ t.function.name }}]{% endfor %}{% endif %}{% for m in messages %}{{ m.role }}:{% if m.tool_calls %}{% for c in m.tool_calls %}{{ c.function.name }}({{ c.function.arguments }}){% endfor %}{% else %}{{ m.content }}{% endif %}{% if m.tool_call_id %}#{{ m.tool_call_id }}{% endif %};{% endfor %}";
        let t = ChatTemplate::new(src, "", "").unwrap();
        let messages = vec![
            serde_json::json!({"role": "user", "content": "weather?"}),
            serde_json::json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_0", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"}}]}),
            serde_json::json!({"role": "tool", "tool_call_id": "call_0", "content": "-3C"}),
        ];
        let tools = serde_json::json!([{"type": "function", "function": {"name": "get_weather"}}]);
        assert_eq!(
            t.render_json(&messages, Some(&tools), false).unwrap(),
            "[get_weather]user:weather?;assistant:get_weather({\"city\":\"Oslo\"});tool:-3C#call_0;"
        );
        assert!(!t
            .render_json(&messages, None, false)
            .unwrap()
            .contains("[get_weather]"));
    }

    #[test]
    fn tojson_writes_what_python_json_dumps_writes() {
        let src = "{{ v | tojson }}|{{ v | tojson(ensure_ascii=true) }}|{{ v | tojson(indent=2) }}|{{ v | tojson(sort_keys=true) }}";
        let t = ChatTemplate::new(src, "", "").unwrap();
        let v = serde_json::json!({"z": [1, 2.5, "é\n<&>\""], "a": null, "e": {}, "t": true});
        let got = t
            .render_with(
                &[],
                None,
                false,
                &serde_json::Map::from_iter([("v".to_string(), v)]),
            )
            .unwrap();
        // Python: json.dumps(v), json.dumps(v, ensure_ascii=True), json.dumps(v, indent=2),
        // json.dumps(v, sort_keys=True) — with transformers' ensure_ascii=False default.
        let want = [
            r#"{"z": [1, 2.5, "é\n<&>\""], "a": null, "e": {}, "t": true}"#,
            r#"{"z": [1, 2.5, "\u00e9\n<&>\""], "a": null, "e": {}, "t": true}"#,
            "{\n  \"z\": [\n    1,\n    2.5,\n    \"é\\n<&>\\\"\"\n  ],\n  \"a\": null,\n  \"e\": {},\n  \"t\": true\n}",
            r#"{"a": null, "e": {}, "t": true, "z": [1, 2.5, "é\n<&>\""]}"#,
        ]
        .join("|");
        assert_eq!(got, want);
    }

    #[test]
    fn a_broken_template_is_an_error() {
        assert!(ChatTemplate::new("{% for %}", "", "").is_err());
    }
}

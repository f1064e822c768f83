//! Chat templates: the model's own Jinja template (from `tokenizer.chat_template`), rendered
//! with minijinja and Python-compatible string methods.

pub mod parse;

use minijinja::{context, Environment, Error as JinjaError, ErrorKind};
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

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos: String,
    eos: String,
}

fn raise_exception(msg: String) -> std::result::Result<String, JinjaError> {
    Err(JinjaError::new(ErrorKind::InvalidOperation, msg))
}

impl ChatTemplate {
    /// Compiles `source`; `bos`/`eos` are the texts of the model's BOS and EOS tokens.
    pub fn new(source: &str, bos: &str, eos: &str) -> Result<ChatTemplate> {
        let mut env = Environment::new();
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", |fmt: String| -> String {
            // Templates use it for "today's date"; a fixed format keeps prompts reproducible.
            let _ = fmt;
            "26 Jul 2024".to_string()
        });
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.add_template_owned("chat", source.to_string())
            .map_err(|e| Error::Tokenizer(format!("chat template does not compile: {e}")))?;
        Ok(ChatTemplate {
            env,
            bos: bos.to_string(),
            eos: eos.to_string(),
        })
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
        let t = self
            .env
            .get_template("chat")
            .map_err(|e| Error::Tokenizer(format!("chat template: {e}")))?;
        t.render(context! {
            messages => messages,
            tools => tools,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos,
            eos_token => self.eos,
        })
        .map_err(|e| Error::Tokenizer(format!("chat template failed: {e}")))
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
    fn a_broken_template_is_an_error() {
        assert!(ChatTemplate::new("{% for %}", "", "").is_err());
    }
}

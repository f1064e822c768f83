//! One conversation, one prompt: `kiln chat`'s prompt ids (its template compiled in-process,
//! its own messages) equal the ids `/v1/chat/completions` tokenizes the same conversation to
//! (the template compiled in the sandbox, the messages parsed from the request; the response's
//! `prompt_token_ids`, vLLM's `return_token_ids`), on every fixture family with a chat template
//! and both real models. And the one rule itself: a BOS the template writes is not added again,
//! and a BOS the tokenizer adds is there when the template writes none.

#[path = "common/server.rs"]
mod common;

use kiln_core::chat::Message;
use kiln_core::engine::RunnerConfig;
use kiln_server::generate::ChatPrompter;
use kiln_tests::{fixtures, model_file, GEMMA3, HF_MODELS, SMOLLM2};
use serde_json::{json, Value};

/// Every fixture family with a chat template: the transformers-checked ones and DiffusionGemma.
fn fixtures_with_templates() -> Vec<&'static str> {
    let mut v = HF_MODELS.to_vec();
    v.push("diffusion_gemma");
    v
}

fn conversation() -> Vec<(&'static str, &'static str)> {
    vec![
        ("system", "You answer in one short sentence."),
        ("user", "What is the capital of France?"),
        ("assistant", "Paris is the capital of France."),
        ("user", "And of Italy?"),
    ]
}

/// Both prompts of the model at `path`; `None` when it has no chat template.
fn both(path: &std::path::Path) -> Option<(Vec<u32>, Vec<u32>)> {
    let loaded = common::load_model(path, 512, RunnerConfig::default());
    let tok = &loaded.tokenizer;
    let src = tok.chat_template()?.to_string();
    let messages: Vec<Message> = conversation()
        .into_iter()
        .map(|(r, c)| Message::new(r, c.to_string()))
        .collect();
    let chat = ChatPrompter::new(tok, &src)
        .expect("template compiles")
        .ids(tok, &messages)
        .expect("prompt");
    let server = common::start_model(path, 1, None).expect("server");
    let body = json!({
        "messages": conversation()
            .into_iter()
            .map(|(r, c)| json!({"role": r, "content": c}))
            .collect::<Vec<_>>(),
        "max_tokens": 1,
        "temperature": 0,
        "return_token_ids": true,
    });
    let (status, text) = common::post(server.addr, "/v1/chat/completions", &body);
    assert_eq!(status, 200, "{}: {}", path.display(), text);
    let v: Value = serde_json::from_str(&text).expect("JSON");
    let ids: Vec<u32> = v["prompt_token_ids"]
        .as_array()
        .expect("prompt_token_ids")
        .iter()
        .map(|x| x.as_u64().expect("an id") as u32)
        .collect();
    assert_eq!(
        v["usage"]["prompt_tokens"].as_u64(),
        Some(ids.len() as u64),
        "{}",
        path.display()
    );
    Some((chat, ids))
}

#[test]
fn kiln_chat_and_the_chat_endpoint_give_the_same_prompt_ids() {
    let families = fixtures_with_templates();
    let mut paths: Vec<std::path::PathBuf> = families
        .iter()
        .map(|f| fixtures().join("hf").join(f))
        .collect();
    for real in [SMOLLM2, GEMMA3] {
        match model_file(real) {
            Some(p) => paths.push(p),
            None => println!("{real}: not downloaded, skipped"),
        }
    }
    let mut compared = 0;
    for p in &paths {
        let Some((chat, server)) = both(p) else {
            println!("{}: no chat template", p.display());
            continue;
        };
        let bos = common::load_model(p, 512, RunnerConfig::default())
            .tokenizer
            .bos();
        let leading = bos.filter(|b| chat.first() == Some(b)).is_some();
        println!(
            "{}: {} prompt ids{}",
            p.file_name().unwrap_or_default().to_string_lossy(),
            chat.len(),
            if leading { ", BOS first" } else { "" }
        );
        assert_eq!(chat, server, "{}", p.display());
        // Never two BOS in a row at the start.
        assert!(
            !(leading && chat.get(1) == chat.first()),
            "{}: BOS twice",
            p.display()
        );
        compared += 1;
    }
    assert!(
        compared >= families.len(),
        "only {compared} models compared"
    );
}

/// The rule on a real tokenizer with a BOS (Gemma 3's): a prompt that starts with the BOS text
/// keeps exactly one, a prompt without gets the one the tokenizer adds.
#[test]
fn a_template_written_bos_is_not_added_again() {
    let Some(p) = model_file(GEMMA3) else {
        println!("{GEMMA3}: not downloaded, skipped");
        return;
    };
    let tok = common::load_model(&p, 512, RunnerConfig::default()).tokenizer;
    let bos = tok.bos().expect("Gemma 3 has a BOS");
    let bos_text = tok.decode(&[bos]);
    let with = tok
        .encode_chat(&format!("{bos_text}<start_of_turn>user\nHi<end_of_turn>\n"))
        .expect("encode");
    let without = tok
        .encode_chat("<start_of_turn>user\nHi<end_of_turn>\n")
        .expect("encode");
    assert_eq!(with, without, "one BOS either way");
    assert_eq!(with.iter().filter(|&&t| t == bos).count(), 1);
    assert_eq!(with.first(), Some(&bos));
}

/// A tokenizer that appends EOS to what it encodes (`add_eos_token`) and prepends BOS: a chat
/// prompt gets the BOS but never the EOS, which would end the conversation before the reply.
#[test]
fn a_chat_prompt_never_ends_in_eos() {
    let dir = common::fixture_copy("llama", "chat-eos");
    let src = std::fs::read_to_string(fixtures().join("hf/llama/tokenizer_config.json"))
        .expect("tokenizer_config");
    let mut cfg: Value = serde_json::from_str(&src).expect("JSON");
    cfg["bos_token"] = json!("<|endoftext|>");
    cfg["add_bos_token"] = json!(true);
    cfg["add_eos_token"] = json!(true);
    std::fs::write(dir.join("tokenizer_config.json"), cfg.to_string()).expect("write");
    let tok = common::load_model(&dir, 512, RunnerConfig::default()).tokenizer;
    let (bos, eos) = (tok.bos().expect("a BOS"), tok.eos().expect("an EOS"));
    let text = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n";
    // Plain encoding with the specials adds both; the chat rule only the BOS.
    let plain = tok.encode(text, true).expect("encode");
    assert_eq!(
        (plain.first(), plain.last()),
        (Some(&bos), Some(&eos)),
        "the tokenizer adds both"
    );
    let chat = tok.encode_chat(text).expect("encode");
    assert_eq!(chat.first(), Some(&bos));
    assert_ne!(chat.last(), Some(&eos), "{chat:?}");
    assert_eq!(&chat[..], &plain[..plain.len() - 1]);
    let _ = std::fs::remove_dir_all(&dir);
}

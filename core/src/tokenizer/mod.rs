//! One Tokenizer type over GGUF vocabularies (gpt2-style BPE, SentencePiece-style) and HF tokenizer.json.

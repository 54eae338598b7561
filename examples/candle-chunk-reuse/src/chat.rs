//! ChatML segments (SmolLM2's template) as token runs: one segment per message, so a message's
//! chunks are the same wherever it stands in a conversation.

use anyhow::Context;
use std::path::Path;
use tokenizers::Tokenizer;

/// The tokenizer stored in the GGUF file (converted by `kvb-modelfile`).
pub struct Chat {
    tokenizer: Tokenizer,
}

impl Chat {
    /// Reads the file's tokenizer.
    pub fn load(gguf: &Path) -> anyhow::Result<Self> {
        let json = kvb_modelfile::gguf::GgufModel::open(gguf)?.tokenizer_json()?;
        let tokenizer = Tokenizer::from_bytes(json.to_string().as_bytes())
            .map_err(|e| anyhow::anyhow!("the tokenizer of {}: {e}", gguf.display()))?;
        Ok(Chat { tokenizer })
    }

    /// Token ids of `text`, special tokens as written.
    pub fn encode(&self, text: &str) -> anyhow::Result<Vec<u32>> {
        let enc = self
            .tokenizer
            .encode(text, false)
            .map_err(|e| anyhow::anyhow!("{e}"))
            .with_context(|| format!("encoding {:?}", text.chars().take(40).collect::<String>()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Text of `ids`, special tokens dropped.
    pub fn decode(&self, ids: &[u32]) -> anyhow::Result<String> {
        self.tokenizer
            .decode(ids, true)
            .map_err(|e| anyhow::anyhow!("decoding: {e}"))
    }

    /// One whole message.
    pub fn message(&self, role: &str, content: &str) -> anyhow::Result<Vec<u32>> {
        self.encode(&format!("<|im_start|>{role}\n{content}<|im_end|>\n"))
    }

    /// An assistant message made of generated `answer` tokens (an end token dropped).
    pub fn answer(&self, answer: &[u32], eos: &[u32]) -> anyhow::Result<Vec<u32>> {
        let body = match answer.last() {
            Some(t) if eos.contains(t) => &answer[..answer.len() - 1],
            _ => answer,
        };
        let mut ids = self.encode("<|im_start|>assistant\n")?;
        ids.extend_from_slice(body);
        ids.extend(self.encode("<|im_end|>\n")?);
        Ok(ids)
    }

    /// What the assistant's answer follows.
    pub fn generation_prompt(&self) -> anyhow::Result<Vec<u32>> {
        self.encode("<|im_start|>assistant\n")
    }
}

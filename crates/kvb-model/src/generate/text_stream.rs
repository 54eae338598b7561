//! Incremental detokenisation and stop strings.
//!
//! A byte-level BPE token can end in the middle of a UTF-8 character, so text is only released once
//! it decodes without a trailing replacement character; and text that could be the start of a stop
//! string is held back until it is known not to be one, so a stop string never reaches the user.

use crate::error::Result;
use crate::tokenizer::Tokenizer;

/// Turns a stream of token ids into a stream of text pieces. It holds no tokenizer (each push
/// takes one), so a scheduler can keep one per sequence for as long as the sequence runs.
#[derive(Debug, Clone)]
pub struct TextStream {
    tokens: Vec<u32>,
    /// Decoded text of all tokens so far that forms whole characters.
    text: String,
    /// How much of `text` has been handed out.
    emitted: usize,
    stop_strings: Vec<String>,
    stopped: bool,
}

impl TextStream {
    /// A stream that stops at any of `stop_strings` (empty strings are ignored).
    pub fn new(stop_strings: &[String]) -> Self {
        TextStream {
            tokens: Vec::new(),
            text: String::new(),
            emitted: 0,
            stop_strings: stop_strings
                .iter()
                .filter(|s| !s.is_empty())
                .cloned()
                .collect(),
            stopped: false,
        }
    }

    /// Adds a token; returns the text that became final (possibly empty).
    pub fn push(&mut self, tokenizer: &Tokenizer, token: u32) -> Result<String> {
        if self.stopped {
            return Ok(String::new());
        }
        self.tokens.push(token);
        let decoded = tokenizer.decode(&self.tokens, true)?;
        if decoded.ends_with('\u{FFFD}') {
            return Ok(String::new()); // an incomplete UTF-8 sequence: wait for the next token
        }
        self.text = decoded;
        if let Some(at) = self.first_stop() {
            self.text.truncate(at);
            self.stopped = true;
            return Ok(self.release(self.text.len()));
        }
        let hold = self.held_back();
        Ok(self.release(self.text.len() - hold))
    }

    /// Whether a stop string has been seen.
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// Releases everything still held back (call once generation ends).
    pub fn finish(&mut self) -> String {
        self.release(self.text.len())
    }

    /// The whole text so far (without a stop string).
    pub fn text(&self) -> &str {
        &self.text
    }

    fn release(&mut self, upto: usize) -> String {
        let upto = floor_char_boundary(&self.text, upto.max(self.emitted));
        let piece = self.text[self.emitted..upto].to_string();
        self.emitted = upto;
        piece
    }

    fn first_stop(&self) -> Option<usize> {
        // Only a stop string ending in new text can be new; search from just before it.
        let from = self
            .emitted
            .saturating_sub(self.stop_strings.iter().map(|s| s.len()).max().unwrap_or(0));
        let from = floor_char_boundary(&self.text, from);
        self.stop_strings
            .iter()
            .filter_map(|s| self.text[from..].find(s.as_str()).map(|i| i + from))
            .min()
    }

    /// Length of the longest suffix of the text that is a proper prefix of a stop string.
    fn held_back(&self) -> usize {
        let tail = &self.text[self.emitted..];
        self.stop_strings
            .iter()
            .flat_map(|s| {
                (1..s.len())
                    .rev()
                    .filter(|&k| s.is_char_boundary(k))
                    .map(move |k| &s[..k])
            })
            .filter(|prefix| tail.ends_with(prefix))
            .map(|p| p.len())
            .max()
            .unwrap_or(0)
    }
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

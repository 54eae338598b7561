//! Text files the commands read (prompts, request lines): UTF-8 or a clear error.

use anyhow::Context;
use std::io::Read;
use std::path::Path;

/// The text of `path` (`-`: standard input), which must be UTF-8; the error names the file as
/// `what` and the offset of the first byte that is not UTF-8.
pub fn read_text_file(path: &Path, what: &str) -> anyhow::Result<String> {
    let bytes = if path == Path::new("-") {
        let mut buf = Vec::new();
        std::io::stdin()
            .read_to_end(&mut buf)
            .with_context(|| format!("reading the {what} from standard input"))?;
        buf
    } else {
        std::fs::read(path).with_context(|| format!("reading the {what} {}", path.display()))?
    };
    String::from_utf8(bytes).map_err(|e| {
        anyhow::anyhow!(
            "the {what} {} is not UTF-8 text: invalid byte at offset {}",
            path.display(),
            e.utf8_error().valid_up_to()
        )
    })
}

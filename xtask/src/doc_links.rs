//! The docs' relative links resolve: every `[text](path)` and `[text](path#anchor)` in the
//! README, `docs/` and the crates' READMEs names a file of the workspace and, for Markdown, one
//! of its headings (GitHub's anchors). Run by the tests, so CI fails on a broken link.

use std::path::{Path, PathBuf};

/// The Markdown files whose links are checked, from the workspace root.
fn documents(root: &Path) -> Vec<PathBuf> {
    let mut out = vec![root.join("README.md")];
    for dir in ["docs", "crates", "examples"] {
        let Ok(entries) = std::fs::read_dir(root.join(dir)) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "md") {
                out.push(p);
            } else if p.join("README.md").is_file() {
                out.push(p.join("README.md"));
            }
        }
    }
    out.sort();
    out
}

/// The link targets of `text` (`[..](target)`, images included), fenced code left out.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            out.push(after[..end].to_string());
            rest = &after[end..];
        }
    }
    out
}

/// GitHub's anchor of a heading: lower case, punctuation other than `-` and `_` dropped, spaces
/// as hyphens.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown text's headings.
fn anchors(text: &str) -> Vec<String> {
    let mut fenced = false;
    text.lines()
        .filter(|l| {
            if l.trim_start().starts_with("```") {
                fenced = !fenced;
            }
            !fenced && l.starts_with('#')
        })
        .map(|l| anchor(l.trim_start_matches('#')))
        .collect()
}

/// Every broken link of the documents under `root`, as `file: target (why)`.
pub fn broken(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for doc in documents(root) {
        let Ok(text) = std::fs::read_to_string(&doc) else {
            continue;
        };
        let shown = doc.strip_prefix(root).unwrap_or(&doc).display().to_string();
        for target in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, fragment) = match target.split_once('#') {
                Some((p, f)) => (p, Some(f)),
                None => (target.as_str(), None),
            };
            let file = if path.is_empty() {
                doc.clone()
            } else {
                doc.parent().unwrap_or(root).join(path)
            };
            if !file.exists() {
                out.push(format!("{shown}: {target} (no such file)"));
                continue;
            }
            let Some(fragment) = fragment else { continue };
            if file.extension().is_some_and(|x| x == "md") {
                let held = std::fs::read_to_string(&file).unwrap_or_default();
                if !anchors(&held).iter().any(|a| a == fragment) {
                    out.push(format!("{shown}: {target} (no such heading)"));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_link_in_the_docs_resolves() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        assert!(root.join("docs").is_dir(), "docs/ is missing");
        let broken = broken(&root);
        assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
    }

    #[test]
    fn a_missing_file_or_heading_is_reported() {
        let dir = std::env::temp_dir().join(format!("kvb-doc-links-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("docs")).unwrap();
        std::fs::write(
            dir.join("docs/a.md"),
            "# A\n\n## 8-bit activations: `--activations q8`\n\n\
             [ok](#8-bit-activations---activations-q8) [up](../README.md#kvb) \
             [gone](b.md) [bad](#nowhere)\n\n```sh\n[not a link](c.md)\n```\n",
        )
        .unwrap();
        std::fs::write(dir.join("README.md"), "# kvb\n\n[a](docs/a.md#a)\n").unwrap();
        let found = broken(&dir);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            found,
            vec![
                "docs/a.md: b.md (no such file)".to_string(),
                "docs/a.md: #nowhere (no such heading)".to_string(),
            ]
        );
    }
}

//! `kvb chat` keeps what it learned: a session ended by Ctrl-C (SIGINT) flushes its chunk store
//! to the disk tier, so the next session, a new process, reuses the conversation's K/V.

use crate::common::tiny_model;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStderr, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::Duration;

/// `kvb chat` on the tiny model with a disk tier, its stderr lines on a channel.
fn chat(model: &std::path::Path, disk: &std::path::Path) -> (Child, Receiver<String>) {
    let mut child = crate::common::kvb()
        .arg("chat")
        .arg("--model")
        .arg(model)
        .arg("--disk-dir")
        .arg(disk)
        .args(["--max-new-tokens", "6", "--chunk-size", "16"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting kvb chat");
    let stderr: ChildStderr = child.stderr.take().unwrap();
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    (child, rx)
}

/// Sends one message and returns its summary line (`[prompt tokens: ...]`).
fn ask(child: &mut Child, rx: &Receiver<String>, message: &str) -> String {
    let stdin = child.stdin.as_mut().unwrap();
    writeln!(stdin, "{message}").unwrap();
    stdin.flush().unwrap();
    loop {
        let line = rx
            .recv_timeout(Duration::from_secs(120))
            .expect("kvb chat answered");
        if let Some(summary) = line.trim_start_matches("> ").strip_prefix('[') {
            return summary.to_string();
        }
        assert!(!line.starts_with("error"), "kvb chat: {line}");
    }
}

/// The `cached: N` figure of a summary line.
fn cached(summary: &str) -> usize {
    summary
        .split("cached: ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no cached count in `{summary}`"))
}

#[test]
fn ctrl_c_flushes_the_conversation_to_the_disk_tier() {
    let (_keep, model) = tiny_model();
    let disk = tempfile::tempdir().unwrap();
    let message = "Tell me everything about the museum's collection of old maps, its opening \
                   hours, the price of a ticket and where visitors can leave their coats.";
    let (mut first, rx) = chat(&model, disk.path());
    let summary = ask(&mut first, &rx, message);
    assert_eq!(cached(&summary), 0, "a fresh disk tier: {summary}");
    // Held open until the end: `Child::wait` closes stdin first, and an end of input racing the
    // signal would let the chat end normally (exit 0) instead of as interrupted.
    let _stdin = first.stdin.take();
    let ok = Command::new("kill")
        .args(["-INT", &first.id().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
    let status = first.wait().unwrap();
    assert_eq!(status.code(), Some(130), "kvb chat exits as interrupted");

    // A new process: the same first message is read back from the disk tier.
    let (mut second, rx) = chat(&model, disk.path());
    let summary = ask(&mut second, &rx, message);
    assert!(
        cached(&summary) >= 16,
        "nothing reused after Ctrl-C: {summary}"
    );
    drop(second.stdin.take());
    assert!(second.wait().unwrap().success());
}

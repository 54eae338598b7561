//! The demo: a multi-turn chat and a document moved behind other preambles, candle with kvb's
//! chunk store beside candle alone, printed as `kvb demo` prints its tables.

use candle_chunk_reuse::{plain_greedy, texts, CandleLlama, Chat, ChunkReuse, PrefillStats};
use std::time::Duration;

const MAX_NEW: usize = 24;

fn main() -> anyhow::Result<()> {
    let path = std::env::args()
        .nth(1)
        .map(Into::into)
        .unwrap_or_else(candle_chunk_reuse::default_model_path);
    let model = CandleLlama::load(&path)?;
    let chat = Chat::load(&path)?;
    let reuse = ChunkReuse::new(&model, path.to_string_lossy().as_bytes(), 64, 256 << 20)?;
    let eos = model.config.eos_token_ids.clone();
    println!("candle running {} with kvb's chunk store\n", path.display());

    println!("Multi-turn chat (each turn's history is the previous prompt and answer):\n");
    header();
    let mut history = vec![chat.message("system", texts::SYSTEM)?];
    for (i, question) in texts::QUESTIONS.iter().enumerate() {
        history.push(chat.message("user", question)?);
        let mut segments = history.clone();
        segments.push(chat.generation_prompt()?);
        let answer = turn(&model, &reuse, &segments, &format!("chat {}", i + 1))?;
        history.push(chat.answer(&answer, &eos)?);
        println!(
            "|   | answer: {} |",
            chat.decode(&answer)?.trim().replace('\n', " ")
        );
    }

    println!("\nA document moved behind other preambles (the first stores it):\n");
    header();
    for (i, preamble) in texts::PREAMBLES.iter().enumerate() {
        let segments = vec![
            chat.encode(&format!("<|im_start|>user\n{preamble}\n\n"))?,
            chat.encode(texts::DOCUMENT)?,
            chat.encode(&format!("\n\n{}<|im_end|>\n", texts::DOCUMENT_QUESTION))?,
            chat.generation_prompt()?,
        ];
        let answer = turn(
            &model,
            &reuse,
            &segments,
            &format!("document, preamble {}", i + 1),
        )?;
        println!(
            "|   | answer: {} |",
            chat.decode(&answer)?.trim().replace('\n', " ")
        );
    }
    let s = reuse.store().stats();
    println!(
        "\nstore: {} chunks, {:.1} MB, {} hits, {} misses",
        s.ram_chunks,
        s.ram_bytes as f64 / 1e6,
        s.hits,
        s.misses
    );
    Ok(())
}

fn header() {
    println!("| turn | prompt tokens | TTFT cold (candle) | TTFT warm (candle + kvb) | speedup | reuse | recomputed | same output |");
    println!("|---|---:|---:|---:|---:|---:|---:|---|");
}

/// One prompt both ways; prints its row, returns the warm answer.
fn turn(
    model: &CandleLlama,
    reuse: &ChunkReuse,
    segments: &[Vec<u32>],
    name: &str,
) -> anyhow::Result<Vec<u32>> {
    let tokens: Vec<u32> = segments.concat();
    let (cold, cold_ttft) = plain_greedy(model, &tokens, MAX_NEW)?;
    let mut warm = reuse.prefill(model, segments)?;
    let stats: PrefillStats = warm.stats.clone();
    let answer = candle_chunk_reuse::generate(model, &mut warm, MAX_NEW)?;
    let same = answer == cold;
    println!(
        "| {name} | {} | {} | {} | {:.1}x | {:.0}% | {} | {} |",
        stats.prompt_tokens,
        ms(cold_ttft),
        ms(stats.ttft),
        cold_ttft.as_secs_f64() / stats.ttft.as_secs_f64(),
        100.0 * stats.reuse(),
        stats.computed_tokens,
        if same {
            "yes".to_string()
        } else {
            format!("no ({} moved tokens, no repair)", stats.moved_tokens)
        }
    );
    Ok(answer)
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1e3)
}

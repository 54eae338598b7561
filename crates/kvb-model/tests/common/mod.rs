//! Helpers shared by kvb-model's integration tests: fixture paths, random tiny models and a
//! minimal GGUF writer.
#![allow(dead_code)]

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use safetensors::tensor::TensorView;
use safetensors::Dtype;
use std::path::{Path, PathBuf};

pub type B = burn::backend::NdArray<f32>;

/// The workspace's `fixtures/` folder.
pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

/// The logits of every position of one prefill of `ids` at positions `0..`.
pub fn all_logits(model: &kvb_model::Model<B>, ids: &[u32]) -> Vec<f32> {
    let positions: Vec<usize> = (0..ids.len()).collect();
    let mut cache = model.new_cache();
    model
        .forward(ids, &positions, &mut cache, kvb_model::LogitsFor::All)
        .unwrap()
        .into_data()
        .to_vec::<f32>()
        .unwrap()
}

/// The largest absolute difference between two equally long runs of values.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()))
}

/// Reads a raw little-endian f32 file.
pub fn read_f32(path: &Path) -> Vec<f32> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// Names and PyTorch shapes of a Llama-layout checkpoint for `c`.
pub fn llama_tensor_shapes(c: &kvb_model::ModelConfig) -> Vec<(String, Vec<usize>)> {
    let (h, hd, i) = (c.hidden_size, c.head_dim, c.intermediate_size);
    let mut out = vec![(
        "model.embed_tokens.weight".to_string(),
        vec![c.vocab_size, h],
    )];
    for l in 0..c.num_layers {
        let p = format!("model.layers.{l}");
        out.push((format!("{p}.input_layernorm.weight"), vec![h]));
        out.push((format!("{p}.post_attention_layernorm.weight"), vec![h]));
        out.push((
            format!("{p}.self_attn.q_proj.weight"),
            vec![c.num_heads * hd, h],
        ));
        out.push((
            format!("{p}.self_attn.k_proj.weight"),
            vec![c.num_kv_heads * hd, h],
        ));
        out.push((
            format!("{p}.self_attn.v_proj.weight"),
            vec![c.num_kv_heads * hd, h],
        ));
        out.push((
            format!("{p}.self_attn.o_proj.weight"),
            vec![h, c.num_heads * hd],
        ));
        out.push((format!("{p}.mlp.gate_proj.weight"), vec![i, h]));
        out.push((format!("{p}.mlp.up_proj.weight"), vec![i, h]));
        out.push((format!("{p}.mlp.down_proj.weight"), vec![h, i]));
    }
    out.push(("model.norm.weight".to_string(), vec![h]));
    if !c.tie_word_embeddings {
        out.push(("lm_head.weight".to_string(), vec![c.vocab_size, h]));
    }
    out
}

/// Random weights for every tensor of `c` (norm weights near 1, others scaled like an init).
pub fn random_weights(
    c: &kvb_model::ModelConfig,
    seed: u64,
) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    let mut rng = StdRng::seed_from_u64(seed);
    llama_tensor_shapes(c)
        .into_iter()
        .map(|(name, shape)| {
            let n: usize = shape.iter().product();
            let data = if shape.len() == 1 {
                (0..n).map(|_| 1.0 + rng.random_range(-0.1..0.1)).collect()
            } else {
                let s = 1.0 / (shape[1] as f32).sqrt();
                (0..n).map(|_| rng.random_range(-s..s) * 1.5).collect()
            };
            (name, shape, data)
        })
        .collect()
}

/// Writes `config.json` and `model.safetensors` with random weights into a fresh temporary folder.
pub fn random_model_dir(config_json: &str, seed: u64) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), config_json).unwrap();
    let config = kvb_model::ModelConfig::from_json(config_json, true).unwrap();
    write_safetensors(
        &dir.path().join("model.safetensors"),
        &random_weights(&config, seed),
    );
    dir
}

/// Writes f32 tensors to a safetensors file.
pub fn write_safetensors(path: &Path, tensors: &[(String, Vec<usize>, Vec<f32>)]) {
    write_safetensors_as(path, tensors, Dtype::F32)
}

/// `data` in `dtype` (F32, F16 or BF16, rounded to nearest), little-endian.
pub fn half_bytes(dtype: Dtype, data: &[f32]) -> Vec<u8> {
    match dtype {
        Dtype::F16 => data
            .iter()
            .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
            .collect(),
        Dtype::BF16 => data
            .iter()
            .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
            .collect(),
        _ => data.iter().flat_map(|v| v.to_le_bytes()).collect(),
    }
}

/// Writes tensors to a safetensors file in `dtype` (as HF checkpoints in bf16 or f16 are).
pub fn write_safetensors_as(path: &Path, tensors: &[(String, Vec<usize>, Vec<f32>)], dtype: Dtype) {
    let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(n, s, d)| (n.clone(), s.clone(), half_bytes(dtype, d)))
        .collect();
    let views: Vec<(String, TensorView)> = bytes
        .iter()
        .map(|(n, s, b)| (n.clone(), TensorView::new(dtype, s.clone(), b).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

/// A tiny Llama config (GQA when `kv_heads < 4`); its vocabulary holds the fixture tokenizer's
/// 407 tokens, which some tests load beside it.
pub fn tiny_llama_config(kv_heads: usize) -> String {
    format!(
        r#"{{"architectures":["LlamaForCausalLM"],"hidden_size":32,"intermediate_size":64,
        "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":{kv_heads},
        "vocab_size":512,"max_position_embeddings":512,"rms_norm_eps":1e-5,"rope_theta":10000.0,
        "tie_word_embeddings":false,"eos_token_id":1}}"#
    )
}

/// A minimal GGUF writer (version 3, F32 tensors, string/int/float metadata) for tests.
pub enum Meta {
    Str(&'static str, String),
    U32(&'static str, u32),
    F32(&'static str, f32),
    Bool(&'static str, bool),
    StrArray(&'static str, Vec<String>),
    I32Array(&'static str, Vec<i32>),
    F32Array(&'static str, Vec<f32>),
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

/// A metadata array of `count` numbers of GGUF type `element` (5: i32, 6: f32), as bytes.
fn put_array(
    out: &mut Vec<u8>,
    key: &str,
    element: u32,
    count: usize,
    values: impl Iterator<Item = u8>,
) {
    put_str(out, key);
    out.extend(9u32.to_le_bytes());
    out.extend(element.to_le_bytes());
    out.extend((count as u64).to_le_bytes());
    out.extend(values);
}

/// Serialises a GGUF file: `tensors` are (gguf name, PyTorch shape, f32 data).
pub fn gguf_bytes(meta: &[Meta], tensors: &[(String, Vec<usize>, Vec<f32>)]) -> Vec<u8> {
    gguf_bytes_as(meta, tensors, GgufStorage::F32)
}

/// How [`gguf_bytes_as`] stores 2-d tensors whose rows are whole blocks of 32 (others: F32).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum GgufStorage {
    F32,
    /// 2-d tensors in 16-bit floats (rounded to nearest), 1-d ones in f32.
    F16,
    Bf16,
    Q4_0,
    Q4_1,
    Q8_0,
    /// K-quants: random blocks (kvb has no K-quant quantizer), small scales, the values
    /// ignored; for tests that compare two ways of running the same file.
    RandomQ4K,
    RandomQ5K,
    RandomQ6K,
}

impl GgufStorage {
    /// ggml type id and the bytes of `data`'s rows in that type.
    fn encode(self, shape: &[usize], data: &[f32]) -> (u32, Vec<u8>) {
        let random_k = match self {
            GgufStorage::RandomQ4K => Some((12, 144, vec![0, 2])),
            GgufStorage::RandomQ5K => Some((13, 176, vec![0, 2])),
            GgufStorage::RandomQ6K => Some((14, 210, vec![208])),
            _ => None,
        };
        let float16 = match self {
            GgufStorage::F16 => Some((1, half_bytes(Dtype::F16, data))),
            GgufStorage::Bf16 => Some((30, half_bytes(Dtype::BF16, data))),
            _ => None,
        };
        if let (Some(stored), 2) = (float16, shape.len()) {
            return stored;
        }
        let block = if random_k.is_some() { 256 } else { 32 };
        let blockwise = shape.len() == 2 && shape[1].is_multiple_of(block);
        if matches!(
            self,
            GgufStorage::F32 | GgufStorage::F16 | GgufStorage::Bf16
        ) || !blockwise
        {
            return (0, data.iter().flat_map(|v| v.to_le_bytes()).collect());
        }
        if let Some((id, size, f16_at)) = random_k {
            let mut rng = StdRng::seed_from_u64(data.len() as u64 ^ (data[0].to_bits() as u64));
            let scale = 0.02 / (shape[1] as f32).sqrt();
            let mut out = Vec::new();
            for _ in 0..data.len() / 256 {
                let start = out.len();
                out.extend((0..size).map(|_| rng.random::<u8>()));
                for &at in &f16_at {
                    let d = half::f16::from_f32(scale * rng.random_range(0.5..1.0f32));
                    out[start + at..start + at + 2].copy_from_slice(&d.to_le_bytes());
                }
            }
            return (id, out);
        }
        let f16 = |v: f32| half::f16::from_f32(v).to_le_bytes();
        let mut out = Vec::new();
        for b in data.chunks_exact(32) {
            match self {
                GgufStorage::Q8_0 => {
                    let d = b.iter().fold(0f32, |a, v| a.max(v.abs())) / 127.0;
                    let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
                    out.extend(f16(d));
                    out.extend(b.iter().map(|v| (v * inv).round() as i8 as u8));
                }
                GgufStorage::Q4_0 => {
                    // llama.cpp: the value of largest magnitude maps to -8.
                    let max = b
                        .iter()
                        .fold(0f32, |a, &v| if v.abs() > a.abs() { v } else { a });
                    let d = max / -8.0;
                    let inv = if d != 0.0 { 1.0 / d } else { 0.0 };
                    let q = |v: f32| ((v * inv + 8.5) as i32).clamp(0, 15) as u8;
                    out.extend(f16(d));
                    out.extend((0..16).map(|i| q(b[i]) | (q(b[i + 16]) << 4)));
                }
                GgufStorage::Q4_1 => {
                    let min = b.iter().fold(f32::MAX, |a, &v| a.min(v));
                    let max = b.iter().fold(f32::MIN, |a, &v| a.max(v));
                    let d = (max - min) / 15.0;
                    let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
                    let q = |v: f32| (((v - min) * inv).round() as i32).clamp(0, 15) as u8;
                    out.extend(f16(d));
                    out.extend(f16(min));
                    out.extend((0..16).map(|i| q(b[i]) | (q(b[i + 16]) << 4)));
                }
                _ => unreachable!("handled above"),
            }
        }
        let id = match self {
            GgufStorage::Q4_0 => 2,
            GgufStorage::Q4_1 => 3,
            _ => 8,
        };
        (id, out)
    }
}

/// [`gguf_bytes`] with 2-d tensors stored as `storage`.
pub fn gguf_bytes_as(
    meta: &[Meta],
    tensors: &[(String, Vec<usize>, Vec<f32>)],
    storage: GgufStorage,
) -> Vec<u8> {
    let encoded: Vec<(u32, Vec<u8>)> = tensors
        .iter()
        .map(|(_, shape, data)| storage.encode(shape, data))
        .collect();
    let mut out = Vec::new();
    out.extend(b"GGUF");
    out.extend(3u32.to_le_bytes());
    out.extend((tensors.len() as u64).to_le_bytes());
    out.extend((meta.len() as u64).to_le_bytes());
    for m in meta {
        match m {
            Meta::Str(k, v) => {
                put_str(&mut out, k);
                out.extend(8u32.to_le_bytes());
                put_str(&mut out, v);
            }
            Meta::U32(k, v) => {
                put_str(&mut out, k);
                out.extend(4u32.to_le_bytes());
                out.extend(v.to_le_bytes());
            }
            Meta::F32(k, v) => {
                put_str(&mut out, k);
                out.extend(6u32.to_le_bytes());
                out.extend(v.to_le_bytes());
            }
            Meta::StrArray(k, v) => {
                put_str(&mut out, k);
                out.extend(9u32.to_le_bytes());
                out.extend(8u32.to_le_bytes());
                out.extend((v.len() as u64).to_le_bytes());
                for s in v {
                    put_str(&mut out, s);
                }
            }
            Meta::Bool(k, v) => {
                put_str(&mut out, k);
                out.extend(7u32.to_le_bytes());
                out.push(*v as u8);
            }
            Meta::I32Array(k, v) => {
                let values = v.iter().flat_map(|x| x.to_le_bytes());
                put_array(&mut out, k, 5, v.len(), values);
            }
            Meta::F32Array(k, v) => {
                let values = v.iter().flat_map(|x| x.to_le_bytes());
                put_array(&mut out, k, 6, v.len(), values);
            }
        }
    }
    let mut offset = 0u64;
    for ((name, shape, _), (ty, bytes)) in tensors.iter().zip(&encoded) {
        put_str(&mut out, name);
        out.extend((shape.len() as u32).to_le_bytes());
        for d in shape.iter().rev() {
            out.extend((*d as u64).to_le_bytes());
        }
        out.extend(ty.to_le_bytes());
        out.extend(offset.to_le_bytes());
        offset += bytes.len().div_ceil(32) as u64 * 32;
    }
    while out.len() % 32 != 0 {
        out.push(0);
    }
    for (_, bytes) in &encoded {
        let start = out.len();
        out.extend(bytes);
        while (out.len() - start) % 32 != 0 {
            out.push(0);
        }
    }
    out
}

/// llama.cpp's q/k row permutation (HF rows `[heads, 2, hd/2]` -> GGUF rows `[heads, hd/2, 2]`).
pub fn permute_like_llama_cpp(data: &[f32], rows: usize, cols: usize, heads: usize) -> Vec<f32> {
    let half = rows / heads / 2;
    let mut out = vec![0f32; data.len()];
    for h in 0..heads {
        for s in 0..2 {
            for i in 0..half {
                let src = (h * 2 * half + s * half + i) * cols;
                let dst = (h * half * 2 + i * 2 + s) * cols;
                out[dst..dst + cols].copy_from_slice(&data[src..src + cols]);
            }
        }
    }
    out
}

/// The GGUF name of an HF llama tensor.
pub fn gguf_name(hf: &str) -> String {
    match hf {
        "model.embed_tokens.weight" => return "token_embd.weight".into(),
        "model.norm.weight" => return "output_norm.weight".into(),
        "lm_head.weight" => return "output.weight".into(),
        _ => {}
    }
    let rest = hf.strip_prefix("model.layers.").unwrap();
    let (layer, tail) = rest.split_once('.').unwrap();
    let (module, kind) = tail.rsplit_once('.').unwrap();
    let part = match module {
        "input_layernorm" => "attn_norm",
        "post_attention_layernorm" => "ffn_norm",
        "self_attn.q_proj" => "attn_q",
        "self_attn.k_proj" => "attn_k",
        "self_attn.v_proj" => "attn_v",
        "self_attn.o_proj" => "attn_output",
        "mlp.gate_proj" => "ffn_gate",
        "mlp.up_proj" => "ffn_up",
        "mlp.down_proj" => "ffn_down",
        other => panic!("no GGUF name for {other}"),
    };
    format!("blk.{layer}.{part}.{kind}")
}

/// A GGUF (llama architecture, F32) of the same model as `tensors` with HF names.
pub fn llama_gguf(
    c: &kvb_model::ModelConfig,
    tensors: &[(String, Vec<usize>, Vec<f32>)],
) -> Vec<u8> {
    llama_gguf_as(c, tensors, GgufStorage::F32)
}

/// [`llama_gguf`] with 2-d tensors stored as `storage`.
pub fn llama_gguf_as(
    c: &kvb_model::ModelConfig,
    tensors: &[(String, Vec<usize>, Vec<f32>)],
    storage: GgufStorage,
) -> Vec<u8> {
    llama_gguf_with(c, tensors, storage, Vec::new())
}

/// [`llama_gguf_as`] with `extra` metadata (a vocabulary, say) after the model's.
pub fn llama_gguf_with(
    c: &kvb_model::ModelConfig,
    tensors: &[(String, Vec<usize>, Vec<f32>)],
    storage: GgufStorage,
    extra: Vec<Meta>,
) -> Vec<u8> {
    let converted: Vec<(String, Vec<usize>, Vec<f32>)> = tensors
        .iter()
        .map(|(n, s, d)| {
            let data = if n.ends_with("q_proj.weight") {
                permute_like_llama_cpp(d, s[0], s[1], c.num_heads)
            } else if n.ends_with("k_proj.weight") {
                permute_like_llama_cpp(d, s[0], s[1], c.num_kv_heads)
            } else {
                d.clone()
            };
            (gguf_name(n), s.clone(), data)
        })
        .collect();
    let meta = vec![
        Meta::Str("general.architecture", "llama".into()),
        Meta::U32("llama.block_count", c.num_layers as u32),
        Meta::U32("llama.context_length", c.max_position_embeddings as u32),
        Meta::U32("llama.embedding_length", c.hidden_size as u32),
        Meta::U32("llama.feed_forward_length", c.intermediate_size as u32),
        Meta::U32("llama.attention.head_count", c.num_heads as u32),
        Meta::U32("llama.attention.head_count_kv", c.num_kv_heads as u32),
        Meta::F32("llama.rope.freq_base", c.rope_theta),
        Meta::F32(
            "llama.attention.layer_norm_rms_epsilon",
            c.rms_norm_eps as f32,
        ),
        Meta::U32("tokenizer.ggml.eos_token_id", 1),
    ];
    let meta: Vec<Meta> = meta.into_iter().chain(extra).collect();
    gguf_bytes_as(&meta, &converted, storage)
}

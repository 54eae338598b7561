//! Byte encoding of a [`KvChunk`] for the disk tier. Decoding checks every length against the
//! chunk's shape before allocating, so corrupt bytes give an error, never a panic or a huge
//! allocation.

use crate::chunk::{KvChunk, KvData, LayerKv};
use half::{bf16, f16};
use kvb_hash::{ContentKey, Key, PrefixKey};
use kvb_quant::{Bits, QuantAxis, QuantConfig, QuantizedKv};

const VERSION: u32 = 1;

fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_data(out: &mut Vec<u8>, d: &KvData) {
    match d {
        KvData::F32(v) => {
            out.push(0);
            put_u64(out, v.len() as u64);
            v.iter()
                .for_each(|x| out.extend_from_slice(&x.to_le_bytes()));
        }
        KvData::F16(v) => {
            out.push(1);
            put_u64(out, v.len() as u64);
            v.iter()
                .for_each(|x| out.extend_from_slice(&x.to_le_bytes()));
        }
        KvData::Bf16(v) => {
            out.push(2);
            put_u64(out, v.len() as u64);
            v.iter()
                .for_each(|x| out.extend_from_slice(&x.to_le_bytes()));
        }
        KvData::Quantized(q) => {
            out.push(3);
            out.push(match q.axis() {
                QuantAxis::PerChannel => 0,
                QuantAxis::PerToken => 1,
            });
            out.push(q.config().bits.count() as u8);
            put_u32(out, q.config().group_size as u32);
            put_u64(out, q.codes().len() as u64);
            out.extend_from_slice(q.codes());
            put_u64(out, q.scales().len() as u64);
            q.scales()
                .iter()
                .for_each(|x| out.extend_from_slice(&x.to_le_bytes()));
            q.zeros()
                .iter()
                .for_each(|x| out.extend_from_slice(&x.to_le_bytes()));
        }
    }
}

/// Encodes a chunk.
pub fn encode(c: &KvChunk) -> Vec<u8> {
    let mut out = Vec::with_capacity(c.bytes() + 64);
    put_u32(&mut out, VERSION);
    out.extend_from_slice(c.prefix_key.bytes());
    out.extend_from_slice(c.content_key.bytes());
    out.extend_from_slice(c.parent.bytes());
    put_u32(&mut out, c.tokens.len() as u32);
    c.tokens.iter().for_each(|t| put_u32(&mut out, *t));
    c.positions.iter().for_each(|p| put_u32(&mut out, *p));
    put_u32(&mut out, c.kv_heads as u32);
    put_u32(&mut out, c.head_dim as u32);
    put_u32(&mut out, c.layers.len() as u32);
    for l in &c.layers {
        put_data(&mut out, &l.k);
        put_data(&mut out, &l.v);
    }
    out
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if n > self.bytes.len() - self.pos {
            return Err(format!("truncated at byte {} (needed {n})", self.pos));
        }
        let s = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().map_err(|_| "u32")?,
        ))
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().map_err(|_| "u64")?,
        ))
    }
    fn key(&mut self) -> Result<Key, String> {
        let mut k = [0u8; 32];
        k.copy_from_slice(self.take(32)?);
        Ok(Key(k))
    }
    /// A count that must equal `expected`.
    fn count(&mut self, expected: usize, what: &str) -> Result<usize, String> {
        let n = self.u64()?;
        if n != expected as u64 {
            return Err(format!("{what}: {n} stored, {expected} expected"));
        }
        Ok(expected)
    }
    fn halfs(&mut self, n: usize) -> Result<Vec<[u8; 2]>, String> {
        let raw = self.take(n.checked_mul(2).ok_or("overflow")?)?;
        Ok(raw.chunks_exact(2).map(|b| [b[0], b[1]]).collect())
    }
}

fn get_data(r: &mut Reader, shape: [usize; 3]) -> Result<KvData, String> {
    let elems = shape.iter().product::<usize>();
    Ok(match r.u8()? {
        0 => {
            let n = r.count(elems, "f32 values")?;
            let raw = r.take(n * 4)?;
            KvData::F32(
                raw.chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect(),
            )
        }
        1 => {
            let n = r.count(elems, "f16 values")?;
            KvData::F16(r.halfs(n)?.into_iter().map(f16::from_le_bytes).collect())
        }
        2 => {
            let n = r.count(elems, "bf16 values")?;
            KvData::Bf16(r.halfs(n)?.into_iter().map(bf16::from_le_bytes).collect())
        }
        3 => {
            let axis = match r.u8()? {
                0 => QuantAxis::PerChannel,
                1 => QuantAxis::PerToken,
                a => return Err(format!("unknown quantization axis {a}")),
            };
            let bits = Bits::from_count(r.u8()? as u32).ok_or("unknown bit width")?;
            let group_size = r.u32()? as usize;
            if group_size == 0 {
                return Err("group size 0".into());
            }
            let code_len = kvb_quant::packing::packed_len(elems, bits);
            let code_len = r.count(code_len, "code bytes")?;
            let codes = r.take(code_len)?.to_vec();
            let groups = match axis {
                QuantAxis::PerChannel => shape[0] * shape[2] * shape[1].div_ceil(group_size),
                QuantAxis::PerToken => shape[0] * shape[1] * shape[2].div_ceil(group_size),
            };
            let n = r.count(groups, "groups")?;
            let scales = r.halfs(n)?.into_iter().map(f16::from_le_bytes).collect();
            let zeros = r.halfs(n)?.into_iter().map(f16::from_le_bytes).collect();
            let cfg = QuantConfig { bits, group_size };
            KvData::Quantized(
                QuantizedKv::from_raw(shape, axis, cfg, codes, scales, zeros)
                    .map_err(|e| e.to_string())?,
            )
        }
        tag => return Err(format!("unknown K/V data tag {tag}")),
    })
}

/// What the indexes need of an encoded chunk, read without decoding its K/V.
pub struct ChunkMeta {
    /// The chunk's prefix key.
    pub prefix_key: PrefixKey,
    /// Its content key.
    pub content_key: ContentKey,
    /// Its parent's prefix key.
    pub parent: PrefixKey,
    /// Its tokens.
    pub tokens: Vec<u32>,
}

/// Reads the version, keys and tokens that open every encoded chunk.
fn read_meta(r: &mut Reader) -> Result<ChunkMeta, String> {
    let version = r.u32()?;
    if version != VERSION {
        return Err(format!(
            "chunk encoding version {version}, expected {VERSION}"
        ));
    }
    let prefix_key = PrefixKey(r.key()?);
    let content_key = ContentKey(r.key()?);
    let parent = PrefixKey(r.key()?);
    let n = r.u32()? as usize;
    // Tokens and positions are 8 bytes per token: refuse counts the buffer cannot hold.
    if n > r.bytes.len() / 8 {
        return Err(format!("{n} tokens cannot fit in {} bytes", r.bytes.len()));
    }
    let tokens = (0..n).map(|_| r.u32()).collect::<Result<Vec<_>, _>>()?;
    Ok(ChunkMeta {
        prefix_key,
        content_key,
        parent,
        tokens,
    })
}

/// Reads the keys and tokens at the start of an encoded chunk.
pub fn decode_meta(bytes: &[u8]) -> Result<ChunkMeta, String> {
    read_meta(&mut Reader { bytes, pos: 0 })
}

/// Decodes a chunk, checking everything.
pub fn decode(bytes: &[u8]) -> Result<KvChunk, String> {
    let mut r = Reader { bytes, pos: 0 };
    let ChunkMeta {
        prefix_key,
        content_key,
        parent,
        tokens,
    } = read_meta(&mut r)?;
    let n = tokens.len();
    let positions = (0..n).map(|_| r.u32()).collect::<Result<Vec<_>, _>>()?;
    let kv_heads = r.u32()? as usize;
    let head_dim = r.u32()? as usize;
    let layers = r.u32()? as usize;
    let shape = [kv_heads, n, head_dim];
    let elems = kv_heads
        .checked_mul(n)
        .and_then(|x| x.checked_mul(head_dim));
    // Even 2-bit codes take a quarter byte per value: refuse shapes the buffer cannot hold.
    match elems {
        Some(e) if e / 4 <= bytes.len() => {}
        _ => {
            return Err(format!(
                "a {shape:?} block cannot fit in {} bytes",
                bytes.len()
            ))
        }
    }
    if layers > bytes.len() {
        return Err(format!(
            "{layers} layers cannot fit in {} bytes",
            bytes.len()
        ));
    }
    let mut out = Vec::with_capacity(layers);
    for _ in 0..layers {
        let k = get_data(&mut r, shape)?;
        let v = get_data(&mut r, shape)?;
        out.push(LayerKv { k, v });
    }
    if r.pos != bytes.len() {
        return Err(format!("{} trailing bytes", bytes.len() - r.pos));
    }
    Ok(KvChunk {
        prefix_key,
        content_key,
        parent,
        tokens,
        positions,
        kv_heads,
        head_dim,
        layers: out,
    })
}

//! The fused q/k/v projection split into heads, with q and k rotated to their positions, in one
//! launch: a cube per (token, head of q, k and v), a unit per value of the head. The rotation
//! is computed in f32 (`A`) and rounded once, whatever the tensors hold.

use burn::tensor::DType;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::prelude::*;

#[cube(launch)]
fn split_rope_kernel<F: Float, A: Float>(
    qkv: &Tensor<F>,        // [n, (hq + 2 hkv) d], any strides
    cos: &Tensor<F>,        // [1, 1, n, d]
    signed_sin: &Tensor<F>, // [1, 1, n, d]
    q: &mut Tensor<F>,      // [1, hq, n, d], contiguous
    k: &mut Tensor<F>,      // [1, hkv, n, d], contiguous
    v: &mut Tensor<F>,      // [1, hkv, n, d], contiguous
    q_heads: u32,
    kv_heads: u32,
    #[comptime] head_dim: usize,
    #[define(F, A)] _dtypes: [StorageType; 2],
) {
    let t = CUBE_POS_X as usize;
    let head = CUBE_POS_Y as usize;
    let e = UNIT_POS_X as usize;
    let hq = q_heads as usize;
    let hkv = kv_heads as usize;
    let half = head_dim / 2;
    let base = t * qkv.stride(0) + head * head_dim * qkv.stride(1);
    let x = qkv[base + e * qkv.stride(1)];
    if head < hq + hkv {
        // HF's rotate_half: value e pairs with e + d/2 (its sign is in `signed_sin`).
        let mut pair = e + half;
        if e >= half {
            pair = e - half;
        }
        let y = A::cast_from(qkv[base + pair * qkv.stride(1)]);
        let c = A::cast_from(cos[t * cos.stride(2) + e * cos.stride(3)]);
        let s = A::cast_from(signed_sin[t * signed_sin.stride(2) + e * signed_sin.stride(3)]);
        let rotated = F::cast_from(A::cast_from(x) * c + y * s);
        if head < hq {
            q[head * q.stride(1) + t * q.stride(2) + e] = rotated;
        } else {
            let kh = head - hq;
            k[kh * k.stride(1) + t * k.stride(2) + e] = rotated;
        }
    } else {
        let vh = head - hq - hkv;
        v[vh * v.stride(1) + t * v.stride(2) + e] = x;
    }
}

/// q `[1, hq, n, d]`, k and v `[1, hkv, n, d]` from `qkv` `[n, (hq + 2 hkv) d]`, q and k
/// rotated by `[cos, signed_sin]` (`[1, 1, n, d]` each). Needs n > 0 and `d` even and at most a
/// cube's units.
pub(super) fn launch<R: CubeRuntime>(
    qkv: CubeTensor<R>,
    [cos, signed_sin]: [CubeTensor<R>; 2],
    (hq, hkv, d): (usize, usize, usize),
) -> [CubeTensor<R>; 3] {
    let n = qkv.meta.shape[0];
    let dtype = qkv.dtype;
    let alloc = |heads: usize| {
        empty_device_contiguous_dtype::<R>(
            qkv.client.clone(),
            qkv.device.clone(),
            vec![1, heads, n, d].into(),
            dtype,
        )
    };
    let [q, k, v] = [alloc(hq), alloc(hkv), alloc(hkv)];
    split_rope_kernel::launch::<R>(
        &qkv.client,
        CubeCount::Static(n as u32, (hq + 2 * hkv) as u32, 1),
        CubeDim::new_1d(d as u32),
        qkv.clone().into_tensor_arg(),
        cos.into_tensor_arg(),
        signed_sin.into_tensor_arg(),
        q.clone().into_tensor_arg(),
        k.clone().into_tensor_arg(),
        v.clone().into_tensor_arg(),
        hq as u32,
        hkv as u32,
        d,
        [dtype.into(), DType::F32.into()],
    );
    [q, k, v]
}

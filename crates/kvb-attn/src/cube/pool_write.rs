//! Writing new K/V into a paged pool on the device: one launch for all the slots of a call.
//!
//! burn's generic ops write a pool with one slice-assign per run of consecutive slots, so a decode
//! step of 16 sequences costs 16 launches per layer for K and as many for V (960 per step on a
//! 30-layer model), each a round of host work. Here one cube per (slot, kv head) copies the
//! slot's `head_dim` values in place: one launch per layer for K and V together, whatever the
//! slots. The values are copied, so the pool holds the same bits either way.

use burn::tensor::{Tensor as BurnTensor, TensorPrimitive};
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use cubecl::prelude::*;

#[cube(launch)]
pub(crate) fn pool_write_kernel<F: Float, I: Numeric>(
    pool: &mut Tensor<F>, // [kv_heads, slots, head_dim]
    values: &Tensor<F>,   // [kv_heads, n, head_dim], any strides
    slots: &Tensor<I>,    // [n]
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    let i = CUBE_POS_X as usize;
    let head = CUBE_POS_Y as usize;
    let e = UNIT_POS_X as usize;
    let slot = u32::cast_from(slots[i]) as usize;
    pool[head * pool.stride(0) + slot * pool.stride(1) + e * pool.stride(2)] =
        values[head * values.stride(0) + i * values.stride(1) + e * values.stride(2)];
}

/// [`pool_write_kernel`] for K (cubes at z = 0) and V (z = 1) of a layer in one launch.
#[cube(launch)]
pub(crate) fn pool_write_pair_kernel<F: Float, I: Numeric>(
    k_pool: &mut Tensor<F>, // [kv_heads, slots, head_dim]
    v_pool: &mut Tensor<F>, // [kv_heads, slots, head_dim]
    k: &Tensor<F>,          // [kv_heads, n, head_dim], any strides
    v: &Tensor<F>,          // [kv_heads, n, head_dim], any strides
    slots: &Tensor<I>,      // [n]
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    let i = CUBE_POS_X as usize;
    let head = CUBE_POS_Y as usize;
    let e = UNIT_POS_X as usize;
    let slot = u32::cast_from(slots[i]) as usize;
    if CUBE_POS_Z == 0 {
        k_pool[head * k_pool.stride(0) + slot * k_pool.stride(1) + e * k_pool.stride(2)] =
            k[head * k.stride(0) + i * k.stride(1) + e * k.stride(2)];
    } else {
        v_pool[head * v_pool.stride(0) + slot * v_pool.stride(1) + e * v_pool.stride(2)] =
            v[head * v.stride(0) + i * v.stride(1) + e * v.stride(2)];
    }
}

/// A pool layer (or values for one) on a CubeCL backend.
type Layer<R, F, I, BT> = BurnTensor<CubeBackend<R, F, I, BT>, 3>;

/// A layer's K and V pools written, or handed back unwritten.
type WrittenPair<R, F, I, BT> = Result<[Layer<R, F, I, BT>; 2], [Layer<R, F, I, BT>; 2]>;

/// The pool written, or handed back unwritten.
type Written<R, F, I, BT> = Result<Layer<R, F, I, BT>, Layer<R, F, I, BT>>;

/// Writes `values` `[kv_heads, n, head_dim]` into `pool` at pool slots `slots` (distinct) in
/// place; `Err(pool)` unchanged when its buffer is shared (the caller writes another way) or a
/// head is wider than a cube.
#[allow(clippy::result_large_err)]
pub(crate) fn pool_write_in_place<R, F, I, BT>(
    pool: Layer<R, F, I, BT>,
    slots: &[usize],
    values: Layer<R, F, I, BT>,
) -> Written<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    let [heads, _, d] = pool.dims();
    let n = slots.len();
    let device = pool.device();
    let target = pool.into_primitive().tensor();
    let max_units = target.client.properties().hardware.max_cube_dim.0 as usize;
    if !target.can_mut() || d > max_units {
        return Err(BurnTensor::from_primitive(TensorPrimitive::Float(target)));
    }
    if n > 0 && heads > 0 && d > 0 {
        let index: Vec<i32> = slots.iter().map(|&s| s as i32).collect();
        let [index] =
            super::memo::int_tensors::<R, F, I, BT, 1>(&super::memo::POOL_WRITE, &device, [index]);
        let values = values.into_primitive().tensor();
        let dtypes = [target.dtype.into(), index.dtype.into()];
        crate::host_work::launched(1);
        pool_write_kernel::launch::<R>(
            &target.client,
            CubeCount::Static(n as u32, heads as u32, 1),
            CubeDim::new_1d(d as u32),
            target.clone().into_tensor_arg(),
            values.into_tensor_arg(),
            index.into_tensor_arg(),
            dtypes,
        );
    }
    Ok(BurnTensor::from_primitive(TensorPrimitive::Float(target)))
}

/// [`pool_write_in_place`] of a layer's K and V at the same slots in one launch; `Err` with
/// both pools unchanged when either buffer is shared or a head is wider than a cube.
#[allow(clippy::result_large_err)]
pub(crate) fn pool_write_pair_in_place<R, F, I, BT>(
    [k_pool, v_pool]: [Layer<R, F, I, BT>; 2],
    slots: &[usize],
    [k, v]: [Layer<R, F, I, BT>; 2],
) -> WrittenPair<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    let [heads, _, d] = k_pool.dims();
    let n = slots.len();
    let device = k_pool.device();
    let (kt, vt) = (
        k_pool.into_primitive().tensor(),
        v_pool.into_primitive().tensor(),
    );
    let max_units = kt.client.properties().hardware.max_cube_dim.0 as usize;
    let burn = |t| BurnTensor::from_primitive(TensorPrimitive::Float(t));
    if !kt.can_mut() || !vt.can_mut() || d > max_units || v.dims() != k.dims() {
        return Err([burn(kt), burn(vt)]);
    }
    if n > 0 && heads > 0 && d > 0 {
        let index: Vec<i32> = slots.iter().map(|&s| s as i32).collect();
        let [index] =
            super::memo::int_tensors::<R, F, I, BT, 1>(&super::memo::POOL_WRITE, &device, [index]);
        let dtypes = [kt.dtype.into(), index.dtype.into()];
        crate::host_work::launched(1);
        pool_write_pair_kernel::launch::<R>(
            &kt.client,
            CubeCount::Static(n as u32, heads as u32, 2),
            CubeDim::new_1d(d as u32),
            kt.clone().into_tensor_arg(),
            vt.clone().into_tensor_arg(),
            k.into_primitive().tensor().into_tensor_arg(),
            v.into_primitive().tensor().into_tensor_arg(),
            index.into_tensor_arg(),
            dtypes,
        );
    }
    Ok([burn(kt), burn(vt)])
}

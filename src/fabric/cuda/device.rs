//! What the driver says about the GPUs: static facts of one device, the devices CUDA sees and
//! which pairs can reach each other, the driver's version and free memory. Queries only, apart
//! from the object owners in [`super::driver`].

use std::sync::Arc;

use cudarc::driver::{result, sys, CudaContext, DriverError};

/// Static facts about one GPU.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DeviceFacts {
    pub ordinal: usize,
    pub name: String,
    pub cc: (u32, u32),
    pub sms: u32,
    pub total_mem: u64,
    /// PCI bus id as CUDA writes it, e.g. "0000:00:06.0".
    pub bus_id: String,
}

pub fn device_facts(ctx: &Arc<CudaContext>) -> Result<DeviceFacts, DriverError> {
    let (major, minor) = ctx.compute_capability()?;
    let sms = ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
    let mut buf = [0 as std::ffi::c_char; 64];
    // SAFETY: buffer of the stated length.
    unsafe {
        sys::cuDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as i32, ctx.cu_device()).result()
    }?;
    // SAFETY: the driver NUL-terminates within the buffer.
    let bus_id = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    Ok(DeviceFacts {
        ordinal: ctx.ordinal(),
        name: ctx.name()?,
        cc: (major.max(0) as u32, minor.max(0) as u32),
        sms: sms.max(1) as u32,
        total_mem: ctx.total_mem()? as u64,
        bus_id,
    })
}

/// PCI bus ids of the GPUs CUDA can see (after CUDA_VISIBLE_DEVICES), in ordinal order. Needs
/// no context: the coordinator plans with it before any worker starts.
pub fn visible_bus_ids() -> Result<Vec<String>, DriverError> {
    result::init()?;
    let n = result::device::get_count()?;
    let mut out = Vec::new();
    for o in 0..n.max(0) {
        let d = result::device::get(o)?;
        let mut buf = [0 as std::ffi::c_char; 64];
        // SAFETY: buffer of the stated length.
        unsafe { sys::cuDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as i32, d).result() }?;
        // SAFETY: the driver NUL-terminates within the buffer.
        out.push(
            unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }
                .to_string_lossy()
                .into_owned(),
        );
    }
    Ok(out)
}

/// cuDeviceCanAccessPeer for every ordered pair of the first `n` ordinals (false on error).
pub fn p2p_matrix(n: usize) -> Vec<Vec<bool>> {
    let dev = |o: usize| result::device::get(o as i32).ok();
    (0..n)
        .map(|a| {
            (0..n)
                .map(|b| {
                    let (Some(da), Some(db)) = (dev(a), dev(b)) else {
                        return false;
                    };
                    let mut ok = 0;
                    // SAFETY: two valid device handles and an out-pointer.
                    a != b
                        && unsafe { sys::cuDeviceCanAccessPeer(&mut ok, da, db).result() }.is_ok()
                        && ok != 0
                })
                .collect()
        })
        .collect()
}

/// CUDA driver API version, e.g. "13.0".
pub fn cuda_version() -> Result<String, DriverError> {
    let mut v: i32 = 0;
    // SAFETY: writes one int.
    unsafe { sys::cuDriverGetVersion(&mut v).result() }?;
    Ok(format!("{}.{}", v / 1000, (v % 1000) / 10))
}

//! Another process's buffer opened through its CUDA IPC handle: the handle on the wire, and
//! the opened range, whose length is checked against the real mapping.

use std::sync::Arc;

use cudarc::driver::{sys, DriverError};

use super::driver::{Ctx, Mem, Span};

/// A cuIpcGetMemHandle handle in hex, with the size of the buffer it names.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct IpcHandle {
    pub hex: String,
    pub bytes: u64,
}

/// Another process's buffer opened through its IPC handle; closed when the last span of it
/// goes (the coordinator has every importer close before any owner frees).
pub struct Imported {
    mem: Arc<Mem>,
}

/// Why an IPC handle could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum IpcError {
    #[error("the handle is not 64 bytes of hex")]
    Malformed,
    #[error("cuIpcOpenMemHandle failed: {0}")]
    Open(DriverError),
    /// The size sent with the handle is larger than the allocation it opens: a span of that
    /// size would let checked copies run past the end.
    #[error("the handle claims {claimed} bytes but names an allocation of {real} bytes")]
    Larger { claimed: u64, real: usize },
}

impl Imported {
    pub fn open(ctx: &Arc<Ctx>, h: &IpcHandle) -> Result<Imported, IpcError> {
        let raw = h.hex.as_bytes();
        if raw.len() != 128 {
            return Err(IpcError::Malformed);
        }
        // SAFETY: zeroed bytes are a valid handle to fill in.
        let mut handle: sys::CUipcMemHandle = unsafe { std::mem::zeroed() };
        for (i, pair) in raw.chunks(2).enumerate() {
            let s = std::str::from_utf8(pair).map_err(|_| IpcError::Malformed)?;
            handle.reserved[i] =
                u8::from_str_radix(s, 16).map_err(|_| IpcError::Malformed)? as std::ffi::c_char;
        }
        ctx.bind_to_thread().map_err(IpcError::Open)?;
        let mut ptr = 0;
        let lazy = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
        // SAFETY: a handle exported by cuIpcGetMemHandle in another process; out-pointer valid.
        unsafe { sys::cuIpcOpenMemHandle_v2(&mut ptr, handle, lazy).result() }
            .map_err(IpcError::Open)?;
        // Owned from here: closed on every return below (Mem's drop).
        let mut mem = Mem {
            ptr,
            bytes: 0,
            imported: true,
            ctx: ctx.clone(),
        };
        // The size on the wire is only a claim: the mapping's real extent bounds every copy.
        let (mut base, mut real) = (0, 0usize);
        // SAFETY: out-pointers valid; ptr was just mapped in the bound context.
        unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut real, ptr).result() }
            .map_err(IpcError::Open)?;
        within(ptr, h.bytes, base, real)?;
        mem.bytes = h.bytes as usize;
        Ok(Imported { mem: Arc::new(mem) })
    }

    pub fn span(&self) -> Span {
        Span::of(&self.mem)
    }
}

/// Whether `claimed` bytes from `ptr` lie inside the allocation `[base, base + real)`.
fn within(ptr: u64, claimed: u64, base: u64, real: usize) -> Result<(), IpcError> {
    let end = base.saturating_add(real as u64);
    match ptr >= base && ptr.checked_add(claimed).is_some_and(|e| e <= end) {
        true => Ok(()),
        false => Err(IpcError::Larger {
            claimed,
            real: end.saturating_sub(ptr) as usize,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_size_larger_than_the_mapping_is_refused() {
        let (base, real) = (0x1000_0000u64, 1 << 20);
        assert!(within(base, 1 << 20, base, real).is_ok());
        assert!(within(base + 4096, (1 << 20) - 4096, base, real).is_ok());
        let e = within(base, (1 << 20) + 1, base, real).unwrap_err();
        assert_eq!(
            e.to_string(),
            "the handle claims 1048577 bytes but names an allocation of 1048576 bytes"
        );
        assert!(within(base + 4096, 1 << 20, base, real).is_err());
        assert!(within(base - 1, 1, base, real).is_err());
        assert!(within(u64::MAX - 1, 16, base, real).is_err());
    }
}

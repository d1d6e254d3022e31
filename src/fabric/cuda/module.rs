//! Loaded kernels: a module, and the functions taken from it, which keep it loaded.

use std::ffi::{c_void, CString};
use std::rc::Rc;
use std::sync::Arc;

use cudarc::driver::{result, sys, DriverError};

use super::driver::{dev, Ctx, Stream};
use crate::fabric::{DeviceError, FabricError};

/// A loaded module; the functions taken from it keep it loaded (as cudarc's functions hold
/// their `Arc<CudaModule>`). `Rc`, not `Arc`: modules and functions stay on the worker's one
/// thread (the raw handles make them neither `Send` nor `Sync`).
pub struct Module {
    raw: sys::CUmodule,
    ctx: Arc<Ctx>,
}

impl Module {
    /// Loads a cubin or NUL-terminated PTX image.
    ///
    /// # Safety
    /// `image` must be a complete cubin or NUL-terminated PTX made by NVRTC: the driver
    /// parses it unchecked, and a truncated or foreign image is undefined behaviour (a
    /// crash at best). Images of [`super::compile::Images`] are (fresh, or a cache file
    /// whose header, key, length and digest were checked).
    pub unsafe fn load(ctx: &Arc<Ctx>, image: &[u8]) -> Result<Rc<Module>, DriverError> {
        ctx.bind_to_thread()?;
        // SAFETY: the caller vouches for the image (above).
        let raw = unsafe { result::module::load_data(image.as_ptr() as *const c_void) }?;
        Ok(Rc::new(Module {
            raw,
            ctx: ctx.clone(),
        }))
    }

    pub fn function(self: &Rc<Self>, name: &str) -> Result<Function, FabricError> {
        let kernel = |detail: String| DeviceError::Kernel {
            name: name.into(),
            detail,
        };
        let cname = CString::new(name).map_err(|_| kernel("its name contains NUL".into()))?;
        dev(self.ctx.bind_to_thread(), "binding the CUDA context")?;
        // SAFETY: the module is loaded; the function keeps it loaded.
        let raw = unsafe { result::module::get_function(self.raw, cname) }
            .map_err(|e| kernel(format!("missing from the module ({e})")))?;
        Ok(Function {
            raw,
            _module: self.clone(),
        })
    }
}

/// Every compiled unit loaded into one context; a kernel is looked up by name in whichever
/// holds it (a program may be split into units, [`super::compile::units`]).
pub struct Modules(Vec<Rc<Module>>);

impl Modules {
    /// Loads each image of `images`.
    pub fn load(ctx: &Arc<Ctx>, images: &super::compile::Images) -> Result<Modules, FabricError> {
        let mut out = Vec::new();
        for (img, unit) in images.images().iter().zip(images.units()) {
            out.push(dev(
                // SAFETY: an image of `compile::Images`, which holds only fresh NVRTC output
                // and validated cache entries.
                unsafe { Module::load(ctx, img) },
                &format!("loading the compiled kernels/{}", unit.name),
            )?);
        }
        Ok(Modules(out))
    }

    /// The kernel `name` from the first module that has it.
    pub fn function(&self, name: &str) -> Result<Function, FabricError> {
        let mut last = None;
        for m in &self.0 {
            match m.function(name) {
                Ok(f) => return Ok(f),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| {
            FabricError::Device(DeviceError::Kernel {
                name: name.into(),
                detail: "no kernels are loaded".into(),
            })
        }))
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        if self.ctx.poisoned().is_none() && self.ctx.bind_to_thread().is_ok() {
            // SAFETY: loaded above and unloaded once.
            let _ = unsafe { result::module::unload(self.raw) };
        }
    }
}

/// A kernel in a loaded module, which it keeps loaded.
#[derive(Clone)]
pub struct Function {
    pub raw: sys::CUfunction,
    _module: Rc<Module>,
}

impl Function {
    /// Launches with a single by-value argument struct `args`.
    ///
    /// # Safety
    /// The kernel takes exactly one parameter of type `A`, and every pointer in `args` names
    /// memory that holds what the kernel reads and writes until it has finished.
    pub unsafe fn launch<A>(
        &self,
        grid: (u32, u32),
        block: u32,
        stream: &Stream,
        args: &A,
    ) -> Result<(), DriverError> {
        // SAFETY: the caller's contract.
        unsafe { self.launch_with(grid, block, stream, args, false) }
    }

    /// `launch`, optionally as a programmatic dependent launch (compute capability 9.0 and
    /// later): the grid may be scheduled while the previous kernel in the stream drains, and
    /// waits in `griddepcontrol.wait` (kernels/common.cuh, pdl_wait) until that kernel has
    /// finished and its memory is visible. It hides the gap between back-to-back launches.
    ///
    /// # Safety
    /// As [`Function::launch`].
    pub unsafe fn launch_with<A>(
        &self,
        grid: (u32, u32),
        block: u32,
        stream: &Stream,
        args: &A,
        pdl: bool,
    ) -> Result<(), DriverError> {
        // SAFETY: the caller's contract.
        unsafe { self.launch_on(grid, block, stream.raw, args, pdl) }
    }

    /// [`Function::launch_with`] on a stream this process did not create here (an engine's,
    /// whose context must be the one this kernel's module was loaded in, and current).
    ///
    /// # Safety
    /// As [`Function::launch`], and `stream` is a live stream of the module's context.
    pub unsafe fn launch_on<A>(
        &self,
        grid: (u32, u32),
        block: u32,
        stream: sys::CUstream,
        args: &A,
        pdl: bool,
    ) -> Result<(), DriverError> {
        // The kernel takes exactly one parameter of type A (layouts mirrored in the CUDA
        // sources); the driver copies it before returning.
        let mut params = [args as *const A as *mut c_void];
        if !pdl {
            // SAFETY: the caller's contract; `params` points at one A.
            return unsafe { self.launch_params(grid, block, stream, &mut params) };
        }
        // SAFETY: a zeroed attribute is valid; the union field set is the one its id names.
        let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let config = sys::CUlaunchConfig {
            gridDimX: grid.0,
            gridDimY: grid.1,
            gridDimZ: 1,
            blockDimX: block,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: 0,
            hStream: stream,
            attrs: &mut attr,
            numAttrs: 1,
        };
        // SAFETY: `params` as above; `config` and `attr` outlive the call.
        unsafe {
            sys::cuLaunchKernelEx(&config, self.raw, params.as_mut_ptr(), std::ptr::null_mut())
                .result()
        }
    }

    /// Launches with raw parameter pointers.
    ///
    /// # Safety
    /// `params` matches the kernel's signature, each entry pointing at one argument, and the
    /// memory the arguments name stays valid until the kernel has finished.
    pub unsafe fn launch_raw(
        &self,
        grid: (u32, u32),
        block: u32,
        stream: &Stream,
        params: &mut [*mut c_void],
    ) -> Result<(), DriverError> {
        // SAFETY: the caller's contract.
        unsafe { self.launch_params(grid, block, stream.raw, params) }
    }

    /// SAFETY: as [`Function::launch_raw`], on a live stream of the module's context.
    unsafe fn launch_params(
        &self,
        grid: (u32, u32),
        block: u32,
        stream: sys::CUstream,
        params: &mut [*mut c_void],
    ) -> Result<(), DriverError> {
        // SAFETY: the caller matches `params` to the kernel's signature.
        unsafe {
            sys::cuLaunchKernel(
                self.raw,
                grid.0,
                grid.1,
                1,
                block,
                1,
                1,
                0,
                stream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
            .result()
        }
    }

    /// Blocks of `threads` that fit on one multiprocessor at once.
    pub fn blocks_per_sm(&self, threads: u32) -> Result<u32, DriverError> {
        let mut n: i32 = 0;
        // SAFETY: valid function handle.
        unsafe {
            sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(&mut n, self.raw, threads as i32, 0)
                .result()
        }?;
        Ok(n.max(0) as u32)
    }
}

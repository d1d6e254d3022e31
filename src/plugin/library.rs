//! Where the plugin library is, for what artune tells people to give NCCL. `cargo build
//! --release` writes it beside the binary (target/release/libartune.so); an installation puts
//! the binary in PREFIX/bin and the library in PREFIX/lib (docs/GUIDE.md); the Python wheel
//! ships its own beside its extension module (`artune.plugin_path()`). `cargo install` installs
//! no library.

use std::path::PathBuf;

/// The library's file name.
pub const FILE: &str = "libartune.so";

/// The library that belongs with the running artune binary: beside it, else in `../lib`.
pub fn installed() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let bin = exe.parent()?;
    [bin.join(FILE), bin.join("../lib").join(FILE)]
        .into_iter()
        .find(|p| p.is_file())
        .map(|p| p.canonicalize().unwrap_or(p))
}

/// What `NCCL_TUNER_PLUGIN` should say: the installed library's absolute path, else the bare
/// file name (which NCCL finds only on the loader's search path).
pub fn tuner_plugin_value() -> String {
    installed().map_or_else(|| FILE.into(), |p| p.display().to_string())
}

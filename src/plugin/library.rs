//! Where the plugin library is, for what artune tells people to give NCCL. `cargo build
//! --release` writes it beside the binary (target/release/libartune.so); an installation puts
//! the binary in PREFIX/bin and the library in PREFIX/lib (docs/GUIDE.md); the Python wheel
//! installs the binary in PREFIX/bin and the library in its package, beside the extension
//! module (`artune.plugin_path()`). `cargo install` installs no library.

use std::path::{Path, PathBuf};

/// The library's file name.
pub const FILE: &str = "libartune.so";

/// The library that belongs with the running artune binary: beside it, in `../lib`, or in the
/// artune Python package of the environment the binary is installed in.
pub fn installed() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    beside(exe.parent()?)
}

/// The library that belongs with an artune binary in `bin`.
pub fn beside(bin: &Path) -> Option<PathBuf> {
    let lib = bin.join("../lib");
    [bin.join(FILE), lib.join(FILE)]
        .into_iter()
        .chain(wheel_copies(&lib))
        .find(|p| p.is_file())
        .map(|p| p.canonicalize().unwrap_or(p))
}

/// PREFIX/lib/pythonX.Y/site-packages/artune/libartune.so, for each Python in the prefix.
fn wheel_copies(lib: &Path) -> Vec<PathBuf> {
    let Ok(dir) = std::fs::read_dir(lib) else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = dir
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("python"))
        .map(|e| e.path().join("site-packages").join("artune").join(FILE))
        .collect();
    found.sort();
    found
}

/// What `NCCL_TUNER_PLUGIN` should say: the installed library's absolute path, else the bare
/// file name (which NCCL finds only on the loader's search path).
pub fn tuner_plugin_value() -> String {
    installed().map_or_else(|| FILE.into(), |p| p.display().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// pip puts the binary in PREFIX/bin and the wheel's library in its package.
    #[test]
    fn finds_the_wheels_library_from_its_binary() {
        let d = tempfile::tempdir().unwrap();
        let bin = d.path().join("bin");
        let pkg = d.path().join("lib/python3.11/site-packages/artune");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::create_dir_all(&pkg).unwrap();
        assert_eq!(beside(&bin), None);
        std::fs::write(pkg.join(FILE), b"").unwrap();
        assert_eq!(beside(&bin), Some(pkg.join(FILE).canonicalize().unwrap()));
        std::fs::write(d.path().join("lib").join(FILE), b"").unwrap();
        assert_eq!(
            beside(&bin),
            Some(d.path().join("lib").join(FILE).canonicalize().unwrap())
        );
    }
}

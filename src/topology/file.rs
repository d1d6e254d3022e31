//! Reading and writing topology JSON files.
//!
//! Users describe machines artune cannot see (or calibrate the simulator from their own
//! measurements) in this format; `artune topo --json` writes it. The README documents it.

use super::Topology;
use crate::error::Error;
use std::path::Path;

/// Largest topology file accepted. A 256-GPU machine with every pair listed fits well below.
pub const MAX_FILE_BYTES: u64 = 16 << 20;

/// Loads and normalizes a topology file.
pub fn load(path: &Path) -> Result<Topology, Error> {
    let meta = std::fs::metadata(path).map_err(|e| Error::Read {
        path: path.into(),
        reason: e.to_string(),
    })?;
    if meta.len() > MAX_FILE_BYTES {
        return Err(Error::Parse {
            path: path.into(),
            what: "topology file",
            reason: format!(
                "it is {} bytes, more than the {} a topology file may have",
                meta.len(),
                MAX_FILE_BYTES
            ),
        });
    }
    let text = std::fs::read_to_string(path).map_err(|e| Error::Read {
        path: path.into(),
        reason: e.to_string(),
    })?;
    let mut t = parse(&text).map_err(|reason| Error::Parse {
        path: path.into(),
        what: "topology file",
        reason: format!("{reason}; see \"Topology files\" in the README"),
    })?;
    t.origin.kind = "file".into();
    t.origin.name = Some(path.display().to_string());
    Ok(t)
}

/// Parses topology JSON and normalizes it. The error is a phrase to embed in a sentence.
pub fn parse(text: &str) -> Result<Topology, String> {
    let mut t: Topology = serde_json::from_str(text).map_err(|e| {
        if e.is_eof() {
            format!(
                "it ends too early (line {}): the file looks truncated",
                e.line()
            )
        } else {
            format!("{e}")
        }
    })?;
    t.normalize()?;
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncated_is_named() {
        let full = crate::topology::presets::json("pcie-2x").unwrap();
        let err = parse(&full[..full.len() / 2]).unwrap_err();
        assert!(err.contains("truncated"), "{err}");
    }

    #[test]
    fn dangling_parent_is_named() {
        let mut t = crate::topology::presets::get("pcie-2x").unwrap();
        t.pairs.clear();
        t.gpus[1].parent = "nowhere".into();
        let text = serde_json::to_string(&t).unwrap();
        assert!(parse(&text).unwrap_err().contains("nowhere"));
    }

    #[test]
    fn roundtrip() {
        let t = crate::topology::presets::get("pcie-8x-2switch").unwrap();
        let text = serde_json::to_string_pretty(&t).unwrap();
        assert_eq!(parse(&text).unwrap(), t);
    }
}

//! The JSON Schema of profile v1, generated from the serde types. The committed copy under
//! profiles/schema/ is what other tools validate against; a test keeps the two equal.

/// The schema as pretty JSON with a trailing newline.
pub fn generate() -> String {
    let schema = schemars::schema_for!(super::Profile);
    let mut s = serde_json::to_string_pretty(&schema).expect("schema serializes");
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    #[test]
    fn committed_schema_matches_types() {
        let committed = include_str!("../../profiles/schema/profile-v1.json");
        assert!(
            committed == super::generate(),
            "profiles/schema/profile-v1.json is out of date; regenerate it with `artune schema > profiles/schema/profile-v1.json`"
        );
    }
}

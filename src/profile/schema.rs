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

    /// The per-node fields fleet needs are in the schema, optional, so v1 files without them
    /// stay valid (the corpus profile predates them).
    #[test]
    fn node_and_fleet_fields_are_optional() {
        let schema: serde_json::Value = serde_json::from_str(&super::generate()).unwrap();
        let props = &schema["properties"];
        assert!(
            props["node"].is_object() && props["fleet"].is_object(),
            "{props}"
        );
        let required: Vec<&str> = schema["required"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert!(!required.contains(&"node") && !required.contains(&"fleet"));
        let defs = &schema["$defs"];
        assert!(defs["Node"]["properties"]["hostname"].is_object());
        assert!(defs["Settings"]["properties"]["dtype"].is_object());
        let old = include_str!("../../tests/corpus/profile-v1-4x.json");
        assert!(!old.contains("\"node\""));
        let p = super::super::Profile::parse(old).unwrap();
        assert_eq!((p.node, p.fleet, p.settings.dtype), (None, None, None));
    }

    /// Every map keyed by backend says so (`propertyNames`), so the schema refuses what a
    /// reader refuses, such as `results.bogus` (the loader names the unknown id).
    #[test]
    fn maps_keyed_by_backend_name_their_keys() {
        let schema: serde_json::Value = serde_json::from_str(&super::generate()).unwrap();
        let defs = &schema["$defs"];
        let keyed = |def: &str, field: &str| {
            defs[def]["properties"][field]["propertyNames"]["$ref"] == "#/$defs/Backend"
        };
        for (def, field) in [
            ("Bucket", "results"),
            ("Bucket", "waived"),
            ("GroupProfile", "memory"),
            ("GroupProfile", "forms"),
            ("GroupProfile", "waived"),
            ("GroupProfile", "drift"),
        ] {
            assert!(
                keyed(def, field),
                "{def}.{field}: {}",
                defs[def]["properties"][field]
            );
        }
    }
}

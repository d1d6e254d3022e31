//! Any bytes given to the topology parser: an answer (Ok or a one-line error), never a panic,
//! and whatever it accepts is still accepted after it is written out again.
#![no_main]

use artune::topology::file;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match file::parse(text) {
        Ok(t) => {
            let again = serde_json::to_string(&t).expect("topology serializes");
            if let Err(e) = file::parse(&again) {
                panic!("an accepted topology is refused once rewritten: {e}");
            }
        }
        Err(e) => {
            let e = e.to_string();
            assert!(
                !e.is_empty() && !e.contains('\n'),
                "error is not one line: {e:?}"
            )
        }
    }
});

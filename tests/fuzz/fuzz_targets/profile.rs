//! Any bytes given to the profile parser: an answer (Ok or a one-line error), never a panic,
//! and whatever it accepts is still accepted after it is written out again.
#![no_main]

use artune::profile::Profile;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match Profile::parse(text) {
        Ok(p) => {
            if let Err(e) = Profile::parse(&p.to_json()) {
                panic!("an accepted profile is refused once rewritten: {e}");
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

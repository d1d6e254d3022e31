//! The values of command-line options, parsed and refused in each option's own words (clap
//! would say "invalid digit found in string", or take a negative value for a flag).

use std::collections::BTreeSet;

use crate::error::Error;

/// A whole number for an option, or the sentence "`S` is not WHAT; give HOW" (clap would
/// say "invalid digit found in string").
fn whole<T: std::str::FromStr>(s: &str, what: &str, how: &str) -> Result<T, String> {
    s.trim()
        .parse()
        .map_err(|_| format!("`{s}` is not {what}; give {how}"))
}

/// `--wait`: whole seconds.
pub fn seconds(s: &str) -> Result<u64, String> {
    whole(
        s,
        "a whole number of seconds",
        "e.g. 30, or 0 to refuse at once",
    )
}

/// `--seed`: a whole number from 0 up.
pub fn seed(s: &str) -> Result<u64, String> {
    whole(s, "a seed", "a whole number from 0 up, e.g. 1")
}

/// `--loopback K`: a whole number of virtual ranks.
pub fn ranks(s: &str) -> Result<usize, String> {
    whole(
        s,
        "a number of virtual ranks",
        "a whole number from 2 up, e.g. 8",
    )
}

/// `--tp K` of the commands that ask a profile: a whole number of GPUs.
pub fn tp_size(s: &str) -> Result<usize, String> {
    whole(s, "a TP size", "a whole number of GPUs from 2 up, e.g. 4")
}

/// `--gpus 3,4`: GPU indices from 0 up.
pub fn gpu_index(s: &str) -> Result<usize, String> {
    whole(
        s,
        "a GPU index",
        "indices from 0 up, comma separated, e.g. 3,4",
    )
}

/// `--hidden N`: the model's hidden size in elements.
pub fn hidden_size(s: &str) -> Result<u64, String> {
    whole(
        s,
        "a hidden size",
        "the model's hidden size in elements, e.g. 7168",
    )
}

/// `--world-size N`: the deployment's ranks.
pub fn world_size(s: &str) -> Result<usize, String> {
    whole(
        s,
        "a number of ranks",
        "the deployment's ranks (TP x PP), e.g. 8",
    )
}

/// Island sizes as typed: "4,4".
pub fn shown<T: ToString>(sizes: &[T]) -> String {
    let v: Vec<String> = sizes.iter().map(T::to_string).collect();
    v.join(",")
}

/// Parses `--islands 4,4`: equal islands of 2 or more GPUs, two or more of them. Whether they
/// add up to a tuned group's size is checked once the machine is known ([`Tune::options`]).
pub fn parse_islands(items: &[String]) -> Result<Vec<usize>, Error> {
    let sizes = items
        .iter()
        .map(|it| {
            // A negative size is a number too small, not "not a number".
            it.trim().parse::<i64>().map_err(|_| {
                Error::bad_input(format!(
                    "--islands `{it}` is not a number; give island sizes like --islands 4,4"
                ))
            })
        })
        .collect::<Result<Vec<i64>, Error>>()?;
    let s = shown(&sizes);
    if sizes.len() < 2 {
        return Err(Error::bad_input(format!(
            "--islands {s} is one island: an island schedule crosses between two or more; give sizes like --islands 4,4"
        )));
    }
    if sizes.iter().any(|&k| k < 2) {
        return Err(Error::bad_input(format!(
            "--islands {s} has an island of fewer than 2 GPUs, with nothing to reduce inside it; give islands of 2 or more"
        )));
    }
    if sizes.windows(2).any(|w| w[0] != w[1]) {
        return Err(Error::bad_input(format!(
            "--islands {s} are of unequal size: the island schedules need equal islands; give equal sizes such as --islands 4,4"
        )));
    }
    Ok(sizes.into_iter().map(|k| k as usize).collect())
}

/// Parses `--tp 2,4,8`: TP sizes of at least 2 (whether they fit is the machine's to say).
pub fn parse_tp(items: &[String]) -> Result<Vec<usize>, Error> {
    let mut out = BTreeSet::new();
    for it in items {
        // A negative size is a number too small, not "not a number".
        let t: i64 = it.trim().parse().map_err(|_| {
            Error::bad_input(format!(
                "--tp `{it}` is not a number; give TP sizes like --tp 2,4,8"
            ))
        })?;
        if t < 2 {
            return Err(Error::bad_input(format!(
                "--tp {t}: an allreduce needs at least 2 GPUs; give TP sizes like --tp 2,4,8"
            )));
        }
        out.insert(t as usize);
    }
    if out.is_empty() {
        return Err(Error::bad_input(
            "--tp is empty; give TP sizes like --tp 2,4,8",
        ));
    }
    Ok(out.into_iter().collect())
}

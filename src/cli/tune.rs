//! `artune tune` and `artune show`.

use super::gate::Free;
use super::output::{out, outln};
use super::progress::{stop_on_signals, StatusLine};
use super::values::{parse_islands, parse_tp, shown};
use super::{ShowArgs, TuneArgs};
use crate::cancel::Cancel;
use crate::error::Error;
use crate::measure::Harness;
use crate::profile::paths::{self, check_replace, Writes};
use crate::profile::{Profile, Sampling};
use crate::{report, tune, units};

/// `tune`'s arguments, each checked once and turned into what the run uses, before anything
/// touches a GPU (as ripgrep's `HiArgs::from_low_args`). A new flag is one field of
/// [`TuneArgs`] and one line in [`Tune::from_args`]; only the TP sizes wait for the machine
/// ([`Tune::options`]).
struct Tune {
    source: super::Source,
    loopback: Option<usize>,
    faults: crate::fabric::sim::Faults,
    occupancy: Option<std::path::PathBuf>,
    allow_busy: bool,
    /// `--wait`: how long to wait for another artune measuring the same GPUs.
    wait: std::time::Duration,
    /// `--out` with `{host}` replaced, checked writable.
    out: std::path::PathBuf,
    plot: Option<std::path::PathBuf>,
    /// `--sizes` as typed, for messages.
    sizes: String,
    json: bool,
    node: crate::profile::Node,
    /// `--tp` as given (each at least 2); empty: the default for the machine.
    tp: Vec<usize>,
    /// `--islands` as given (equal islands of 2 or more, two or more of them).
    islands: Option<Vec<usize>>,
    /// Everything else the pipeline takes.
    options: tune::Options,
}

impl Tune {
    fn from_args(a: TuneArgs) -> Result<Tune, Error> {
        let mut node = crate::profile::Node::here();
        node.args = std::env::args().skip(1).collect();
        let out = out_path(&a.out, &node)?;
        crate::profile::check_writable(&out)?;
        if let Some(t) = &a.source.topology {
            paths::check_not_input(&out, "--out", t, "topology file")?;
        }
        check_replace(&out, "--out", Writes::Profile, a.force)?;
        let simulated = a.source.sim.is_some() || a.source.topology.is_some();
        if simulated && !a.force {
            keeps_measured(&out)?;
        }
        if let Some(dir) = &a.plot {
            paths::check_output(dir, "--plot", paths::Expect::Dir)?;
            report::check_plot_dir(dir, a.force)?;
        }
        let dtype = a.dtype.into();
        let (min_bytes, max_bytes) = sizes(&a.sizes, dtype)?;
        let (sampling, harness) = sampling(a.exhaustive, a.target_ci.as_deref())?;
        Ok(Tune {
            faults: super::sim_faults(a.sim_faults.as_deref(), &a.source)?,
            source: a.source,
            loopback: a.loopback,
            occupancy: a.sim_occupancy,
            allow_busy: a.allow_busy,
            wait: std::time::Duration::from_secs(a.wait),
            out,
            plot: a.plot,
            sizes: a.sizes,
            json: a.json,
            node,
            tp: a
                .tp
                .as_deref()
                .map(parse_tp)
                .transpose()?
                .unwrap_or_default(),
            islands: a.islands.as_deref().map(parse_islands).transpose()?,
            options: tune::Options {
                min_bytes,
                max_bytes,
                modes: a.mode.modes(),
                dtype,
                mem_budget: a.mem_budget.as_deref().map(mem_budget).transpose()?,
                seed: a.seed,
                contention: !a.no_contention,
                sampling,
                harness,
                ..Default::default()
            },
        })
    }

    /// The pipeline's options for the machine `topo`: the checks that need it.
    fn options(
        &self,
        topo: &crate::topology::Topology,
        free: Option<Free>,
    ) -> Result<tune::Options, Error> {
        let gpus = topo.gpu_count();
        if let Some(t) = self.tp.iter().find(|&&t| t > gpus) {
            return Err(Error::bad_input(format!(
                "--tp {t} does not fit this machine of {gpus} GPU{}; {}",
                if gpus == 1 { "" } else { "s" },
                match gpus {
                    0 | 1 => "a TP group needs 2 GPUs or more, so there is nothing to tune here"
                        .to_string(),
                    2 => "give --tp 2, or leave --tp out".to_string(),
                    n => format!("choose sizes from 2 to {n}"),
                }
            )));
        }
        let tuned = match self.tp.is_empty() {
            true => crate::plan::default_tp(gpus),
            false => self.tp.clone(),
        };
        if let Some(sizes) = &self.islands {
            let sum: usize = sizes.iter().sum();
            if !tuned.contains(&sum) {
                let list: Vec<String> = tuned.iter().map(usize::to_string).collect();
                // Another TP size is advice only where the machine has the GPUs for it.
                let or = match sum <= gpus {
                    true => format!(" (or tune that size with --tp {sum})"),
                    false => format!(" (this machine has {gpus} GPUs)"),
                };
                return Err(Error::bad_input(format!(
                    "--islands {} adds up to {sum} GPUs, but the groups tuned have {}; give sizes that add up to one of them{or}",
                    shown(sizes),
                    list.join(", ")
                )));
            }
        }
        self.buffers_fit(topo, &tuned, free)?;
        self.sizes_fit(&tuned)?;
        self.budget_fits(&tuned)?;
        Ok(tune::Options {
            tp: self.tp.clone(),
            islands: self.islands.clone(),
            ..self.options.clone()
        })
    }
}

impl Tune {
    /// `--sizes`' largest message fits what a profile records, before anything is measured:
    /// every custom kernel's buffers for it within the profile's limit.
    fn sizes_fit(&self, tuned: &[usize]) -> Result<(), Error> {
        use crate::allreduce::{memory, Backend, Ranks};
        let high = self.options.max_bytes;
        let limit = crate::profile::LIMITS.buffer_bytes;
        let most = tuned
            .iter()
            .flat_map(|&t| Backend::ALL.iter().map(move |&b| (b, Ranks::flat(t))))
            .filter(|(b, _)| b.is_custom())
            .filter_map(|(b, r)| memory::largest_within(b, r, limit, 0))
            .min();
        if let Some(most) = most.filter(|&m| m < high) {
            return Err(Error::bad_input(format!(
                "--sizes {}: custom kernels' buffers for {} would be more than the {} per GPU a profile records; choose HIGH at most {}",
                self.sizes,
                units::fmt_size(high),
                units::fmt_size(limit),
                units::fmt_size(units::floor_typed(most))
            )));
        }
        Ok(())
    }
}

impl Tune {
    /// `--mem-budget` leaves some custom kernel room at the smallest size: a budget below every
    /// kernel's buffers there excludes them all at every size, as 0 would (refused as 0 is).
    fn budget_fits(&self, tuned: &[usize]) -> Result<(), Error> {
        use crate::allreduce::{memory, Backend, Ranks};
        let (Some(budget), low) = (self.options.mem_budget, self.options.min_bytes) else {
            return Ok(());
        };
        let least = tuned
            .iter()
            .flat_map(|&t| Backend::ALL.iter().map(move |&b| (b, Ranks::flat(t))))
            .filter(|(b, _)| b.is_custom())
            .map(|(b, r)| memory::modelled(b, r, low, 0))
            .min();
        match least.filter(|&l| l > budget) {
            Some(l) => Err(Error::bad_input(format!(
                "--mem-budget {} leaves no custom kernel at any size: the smallest needs {} for {} messages; give at least that, or leave --mem-budget out",
                units::fmt_mem(budget),
                units::fmt_mem(l),
                units::fmt_size(low)
            ))),
            None => Ok(()),
        }
    }
}

impl Tune {
    /// The custom kernels' buffers fit beside the largest message's input and output: a group
    /// sets every custom backend up at once, each sized for `--sizes`' HIGH, on each rank a GPU
    /// holds, so a tune that would run out of device memory is refused before it starts. The
    /// memory is what NVML read free where it did (`free`), else the topology's size.
    fn buffers_fit(
        &self,
        topo: &crate::topology::Topology,
        tuned: &[usize],
        free: Option<Free>,
    ) -> Result<(), Error> {
        use crate::allreduce::{memory, Backend, Ranks};
        let ranks = self.loopback.unwrap_or(1) as u64;
        let total = topo
            .gpus
            .iter()
            .filter_map(|g| Some((g.index, g.memory_bytes?)))
            .min_by_key(|&(_, m)| m);
        let (gpu, mem, what) = match (free, total) {
            (Some((g, f)), _) => (g, f, "free"),
            (None, Some((g, m))) => (g, m, "in all"),
            (None, None) => return Ok(()),
        };
        // Per GPU for messages up to `high`: the largest group's buffers and its input and
        // output, on each rank. Island kernels are left out, as a machine without islands
        // waives them: the sum is at most what the group sets up, so it never refuses wrongly.
        let flat: Vec<Backend> = Backend::ALL
            .iter()
            .copied()
            .filter(|b| b.is_custom() && !b.is_hierarchical())
            .collect();
        let need = |high: u64| -> (u64, usize) {
            tuned
                .iter()
                .map(|&t| {
                    let bytes = flat
                        .iter()
                        .map(|&b| memory::modelled(b, Ranks::flat(t), high, 0))
                        .fold(high.saturating_mul(2), u64::saturating_add);
                    (bytes.saturating_mul(ranks), t)
                })
                .max()
                .unwrap_or_default()
        };
        let high = self.options.max_bytes;
        let (bytes, tp) = need(high);
        if bytes <= mem {
            return Ok(());
        }
        let (mut lo, mut hi) = (0u64, high);
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            match need(mid).0 <= mem {
                true => lo = mid,
                false => hi = mid - 1,
            }
        }
        let on = match ranks {
            1 => String::new(),
            k => format!(" on each of its {k} ranks"),
        };
        let mut advice = match lo {
            0 => "free memory on the GPU".to_string(),
            lo => format!(
                "choose HIGH at most {}",
                units::fmt_size(units::floor_typed(lo))
            ),
        };
        if self.options.mem_budget.is_some() {
            // Every kernel is timed at every size; the budget only rules out choices.
            advice += " (--mem-budget limits what the profile chooses, not the buffers the tune times kernels with)";
        }
        Err(Error::bad_input(format!(
            "--sizes {}: a TP{tp} group's custom kernels with their buffers for {} messages and its input and output{on} need at least {} per GPU, more than the {} GPU {gpu} has {what}; {advice}",
            self.sizes,
            units::fmt_size(high),
            units::fmt_mem(bytes),
            units::fmt_mem(mem),
        )))
    }
}

/// A simulated tune does not replace a measured profile without --force: a model written over
/// what a machine measured loses the measurement, and the file's readers (engines, check)
/// would then refuse it as simulated.
fn keeps_measured(out: &std::path::Path) -> Result<(), Error> {
    let limit = crate::profile::LIMITS.file_bytes;
    let Ok(text) = crate::topology::file::read_text(out, limit, "profile") else {
        return Ok(());
    };
    // Two fields are all this asks; check_replace has already validated the file whole.
    #[derive(serde::Deserialize)]
    struct Made {
        simulated: bool,
        fabric: String,
    }
    match serde_json::from_str::<Made>(&text) {
        Ok(p) if !p.simulated => Err(Error::bad_input(format!(
            "--out {}: that file holds a profile measured on {}, and a simulated tune would replace it with a model; choose another --out, or pass --force to replace it",
            out.display(),
            p.fabric
        ))),
        _ => Ok(()),
    }
}

/// `--sizes LOW:HIGH`: within the profile's limits, and whole elements of `dtype` at both ends.
fn sizes(text: &str, dtype: crate::allreduce::Dtype) -> Result<(u64, u64), Error> {
    let (min_bytes, max_bytes) = units::parse_range(text)?;
    if max_bytes > crate::profile::LIMITS.message_bytes {
        return Err(Error::bad_input(format!(
            "--sizes {text} goes above 1 TiB; choose a smaller upper bound"
        )));
    }
    tune::check_sizes(min_bytes, max_bytes, dtype)
        .map_err(|e| Error::bad_input(format!("--sizes {text}: {e}")))?;
    Ok((min_bytes, max_bytes))
}

/// `--mem-budget BYTES`, above 0: a budget of 0 would exclude every custom kernel at every
/// size, so it is refused, not applied.
fn mem_budget(text: &str) -> Result<u64, Error> {
    match units::parse_bytes(text)? {
        0 => Err(Error::bad_input(format!("--mem-budget {text} leaves no custom kernel; give a size such as 256MiB, or leave --mem-budget out to allow any"))),
        b => Ok(b),
    }
}

/// Parses `--target-ci PCT` (a percentage, `2` or `2%`) into a fraction.
pub fn parse_target_ci(text: &str) -> Result<f64, Error> {
    let pct: f64 = text
        .trim()
        .trim_end_matches('%')
        .trim()
        .parse()
        .ok()
        .filter(|p: &f64| p.is_finite())
        .ok_or_else(|| {
            Error::bad_input(format!(
                "--target-ci `{text}` is not a number; give the interval's half-width in percent, e.g. --target-ci 2"
            ))
        })?;
    if !(0.1..=20.0).contains(&pct) {
        return Err(Error::bad_input(format!(
            "--target-ci {text} is outside 0.1%..20%; give the interval's half-width in percent, e.g. --target-ci 2"
        )));
    }
    Ok(pct / 100.0)
}

/// The sampling asked for (`--exhaustive`, `--target-ci`), or why the flags contradict.
fn sampling(exhaustive: bool, target_ci: Option<&str>) -> Result<(Sampling, Harness), Error> {
    let target = target_ci.map(parse_target_ci).transpose()?;
    let mut harness = tune::fast_harness();
    match (exhaustive, target) {
        (true, Some(_)) => Err(Error::bad_input(
            "--exhaustive samples every backend to the reference 2% target, so --target-ci cannot change it; drop one of them",
        )),
        (true, None) => Ok((Sampling::Exhaustive, harness)),
        (false, t) => {
            if let Some(t) = t {
                harness.target_ci = t;
            }
            Ok((Sampling::Fast, harness))
        }
    }
}

/// `--out` with `{host}` replaced by this node's name (the scheduler's, else the host name), so
/// one command line launched on every node writes one file per node. A name that cannot be a
/// file name is refused naming where it came from.
fn out_path(
    out: &std::path::Path,
    node: &crate::profile::Node,
) -> Result<std::path::PathBuf, Error> {
    let text = out.to_string_lossy();
    if !text.contains("{host}") {
        return Ok(out.to_path_buf());
    }
    let set = |k: &'static str| std::env::var(k).ok().filter(|v| !v.is_empty()).map(|_| k);
    let from = match &node.scheduler_node {
        Some(_) => set("SLURMD_NODENAME")
            .or_else(|| set("NODE_NAME"))
            .unwrap_or("the scheduler's node name"),
        None => "the host name",
    };
    let Some(name) = node.name().map(str::to_string) else {
        return Err(Error::bad_input(
            "--out names {host}, but SLURMD_NODENAME and NODE_NAME are unset and the host name is unknown; set NODE_NAME or write the file name out",
        ));
    };
    let why = if name.contains('/') {
        Some("it holds a /")
    } else if name == "." || name == ".." {
        Some("it names a directory")
    } else {
        None
    };
    if let Some(why) = why {
        let shown = match from {
            "the host name" => format!("the host name `{name}`"),
            var => format!("{var}={name}"),
        };
        return Err(Error::bad_input(format!(
            "--out names {{host}}, which would be {shown} here, and that is not a file name ({why}); set it to the node's name, or write the file name out"
        )));
    }
    Ok(text.replace("{host}", &name).into())
}

pub fn run(a: TuneArgs) -> Result<i32, Error> {
    // Signals first: reading a large --out to check what it replaces takes a while, and a
    // Ctrl-C then must end in the message and exit 130, not a bare kill.
    let status = StatusLine::new();
    let cancel = Cancel::new();
    let stopping = stop_on_signals(&cancel, &status);
    let t = Tune::from_args(a)?;
    if cancel.is_cancelled() {
        return Err(Error::Interrupted);
    }
    super::compile_ahead(&t.source, &[t.options.dtype]);
    status.stage("looking for other processes on the GPUs");
    let simulated = t.source.sim.is_some() || t.source.topology.is_some();
    let ask = super::gate::Ask {
        simulated,
        loopback: t.loopback,
        fake: t.occupancy.as_deref(),
        allow_busy: t.allow_busy,
        wait: t.wait,
        command: "tune",
    };
    let (gated, mut fabric, spent) = super::gate::gate_then_open(
        &ask,
        &mut || {
            status.stage(match simulated {
                true => "modelling the simulated machine",
                false => "starting a worker per GPU and compiling the kernels",
            })
        },
        |busy| {
            let dtypes = [t.options.dtype];
            super::open_fabric(
                &t.source,
                t.loopback,
                t.options.seed,
                t.faults.clone(),
                &dtypes,
            )
            .map_err(|e| beside_busy(e, busy))
        },
    )?;
    let super::gate::Gated {
        busy,
        neighbours,
        free,
    } = gated;
    let opts = tune::Options {
        checks_seconds: spent.checks_s,
        startup_seconds: spent.startup_s,
        environment: crate::profile::environment::current(),
        allow_busy: t.allow_busy,
        busy,
        neighbours,
        cancel,
        ..t.options(fabric.topology(), free)?
    };
    status.stage("planning the GPU groups and sizes");
    let result = tune::run(fabric.as_mut(), &opts, &mut |p| status.progress(p));
    stopping.commit();
    status.finish();
    // Releases communicators and device memory before anything is written.
    drop(fabric);
    let mut profile = result.map_err(|e| beside_busy(e, &opts.busy))?;
    profile.node = Some(t.node);
    profile.write_atomic(&t.out)?;
    // The profile is written: plots that fail are a warning (exit 5), not a failed tune.
    let mut code = 0;
    if let Some(dir) = &t.plot {
        match report::plots(&profile, dir) {
            Ok(files) => eprintln!("wrote {} plots to {}", files.len(), dir.display()),
            Err(e) => {
                let why = match e {
                    Error::Write { path, reason } => format!("{}: {reason}", path.display()),
                    e => e.to_string(),
                };
                eprintln!(
                    "warning: {} was written, but the plots were not ({why}); give --plot a writable directory",
                    t.out.display()
                );
                code = crate::error::EXIT_WARNINGS;
            }
        }
    }
    let printed = if t.json {
        let json = serde_json::to_string_pretty(&report::summary_json(&profile)).expect("json");
        super::output::write_fmt(format_args!("{json}\n"))
    } else {
        super::output::write_fmt(format_args!("{}", report::summary(&profile)))
    };
    // The profile is written: a summary that cannot be printed is a warning too.
    if let Err(e) = printed {
        eprintln!("warning: {} was written, but {e}", t.out.display());
        return Ok(crate::error::EXIT_WARNINGS);
    }
    if !t.json {
        eprint!("\n{}", report::next_steps(&t.out, &profile));
    }
    Ok(code)
}

/// A hardware failure on GPUs measured with `--allow-busy` (out of memory, typically) names
/// who else held them and how much, as read before the tune.
fn beside_busy(e: Error, busy: &[crate::profile::environment::BusyGpu]) -> Error {
    match e {
        Error::Hardware(msg) if !busy.is_empty() => {
            let who: Vec<String> = busy.iter().map(ToString::to_string).collect();
            Error::Hardware(format!(
                "{msg} (with --allow-busy: before the tune, {} held the GPUs)",
                who.join("; ")
            ))
        }
        e => e,
    }
}

pub fn show(a: ShowArgs) -> Result<i32, Error> {
    let p = Profile::load(&a.profile)?;
    if a.json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&report::summary_json(&p)).expect("json")
        );
    } else {
        out!("{}", report::summary(&p));
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::{beside_busy, parse_target_ci};
    use crate::cli::values::parse_tp;

    use crate::error::Error;
    use crate::profile::environment::BusyGpu;

    #[test]
    fn a_hardware_failure_beside_allowed_work_names_who_held_the_gpu() {
        let busy = [BusyGpu {
            gpu: 0,
            pid: 9,
            name: "matmul".into(),
            memory_bytes: Some(140 << 30),
        }];
        let e = beside_busy(
            Error::Hardware("opening GPU 0 failed: OUT_OF_MEMORY".into()),
            &busy,
        );
        let msg = e.to_string();
        assert!(
            msg.contains("GPU 0: pid 9 (matmul) holding 140.0 GiB held the GPUs"),
            "{msg}"
        );
        assert_eq!(e.exit_code(), crate::error::EXIT_HARDWARE);
        let quiet = beside_busy(Error::Hardware("x".into()), &[]);
        assert_eq!(quiet.to_string(), "x");
    }

    #[test]
    fn a_host_name_that_is_no_file_name_is_refused_naming_its_variable() {
        let node = |sched: Option<&str>, host: Option<&str>| crate::profile::Node {
            scheduler_node: sched.map(Into::into),
            hostname: host.map(Into::into),
            args: Vec::new(),
        };
        let out = std::path::Path::new("/p/{host}.json");
        let ok = super::out_path(out, &node(None, Some("n7"))).unwrap();
        assert_eq!(ok, std::path::Path::new("/p/n7.json"));
        let e = super::out_path(out, &node(None, Some("..")))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("the host name `..`") && e.contains("names a directory"),
            "{e}"
        );
        let e = super::out_path(out, &node(None, None))
            .unwrap_err()
            .to_string();
        assert!(e.contains("SLURMD_NODENAME and NODE_NAME are unset"), "{e}");
    }

    #[test]
    fn target_ci_is_a_percentage_within_bounds() {
        assert_eq!(parse_target_ci("2").unwrap(), 0.02);
        assert_eq!(parse_target_ci("0.5%").unwrap(), 0.005);
        assert_eq!(parse_target_ci("20").unwrap(), 0.2);
        for bad in ["0.05", "25", "-1", "x", "nan", "inf"] {
            assert!(parse_target_ci(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn tp_sizes_parse_and_must_fit_the_machine() {
        assert_eq!(parse_tp(&["4".into(), "2".into()]).unwrap(), vec![2, 4]);
        assert!(parse_tp(&["1".into()]).is_err());
        assert!(parse_tp(&["x".into()]).is_err());
        use clap::Parser;
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("p.json");
        let args = ["artune", "tune", "--sim", "pcie-2x", "--tp", "4", "--out"];
        let a =
            crate::cli::Cli::try_parse_from(args.iter().copied().chain([out.to_str().unwrap()]))
                .unwrap();
        let crate::cli::Command::Tune(a) = a.command else {
            panic!("not tune")
        };
        let t = super::Tune::from_args(a).unwrap();
        let machine = |m| crate::topology::presets::get(m).unwrap();
        let e = t
            .options(&machine("pcie-2x"), None)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "--tp 4 does not fit this machine of 2 GPUs; give --tp 2, or leave --tp out"
        );
        assert_eq!(
            t.options(&machine("pcie-4x-1switch"), None).unwrap().tp,
            vec![4]
        );
        // One GPU: no TP size to offer.
        let mut one = machine("pcie-2x");
        one.gpus.truncate(1);
        assert_eq!(
            t.options(&one, None).unwrap_err().to_string(),
            "--tp 4 does not fit this machine of 1 GPU; a TP group needs 2 GPUs or more, so there is nothing to tune here"
        );
    }
}

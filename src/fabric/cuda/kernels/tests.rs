use super::*;
use crate::fabric::cuda::layout::{
    defines, ArArgs, CeSumArgs, ProbeArgs, RegSlot, LL1_MAX_BYTES, LL1_THREADS, LL2_MAX_BYTES,
    MAX_RANKS, SIGNAL_STATUS_OFFSET,
};

#[test]
fn the_kernels_that_stage_have_a_registered_form() {
    let with: Vec<Backend> = Backend::ALL
        .into_iter()
        .filter(|b| b.has_registered_form())
        .collect();
    // One-stage push stages nothing (peers write only its slots).
    assert_eq!(
        with,
        [
            Backend::OneStagePull,
            Backend::TwoStagePull,
            Backend::TwoStagePush,
            Backend::IslandTwoShot,
            Backend::IslandOneShot,
        ]
    );
    assert_eq!(
        registered_kernel_name(Backend::TwoStagePull, Dtype::Fp16).as_deref(),
        Some("two_stage_pull_reg_fp16")
    );
    assert_eq!(
        registered_kernel_name(Backend::IslandTwoShot, Dtype::Bf16).as_deref(),
        Some("island_two_shot_reg_bf16")
    );
    assert_eq!(
        registered_kernel_name(Backend::OneStagePush, Dtype::Bf16),
        None
    );
    // Peers read the pull kernels' and the one-shot's inputs, write two-stage push's
    // outputs, and the island two-shot's both: its kernel reads two slots.
    let tensors: Vec<_> = with.iter().map(|&b| registered_tensors(b)).collect();
    use RegTensors::*;
    assert_eq!(
        tensors,
        [
            Some(Input),
            Some(Input),
            Some(Output),
            Some(Both),
            Some(Input)
        ]
    );
    assert_eq!(registered_tensors(Backend::OneStagePush), None);
    assert_eq!(Both.of(0xa0, 0xc0), [0xa0, 0xc0]);
    assert_eq!(Output.of(0xa0, 0xc0), [0xc0]);
    // Every registered kernel is in its program's source.
    for b in with {
        let src = program(b.spec().kernel.unwrap().source);
        for d in DTYPES {
            let name = registered_kernel_name(b, d).unwrap();
            let (stem, _) = name.rsplit_once('_').unwrap();
            assert!(src.contains(&format!("{stem}_##suffix")), "{name}");
        }
    }
}

#[test]
fn programmatic_launch_from_hopper_on() {
    assert!(!programmatic_launch((7, 5)));
    assert!(!programmatic_launch((8, 9)));
    assert!(programmatic_launch((9, 0)));
    assert!(programmatic_launch((12, 0)));
}

/// Field offsets and size of `struct name` as declared in `src` (kernels/*.cu), laid out
/// by C's rules (natural alignment), with the shared constants the -D options give it.
fn c_layout(src: &str, name: &str) -> (Vec<(String, usize)>, usize) {
    let start = src
        .find(&format!("struct {name} {{"))
        .unwrap_or_else(|| panic!("struct {name} is not in the source"));
    let body = &src[start..][..src[start..].find("};").unwrap()];
    let (mut at, mut align_all, mut fields) = (0usize, 1usize, Vec::new());
    for line in body.lines().skip(1) {
        let decl = line.split("//").next().unwrap().trim();
        let Some(decl) = decl.strip_suffix(';') else {
            continue;
        };
        let (ty, rest) = decl.split_once(' ').unwrap();
        let size = match ty {
            "u64" => 8,
            "u32" | "int" => 4,
            other => panic!("unknown C type {other} in {name}"),
        };
        let mut parts = rest.split('[');
        let field = parts.next().unwrap().trim().to_string();
        let count: usize = parts
            .map(|d| match d.trim_end_matches(']') {
                "MAX_RANKS" => 16,
                "MAX_BLOCKS" => 256,
                n => n.parse::<usize>().unwrap(),
            })
            .product();
        at = at.div_ceil(size) * size;
        fields.push((field, at));
        at += size * count;
        align_all = align_all.max(size);
    }
    (fields, at.div_ceil(align_all) * align_all)
}

#[test]
fn arg_layouts_match_the_cuda_structs() {
    use std::mem::{offset_of, size_of};
    // The offsets the CUDA compiler gives each field, read from the declarations.
    let (f, size) = c_layout(compile::COMMON, "ArArgs");
    let rust = [
        ("in", offset_of!(ArArgs, input)),
        ("out", offset_of!(ArArgs, out)),
        ("scratch", offset_of!(ArArgs, scratch)),
        ("sig", offset_of!(ArArgs, sig)),
        ("src", offset_of!(ArArgs, src)),
        ("dst", offset_of!(ArArgs, dst)),
        ("n", offset_of!(ArArgs, n)),
        ("slot_bytes", offset_of!(ArArgs, slot_bytes)),
        ("fault", offset_of!(ArArgs, fault)),
        ("nranks", offset_of!(ArArgs, nranks)),
        ("rank_base", offset_of!(ArArgs, rank_base)),
        ("island", offset_of!(ArArgs, island)),
        ("dirs", offset_of!(ArArgs, dirs)),
        ("order", offset_of!(ArArgs, order)),
        ("reg", offset_of!(ArArgs, reg)),
        ("missed", offset_of!(ArArgs, missed)),
        ("reg_gen", offset_of!(ArArgs, reg_gen)),
    ];
    let rust: Vec<(String, usize)> = rust.iter().map(|(n, o)| (n.to_string(), *o)).collect();
    assert_eq!(f, rust);
    assert_eq!(size, size_of::<ArArgs>());
    let (f, size) = c_layout(compile::COMMON, "RegSlot");
    let rust = [
        ("peer", offset_of!(RegSlot, peer)),
        ("gen", offset_of!(RegSlot, gen)),
        ("pad", offset_of!(RegSlot, pad)),
    ];
    let rust: Vec<(String, usize)> = rust.iter().map(|(n, o)| (n.to_string(), *o)).collect();
    assert_eq!(f, rust);
    assert_eq!(size, size_of::<RegSlot>());
    let s = RegSlot {
        peer: [7; MAX_RANKS],
        gen: 3,
        pad: 0,
    };
    assert_eq!(s.to_bytes()[offset_of!(RegSlot, gen)], 3);
    let (f, size) = c_layout(compile::PROBE, "ProbeArgs");
    let rust = [
        ("src", offset_of!(ProbeArgs, src)),
        ("dst", offset_of!(ProbeArgs, dst)),
        ("bytes", offset_of!(ProbeArgs, bytes)),
        ("sink", offset_of!(ProbeArgs, sink)),
        ("nranks", offset_of!(ProbeArgs, nranks)),
        ("rank", offset_of!(ProbeArgs, rank)),
        ("peers", offset_of!(ProbeArgs, peers)),
        ("pad", offset_of!(ProbeArgs, pad)),
    ];
    let rust: Vec<(String, usize)> = rust.iter().map(|(n, o)| (n.to_string(), *o)).collect();
    assert_eq!(f, rust);
    assert_eq!(size, size_of::<ProbeArgs>());
    let (f, size) = c_layout(compile::CE_SUM, "CeSumArgs");
    let rust = [
        ("in", offset_of!(CeSumArgs, inputs)),
        ("out", offset_of!(CeSumArgs, out)),
        ("n", offset_of!(CeSumArgs, n)),
        ("count", offset_of!(CeSumArgs, count)),
        ("pad", offset_of!(CeSumArgs, pad)),
        ("status", offset_of!(CeSumArgs, status)),
        ("fault", offset_of!(CeSumArgs, fault)),
    ];
    let rust: Vec<(String, usize)> = rust.iter().map(|(n, o)| (n.to_string(), *o)).collect();
    assert_eq!(f, rust);
    assert_eq!(size, size_of::<CeSumArgs>());
    // The host reads `Signal::status` at SIGNAL_STATUS_OFFSET; the LL lines start after it all.
    let (f, size) = c_layout(compile::COMMON, "Signal");
    let status = f.iter().find(|(n, _)| n == "status").unwrap().1;
    assert_eq!(SIGNAL_STATUS_OFFSET, status);
    assert!(size <= SIGNAL_ALLOC, "Signal is {size} bytes");
    let d = defines();
    for want in ["-DMAX_BLOCKS=256", "-DMAX_RANKS=16", "-DTHREADS=512"] {
        assert!(d.iter().any(|x| x == want), "{d:?}");
    }
    // The sources define none of the shared constants themselves.
    for name in [
        "MAX_RANKS",
        "MAX_BLOCKS",
        "THREADS",
        "LL_OFFSET",
        "LL_LINE",
        "LL_THREADS",
    ] {
        assert!(
            !compile::COMMON.contains(&format!("#define {name} ")),
            "{name}"
        );
    }
}

/// Every allreduce kernel, flat (staged or registered) or island, ends in `fail_safe`
/// (common.cuh), after its work: where a wait of the group gave up, its output is NaN,
/// never a sum that looks right.
#[test]
fn every_allreduce_kernel_ends_failing_safe() {
    let split = |src: &'static str| src.split("extern \"C\" __global__").skip(1);
    let kernels: Vec<&str> = split(compile::ALLREDUCE)
        .chain(split(compile::ISLAND))
        .collect();
    assert_eq!(kernels.len(), 10 + 6);
    for k in kernels {
        let name = k
            .split("(const")
            .next()
            .unwrap()
            .rsplit(' ')
            .next()
            .unwrap();
        let body = &k[..k.find("\n  }").unwrap_or(k.len())];
        let safe = body.find("fail_safe<T>(a");
        // The first call taking the arguments: the kernel's work.
        let work = body.find(">(a);").unwrap();
        assert!(
            safe.is_some_and(|s| s > work),
            "{name} does not call fail_safe after its work"
        );
    }
}

#[test]
fn loopback_ranks_share_the_gpu() {
    // H200: 132 SMs, one 512-thread block each; 8 virtual ranks get 16 blocks each.
    assert_eq!(block_cap(132, 1, 8), 16);
    assert!(block_cap(132, 1, 8) * 8 <= 132);
    assert_eq!(block_cap(132, 4, 1), MAX_BLOCKS);
    assert_eq!(block_cap(10, 1, 16), 1);
}

/// The table names the program each kernel is in; the loader finds kernels by name in
/// every unit, so only this keeps the table's word true.
#[test]
fn each_kernel_is_defined_in_the_program_the_table_names() {
    for (b, k) in custom() {
        let src = program(k.source);
        let mut names = vec![format!(" {}_##suffix(", k.name)];
        if k.ll.is_some() {
            names.push(format!(" {}_ll_##suffix(", k.name));
        }
        for n in names {
            assert!(src.contains(&n), "{b}: no `{n}` in kernels/{}", k.source);
        }
    }
}

/// The same for the sums of the copy-engine backends, which the loader finds by the table's
/// name too.
#[test]
fn each_copy_sum_is_defined_in_the_program_the_table_names() {
    let sums: Vec<_> = TABLE
        .iter()
        .filter_map(|s| match s.executor {
            Executor::CopyEngine(sum) => Some((s.backend, sum)),
            Executor::Nccl | Executor::SmKernel => None,
        })
        .collect();
    assert!(!sums.is_empty());
    for (b, sum) in sums {
        let src = program(sum.source);
        let n = format!(" {}_##suffix(", sum.name);
        assert!(src.contains(&n), "{b}: no `{n}` in kernels/{}", sum.source);
    }
}

/// Each LL kernel refuses a message past the limit of its layout's size, as the table
/// states it ([`Ll::max_bytes`], which the host and the simulator read): the constant its
/// `ll_launch_ok` checks is that limit.
#[test]
fn each_ll_kernel_checks_the_tables_limit() {
    for (b, k) in custom() {
        let Some(ll) = k.ll else { continue };
        let src = program(k.source);
        let body = src
            .split_once(&format!(" {}_ll(const ArArgs& a)", k.name))
            .unwrap_or_else(|| panic!("{b}: no {}_ll in kernels/{}", k.name, k.source))
            .1;
        let call = body.split_once("ll_launch_ok(").unwrap().1;
        let limit = call.split(',').nth(2).unwrap().trim();
        let bytes = match limit {
            "LL1_MAX_BYTES" => LL1_MAX_BYTES,
            "LL2_MAX_BYTES" => LL2_MAX_BYTES,
            other => panic!("{b}: its LL kernel checks `{other}`"),
        };
        assert_eq!(bytes, ll.max_bytes(), "{b}: {limit}");
    }
}

/// Each LL kernel is declared for the threads per block the host launches it with
/// ([`ll_threads`]) and, one word per thread, takes its word and checks its grid by the same
/// count (the island two-shot spreads a word over threads: its own test below).
#[test]
fn each_ll_kernel_runs_the_threads_the_host_launches() {
    let mut checked = 0;
    for (b, k) in custom() {
        let Some(ll) = k.ll else { continue };
        let src = program(k.source);
        let want = match ll_threads(ll) {
            LL_THREADS => "LL_THREADS",
            LL1_THREADS => "LL1_THREADS",
            t => panic!("{b}: {t} threads is no shared constant"),
        };
        let bounds = format!("__launch_bounds__({want}) {}_ll_##suffix(", k.name);
        assert!(src.contains(&bounds), "{b}: no `{bounds}`");
        if ll == Ll::IslandShards {
            continue;
        }
        let body = src
            .split_once(&format!(" {}_ll(const ArArgs& a)", k.name))
            .unwrap()
            .1;
        let body = &body[..body.find("\n}\n").unwrap()];
        let call = body.split_once("ll_launch_ok(").unwrap().1;
        let args: Vec<&str> = call[..call.find(')').unwrap()]
            .split(',')
            .map(str::trim)
            .collect();
        assert_eq!(*args.get(5).unwrap_or(&"LL_THREADS"), want, "{b}");
        let word = format!("blockIdx.x * {want} + threadIdx.x");
        assert!(body.contains(&word), "{b}: no `{word}`");
        checked += 1;
    }
    assert_eq!(checked, 4);
}

/// one_stage_push_ll zeroes no line it read: its stale-line argument (allreduce.cu) needs each
/// line to be rewritten in every call of its block with the line's parity, so every thread
/// stores its lines, words past the message too, unconditionally (at the function's top level,
/// after only the launch check).
#[test]
fn one_stage_push_ll_rewrites_every_line_of_its_blocks() {
    let src = compile::ALLREDUCE;
    let body = src
        .split_once(" one_stage_push_ll(const ArArgs& a) {")
        .unwrap()
        .1;
    let body = &body[..body.find("\n}\n").unwrap()];
    assert!(!body.contains("ll_clear"));
    let before = &body[..body.find("ll_store(").unwrap()];
    let depth = |c| before.matches(c).count();
    assert_eq!(
        depth('{'),
        depth('}'),
        "its lines are stored under a condition"
    );
    let conditions: Vec<&str> = before.lines().filter(|l| l.contains("if (")).collect();
    assert_eq!(conditions.len(), 2, "{conditions:?}");
    assert!(conditions[0].contains("ll_launch_ok("));
    // The store's own: every peer but the rank itself.
    assert_eq!(conditions[1].trim(), "if (p < n && p != rank)");
}

#[test]
fn small_messages_use_one_block() {
    let g = |b, elems, dtype, cap| grid(b, elems, dtype, Ranks::flat(8), cap, false);
    assert_eq!(
        g(Backend::OneStagePull, 2048, Dtype::Bf16, 16),
        (1, THREADS)
    );
    assert_eq!(
        g(Backend::OneStagePull, 1 << 24, Dtype::Bf16, 16),
        (16, THREADS)
    );
    assert_eq!(g(Backend::TwoStagePush, 3, Dtype::Fp32, 16), (1, THREADS));
}

/// A registered form's small call runs blocks of SMALL_THREADS, four times as many as of
/// THREADS, up to SMALL_VECTORS vectors (32 KiB per rank of one-stage pull); past it, and in
/// the staged form, THREADS. Either way the blocks cover the widest part (the kernels stride
/// by blockDim) and stay within the cap loopback 8 leaves each rank on an H200.
#[test]
fn a_registered_small_call_spreads_over_more_blocks() {
    let pull = |bytes: u64, registered| {
        grid(
            Backend::OneStagePull,
            bytes / 2,
            Dtype::Bf16,
            Ranks::flat(8),
            33,
            registered,
        )
    };
    assert_eq!(SMALL_THREADS, 128);
    assert_eq!(pull(4 << 10, true), (2, SMALL_THREADS));
    assert_eq!(pull(4 << 10, false), (1, THREADS));
    assert_eq!(pull(16 << 10, true), (8, SMALL_THREADS));
    assert_eq!(pull(32 << 10, true), (16, SMALL_THREADS));
    assert_eq!(pull((32 << 10) + 16, true), (5, THREADS));
    assert_eq!(pull(64 << 10, true), (8, THREADS));
    assert_eq!(pull(64 << 20, true), (33, THREADS));
    for bytes in (16..=(256u64 << 10)).step_by(16 * 97) {
        for registered in [false, true] {
            let (blocks, threads) = pull(bytes, registered);
            let vectors = bytes / 16;
            assert!(
                blocks == 33 || blocks as u64 * threads as u64 >= vectors,
                "{bytes} B"
            );
            assert!(blocks <= block_cap(132, 2, 8), "{bytes} B");
        }
    }
    // Every registered form's kernel allows SMALL_THREADS (its bounds are THREADS).
    const { assert!(SMALL_THREADS <= THREADS && THREADS.is_multiple_of(SMALL_THREADS)) };
}

#[test]
fn ll_constants_match_the_kernels() {
    let d = defines();
    for want in [
        "-DLL_OFFSET=65536",
        "-DLL_LINE=16",
        "-DLL1_MAX_BYTES=32768",
        "-DLL2_MAX_BYTES=65536",
        "-DLL_THREADS=128",
        "-DLL1_THREADS=64",
    ] {
        assert!(d.iter().any(|x| x == want), "{d:?}");
    }
    // The Signal struct (flags, epochs, status, LL epochs) ends before the LL lines.
    const { assert!(SIGNAL_STATUS_OFFSET + 4 + 256 * 4 <= SIGNAL_ALLOC) };
    for b in [
        Backend::OneStagePush,
        Backend::TwoStagePull,
        Backend::TwoStagePush,
    ] {
        let d = Dtype::Bf16;
        let name = ll_kernel_name(b, d).unwrap();
        assert!(
            compile::ALLREDUCE.contains(&format!("{}_##suffix", name.trim_end_matches("_bf16")))
        );
    }
    assert_eq!(ll_kernel_name(Backend::OneStagePull, Dtype::Bf16), None);
}

#[test]
fn ll_grids_cover_one_word_per_thread() {
    // 4 KiB: 512 words, eight blocks of 64 in one-stage push; two-stage: a shard of 64 words.
    assert_eq!(
        ll_blocks(Backend::OneStagePush, 4096, Ranks::flat(8)),
        Some(8)
    );
    assert_eq!(
        ll_blocks(Backend::TwoStagePush, 4096, Ranks::flat(8)),
        Some(1)
    );
    assert_eq!(
        ll_blocks(Backend::OneStagePush, 32 << 10, Ranks::flat(8)),
        Some(64)
    );
    // One-stage push's 64-thread blocks get twice the cap of 128-thread ones, so its largest
    // LL grid fits beside 7 other loopback ranks on an H200 too; the other LL kernels' cap is
    // block_cap's.
    assert_eq!(ll_threads(Ll::Message), 64);
    assert!(64 <= ll_block_cap(132, 32, 8, ll_threads(Ll::Message)));
    assert_eq!(ll_block_cap(132, 32, 8, LL_THREADS), block_cap(132, 32, 8));
    assert_eq!(ll_block_cap(132, 1, 8, 64), block_cap(132, 1, 8));
    assert_eq!(
        ll_blocks(Backend::OneStagePush, (32 << 10) + 2, Ranks::flat(8)),
        None
    );
    assert_eq!(
        ll_blocks(Backend::TwoStagePull, 64 << 10, Ranks::flat(2)),
        Some(32)
    );
    assert_eq!(
        ll_blocks(Backend::TwoStagePull, 64 << 10, Ranks::flat(8)),
        Some(8)
    );
    // The largest LL grids still fit beside 7 other loopback ranks on an H200.
    assert!(32 <= block_cap(132, 2, 8));
    assert_eq!(
        ll_blocks(Backend::TwoStagePush, (64 << 10) + 2, Ranks::flat(8)),
        None
    );
    assert_eq!(ll_blocks(Backend::OneStagePull, 4096, Ranks::flat(8)), None);
    // The island one-shot: a line per word of the message, as one-stage push; the
    // two-shot: a line per word of an island shard (4 KiB in islands of 4: 128 words),
    // each word a thread at each of the 4 places, so 32 words per block.
    let two_fours = Ranks { n: 8, island: 4 };
    assert_eq!(ll_blocks(Backend::IslandOneShot, 4096, two_fours), Some(4));
    assert_eq!(
        ll_blocks(Backend::IslandOneShot, (32 << 10) + 2, two_fours),
        None
    );
    assert_eq!(ll_blocks(Backend::IslandTwoShot, 4096, two_fours), Some(4));
    assert_eq!(
        ll_blocks(Backend::IslandTwoShot, 32 << 10, two_fours),
        Some(32)
    );
    // Islands of 2: 256-word shards, 64 words per block; of 3: 171-word shards, 42 words
    // per block (two threads idle).
    let pairs = Ranks { n: 8, island: 2 };
    assert_eq!(ll_blocks(Backend::IslandTwoShot, 4096, pairs), Some(4));
    let threes = Ranks { n: 6, island: 3 };
    assert_eq!(ll_blocks(Backend::IslandTwoShot, 4096, threes), Some(5));
    assert_eq!(ll_blocks(Backend::IslandTwoShot, 2, two_fours), Some(1));
    assert!(32 <= block_cap(132, 2, 8));
    assert_eq!(
        ll_blocks(Backend::IslandTwoShot, (32 << 10) + 2, two_fours),
        None
    );
    // Tiny messages still exchange a (padded) word between every pair.
    assert_eq!(
        ll_blocks(Backend::TwoStagePush, 2, Ranks::flat(16)),
        Some(1)
    );
    assert_eq!(ll_shard(1, 16), 1);
    assert_eq!(ll_shard(8193, 8), 1025);
}

/// island.cu island_two_shot_ll: thread t of block b serves place t / per and shard word
/// b * per + t % per (per = LL_THREADS / m). The grid must give every (place, word) of the
/// shard one thread, and every block a word at every place: the lines' reuse argument
/// needs each block to exchange with every peer in every call.
#[test]
fn island_two_shot_ll_grid_gives_each_place_and_word_one_thread() {
    for m in 2..=8usize {
        let ranks = Ranks {
            n: 16 / m * m,
            island: m,
        };
        let per = LL_THREADS as u64 / m as u64;
        for bytes in (1..=LL1_MAX_BYTES)
            .step_by(61)
            .chain([8 * 1023, LL1_MAX_BYTES])
        {
            let sw = ll_shard(bytes.div_ceil(8), m);
            let blocks = ll_blocks(Backend::IslandTwoShot, bytes, ranks).unwrap() as u64;
            let mut seen = vec![0u32; m * sw as usize];
            for b in 0..blocks {
                let mut places = vec![false; m];
                for t in 0..LL_THREADS as u64 {
                    let (p, i) = ((t / per) as usize, b * per + t % per);
                    if p < m && i < sw {
                        seen[p * sw as usize + i as usize] += 1;
                        places[p] = true;
                    }
                }
                assert!(
                    places.iter().all(|x| *x),
                    "m={m} {bytes} B: block {b} idles"
                );
            }
            assert!(seen.iter().all(|c| *c == 1), "m={m} {bytes} B: {seen:?}");
        }
    }
}

#[test]
fn ll_lines_fit_the_signal_allocation() {
    // Written out from kernels/allreduce.cu's line addresses (LL_OFFSET + index * 16 bytes):
    // ll1: ((q * n + src) * LL1_LINES + j), q < 2, src < n, j < 4096 (32 KiB / 8): 2n x 4096
    // lines; ll2: (((stage * 2 + q) * n + src) * smax + i), smax = ceil(8192 / n): 4n x smax
    // lines; llp: ((q * n + s) * smax + i), q < 2, s < n, i < smax: 2n x smax lines.
    let signal = 64 << 10;
    for (n, one_push, two_push, two_pull) in [
        // n, 2n*4096, 4n*ceil(8192/n), 2n*ceil(8192/n) lines
        (2usize, 16384u64, 32768u64, 16384u64),
        (3, 24576, 32772, 16386),
        (8, 65536, 32768, 16384),
        (16, 131072, 32768, 16384),
    ] {
        assert_eq!(
            signal_bytes(Backend::OneStagePush, Ranks::flat(n)),
            signal + one_push * 16,
            "n={n}"
        );
        assert_eq!(
            signal_bytes(Backend::TwoStagePush, Ranks::flat(n)),
            signal + two_push * 16,
            "n={n}"
        );
        assert_eq!(
            signal_bytes(Backend::TwoStagePull, Ranks::flat(n)),
            signal + two_pull * 16,
            "n={n}"
        );
        assert_eq!(
            signal_bytes(Backend::OneStagePull, Ranks::flat(n)),
            signal,
            "n={n}"
        );
        // island.cu lli: (((stage * 2 + q) * (n + 1) + s) * len + j), q < 2, s <= n; the
        // one-shot: one stage, len 4096 (32 KiB / 8); the two-shot: two stages, len
        // ceil(4096 / m) for islands of m.
        let n1 = n as u64 + 1;
        assert_eq!(
            signal_bytes(Backend::IslandOneShot, Ranks::flat(n)),
            signal + 2 * n1 * 4096 * 16,
            "n={n}"
        );
        assert_eq!(
            signal_bytes(Backend::IslandTwoShot, Ranks { n, island: 2 }),
            signal + 4 * n1 * 2048 * 16,
            "n={n}"
        );
    }
    // K = 8: 1 MiB of lines for one-stage push, 512 KiB for two-stage push.
    assert_eq!(
        signal_bytes(Backend::OneStagePush, Ranks::flat(8)),
        (64 << 10) + (1 << 20)
    );
    assert_eq!(
        signal_bytes(Backend::TwoStagePush, Ranks::flat(8)),
        (64 << 10) + (512 << 10)
    );
    // 256 KiB for two-stage pull, whose reduce-scatter travels in lines too.
    assert_eq!(
        signal_bytes(Backend::TwoStagePull, Ranks::flat(8)),
        (64 << 10) + (256 << 10)
    );
}

/// The memory model counts what this fabric allocates for each rank's signal, for every
/// backend with a kernel: the flags and the table's lines ([`Ll::lines`]), 16 bytes each.
#[test]
fn the_model_counts_the_signal_allocation() {
    for (b, _) in custom() {
        for ranks in [
            Ranks::flat(2),
            Ranks::flat(3),
            Ranks::flat(4),
            Ranks { n: 4, island: 2 },
            Ranks::flat(8),
            Ranks { n: 8, island: 4 },
            Ranks { n: 8, island: 2 },
            Ranks::flat(16),
        ] {
            let signal = signal_bytes(b, ranks);
            assert_eq!(
                signal - SIGNAL_ALLOC as u64,
                b.ll_lines(ranks) * 16,
                "{b} {ranks:?}"
            );
            // With buffers for no message, the model is the signal and the graph table.
            assert_eq!(
                memory::modelled(b, ranks, 0, 2),
                signal + memory::GRAPH_TABLE_BYTES,
                "{b} {ranks:?}"
            );
        }
    }
}

#[test]
fn slots_hold_a_shard_and_its_tail() {
    assert_eq!(
        slot_bytes(Backend::TwoStagePush, 1 << 20, Ranks::flat(8)) % 256,
        0
    );
    assert!(
        slot_bytes(Backend::TwoStagePush, 1000, Ranks::flat(3))
            >= (1000 / 16u64).div_ceil(3) * 16 + 16
    );
    assert!(slot_bytes(Backend::OneStagePush, 1001, Ranks::flat(8)) >= 1001);
}

/// Every flat allreduce kernel (allreduce.cu) waits for the previous call (pdl_wait) before it
/// reads what that call wrote (its epoch, in RANK_SETUP): in the kernel, or first in its work,
/// where only a registered slot's load may come before it (reg_load_then_wait). A kernel that
/// read its epoch before the wait could take the previous call's flag and pass a barrier early.
#[test]
fn every_allreduce_kernel_waits_for_the_previous_call_first() {
    let src = compile::ALLREDUCE;
    let kernels: Vec<&str> = src.split("extern \"C\" __global__").skip(1).collect();
    assert_eq!(kernels.len(), 10);
    for k in kernels {
        let body = &k[..k.find("\n  }").unwrap_or(k.len())];
        let name = body
            .split("(const")
            .next()
            .unwrap()
            .rsplit(' ')
            .next()
            .unwrap();
        let work = body.find(">(a);").unwrap();
        if body[..work].contains("pdl_wait();") {
            continue;
        }
        // The device function it calls: `name<T...>(a);` defined as `name(const ArArgs& a) {`.
        let call = body[..work].lines().last().unwrap();
        let f = call.split('<').next().unwrap().rsplit(' ').next().unwrap();
        let def = src
            .find(&format!(" {f}(const ArArgs& a) {{"))
            .unwrap_or_else(|| panic!("{name}: no definition of {f}"));
        let fbody = &src[def..][..src[def..].find("\n}\n").unwrap()];
        let wait = ["reg_load_then_wait<REG>(a, ", "pdl_wait();"]
            .iter()
            .filter_map(|w| fbody.find(w))
            .min();
        let first_read = fbody
            .find("RANK_SETUP")
            .or_else(|| fbody.find("Signal* self"));
        assert!(
            wait.is_some_and(|w| first_read.is_some_and(|r| w < r)),
            "{name} reads what the previous call wrote before pdl_wait"
        );
        // Nor reads a signal (its epoch, flags or lines) any other way before it.
        let before = &fbody[..wait.unwrap()];
        assert!(
            !before.contains("sig[") && !before.contains("epoch"),
            "{name} reads a signal before pdl_wait"
        );
    }
}

/// A registered form's replay whose slot did not match (before registration, or after the
/// registrations were dropped) must reach no peer's tensor: the slot then holds addresses of
/// nothing mapped, or of another capture's tensors. In every registered kernel each use of the
/// peers' addresses the slot gave (through the accessors that read them: `ins[p]`, `outs[p]`)
/// lies inside a block of `if (!REG || ok) {` or `if (sends...) {`, or on a line guarded by
/// `sends` (`!REG || ok`), and the kernel ends in reg_missed when the slot did not match.
#[test]
fn a_registered_replay_reaches_peers_only_once_its_slot_matched() {
    let mut checked = Vec::new();
    for src in [compile::ALLREDUCE, compile::ISLAND] {
        for (at, _) in src.match_indices("template <typename T, bool REG>") {
            let body = &src[at..][..src[at..].find("\n}\n").unwrap()];
            let name = body.lines().nth(1).unwrap();
            assert!(
                body.contains("reg_load_then_wait<REG>(a, ")
                    || body.contains("reg_load_both(a, rank, ")
                    || body.contains("reg_load(a, rank, "),
                "{name} does not load its slot"
            );
            // The accessors that read the peers' addresses: `auto F = [&](int p) {... X[p] ...}`.
            let defs: Vec<&str> = body
                .lines()
                .filter(|l| l.contains("auto ") && (l.contains("ins[p]") || l.contains("outs[p]")))
                .collect();
            assert!(
                !defs.is_empty(),
                "{name}: no accessor of the slot's addresses"
            );
            let accessors: Vec<String> = defs
                .iter()
                .map(|d| {
                    let f = d.trim().trim_start_matches("auto ").split(' ').next();
                    format!("{}(", f.unwrap())
                })
                .collect();
            let (mut depth, mut guarded_at) = (0i32, None);
            for line in body.lines() {
                let t = line.trim();
                if guarded_at.is_none()
                    && t.ends_with('{')
                    && (t.starts_with("if (!REG || ok)") || t.starts_with("if (sends"))
                {
                    guarded_at = Some(depth);
                }
                let uses =
                    accessors.iter().any(|a| line.contains(a.as_str())) && !defs.contains(&line);
                assert!(
                    !uses || guarded_at.is_some() || line.contains("sends"),
                    "{name} reaches a peer's tensor unguarded: {line}"
                );
                depth += line.matches('{').count() as i32 - line.matches('}').count() as i32;
                if guarded_at.is_some_and(|d| depth <= d) {
                    guarded_at = None;
                }
            }
            assert!(
                body.contains("if (!ok) reg_missed<T>(out, a.n, a.missed);"),
                "{name} does not leave its output NaN when its slot did not match"
            );
            checked.push(name.to_string());
        }
    }
    assert_eq!(checked.len(), 5, "{checked:?}");
}

/// The tune's registered slots (setup.rs, registered_slot: every rank's user inputs, then its
/// outputs) must be where each registered kernel reads: inputs first for the pull kernels,
/// the island one-shot and the island two-shot (which reads the outputs in the slot after:
/// island.cu, reg_load_both), the outputs for two-stage push.
#[test]
fn each_registered_kernel_is_given_the_tune_slot_it_reads() {
    use crate::fabric::cuda::setup::registered_slot_offset;
    for b in Backend::ALL.into_iter().filter(|b| b.has_registered_form()) {
        let want = match registered_tensors(b).unwrap() {
            RegTensors::Input | RegTensors::Both => 0,
            RegTensors::Output => RegSlot::BYTES as u64,
        };
        assert_eq!(registered_slot_offset(b), want, "{b}");
    }
    assert_eq!(registered_slot_offset(Backend::IslandTwoShot), 0);
    assert!(compile::ISLAND.contains("s[1].peer[t]"));
}

/// A registered island two-shot call, as the op builds it: its two tensors recorded in the
/// book (inputs' slot, then outputs'), the call's arguments naming the first slot, the
/// capture's generation and the host word; the same call planned staged (eager, or its LL
/// form) names no slot, so it never reads one.
#[test]
fn a_registered_island_call_names_its_first_slot_and_a_staged_one_none() {
    use crate::fabric::cuda::registry::Book;
    let mut book = Book::default();
    book.record(&[0x1000], 64).unwrap();
    let tensors = registered_tensors(Backend::IslandTwoShot)
        .unwrap()
        .of(0xa000, 0xc000);
    let (slot, gen) = book.record(&tensors, 1 << 20).unwrap();
    assert_eq!((slot, gen), (1, 1));
    let table = 0x7000_0000u64;
    let work = Work {
        backend: Backend::IslandTwoShot,
        dtype: Dtype::Bf16,
        elems: 1 << 19,
        ranks: Ranks { n: 8, island: 4 },
        base: 3,
        count: 1,
        on_gpu: 8,
        registered: Some(Registered {
            slot: table + (slot * RegSlot::BYTES) as u64,
            gen,
            missed: 0xdead_0000,
        }),
    };
    let args = ArArgs {
        nranks: 8,
        island: 4,
        ..ArArgs::default()
    };
    let a = call_args(&args, &work, true);
    assert_eq!(a.reg, table + RegSlot::BYTES as u64);
    assert_eq!(
        (a.reg_gen, a.missed, a.n, a.rank_base),
        (1, 0xdead_0000, 1 << 19, 3)
    );
    // The inputs' slot, then the outputs' (island.cu reads s[0], s[1] from a.reg).
    let peers = vec![vec![0, 0x10, 0x11]; 8];
    let slots = book.fill(3, &peers).unwrap();
    assert_eq!((slots[1].peer[3], slots[2].peer[3]), (0xa000, 0xc000));
    assert_eq!((slots[1].peer[0], slots[2].peer[0]), (0x10, 0x11));
    let staged = call_args(&args, &work, false);
    assert_eq!((staged.reg, staged.reg_gen, staged.missed), (0, 0, 0));
}

/// The source of the program kernels/`file`, as NVRTC compiles it.
fn program(file: &str) -> &'static str {
    (compile::PROGRAMS.iter())
        .find(|(name, _)| *name == file)
        .unwrap_or_else(|| panic!("kernels/{file} is not a program"))
        .1
}

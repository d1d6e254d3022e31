//! The documentation's figures cannot drift: every simulated figure in README.md, docs/ and
//! profiles/examples/ sits in a block that names the command printing it, and this test reruns
//! each command through the built binary and fails when its output differs from the block.
//!
//! A block is a fenced `console` block right after a marker line:
//!
//! ```text
//! <!-- artune:run [quiet] [fails] [para="A|B"] [grep="X|Y"] [drop="Z"] [head=N] -->
//! ```
//!
//! Lines starting with `$ ` are commands (a trailing ` \` continues one); everything else is the
//! output the test regenerates. A command is `artune ARGS`, `cargo run --release -- ARGS` (both
//! run the binary under test), or `mkdir DIR`; `NAME=VALUE` words before it set the
//! environment. Commands of one document run in order in one scratch directory, so a later block
//! can read what an earlier one wrote. Stdout is shown, then stderr, then `(exit N)` when the
//! status is not 0. Options cut the output: `para` keeps the blank-line-separated paragraphs
//! whose first line starts with one of the texts, `grep` keeps lines containing one, `drop`
//! removes lines containing one, `head` keeps the first N lines; a cut shows as `...`; `quiet`
//! shows no output. A command must succeed unless the block says `fails`, so a command that
//! stopped working is an error, never a figure. Lines over 110 characters are wrapped,
//! times of day and wall-clock seconds are masked.
//!
//! `<!-- artune:keep FILE -->` makes a file the document's commands write part of the
//! document: it must equal the committed FILE beside the document (for profiles, apart from the
//! creation time, the host name and the tuning time).
//!
//! `<!-- artune:printed-by FILE [FILE...] -->` before a fenced block quotes lines that code
//! prints where no command here can run it (an engine plugin, the NCCL plugin inside NCCL):
//! each line of the block must be a string literal of one of the FILEs (paths from the
//! repository root), or of a log kept from hardware, with `…` where the line varies; a line
//! joined from parts with "; " may match part by part. So a changed message shows up here.
//!
//! After a change of output, regenerate every block and kept file in place with
//! `ARTUNE_BLESS=1 cargo test --test docs` and review the diff.

mod common;

use std::path::{Path, PathBuf};

use common::BIN;
const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const WIDTH: usize = 110;
const RUN: &str = "<!-- artune:run";
const KEEP: &str = "<!-- artune:keep";
const PRINTED_BY: &str = "<!-- artune:printed-by";

/// The documents this test owns the figures of.
fn documents() -> Vec<PathBuf> {
    let root = Path::new(ROOT);
    let mut docs = vec![
        root.join("README.md"),
        root.join("profiles/examples/README.md"),
    ];
    if let Ok(dir) = std::fs::read_dir(root.join("docs")) {
        let mut pages: Vec<PathBuf> = dir
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "md"))
            .collect();
        pages.sort();
        docs.extend(pages);
    }
    docs
}

#[derive(Default)]
struct Options {
    quiet: bool,
    fails: bool,
    para: Vec<String>,
    grep: Vec<String>,
    drop: Vec<String>,
    head: Option<usize>,
}

fn parse_options(marker: &str) -> Result<Options, String> {
    let body = marker
        .trim()
        .strip_prefix(RUN)
        .and_then(|s| s.strip_suffix("-->"))
        .ok_or_else(|| format!("malformed marker `{marker}`"))?;
    let mut o = Options::default();
    for word in words(body)? {
        let (key, value) = word.split_once('=').unwrap_or((&word, ""));
        let list = || value.split('|').map(str::to_owned).collect::<Vec<_>>();
        match key {
            "quiet" => o.quiet = true,
            "fails" => o.fails = true,
            "para" => o.para = list(),
            "grep" => o.grep = list(),
            "drop" => o.drop = list(),
            "head" => o.head = Some(value.parse().map_err(|_| format!("head={value}"))?),
            _ => return Err(format!("unknown option `{word}` in `{marker}`")),
        }
    }
    Ok(o)
}

/// Splits a command line as a POSIX shell would for plain words, '…' and "…" quoting.
fn words(line: &str) -> Result<Vec<String>, String> {
    let (mut out, mut cur, mut open) = (Vec::new(), None::<String>, None::<char>);
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match (open, c) {
            (Some(q), c) if c == q => open = None,
            (Some('"'), '\\') => cur.get_or_insert_with(String::new).extend(chars.next()),
            (Some(_), c) => cur.get_or_insert_with(String::new).push(c),
            (None, '\'' | '"') => {
                open = Some(c);
                cur.get_or_insert_with(String::new);
            }
            (None, '\\') => cur.get_or_insert_with(String::new).extend(chars.next()),
            (None, c) if c.is_whitespace() => out.extend(cur.take()),
            (None, c) => cur.get_or_insert_with(String::new).push(c),
        }
    }
    if open.is_some() {
        return Err(format!("unclosed quote in `{line}`"));
    }
    out.extend(cur);
    Ok(out)
}

/// The binary under test installed as the docs describe (GUIDE, "The NCCL plugin library"):
/// PREFIX/usr/local/bin/artune beside PREFIX/usr/local/lib/libartune.so, linked from this
/// build, so what the exports name for NCCL reads as on an installed machine once PREFIX is
/// masked. Returns (PREFIX, the binary).
fn installed() -> &'static (PathBuf, PathBuf) {
    static AT: std::sync::OnceLock<(PathBuf, PathBuf)> = std::sync::OnceLock::new();
    AT.get_or_init(|| {
        let prefix = Path::new(env!("CARGO_TARGET_TMPDIR")).join("docs-install");
        let _ = std::fs::remove_dir_all(&prefix);
        let bin = prefix.join("usr/local/bin/artune");
        let lib = prefix.join("usr/local/lib/libartune.so");
        let place = |from: &Path, to: &Path| {
            std::fs::create_dir_all(to.parent().unwrap()).unwrap();
            let _ = std::fs::remove_file(to);
            if std::fs::hard_link(from, to).is_err() {
                std::fs::copy(from, to).unwrap();
            }
        };
        place(Path::new(BIN), &bin);
        // cargo test leaves the cdylib in deps/ (cargo build also beside the binary).
        let built = Path::new(BIN).parent().unwrap();
        if let Some(l) = [built.join("deps/libartune.so"), built.join("libartune.so")]
            .into_iter()
            .find(|l| l.is_file())
        {
            place(&l, &lib);
        }
        (prefix, bin)
    })
}

/// Runs one command line in `dir` and returns what a reader of the block sees.
fn run(dir: &Path, line: &str) -> Result<(String, i32), String> {
    let mut argv = words(line)?;
    let mut env = Vec::new();
    while argv
        .first()
        .is_some_and(|w| w.contains('=') && !w.starts_with('-'))
    {
        let w = argv.remove(0);
        let (k, v) = w.split_once('=').unwrap();
        env.push((k.to_owned(), v.to_owned()));
    }
    let args: Vec<String> = match argv.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["mkdir", d] => {
            std::fs::create_dir_all(dir.join(d)).map_err(|e| format!("mkdir {d}: {e}"))?;
            return Ok((String::new(), 0));
        }
        ["artune", ..] => argv[1..].to_vec(),
        ["cargo", "run", "--release", "--", ..] => argv[4..].to_vec(),
        _ => return Err(format!("`{line}` is not an artune command")),
    };
    let (prefix, bin) = installed();
    let mut cmd = common::dies_with_test(bin);
    cmd.args(&args).current_dir(dir);
    // What the reader's environment might set must not change the figures.
    for (k, _) in std::env::vars() {
        let p = ["NCCL_", "ARTUNE_", "CUDA_", "SLURM", "RUST_LOG"];
        if p.iter().any(|p| k.starts_with(p)) || k == "NODE_NAME" {
            cmd.env_remove(k);
        }
    }
    cmd.envs(env).env("ARTUNE_CACHE_DIR", "");
    let o = cmd.output().map_err(|e| format!("cannot run {BIN}: {e}"))?;
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    if err.contains("panicked") {
        return Err(format!("`{line}` panicked: {err}"));
    }
    let code = o.status.code().unwrap_or(-1);
    let mut text = out.into_owned();
    text.push_str(&err);
    // The scratch directory's absolute path differs per run; a reader's is their own.
    for d in [dir.to_path_buf(), dir.canonicalize().unwrap_or_default()] {
        let d = format!("{}/", d.display());
        if d.len() > 1 {
            text = text.replace(&d, "");
        }
    }
    for p in [prefix.clone(), prefix.canonicalize().unwrap_or_default()] {
        let p = p.display().to_string();
        if p.len() > 1 {
            text = text.replace(&p, "");
        }
    }
    if code != 0 {
        text.push_str(&format!("(exit {code})\n"));
    }
    Ok((text, code))
}

/// Applies the block's cuts, then masks and wraps every line.
fn shape(text: &str, o: &Options) -> Vec<String> {
    let contains = |l: &str, any: &[String]| any.iter().any(|t| l.contains(t.as_str()));
    let lines: Vec<&str> = text.lines().collect();
    // Some(line) is kept, None a cut.
    let mut kept: Vec<Option<&str>> = if o.para.is_empty() {
        lines.iter().map(|l| Some(*l)).collect()
    } else {
        let mut v = Vec::new();
        for para in lines.split(|l| l.trim().is_empty()) {
            let first = para.first().map_or("", |l| l.trim_start());
            if para.is_empty() {
                continue;
            }
            if o.para.iter().any(|p| first.starts_with(p.as_str())) {
                if v.last().is_some_and(Option::is_some) {
                    v.push(Some(""));
                }
                v.extend(para.iter().map(|l| Some(*l)));
            } else {
                v.push(None);
            }
        }
        v
    };
    if !o.grep.is_empty() {
        kept.retain(|l| l.is_some_and(|l| contains(l, &o.grep)));
    }
    if !o.drop.is_empty() {
        for l in kept.iter_mut() {
            if l.is_some_and(|t| contains(t, &o.drop)) {
                *l = None;
            }
        }
    }
    if let Some(n) = o.head {
        if kept.len() > n {
            kept.truncate(n);
            kept.push(None);
        }
    }
    let mut out: Vec<String> = Vec::new();
    for l in kept {
        match l {
            Some(l) => out.extend(wrap(&mask(l))),
            None if out.last().is_some_and(|l| l == "...") => {}
            None => out.push("...".into()),
        }
    }
    out
}

/// Hides what changes from run to run: the time of day and wall-clock seconds.
fn mask(line: &str) -> String {
    let b = line.as_bytes();
    let mut out = String::new();
    let mut i = 0;
    while i < b.len() {
        // 2026-12-01T15:05:59Z
        if b.len() - i >= 20
            && b[i..i + 4].iter().all(u8::is_ascii_digit)
            && b[i + 4] == b'-'
            && b[i + 10] == b'T'
            && b[i + 19] == b'Z'
        {
            out.push_str("[time]");
            i += 20;
            continue;
        }
        // "1.40 s" (seconds of wall clock: simulated figures are in us and ms)
        let start = i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'.');
        if start && b[i].is_ascii_digit() {
            let mut j = i;
            while j < b.len() && (b[j].is_ascii_digit() || b[j] == b'.') {
                j += 1;
            }
            let secs = line[j..].starts_with(" s")
                && line[j + 2..]
                    .chars()
                    .next()
                    .is_none_or(|c| !c.is_alphanumeric());
            if secs && line[i..j].contains('.') {
                out.push_str("[..]");
                i = j;
                continue;
            }
            out.push_str(&line[i..j]);
            i = j;
            continue;
        }
        let c = line[i..].chars().next().unwrap();
        out.push(c);
        i += c.len_utf8();
    }
    out.trim_end().to_owned()
}

/// Breaks a line longer than the docs' width at spaces, continuing indented by four more.
fn wrap(line: &str) -> Vec<String> {
    let indent = line.len() - line.trim_start().len();
    let pad = " ".repeat(indent + 4);
    let mut out = Vec::new();
    let mut rest = line.to_owned();
    while rest.chars().count() > WIDTH {
        let cut: usize = rest.char_indices().nth(WIDTH).map(|(i, _)| i).unwrap();
        // At a space, else after a comma (JSON), else anywhere.
        let at = rest[..cut]
            .rfind(' ')
            .or_else(|| rest[..cut].rfind(',').map(|c| c + 1))
            .filter(|&at| at > pad.len())
            .unwrap_or(cut);
        out.push(rest[..at].trim_end().to_owned());
        rest = format!("{pad}{}", rest[at..].trim_start());
    }
    out.push(rest);
    out
}

/// One document's blocks rerun; returns the document as its commands print it now.
fn regenerate(doc: &Path, dir: &Path) -> Result<String, String> {
    let text = std::fs::read_to_string(doc).map_err(|e| e.to_string())?;
    if !text.contains(RUN) {
        return Ok(text);
    }
    let lines: Vec<&str> = text.lines().collect();
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        out.push(lines[i].to_owned());
        if !lines[i].trim_start().starts_with(RUN) {
            i += 1;
            continue;
        }
        let at = format!("{}:{}", doc.display(), i + 1);
        let opts = parse_options(lines[i]).map_err(|e| format!("{at}: {e}"))?;
        let fence = lines.get(i + 1).copied().unwrap_or("");
        if !fence.starts_with("```") {
            return Err(format!("{at}: the marker must be followed by a ``` block"));
        }
        out.push(fence.to_owned());
        let mut j = i + 2;
        let mut body = Vec::new();
        while j < lines.len() && !lines[j].starts_with("```") {
            body.push(lines[j]);
            j += 1;
        }
        if j == lines.len() {
            return Err(format!("{at}: the block is not closed"));
        }
        let mut k = 0;
        let mut commands = 0;
        while k < body.len() {
            let Some(first) = body[k].strip_prefix("$ ") else {
                k += 1;
                continue;
            };
            commands += 1;
            let mut shown = vec![body[k].to_owned()];
            let mut line = first.to_owned();
            while line.ends_with('\\') && k + 1 < body.len() {
                line.pop();
                k += 1;
                shown.push(body[k].to_owned());
                line.push(' ');
                line.push_str(body[k].trim());
            }
            k += 1;
            let (printed, code) = run(dir, &line).map_err(|e| format!("{at}: {e}"))?;
            if code != 0 && (opts.quiet || !opts.fails) {
                return Err(format!("{at}: `{line}` exited {code}: {printed}"));
            }
            out.extend(shown);
            if !opts.quiet {
                out.extend(shape(&printed, &opts));
            }
        }
        if commands == 0 {
            return Err(format!("{at}: the block has no `$ ` command"));
        }
        out.push(lines[j].to_owned());
        i = j + 1;
    }
    let mut s = out.join("\n");
    s.push('\n');
    Ok(s)
}

/// A profile without what differs between two runs of the same command.
fn steady(json: &str) -> Option<serde_json::Value> {
    let mut v: serde_json::Value = serde_json::from_str(json).ok()?;
    let o = v.as_object_mut()?;
    o.insert("created".into(), serde_json::Value::Null);
    if let Some(node) = o.get_mut("node").and_then(|n| n.as_object_mut()) {
        node.insert("hostname".into(), serde_json::Value::Null);
    }
    if let Some(s) = o.get_mut("settings").and_then(|s| s.as_object_mut()) {
        s.insert("tuning_seconds".into(), serde_json::Value::Null);
        s.insert("phases".into(), serde_json::Value::Null);
    }
    Some(v)
}

/// Compares (or, blessing, rewrites) the files a document keeps; returns those that drifted.
fn kept_files(doc: &Path, dir: &Path, bless: bool) -> Result<Vec<String>, String> {
    let text = std::fs::read_to_string(doc).map_err(|e| e.to_string())?;
    let mut drift = Vec::new();
    for line in text.lines().filter(|l| l.trim_start().starts_with(KEEP)) {
        let name = line
            .trim()
            .trim_start_matches(KEEP)
            .trim_end_matches("-->")
            .trim();
        let made = std::fs::read_to_string(dir.join(name))
            .map_err(|e| format!("{}: no command wrote {name}: {e}", doc.display()))?;
        let committed = doc.with_file_name(name);
        let old = std::fs::read_to_string(&committed).unwrap_or_default();
        let same = match name.ends_with(".json") {
            true => steady(&made).is_some() && steady(&made) == steady(&old),
            false => made == old,
        };
        if same {
            continue;
        }
        if bless {
            std::fs::write(&committed, made).map_err(|e| e.to_string())?;
        } else {
            drift.push(format!(
                "{} differs from what its commands write",
                committed.display()
            ));
        }
    }
    Ok(drift)
}

/// The string literals of a source file (Rust or Python), with adjacent ones joined (Python
/// joins them, and both continue a line with a backslash), each as the parts between its
/// format placeholders (`{…}`, `%s`, `%d`, ...). A log has none: `check_printed_by` matches
/// its lines itself.
fn literals(path: &Path) -> Vec<Vec<String>> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let is_code = path.extension().is_some_and(|x| x == "rs" || x == "py");
    if !is_code {
        return Vec::new();
    }
    let python = path.extension().is_some_and(|x| x == "py");
    let b: Vec<char> = text.chars().collect();
    // (start, end, contents) of each literal.
    let mut found: Vec<(usize, usize, String)> = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == '#' && python || (c == '/' && b.get(i + 1) == Some(&'/')) {
            while i < b.len() && b[i] != '\n' {
                i += 1;
            }
            continue;
        }
        if c == '\'' && !python {
            i += 1;
            continue;
        }
        if c != '"' && c != '\'' {
            i += 1;
            continue;
        }
        let start = i;
        let mut s = String::new();
        i += 1;
        while i < b.len() && b[i] != c {
            if b[i] == '\\' && i + 1 < b.len() {
                match b[i + 1] {
                    '\n' => {
                        i += 2;
                        while i < b.len() && b[i].is_whitespace() {
                            i += 1;
                        }
                        continue;
                    }
                    'n' => s.push('\n'),
                    other => s.push(other),
                }
                i += 2;
                continue;
            }
            s.push(b[i]);
            i += 1;
        }
        found.push((start, i, s));
        i += 1;
    }
    let mut joined: Vec<String> = Vec::new();
    let mut last_end = None;
    for (start, end, s) in found {
        let gap: String =
            last_end.map_or(String::new(), |e: usize| b[e + 1..start].iter().collect());
        let adjacent = last_end.is_some()
            && gap.trim_end_matches(['f', 'r', 'F', 'R']).trim().is_empty()
            && (python || gap.is_empty());
        match (adjacent, joined.last_mut()) {
            (true, Some(prev)) => prev.push_str(&s),
            _ => joined.push(s),
        }
        last_end = Some(end);
    }
    joined.iter().map(|l| format_parts(l)).collect()
}

/// A format string's fixed parts, split where `{…}` or a `%` conversion stands.
fn format_parts(l: &str) -> Vec<String> {
    let mut parts = vec![String::new()];
    let c: Vec<char> = l.chars().collect();
    let mut i = 0;
    while i < c.len() {
        match (c[i], c.get(i + 1)) {
            ('{', Some('{')) | ('}', Some('}')) | ('%', Some('%')) => {
                parts.last_mut().unwrap().push(c[i]);
                i += 2;
            }
            ('{', _) => {
                while i < c.len() && c[i] != '}' {
                    i += 1;
                }
                parts.push(String::new());
                i += 1;
            }
            ('%', Some(n)) if n.is_ascii_alphanumeric() || *n == '.' => {
                i += 1;
                while i < c.len() && !c[i].is_ascii_alphabetic() {
                    i += 1;
                }
                parts.push(String::new());
                i += 1;
            }
            (ch, _) => {
                parts.last_mut().unwrap().push(ch);
                i += 1;
            }
        }
    }
    parts
}

/// Whether `line` (`…` where it varies) is what the literal with `parts` prints: the parts in
/// order, and between them what a placeholder stands for: anything but "; ", which joins the
/// parts of a composed line (each part is then checked on its own).
fn prints(parts: &[String], line: &str) -> bool {
    fn rest(parts: &[String], line: &str, first: bool) -> bool {
        let Some((p, more)) = parts.split_first() else {
            return line.is_empty();
        };
        if first {
            return line.starts_with(p.as_str()) && rest(more, &line[p.len()..], false);
        }
        if more.is_empty() {
            // `ends_with` first: only then is the cut on a character boundary.
            return line.ends_with(p.as_str()) && !line[..line.len() - p.len()].contains("; ");
        }
        line.match_indices(p.as_str())
            .filter(|(at, _)| !line[..*at].contains("; "))
            .any(|(at, _)| rest(more, &line[at + p.len()..], false))
    }
    if parts.len() == 1 {
        return parts[0] == line;
    }
    rest(parts, line, true)
}

/// Checks a `printed-by` block: every line printed by a literal of the files (see `literals`).
fn check_printed_by(doc: &Path, marker: &str, block: &[&str]) -> Vec<String> {
    let files: Vec<&str> = marker
        .trim()
        .trim_start_matches(PRINTED_BY)
        .trim_end_matches("-->")
        .split_whitespace()
        .collect();
    let all: Vec<Vec<String>> = files
        .iter()
        .flat_map(|f| literals(&Path::new(ROOT).join(f)))
        .collect();
    let trim = |s: &str| {
        s.trim_matches(|c: char| c == ';' || c.is_whitespace())
            .to_string()
    };
    // Literals also as their "; "-joined parts, for lines joined from parts.
    let pieces: Vec<Vec<String>> = all
        .iter()
        .flat_map(|parts| {
            let whole = parts.join("\u{1}");
            whole
                .split("; ")
                .map(|seg| {
                    seg.split('\u{1}')
                        .map(|p| p.to_string())
                        .collect::<Vec<_>>()
                })
                .collect::<Vec<_>>()
        })
        .map(|parts| {
            let n = parts.len();
            parts
                .into_iter()
                .enumerate()
                .map(|(i, p)| match (i, n) {
                    (0, 1) => trim(&p),
                    (0, _) => p
                        .trim_start_matches(|c: char| c == ';' || c.is_whitespace())
                        .to_string(),
                    (i, n) if i == n - 1 => p
                        .trim_end_matches(|c: char| c == ';' || c.is_whitespace())
                        .to_string(),
                    _ => p,
                })
                .collect()
        })
        .collect();
    // A kept log is matched the other way round: the quoted line's `…` stand for what varies
    // in the log's lines.
    let logs: Vec<String> = files
        .iter()
        .map(|f| Path::new(ROOT).join(f))
        .filter(|p| !p.extension().is_some_and(|x| x == "rs" || x == "py"))
        .flat_map(|p| {
            std::fs::read_to_string(p)
                .unwrap_or_default()
                .lines()
                .map(String::from)
                .collect::<Vec<_>>()
        })
        .collect();
    // A literal that is all placeholder ("%s", "{msg}") would print anything: it says nothing.
    let says = |parts: &&Vec<String>| parts.concat().trim().len() >= 4;
    let all: Vec<&Vec<String>> = all.iter().filter(says).collect();
    let pieces: Vec<&Vec<String>> = pieces.iter().collect();
    let mut bad = Vec::new();
    for line in block.iter().map(|l| l.trim()).filter(|l| !l.is_empty()) {
        let quoted: Vec<String> = line.split('…').map(String::from).collect();
        let logged = || logs.iter().any(|l| prints(&quoted, l));
        let whole = all.iter().any(|parts| prints(parts, line)) || logged();
        // Part by part, a third of a part at least must be the literal's own text: a placeholder
        // stands for a value, not for most of a sentence (short parts like `graph: …` excepted).
        let fixed = |s: &str| s.replace('…', "").trim().len();
        let by_parts = || {
            line.split("; ").all(|seg| {
                let seg = seg.trim();
                pieces.iter().any(|p| {
                    (fixed(&p.concat()) * 3 >= fixed(seg) || fixed(seg) <= 8) && prints(p, seg)
                })
            })
        };
        if !whole && !by_parts() {
            bad.push(format!(
                "{}: `{line}` is printed by nothing in {}",
                doc.display(),
                files.join(", ")
            ));
        }
    }
    bad
}

/// Every `printed-by` block of a document.
fn printed_by(doc: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(doc).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let mut bad = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        if !l.trim_start().starts_with(PRINTED_BY) {
            continue;
        }
        let body: Vec<&str> = lines[i + 2..]
            .iter()
            .take_while(|l| !l.starts_with("```"))
            .copied()
            .collect();
        bad.extend(check_printed_by(doc, l, &body));
    }
    bad
}

#[test]
fn quoted_lines_are_printed_by_the_code_they_name() {
    let bad: Vec<String> = documents().iter().flat_map(|d| printed_by(d)).collect();
    assert!(bad.is_empty(), "{}", bad.join("\n"));
    // The matcher itself: a placeholder matches a `…`, fixed text must match.
    let parts = format_parts("artune: %s is stale for this machine (%s); run `artune tune` again");
    assert!(prints(
        &parts,
        "artune: … is stale for this machine (…); run `artune tune` again"
    ));
    assert!(!prints(
        &parts,
        "artune: … is fresh for this machine (…); run `artune tune` again"
    ));
    let parts = format_parts("artune: TP{ws} group {name} follows {bands.path}");
    assert!(prints(
        &parts,
        "artune: TP2 group tp follows /etc/artune/profile.json"
    ));
    assert!(!prints(
        &parts,
        "artune: TP2 group tp uses /etc/artune/profile.json"
    ));
}

/// Where the regenerated text first departs from the committed one.
fn first_difference(old: &str, new: &str) -> String {
    let (o, n): (Vec<_>, Vec<_>) = (old.lines().collect(), new.lines().collect());
    let at = (0..o.len().max(n.len()))
        .find(|&i| o.get(i) != n.get(i))
        .unwrap_or(0);
    format!(
        "line {}:\n  in the doc:    {}\n  printed now:   {}",
        at + 1,
        o.get(at).unwrap_or(&"<end>"),
        n.get(at).unwrap_or(&"<end>")
    )
}

#[test]
fn figures_match_their_commands() {
    let bless = std::env::var_os("ARTUNE_BLESS").is_some_and(|v| v == "1");
    let docs = documents();
    let results: Vec<Result<Vec<String>, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = docs
            .iter()
            .map(|doc| {
                s.spawn(move || -> Result<Vec<String>, String> {
                    let scratch = tempfile::tempdir().map_err(|e| e.to_string())?;
                    let old = std::fs::read_to_string(doc).map_err(|e| e.to_string())?;
                    let new = regenerate(doc, scratch.path())?;
                    let mut drift = kept_files(doc, scratch.path(), bless)?;
                    if new != old {
                        if bless {
                            std::fs::write(doc, &new).map_err(|e| e.to_string())?;
                        } else {
                            let d = first_difference(&old, &new);
                            drift.push(format!("{} has drifted, {d}", doc.display()));
                        }
                    }
                    Ok(drift)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut failures = Vec::new();
    for r in results {
        match r {
            Ok(drift) => failures.extend(drift),
            Err(e) => failures.push(e),
        }
    }
    assert!(
        failures.is_empty(),
        "{}\n\nIf the new output is right, regenerate the docs with \
         `ARTUNE_BLESS=1 cargo test --test docs` and review the diff.",
        failures.join("\n\n")
    );
}

#[test]
fn every_example_profile_is_kept_by_its_readme() {
    let dir = Path::new(ROOT).join("profiles/examples");
    let readme = std::fs::read_to_string(dir.join("README.md")).unwrap();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if name != "README.md" {
            assert!(
                readme.contains(&format!("{KEEP} {name} -->")),
                "profiles/examples/{name} is not regenerated by profiles/examples/README.md"
            );
        }
    }
}

/// Doc tests rustdoc runs and ignores in the library: the fenced blocks in `///` and `//!`
/// comments under src/ (not the binary's main.rs) whose info string rustdoc compiles.
fn doc_tests(dir: &Path, counts: &mut (usize, usize)) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for path in entries.flatten().map(|e| e.path()) {
        if path.is_dir() {
            doc_tests(&path, counts);
            continue;
        }
        if path.extension().is_none_or(|x| x != "rs") || path.ends_with("src/main.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let mut open = false;
        for line in text.lines().map(str::trim_start) {
            let Some(doc) = line
                .strip_prefix("///")
                .or_else(|| line.strip_prefix("//!"))
            else {
                continue;
            };
            let Some(info) = doc.trim_start().strip_prefix("```") else {
                continue;
            };
            open = !open;
            if !open {
                continue;
            }
            let words: Vec<&str> = info.split([',', ' ']).filter(|w| !w.is_empty()).collect();
            let rust = words.iter().all(|w| {
                ["rust", "no_run", "should_panic", "compile_fail", "ignore"].contains(w)
                    || w.starts_with("edition")
            });
            match (rust, words.contains(&"ignore")) {
                (true, true) => counts.1 += 1,
                (true, false) => counts.0 += 1,
                _ => {}
            }
        }
    }
}

/// README's `cargo test --locked` block cannot be rerun here, but it must end on the line the
/// run ends on: the summary of the library's doc tests, with as many as the source holds.
#[test]
fn the_readmes_test_block_ends_as_the_run_does() {
    let readme = std::fs::read_to_string(Path::new(ROOT).join("README.md")).unwrap();
    let start = readme
        .find("```console\n$ cargo test --locked\n")
        .expect("README has a `cargo test --locked` block");
    let block = &readme[start..];
    let block = &block[..block[3..].find("```").unwrap() + 3];
    let lines: Vec<&str> = block.lines().collect();
    let mut counts = (0, 0);
    doc_tests(&Path::new(ROOT).join("src"), &mut counts);
    let (run, ignored) = counts;
    let result = format!(
        "test result: ok. {run} passed; 0 failed; {ignored} ignored; 0 measured; 0 filtered out; finished in "
    );
    let last = lines[lines.len() - 1];
    assert!(
        last.strip_prefix(&result)
            .and_then(|t| t.strip_suffix('s'))
            .is_some_and(|t| t.parse::<f64>().is_ok()),
        "the block ends on {last:?}, where `cargo test --locked` ends on {result}…s"
    );
}

/// FORMATS.md's list of backend ids, which readers refuse beyond, names every backend the
/// table has (two copy-engine backends were once missing from it).
#[test]
fn formats_lists_every_backend_id() {
    let text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/FORMATS.md"))
            .unwrap();
    let start = text.find("- Backend ids:").expect("the backend ids list");
    let list = &text[start..start + text[start..].find("\n\n").unwrap_or(text.len() - start)];
    for b in artune::allreduce::Backend::ALL {
        assert!(
            list.contains(&format!("`{}`", b.id())),
            "FORMATS.md lacks `{}`",
            b.id()
        );
    }
}

/// A Markdown table runs on without a break: a row after a line that is not a row starts a
/// new table, so it must be a header (a separator line follows). A sentence once sat among
/// CLI.md's exit codes, and every row below it rendered as stray text.
#[test]
fn tables_are_not_broken_by_other_lines() {
    let mut broken = Vec::new();
    for doc in documents() {
        let text = std::fs::read_to_string(&doc).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let mut fenced = false;
        for (i, line) in lines.iter().enumerate() {
            if line.trim_start().starts_with("```") {
                fenced = !fenced;
            }
            let row = |l: &str| l.trim_start().starts_with('|');
            let header = lines
                .get(i + 1)
                .is_some_and(|n| n.trim_start().starts_with("|-"));
            if !fenced && row(line) && !header && (i == 0 || !row(lines[i - 1])) {
                broken.push(format!("{}:{}: {line}", doc.display(), i + 1));
            }
        }
    }
    assert!(
        broken.is_empty(),
        "rows outside a table:\n{}",
        broken.join("\n")
    );
}

/// `fleet --help` names every exit code CLI.md's table gives fleet (it once named 7 and 5
/// only, while 9 and 3 happen too).
#[test]
fn fleet_help_names_every_exit_code_the_table_gives_it() {
    let cli = std::fs::read_to_string(Path::new(ROOT).join("docs/CLI.md")).unwrap();
    let codes: Vec<&str> = cli
        .lines()
        .filter(|l| l.contains("`fleet`") || l.contains("`fleet DIR`"))
        .filter_map(|l| l.strip_prefix("| ")?.split(' ').next())
        .filter(|c| c.parse::<u32>().is_ok())
        .collect();
    assert!(codes.len() >= 3, "{codes:?}");
    let o = common::dies_with_test(BIN)
        .args(["fleet", "--help"])
        .output()
        .unwrap();
    let help = common::text(&o.stdout);
    for c in codes.iter().chain(&["2"]) {
        assert!(
            help.lines()
                .any(|l| l.trim_start().starts_with(&format!("{c}  "))),
            "fleet --help does not name exit {c}:\n{help}"
        );
    }
}

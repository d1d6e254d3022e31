//! The JSON gate every artune file passes before serde reads it: one object, nesting bounded,
//! no repeated keys; and serde_json's errors turned into phrases that name the place.

use super::MAX_DEPTH;
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt;

/// Checks that `text` is one JSON object, nested at most [`MAX_DEPTH`] deep, in which no
/// object repeats a key. serde_json keeps the last of repeated map keys without a word, so a
/// hand-edited file could mean something other than what its author reads.
pub fn check_json(text: &str) -> Result<(), String> {
    if text.starts_with('\u{feff}') {
        return Err("it starts with a byte-order mark; save it as UTF-8 without one".into());
    }
    let mut de = serde_json::Deserializer::from_str(text);
    Walk { depth: 0 }
        .deserialize(&mut de)
        .and_then(|()| de.end())
        .map_err(|e| describe(&e, text))?;
    if !text.trim_start().starts_with('{') {
        return Err("it is not a JSON object (`{ … }`)".into());
    }
    Ok(())
}

const TOO_DEEP: &str = "arrays and objects are nested more than";
const REPEATED: &str = "appears twice in one object; a key may appear only once";

/// Visits any JSON value, refusing repeated keys and nesting past [`MAX_DEPTH`]. Keeps only
/// the keys of the objects on the current path, so memory follows the text, not its numbers.
#[derive(Clone, Copy)]
struct Walk {
    depth: usize,
}

impl Walk {
    fn deeper<E: de::Error>(self) -> Result<Walk, E> {
        if self.depth >= MAX_DEPTH {
            return Err(E::custom(format_args!("{TOO_DEEP} {MAX_DEPTH} deep")));
        }
        Ok(Walk {
            depth: self.depth + 1,
        })
    }
}

impl<'de> DeserializeSeed<'de> for Walk {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Walk {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let inner = self.deeper()?;
        while seq.next_element_seed(inner)?.is_some() {}
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let inner = self.deeper()?;
        let mut keys = HashSet::new();
        while let Some(Key(k)) = map.next_key()? {
            if keys.contains(&k) {
                return Err(de::Error::custom(format_args!(
                    "the key \"{}\" {REPEATED}",
                    shorten(&k)
                )));
            }
            keys.insert(k);
            map.next_value_seed(inner)?;
        }
        Ok(())
    }
}

/// An object key, borrowed from the text unless it has escapes.
struct Key<'de>(Cow<'de, str>);

impl<'de> de::Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string key")
            }
            fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(s)))
            }
            fn visit_str<E>(self, s: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(s.into())))
            }
        }
        d.deserialize_str(V)
    }
}

/// A string for an error message: escaped (one line) and cut to 40 characters.
pub(super) fn shorten(s: &str) -> String {
    let mut out: String = s.chars().take(40).flat_map(char::escape_debug).collect();
    if s.chars().nth(40).is_some() {
        out.push('…');
    }
    out
}

/// Turns a serde_json error into a phrase that names the problem and, for a value of the
/// wrong type or range, where it is (`gpus[1].pcie.gen`).
pub fn describe(e: &serde_json::Error, text: &str) -> String {
    use serde_json::error::Category;
    let full = e.to_string();
    let (line, column) = (e.line(), e.column());
    let msg = full
        .strip_suffix(&format!(" at line {line} column {column}"))
        .unwrap_or(&full);
    let msg = &*printable(msg);
    let at = format!("line {line}, column {column}");
    match e.classify() {
        Category::Eof if text.trim().is_empty() => "it is empty".into(),
        Category::Eof => format!("it ends too early (line {line}): the file looks truncated"),
        Category::Syntax if msg.starts_with("number out of range") => {
            format!("it has a number too large to represent ({at})")
        }
        Category::Syntax if msg.starts_with("recursion limit") => {
            format!("{TOO_DEEP} {MAX_DEPTH} deep ({at})")
        }
        // Valid JSON whose map key must be a number (a byte size): serde_json files it as syntax.
        Category::Syntax if msg.contains("expected key to be a number") => {
            let path = locate(text, offset(text, line, column), false);
            format!(
                "a key in `{}` must be a whole number in quotes, like \"4096\" ({at})",
                printable(&path)
            )
        }
        Category::Syntax | Category::Io => format!("it is not valid JSON: {msg} ({at})"),
        Category::Data if msg.starts_with(TOO_DEEP) => format!("{msg} ({at})"),
        Category::Data => {
            let missing = msg.starts_with("missing field");
            let path = locate(text, offset(text, line, column), missing);
            let path = &*printable(&path);
            let msg = &*plain_types(msg);
            let hint = "";
            match (msg.strip_prefix("missing field "), path.is_empty()) {
                (Some(field), true) => format!("it lacks the field {field} ({at})"),
                (Some(field), false) => format!("`{path}` lacks the field {field} ({at})"),
                (None, false) if msg.ends_with(REPEATED) => format!("`{path}` {REPEATED} ({at})"),
                (None, true) => format!("{msg}{hint} ({at})"),
                (None, false) => format!("`{path}` is wrong: {msg}{hint} ({at})"),
            }
        }
    }
}

/// A number of the wrong kind in words, where serde names its types ("invalid value: integer
/// `-1`, expected u64"): what the value is and what it must be, without claiming a range the
/// field itself may narrow (memory is 1 byte up, checked after).
fn plain_types(msg: &str) -> Cow<'_, str> {
    let Some((head, ty)) = msg.rsplit_once(", expected ") else {
        return Cow::Borrowed(msg);
    };
    let whole = matches!(ty, "u8" | "u16" | "u32" | "u64" | "usize");
    let number = whole || matches!(ty, "i8" | "i16" | "i32" | "i64" | "isize" | "f32" | "f64");
    if !number {
        return Cow::Borrowed(msg);
    }
    let value = head.split_once(": ").map_or(head, |(_, v)| v);
    let kind = if whole { "a whole number" } else { "a number" };
    // serde quotes a number in backticks ("integer `-1`"), a string in double quotes.
    let quoted = value.split('`').nth(1);
    Cow::Owned(match (value, quoted) {
        (v, Some(n)) if v.starts_with("integer `-") && whole => {
            format!("it is {n}, and it cannot be negative")
        }
        (v, Some(n)) if v.starts_with("floating point") && whole => {
            format!("it is {n}; it must be {kind}")
        }
        (v, _) if v.starts_with("string") => format!("it is a {v}; write {kind} without quotes"),
        (v, _) => format!("it is {v}; it must be {kind}"),
    })
}

/// Longest part of a serde_json message kept; it quotes the refused value whole.
const MAX_QUOTED: usize = 600;

/// serde_json quotes the value it refused, and a JSON escape (`\n`) can put a line break or
/// another control character in it: those are written as escapes so an error stays one line,
/// and a long value is cut.
fn printable(msg: &str) -> Cow<'_, str> {
    if msg.len() <= MAX_QUOTED && !msg.chars().any(char::is_control) {
        return Cow::Borrowed(msg);
    }
    let mut out = String::new();
    for c in msg.chars() {
        if out.len() >= MAX_QUOTED {
            out.push('…');
            break;
        }
        match c.is_control() {
            true => out.extend(c.escape_default()),
            false => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// Byte index of the last character serde_json read, from its 1-based line and column.
fn offset(text: &str, line: usize, column: usize) -> usize {
    let mut start = 0;
    for _ in 1..line {
        match text[start..].find('\n') {
            Some(p) => start += p + 1,
            None => break,
        }
    }
    (start + column).saturating_sub(1).min(text.len())
}

/// The path (`groups[0].buckets[2].bytes`) of the value being read at byte `at` of valid
/// JSON; with `container`, the path of the object around it instead.
pub(super) fn locate(text: &str, at: usize, container: bool) -> String {
    enum Frame<'a> {
        Obj {
            key: Option<&'a str>,
            want_key: bool,
        },
        Arr(usize),
    }
    let b = text.as_bytes();
    let end = at.min(b.len());
    let mut stack: Vec<Frame> = Vec::new();
    let mut i = 0;
    while i < end {
        match b[i] {
            b'"' => {
                let start = i + 1;
                i += 1;
                while i < end && b[i] != b'"' {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
                if let Some(Frame::Obj { key, want_key }) = stack.last_mut() {
                    if *want_key {
                        *key = text.get(start..i.min(end));
                        *want_key = false;
                    }
                }
            }
            b'{' => stack.push(Frame::Obj {
                key: None,
                want_key: true,
            }),
            b'[' => stack.push(Frame::Arr(0)),
            b'}' | b']' => {
                stack.pop();
            }
            b',' => match stack.last_mut() {
                Some(Frame::Arr(n)) => *n += 1,
                Some(Frame::Obj { want_key, .. }) => *want_key = true,
                None => {}
            },
            _ => {}
        }
        i += 1;
    }
    if container {
        if let Some(Frame::Obj { key, .. }) = stack.last_mut() {
            *key = None;
        }
    }
    let mut path = String::new();
    for f in &stack {
        match f {
            Frame::Obj { key: Some(k), .. } => {
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(&shorten(k));
            }
            Frame::Obj { key: None, .. } => {}
            Frame::Arr(n) => path.push_str(&format!("[{n}]")),
        }
    }
    path
}

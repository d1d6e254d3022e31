//! Words a POSIX shell reads back unchanged: the commands artune suggests and the settings it
//! exports quote paths with [`quote`], so they run as printed.

/// `s` as it is when it holds nothing a shell would split or expand, else in single quotes.
pub fn quote(s: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "/._-+:,=@".contains(c);
    if !s.is_empty() && s.chars().all(plain) {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn plain_words_stay_and_the_rest_is_quoted() {
        assert_eq!(super::quote("/etc/artune/p.json"), "/etc/artune/p.json");
        assert_eq!(super::quote("my box's.json"), r"'my box'\''s.json'");
        assert_eq!(super::quote(""), "''");
        assert_eq!(super::quote("a{host}.json"), "'a{host}.json'");
    }
}

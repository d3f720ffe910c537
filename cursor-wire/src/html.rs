//! HTML escaping for pages built as strings on the server (cursor-server's console, cursor-backend's
//! UI). It lives with the wire mechanics only because both crates need exactly this and nothing else
//! of the kind; a crate of its own for five replacements would cost more than it separates.

/// `&`, `<`, `>`, `"` and `'` as entities: safe in element text and in quoted attribute values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::escape;

    #[test]
    fn the_five_markup_characters_become_entities_and_nothing_else_changes() {
        assert_eq!(
            escape(r#"<a href="x">'&'</a>"#),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;"
        );
        assert_eq!(escape("plain ünïcode 123"), "plain ünïcode 123");
        assert_eq!(escape("&amp;"), "&amp;amp;");
        assert_eq!(escape(""), "");
    }
}

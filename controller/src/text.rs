//! Text that came from a client (an operation's `by` and reason, an annotation quoted back in a
//! message), made safe to print: in status, Events, the log and the plugin's output a control
//! character could forge a line or move the cursor, and a bidirectional override could make
//! "alice" display as someone else's name.

/// `text` without control characters (C0, DEL, C1) and bidirectional formatting characters; a
/// line break or tab becomes a space, so words stay apart.
pub fn printable(text: &str) -> String {
    text.chars()
        .filter_map(|c| match c {
            '\n' | '\r' | '\t' => Some(' '),
            c if c.is_control() || is_bidi_control(c) => None,
            c => Some(c),
        })
        .collect()
}

/// Whether `text` is already [`printable`] (nothing would be removed or replaced).
pub fn is_printable(text: &str) -> bool {
    !text.chars().any(|c| c.is_control() || is_bidi_control(c))
}

/// The Unicode bidirectional formatting characters (marks, embeddings, overrides, isolates).
fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_stripped_and_breaks_become_spaces() {
        assert_eq!(printable("alice\x1b[2J\x07"), "alice[2J");
        assert_eq!(
            printable("stuck\nLockBroken by bob"),
            "stuck LockBroken by bob"
        );
        assert_eq!(printable("a\r\tb\x7f\u{85}c\0"), "a  bc");
    }

    #[test]
    fn bidi_overrides_are_stripped() {
        // "\u{202E}ecila" would display as "alice" reversed into another name.
        assert_eq!(printable("\u{202E}ecila\u{202C}"), "ecila");
        assert_eq!(printable("a\u{2066}b\u{2069}\u{200F}\u{061C}"), "ab");
    }

    #[test]
    fn ordinary_text_is_kept() {
        for t in [
            "alice@example.com",
            "system:serviceaccount:ns:sa",
            "Zoë 山田 — ok",
            "",
        ] {
            assert_eq!(printable(t), t);
            assert!(is_printable(t));
        }
        assert!(!is_printable("a\nb"));
        assert!(!is_printable("\u{202E}"));
    }
}

//! How received bytes are shown in logs and by applications: as text when
//! printable, as hex otherwise ([`render`]), cut to a bound ([`preview`]).

/// Shows received bytes as text when printable, as hex otherwise.
///
/// ```
/// use secure_rdma::server::render;
///
/// assert_eq!(render(b"hi"), "\"hi\"");
/// assert_eq!(render(&[0, 0xff]), "hex:00ff");
/// ```
pub fn render(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(s) if s.chars().all(|c| !c.is_control() || c == '\n' || c == '\t') => format!("{s:?}"),
        _ => {
            let mut hex = String::with_capacity(bytes.len() * 2 + 4);
            hex.push_str("hex:");
            for b in bytes {
                hex.push_str(&format!("{b:02x}"));
            }
            hex
        }
    }
}

/// [`render`] of at most `max` bytes, saying how many more there were.
pub fn preview(bytes: &[u8], max: usize) -> String {
    if bytes.len() <= max {
        return render(bytes);
    }
    // Cut text at a character boundary so a preview of text stays text.
    let cut = match std::str::from_utf8(bytes) {
        Ok(s) => s
            .char_indices()
            .map(|(i, _)| i)
            .take_while(|&i| i <= max)
            .last()
            .unwrap_or(0),
        Err(_) => max,
    };
    format!("{}… (+{} bytes)", render(&bytes[..cut]), bytes.len() - cut)
}

#[cfg(test)]
mod tests {
    use super::{preview, render};

    #[test]
    fn previews_are_bounded_and_say_what_was_cut() {
        assert_eq!(preview(b"short", 64), "\"short\"");
        let long = "é".repeat(100); // 200 bytes
        let p = preview(long.as_bytes(), 64);
        assert!(p.starts_with("\"éé"), "{p}");
        assert!(p.ends_with("… (+136 bytes)"), "{p}");
        let bin = vec![0u8; 1000];
        let p = preview(&bin, 8);
        assert_eq!(p, "hex:0000000000000000… (+992 bytes)");
    }

    #[test]
    fn render_text_or_hex() {
        assert_eq!(render(b"hello"), "\"hello\"");
        assert_eq!(render(&[0, 1, 0xff]), "hex:0001ff");
        assert_eq!(render(b"a\x07b"), "hex:610762");
    }
}

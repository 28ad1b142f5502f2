//! Counts and spans of time in the words every text uses, so that no explanation, estimate or
//! CLI line renders one its own way. Apart from `explain` so that any module (the queues'
//! refusals among them) can use them without an import circle.

/// A span of seconds in the words explanations use: "45 s", "12 min", "2 h 10 min", "3 days
/// 4 h". The one rendering of a wait, for estimates, what-ifs and the no-estimate sentence.
pub fn duration_text(s: f64) -> String {
    let s = s.max(0.0).round() as u64;
    match s {
        0..60 => format!("{s} s"),
        60..3600 => format!("{} min", s / 60),
        3600..86_400 => match (s % 3600) / 60 {
            0 => format!("{} h", s / 3600),
            m => format!("{} h {m} min", s / 3600),
        },
        _ => match (s % 86_400) / 3600 {
            0 => count_text(s / 86_400, "day"),
            h => format!("{} {h} h", count_text(s / 86_400, "day")),
        },
    }
}

/// `n` and its noun, the plural agreeing: "1 pod", "16 pods", "0 GPUs". The one rendering of a
/// count in words, so no text says "1 pods"; `noun` is singular and takes an "s".
pub fn count_text(n: impl Into<u64>, noun: &str) -> String {
    match n.into() {
        1 => format!("1 {noun}"),
        n => format!("{n} {noun}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_words_and_plurals_agree() {
        assert_eq!(duration_text(45.4), "45 s");
        assert_eq!(duration_text(125.951_446_533_203_13), "2 min");
        assert_eq!(duration_text(7_800.0), "2 h 10 min");
        assert_eq!(duration_text(7_200.0), "2 h");
        assert_eq!(duration_text(720.0), "12 min");
        assert_eq!(duration_text(18_000.0), "5 h");
        assert_eq!(duration_text(3.0 * 86_400.0 + 4.0 * 3600.0), "3 days 4 h");
        assert_eq!(duration_text(86_400.0 + 4.0 * 3600.0), "1 day 4 h");
        assert_eq!(duration_text(3.0 * 86_400.0), "3 days");
        assert_eq!(count_text(1u32, "pod"), "1 pod");
        assert_eq!(count_text(16u32, "pod"), "16 pods");
        assert_eq!(count_text(0u64, "GPU"), "0 GPUs");
    }
}

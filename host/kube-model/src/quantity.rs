//! Kubernetes resource quantities ("500m", "2Gi", "1k") as the integers the core counts in.

/// Parses a quantity into its value times `scale` (1000 for milli-units), rounded up the way
/// the API server rounds requests. `None` for text that is not a quantity.
fn scaled(text: &str, scale: f64) -> Option<u64> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let number: f64 = number.parse().ok()?;
    let factor = match suffix {
        "" => 1.0,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "Ki" => 1024.0,
        "Mi" => 1024.0f64.powi(2),
        "Gi" => 1024.0f64.powi(3),
        "Ti" => 1024.0f64.powi(4),
        "Pi" => 1024.0f64.powi(5),
        _ if suffix.starts_with(['e', 'E']) => 10f64.powi(suffix[1..].parse().ok()?),
        _ => return None,
    };
    let value = (number * factor * scale).ceil();
    (value >= 0.0).then_some(value as u64)
}

/// CPU in milli-cores.
pub fn cpu_milli(text: &str) -> Option<u64> {
    scaled(text, 1000.0)
}

/// Memory in MiB, rounded up.
pub fn memory_mib(text: &str) -> Option<u64> {
    scaled(text, 1.0 / (1024.0 * 1024.0))
}

/// A plain count (GPUs, pods).
pub fn count(text: &str) -> Option<u64> {
    scaled(text, 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_suffixes_nodes_and_pods_use() {
        assert_eq!(cpu_milli("192"), Some(192_000));
        assert_eq!(cpu_milli("500m"), Some(500));
        assert_eq!(cpu_milli("1k"), Some(1_000_000));
        assert_eq!(memory_mib("2000000Mi"), Some(2_000_000));
        assert_eq!(memory_mib("1Gi"), Some(1024));
        assert_eq!(memory_mib("1Ti"), Some(1024 * 1024));
        assert_eq!(memory_mib("1048576"), Some(1));
        assert_eq!(memory_mib("1"), Some(1), "rounds up");
        assert_eq!(count("8"), Some(8));
        assert_eq!(count("eight"), None);
        assert_eq!(count("8Xi"), None);
    }
}

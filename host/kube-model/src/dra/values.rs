//! Quantities and versions as CEL sees them: exact resource quantities and semantic
//! versions, each an opaque CEL value with its ordering.

use cel::objects::Opaque;

/// A resource quantity ("80Gi", "500m") as an exact integer count of nano-units, so that
/// capacities compare exactly, as Kubernetes compares `resource.Quantity`, with no float
/// rounding between "80Gi" and "85899345920".
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Quantity {
    pub(super) nanos: i128,
}

pub(super) const NANOS: i128 = 1_000_000_000;

impl Quantity {
    /// Parses Kubernetes' quantity syntax: an optionally signed decimal number, then a binary
    /// (`Ki`…`Ei`), decimal (`n`, `u`, `m`, `k`, `M`…`E`) or exponent (`e3`) suffix. Anything
    /// finer than a nano-unit is rounded up, as the API server rounds. `None` for other text.
    pub fn parse(text: &str) -> Option<Self> {
        let text = text.trim();
        let (negative, rest) = match text.as_bytes().first()? {
            b'-' => (true, &text[1..]),
            b'+' => (false, &text[1..]),
            _ => (false, text),
        };
        let split = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, suffix) = rest.split_at(split);
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        if (whole.is_empty() && fraction.is_empty()) || fraction.contains('.') {
            return None;
        }
        // value = digits / 10^fraction_len * base^exp, in nano-units.
        let digits: String = format!("{whole}{fraction}");
        let digits = digits.trim_start_matches('0');
        if digits.len() > 30 {
            return None;
        }
        let mantissa: i128 = if digits.is_empty() {
            0
        } else {
            digits.parse().ok()?
        };
        let mut decimal_exp: i32 = -i32::try_from(fraction.len()).ok()?;
        let mut binary_exp: u32 = 0;
        match suffix {
            "" => {}
            "n" => decimal_exp -= 9,
            "u" => decimal_exp -= 6,
            "m" => decimal_exp -= 3,
            "k" => decimal_exp += 3,
            "M" => decimal_exp += 6,
            "G" => decimal_exp += 9,
            "T" => decimal_exp += 12,
            "P" => decimal_exp += 15,
            "E" => decimal_exp += 18,
            "Ki" => binary_exp = 10,
            "Mi" => binary_exp = 20,
            "Gi" => binary_exp = 30,
            "Ti" => binary_exp = 40,
            "Pi" => binary_exp = 50,
            "Ei" => binary_exp = 60,
            _ if suffix.starts_with(['e', 'E']) => {
                let exp: i32 = suffix[1..].parse().ok()?;
                if exp.abs() > 40 {
                    return None;
                }
                decimal_exp += exp;
            }
            _ => return None,
        }
        decimal_exp += 9; // to nano-units
        let mut numerator = mantissa.checked_mul(1i128.checked_shl(binary_exp)?)?;
        let mut denominator: i128 = 1;
        if decimal_exp >= 0 {
            numerator = numerator.checked_mul(10i128.checked_pow(decimal_exp.unsigned_abs())?)?;
        } else {
            denominator = 10i128.checked_pow(decimal_exp.unsigned_abs())?;
        }
        let nanos = numerator.div_ceil_positive(denominator);
        Some(Self {
            nanos: if negative { -nanos } else { nanos },
        })
    }

    /// The value in whole units, rounded up (what a count or a byte size means).
    pub fn value(&self) -> i128 {
        self.nanos.div_ceil_positive(NANOS)
    }

    /// The value in nano-units, exact.
    pub fn nanos(&self) -> i128 {
        self.nanos
    }

    pub(super) fn is_integer(&self) -> bool {
        self.nanos % NANOS == 0
    }
}

/// Ceiling division for a positive denominator without the unstable `div_ceil` on signed ints.
trait DivCeil {
    fn div_ceil_positive(self, d: i128) -> i128;
}

impl DivCeil for i128 {
    fn div_ceil_positive(self, d: i128) -> i128 {
        let q = self / d;
        if self % d > 0 { q + 1 } else { q }
    }
}

impl Opaque for Quantity {
    fn runtime_type_name(&self) -> &str {
        "kubernetes.Quantity"
    }
}

/// A semantic version attribute (`cudaComputeCapability: 9.0.0`), parsed strictly as
/// Kubernetes parses `version` attributes, ordered by semver precedence (build metadata
/// ignored) so `isGreaterThan` means what a driver's user expects.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Semver {
    pub(super) major: u64,
    pub(super) minor: u64,
    pub(super) patch: u64,
    /// Pre-releases sort before the release they lead to, as semver says.
    release: ReleaseOrder,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum ReleaseOrder {
    Pre(Vec<PreId>),
    Release,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum PreId {
    Numeric(u64),
    Alpha(String),
}

impl Semver {
    /// Parses `MAJOR.MINOR.PATCH[-pre][+build]` with no leading zeros and no `v` prefix.
    pub fn parse(text: &str) -> Option<Self> {
        let numeric = |s: &str| -> Option<u64> {
            if s.is_empty() || (s.len() > 1 && s.starts_with('0')) {
                return None;
            }
            if !s.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            s.parse().ok()
        };
        let ident_ok =
            |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
        let (rest, build) = match text.split_once('+') {
            Some((rest, build)) => (rest, Some(build)),
            None => (text, None),
        };
        if let Some(build) = build
            && !build.split('.').all(ident_ok)
        {
            return None;
        }
        let (core, pre) = match rest.split_once('-') {
            Some((core, pre)) => (core, Some(pre)),
            None => (rest, None),
        };
        let mut parts = core.split('.');
        let major = numeric(parts.next()?)?;
        let minor = numeric(parts.next()?)?;
        let patch = numeric(parts.next()?)?;
        if parts.next().is_some() {
            return None;
        }
        let release = match pre {
            None => ReleaseOrder::Release,
            Some(pre) => {
                let mut ids = Vec::new();
                for id in pre.split('.') {
                    if !ident_ok(id) {
                        return None;
                    }
                    if id.bytes().all(|b| b.is_ascii_digit()) {
                        ids.push(PreId::Numeric(numeric(id)?));
                    } else {
                        ids.push(PreId::Alpha(id.to_string()));
                    }
                }
                ReleaseOrder::Pre(ids)
            }
        };
        Some(Self {
            major,
            minor,
            patch,
            release,
        })
    }
}

impl Opaque for Semver {
    fn runtime_type_name(&self) -> &str {
        "kubernetes.Semver"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_parse_exactly() {
        let q = |s: &str| Quantity::parse(s).map(|q| q.nanos());
        assert_eq!(q("80Gi"), Some((80i128 << 30) * NANOS));
        assert_eq!(q("500m"), Some(500_000_000));
        assert_eq!(q("1.5k"), Some(1_500 * NANOS));
        assert_eq!(q("1e3"), Some(1_000 * NANOS));
        assert_eq!(q("1E"), Some(1_000_000_000_000_000_000 * NANOS));
        assert_eq!(q("-2"), Some(-2 * NANOS));
        assert_eq!(q("0.1n"), Some(1), "rounded up to a nano-unit");
        assert_eq!(q("forty"), None);
        assert_eq!(q("1Qi"), None);
        assert_eq!(q(""), None);
        assert_eq!(Quantity::parse("1.5").unwrap().value(), 2);
    }

    #[test]
    fn versions_order_by_semver_precedence() {
        let v = |s: &str| Semver::parse(s).unwrap();
        assert!(v("9.0.0") > v("8.9.0"));
        assert!(v("1.0.0") > v("1.0.0-rc.1"));
        assert!(v("1.0.0-rc.2") < v("1.0.0-rc.10"));
        assert_eq!(v("1.2.3+build"), v("1.2.3"));
        assert!(Semver::parse("550.54.05").is_none(), "leading zero");
        assert!(Semver::parse("v1.2.3").is_none());
    }
}

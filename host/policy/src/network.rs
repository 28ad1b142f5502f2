//! The network a policy may reach: an allow-list of addresses and CIDR blocks, optionally with a
//! port. Granting "the network" as a whole would hand a policy everything the scheduler's host
//! can reach (the API server, cloud metadata endpoints); an allow-list names what it needs.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;

/// One allow-list entry: `10.0.0.0/8`, `127.0.0.1`, `127.0.0.1:8080`, `10.1.0.0/16:443`,
/// `::1`, `[fd00::/8]:443`. An address without a prefix is the single host (`/32` or `/128`);
/// an entry without a port allows every port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NetworkRule {
    /// The network address, with every host bit zero.
    pub addr: IpAddr,
    /// Leading bits of `addr` that must match.
    pub prefix: u8,
    /// The only port allowed, or `None` for every port.
    pub port: Option<u16>,
}

/// Why an allow-list entry was refused; the message names the entry and the expected forms.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "bad network entry `{entry}`: {problem} (expected ADDR, ADDR/PREFIX, ADDR:PORT, ADDR/PREFIX:PORT, or [IPv6]:PORT)"
)]
pub struct NetworkRuleError {
    /// The entry as given.
    pub entry: String,
    /// What is wrong with it.
    pub problem: String,
}

impl NetworkRule {
    /// Whether `addr` falls inside this entry.
    pub fn matches(&self, addr: SocketAddr) -> bool {
        if self.port.is_some_and(|port| port != addr.port()) {
            return false;
        }
        let ip = match (self.addr, addr.ip()) {
            // An IPv4 peer may show up as an IPv4-mapped IPv6 address on a dual-stack socket.
            (IpAddr::V4(_), IpAddr::V6(v6)) => match v6.to_ipv4_mapped() {
                Some(v4) => IpAddr::V4(v4),
                None => return false,
            },
            (_, ip) => ip,
        };
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                masked(u128::from(u32::from(ip)), self.prefix, 32) == u128::from(u32::from(net))
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                masked(u128::from(ip), self.prefix, 128) == u128::from(net)
            }
            _ => false,
        }
    }

    /// Parse a comma-separated list (`10.0.0.0/8,127.0.0.1:8080`); empty entries are refused so
    /// a stray comma is not silently ignored.
    pub fn parse_list(text: &str) -> Result<Vec<Self>, NetworkRuleError> {
        text.split(',').map(|entry| entry.trim().parse()).collect()
    }
}

/// `ip` with all but its first `prefix` of `bits` bits cleared.
fn masked(ip: u128, prefix: u8, bits: u8) -> u128 {
    if prefix == 0 {
        return 0;
    }
    let keep = u32::from(bits - prefix);
    (ip >> keep) << keep
}

impl FromStr for NetworkRule {
    type Err = NetworkRuleError;

    fn from_str(entry: &str) -> Result<Self, Self::Err> {
        let fail = |problem: String| NetworkRuleError {
            entry: entry.to_string(),
            problem,
        };
        if entry.is_empty() {
            return Err(fail("the entry is empty".into()));
        }
        // Split off the port: `[v6...]:port`, or `v4...:port` (one colon); a bare IPv6 address
        // has several colons and no port.
        let (net, port) = if let Some(rest) = entry.strip_prefix('[') {
            let (net, after) = rest
                .split_once(']')
                .ok_or_else(|| fail("`[` without a closing `]`".into()))?;
            match after {
                "" => (net, None),
                _ => match after.strip_prefix(':') {
                    Some(port) => (net, Some(port)),
                    None => return Err(fail(format!("unexpected `{after}` after `]`"))),
                },
            }
        } else if entry.matches(':').count() == 1 {
            let (net, port) = entry.split_once(':').unwrap_or((entry, ""));
            (net, Some(port))
        } else {
            (entry, None)
        };
        let port = match port {
            None => None,
            Some(port) => match port.parse::<u16>() {
                Ok(0) => return Err(fail("port 0 is not a port".into())),
                Ok(port) => Some(port),
                Err(_) => return Err(fail(format!("`{port}` is not a port (1-65535)"))),
            },
        };
        let (ip, prefix) = match net.split_once('/') {
            Some((ip, prefix)) => (ip, Some(prefix)),
            None => (net, None),
        };
        let addr: IpAddr = ip.parse().map_err(|_| {
            fail(format!(
                "`{ip}` is not an IP address (host names are not allowed)"
            ))
        })?;
        let bits: u8 = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => bits,
            Some(text) => match text.parse::<u8>() {
                Ok(prefix) if prefix <= bits => prefix,
                _ => {
                    return Err(fail(format!("`/{text}` is not a prefix length (0-{bits})")));
                }
            },
        };
        let value = match addr {
            IpAddr::V4(v4) => u128::from(u32::from(v4)),
            IpAddr::V6(v6) => u128::from(v6),
        };
        let network = masked(value, prefix, bits);
        if network != value {
            let network = match addr {
                IpAddr::V4(_) => IpAddr::from(u32::try_from(network).unwrap_or(0).to_be_bytes()),
                IpAddr::V6(_) => IpAddr::from(network.to_be_bytes()),
            };
            return Err(fail(format!(
                "host bits are set past /{prefix}; did you mean {network}/{prefix}?"
            )));
        }
        Ok(Self { addr, prefix, port })
    }
}

impl fmt::Display for NetworkRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let full = if self.addr.is_ipv4() { 32 } else { 128 };
        let net = if self.prefix == full {
            self.addr.to_string()
        } else {
            format!("{}/{}", self.addr, self.prefix)
        };
        match (self.port, self.addr) {
            (None, _) => f.write_str(&net),
            (Some(port), IpAddr::V4(_)) => write!(f, "{net}:{port}"),
            (Some(port), IpAddr::V6(_)) => write!(f, "[{net}]:{port}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(text: &str) -> NetworkRule {
        text.parse().unwrap_or_else(|e| panic!("{e}"))
    }

    fn addr(text: &str) -> SocketAddr {
        text.parse().unwrap()
    }

    #[test]
    fn parses_every_form_and_prints_it_back() {
        for text in [
            "10.0.0.0/8",
            "127.0.0.1",
            "127.0.0.1:8080",
            "10.1.0.0/16:443",
            "::1",
            "fd00::/8",
            "[fd00::/8]:443",
            "[::1]:53",
        ] {
            assert_eq!(rule(text).to_string(), text);
        }
        assert_eq!(
            rule("10.0.0.0/8"),
            NetworkRule {
                addr: "10.0.0.0".parse().unwrap(),
                prefix: 8,
                port: None
            }
        );
        assert_eq!(
            NetworkRule::parse_list("10.0.0.0/8, 127.0.0.1:8080").unwrap(),
            vec![rule("10.0.0.0/8"), rule("127.0.0.1:8080")]
        );
    }

    #[test]
    fn matches_by_prefix_and_port() {
        let net = rule("10.0.0.0/8");
        assert!(net.matches(addr("10.200.3.4:1")));
        assert!(net.matches(addr("[::ffff:10.0.0.1]:80")));
        assert!(!net.matches(addr("11.0.0.1:80")));
        let host = rule("127.0.0.1:8080");
        assert!(host.matches(addr("127.0.0.1:8080")));
        assert!(!host.matches(addr("127.0.0.1:8081")));
        assert!(!host.matches(addr("127.0.0.2:8080")));
        assert!(rule("fd00::/8").matches(addr("[fd12::1]:443")));
        assert!(!rule("fd00::/8").matches(addr("[fe80::1]:443")));
        assert!(!rule("::1").matches(addr("127.0.0.1:1")));
        assert!(rule("0.0.0.0/0").matches(addr("8.8.8.8:53")));
    }

    #[test]
    fn a_bad_entry_says_what_is_wrong() {
        let problem = |text: &str| text.parse::<NetworkRule>().unwrap_err().problem;
        assert_eq!(
            problem("10.0.0.1/8"),
            "host bits are set past /8; did you mean 10.0.0.0/8?"
        );
        assert_eq!(
            problem("10.0.0.0/33"),
            "`/33` is not a prefix length (0-32)"
        );
        assert_eq!(problem("127.0.0.1:0"), "port 0 is not a port");
        assert_eq!(problem("127.0.0.1:http"), "`http` is not a port (1-65535)");
        assert_eq!(
            problem("example.com"),
            "`example.com` is not an IP address (host names are not allowed)"
        );
        assert_eq!(problem("[::1"), "`[` without a closing `]`");
        assert_eq!(
            NetworkRule::parse_list("10.0.0.0/8,")
                .unwrap_err()
                .to_string(),
            "bad network entry ``: the entry is empty (expected ADDR, ADDR/PREFIX, ADDR:PORT, \
             ADDR/PREFIX:PORT, or [IPv6]:PORT)"
        );
    }
}

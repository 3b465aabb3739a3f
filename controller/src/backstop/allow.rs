//! The hosts a backstop may point at (`--backstop-allowed-hosts`, issue 19): CIDRs and host
//! names; empty allows all.
//!
//! A SingletonJob's author chooses the backstop's host, and the controller connects to it from
//! inside the cluster. Without a list, `BackstopReady` tells "connection refused" from "timed out",
//! which makes the controller a port scanner for anyone who may create a SingletonJob. With a
//! list, a host outside it is refused before any connection is attempted, with one message for
//! every such host.
//!
//! Matching: a host written as an IP address must fall in a CIDR. A host name listed as a name
//! (case-insensitive, a trailing dot ignored) is allowed as is and resolved by the driver. Any
//! other host name is resolved once here; every address it resolves to must fall in a CIDR, and
//! the connection goes to the first of those checked addresses (the driver is given it as
//! `hostaddr`, the name is kept for TLS), so a DNS answer that changes between the check and the
//! dial (DNS rebinding) cannot move the connection outside the list. A `hostaddr` in the Secret is
//! the address dialled, so it must fall in a CIDR whatever the host.

use std::net::IpAddr;

use crate::{Error, Result};

/// The one message for a host outside the list: the same whether it would have answered,
/// refused or timed out (nothing was tried), and it names no Secret value.
pub const NOT_ALLOWED: &str = "the backstop host is not in the controller's allowed backstop hosts (--backstop-allowed-hosts); no connection was attempted";

/// One CIDR: an address and a prefix length.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    len: u8,
}

impl Cidr {
    fn parse(s: &str) -> Option<Cidr> {
        let (a, len) = match s.split_once('/') {
            Some((a, l)) => (a, Some(l.parse::<u8>().ok()?)),
            None => (s, None),
        };
        let addr: IpAddr = a.parse().ok()?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let len = len.unwrap_or(max);
        (len <= max).then_some(Cidr { addr, len })
    }

    /// Whether `ip` falls in this network (an IPv4-mapped IPv6 address counts as its IPv4).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match (self.addr, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => prefix_eq(&n.octets(), &a.octets(), self.len),
            (IpAddr::V6(n), IpAddr::V6(a)) => prefix_eq(&n.octets(), &a.octets(), self.len),
            _ => false,
        }
    }
}

/// Whether the first `len` bits of `a` and `b` are equal.
fn prefix_eq(a: &[u8], b: &[u8], len: u8) -> bool {
    let (whole, rest) = (usize::from(len / 8), len % 8);
    if a[..whole] != b[..whole] {
        return false;
    }
    rest == 0 || {
        let mask = 0xffu8 << (8 - rest);
        a[whole] & mask == b[whole] & mask
    }
}

/// The allow-list; the default (empty) allows every host.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AllowedHosts {
    nets: Vec<Cidr>,
    names: Vec<String>,
}

/// Where to dial, as [`AllowedHosts::check`] decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dial {
    /// As configured (no list, or a host allowed by name).
    AsConfigured,
    /// This checked address (the host name is kept for TLS).
    Address(IpAddr),
}

impl AllowedHosts {
    /// Parses the entries: each a CIDR (`10.0.0.0/8`, `fd00::/8`), an address (a /32 or /128) or
    /// a host name. Empty entries are ignored. Start-up input: an error names the entry.
    pub fn parse<S: AsRef<str>>(entries: &[S]) -> Result<Self> {
        let mut list = AllowedHosts::default();
        for e in entries
            .iter()
            .map(|e| e.as_ref().trim())
            .filter(|e| !e.is_empty())
        {
            if let Some(c) = Cidr::parse(e) {
                list.nets.push(c);
            } else if is_host_name(e) {
                list.names.push(normal_name(e));
            } else {
                return Err(Error::Config(format!(
                    "--backstop-allowed-hosts: {e:?} is neither a CIDR, an IP address nor a host name"
                )));
            }
        }
        Ok(list)
    }

    /// Whether every host is allowed.
    pub fn allows_all(&self) -> bool {
        self.nets.is_empty() && self.names.is_empty()
    }

    /// Whether the address `ip` falls in a listed CIDR.
    pub fn allows_ip(&self, ip: IpAddr) -> bool {
        self.nets.iter().any(|n| n.contains(ip))
    }

    /// Whether `host` is listed by name.
    pub fn allows_name(&self, host: &str) -> bool {
        let host = normal_name(host);
        self.names.contains(&host)
    }

    /// The pure half of [`AllowedHosts::check`]: `host` (and the Secret's `hostaddr`) with what
    /// `host` resolved to (`resolved`, looked up only for a name that the list does not name).
    pub fn decide(
        &self,
        host: &str,
        hostaddr: Option<IpAddr>,
        resolved: &[IpAddr],
    ) -> Result<Dial> {
        if self.allows_all() {
            return Ok(Dial::AsConfigured);
        }
        let refused = || Err(Error::BackstopConfig(NOT_ALLOWED.into()));
        if let Some(ip) = hostaddr {
            return if self.allows_ip(ip) {
                Ok(Dial::AsConfigured)
            } else {
                refused()
            };
        }
        if let Ok(ip) = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>()
        {
            return if self.allows_ip(ip) {
                Ok(Dial::AsConfigured)
            } else {
                refused()
            };
        }
        if self.allows_name(host) {
            return Ok(Dial::AsConfigured);
        }
        match resolved.first() {
            Some(first) if resolved.iter().all(|ip| self.allows_ip(*ip)) => {
                Ok(Dial::Address(*first))
            }
            _ => refused(),
        }
    }

    /// Whether the backstop at `host`:`port` (with the Secret's `hostaddr`, if any) may be dialled,
    /// and where. Resolves `host` only when the list must judge its addresses; a name that does
    /// not resolve is refused with the same message as one outside the list.
    pub async fn check(&self, host: &str, hostaddr: Option<IpAddr>, port: u16) -> Result<Dial> {
        let must_resolve = !self.allows_all()
            && hostaddr.is_none()
            && host.parse::<IpAddr>().is_err()
            && !self.allows_name(host);
        let resolved: Vec<IpAddr> = if must_resolve {
            match tokio::net::lookup_host((host, port)).await {
                Ok(addrs) => addrs.map(|a| a.ip()).collect(),
                Err(_) => Vec::new(),
            }
        } else {
            Vec::new()
        };
        self.decide(host, hostaddr, &resolved)
    }
}

fn normal_name(s: &str) -> String {
    s.trim_end_matches('.').to_ascii_lowercase()
}

/// A DNS name: labels of letters, digits and hyphens (and underscores, which some internal zones
/// use), separated by dots.
fn is_host_name(s: &str) -> bool {
    let s = s.trim_end_matches('.');
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn list(entries: &[&str]) -> AllowedHosts {
        AllowedHosts::parse(entries).unwrap()
    }

    #[test]
    fn cidrs_match_by_prefix_for_v4_v6_and_mapped_addresses() {
        let l = list(&["10.0.0.0/8", "192.168.1.7", "fd00::/8", "172.16.0.0/12"]);
        for ok in [
            "10.1.2.3",
            "192.168.1.7",
            "fd12::1",
            "172.31.255.255",
            "::ffff:10.9.9.9",
        ] {
            assert!(l.allows_ip(ip(ok)), "{ok}");
        }
        for no in [
            "11.0.0.1",
            "192.168.1.8",
            "fe80::1",
            "172.32.0.0",
            "127.0.0.1",
            "::1",
        ] {
            assert!(!l.allows_ip(ip(no)), "{no}");
        }
        assert!(list(&["0.0.0.0/0"]).allows_ip(ip("203.0.113.9")));
        assert!(!list(&["0.0.0.0/0"]).allows_ip(ip("2001:db8::1")));
    }

    #[test]
    fn entries_parse_or_are_refused_by_name() {
        assert!(list(&[]).allows_all());
        assert!(list(&["", " "]).allows_all());
        let l = list(&["db.payments.svc.cluster.local.", "PG-1.example.com"]);
        assert!(l.allows_name("DB.payments.svc.cluster.local"));
        assert!(l.allows_name("pg-1.example.com."));
        assert!(!l.allows_name("evil.example.com"));
        for bad in [
            "10.0.0.0/33",
            "::/129",
            "http://db",
            "db:5432",
            "a..b",
            "-db",
        ] {
            let e = AllowedHosts::parse(&[bad]).unwrap_err().to_string();
            assert!(e.contains(bad), "{bad}: {e}");
        }
    }

    #[test]
    fn a_host_outside_the_list_is_refused_with_one_message_whatever_it_is() {
        let l = list(&["10.0.0.0/8", "db.example.com"]);
        let refused = |r: Result<Dial>| match r {
            Err(Error::BackstopConfig(m)) => m == NOT_ALLOWED,
            _ => false,
        };
        // An address outside, a name resolving outside, partly outside, or not at all.
        assert!(refused(l.decide("127.0.0.1", None, &[])));
        assert!(refused(l.decide("[::1]", None, &[])));
        assert!(refused(l.decide(
            "evil.example.com",
            None,
            &[ip("192.0.2.1")]
        )));
        assert!(refused(l.decide(
            "mixed.example.com",
            None,
            &[ip("10.0.0.1"), ip("192.0.2.1")]
        )));
        assert!(refused(l.decide("nxdomain.example.com", None, &[])));
        // A listed name with a hostaddr outside: the address dialled decides.
        assert!(refused(l.decide(
            "db.example.com",
            Some(ip("192.0.2.1")),
            &[]
        )));
        // Allowed: an address inside, a listed name, a name resolving inside (dialled at the
        // address checked), a hostaddr inside.
        assert_eq!(l.decide("10.1.1.1", None, &[]).unwrap(), Dial::AsConfigured);
        assert_eq!(
            l.decide("DB.example.com", None, &[]).unwrap(),
            Dial::AsConfigured
        );
        assert_eq!(
            l.decide("pg.internal", None, &[ip("10.2.0.1"), ip("10.2.0.2")])
                .unwrap(),
            Dial::Address(ip("10.2.0.1"))
        );
        assert_eq!(
            l.decide("anything", Some(ip("10.3.0.1")), &[]).unwrap(),
            Dial::AsConfigured
        );
        // No list: everything, unresolved.
        assert_eq!(
            AllowedHosts::default()
                .decide("127.0.0.1", None, &[])
                .unwrap(),
            Dial::AsConfigured
        );
    }

    #[tokio::test]
    async fn check_resolves_a_name_once_and_dials_the_address_it_checked() {
        let l = list(&["127.0.0.0/8", "::1"]);
        match l.check("localhost", None, 5432).await.unwrap() {
            Dial::Address(a) => assert!(a.is_loopback(), "{a}"),
            other => panic!("dialled at a checked address, not {other:?}"),
        }
        let l = list(&["10.0.0.0/8"]);
        let e = l.check("localhost", None, 5432).await.unwrap_err();
        assert!(e.to_string().contains(NOT_ALLOWED), "{e}");
        let e = l
            .check("no-such-host.invalid", None, 5432)
            .await
            .unwrap_err();
        assert!(e.to_string().contains(NOT_ALLOWED), "{e}");
    }
}

//! SPIFFE IDs (`spiffe://trust-domain/path`), the identities of X509-SVIDs, checked as the
//! SPIFFE ID standard writes them, so a quota file and a certificate name a workload the same
//! way, byte for byte.
//!
//! The rules (SPIFFE ID standard, §2):
//! - the scheme is `spiffe`, lowercase, followed by `://`;
//! - the trust domain is 1-255 characters from `a-z`, `0-9`, `.`, `-`, `_` (lowercase only);
//!   no user info (`@`) and no port (`:`);
//! - the path is empty or `/segment` repeated; each segment is 1 or more characters from
//!   `a-z`, `A-Z`, `0-9`, `.`, `-`, `_`, and neither `.` nor `..`; no trailing `/`;
//! - no query (`?`) or fragment (`#`), no percent-encoding;
//! - at most 2048 bytes in all.
//!
//! Only canonical IDs pass (no case folding, no normalisation): two strings name the same
//! workload exactly when they are equal, which is what keys in a map need. The same path
//! under two trust domains is two identities.
//!
//! ```
//! use rdma_quota::spiffe::SpiffeId;
//!
//! let id: SpiffeId = "spiffe://prod.example.org/ns/payments/sa/api".parse()?;
//! assert_eq!(id.trust_domain(), "prod.example.org");
//! assert_eq!(id.path(), "/ns/payments/sa/api");
//! assert!("spiffe://Prod.example.org/api".parse::<SpiffeId>().is_err());
//! assert!("spiffe://example.org:8443/api".parse::<SpiffeId>().is_err());
//! # Ok::<(), rdma_quota::spiffe::SpiffeIdError>(())
//! ```

use std::fmt;
use std::str::FromStr;

/// The longest SPIFFE ID, in bytes (SPIFFE ID standard §2.3).
pub const MAX_LEN: usize = 2048;
/// The longest trust domain name, in bytes (the URI host limit, SPIFFE ID standard §2.3).
pub const MAX_TRUST_DOMAIN_LEN: usize = 255;

const SCHEME: &str = "spiffe://";

/// Why a string is not a SPIFFE ID.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SpiffeIdError {
    /// It does not start with `spiffe://`.
    #[error("a SPIFFE ID starts with \"spiffe://\" (lowercase)")]
    Scheme,
    /// Longer than [`MAX_LEN`].
    #[error("{0} bytes is longer than a SPIFFE ID may be ({MAX_LEN})")]
    TooLong(usize),
    /// Nothing between `spiffe://` and the path.
    #[error("the trust domain is missing (spiffe://TRUST-DOMAIN/path)")]
    NoTrustDomain,
    /// Longer than [`MAX_TRUST_DOMAIN_LEN`].
    #[error("the trust domain is {0} bytes, more than {MAX_TRUST_DOMAIN_LEN}")]
    TrustDomainTooLong(usize),
    /// The authority has user info (`user@domain`).
    #[error("a SPIFFE ID has no user info ('@') in its trust domain")]
    UserInfo,
    /// The authority has a port (`domain:port`).
    #[error("a SPIFFE ID has no port (':') in its trust domain")]
    Port,
    /// A query (`?`).
    #[error("a SPIFFE ID has no query ('?')")]
    Query,
    /// A fragment (`#`).
    #[error("a SPIFFE ID has no fragment ('#')")]
    Fragment,
    /// A character the trust domain may not hold.
    #[error(
        "{0:?} is not allowed in a trust domain: use lowercase letters, digits, '.', '-', '_'"
    )]
    TrustDomainChar(char),
    /// A character a path segment may not hold.
    #[error("{0:?} is not allowed in a SPIFFE ID path: use letters, digits, '.', '-', '_'")]
    PathChar(char),
    /// `//`, or a `/` at the end.
    #[error("a SPIFFE ID path has no empty segments ('//') and no trailing '/'")]
    EmptySegment,
    /// A `.` or `..` segment.
    #[error("a SPIFFE ID path has no '.' or '..' segments")]
    DotSegment,
}

/// A valid SPIFFE ID ([module docs](self) for the rules).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SpiffeId {
    id: String,
    /// Where the path starts in `id` (the end of the trust domain).
    path_at: usize,
}

impl SpiffeId {
    /// Checks `text` against the SPIFFE ID rules.
    pub fn parse(text: &str) -> Result<SpiffeId, SpiffeIdError> {
        let rest = text.strip_prefix(SCHEME).ok_or(SpiffeIdError::Scheme)?;
        if text.len() > MAX_LEN {
            return Err(SpiffeIdError::TooLong(text.len()));
        }
        // A query or fragment anywhere is named as such, before the character checks.
        if rest.contains('?') {
            return Err(SpiffeIdError::Query);
        }
        if rest.contains('#') {
            return Err(SpiffeIdError::Fragment);
        }
        let td_len = rest.find('/').unwrap_or(rest.len());
        let (domain, path) = rest.split_at(td_len);
        if domain.contains('@') {
            return Err(SpiffeIdError::UserInfo);
        }
        if domain.contains(':') {
            return Err(SpiffeIdError::Port);
        }
        if domain.is_empty() {
            return Err(SpiffeIdError::NoTrustDomain);
        }
        if domain.len() > MAX_TRUST_DOMAIN_LEN {
            return Err(SpiffeIdError::TrustDomainTooLong(domain.len()));
        }
        if let Some(c) = domain.chars().find(|&c| {
            !(c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '-' | '_'))
        }) {
            return Err(SpiffeIdError::TrustDomainChar(c));
        }
        if !path.is_empty() {
            // `path` starts with '/': every segment follows one.
            for segment in path[1..].split('/') {
                if segment.is_empty() {
                    return Err(SpiffeIdError::EmptySegment);
                }
                if segment == "." || segment == ".." {
                    return Err(SpiffeIdError::DotSegment);
                }
                if let Some(c) = segment
                    .chars()
                    .find(|&c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_')))
                {
                    return Err(SpiffeIdError::PathChar(c));
                }
            }
        }
        Ok(SpiffeId {
            id: text.to_owned(),
            path_at: SCHEME.len() + td_len,
        })
    }

    /// The trust domain (`example.org` of `spiffe://example.org/api`).
    pub fn trust_domain(&self) -> &str {
        &self.id[SCHEME.len()..self.path_at]
    }

    /// The path, empty or starting with `/` (`/api` of `spiffe://example.org/api`).
    pub fn path(&self) -> &str {
        &self.id[self.path_at..]
    }

    /// The whole ID.
    pub fn as_str(&self) -> &str {
        &self.id
    }

    /// The whole ID, owned.
    pub fn into_string(self) -> String {
        self.id
    }
}

/// Whether `text` is meant as a SPIFFE ID (its scheme is `spiffe`, in any case), valid or not:
/// such a name is judged by the SPIFFE rules and its error names what is wrong.
pub fn looks_like_spiffe_id(text: &str) -> bool {
    text.get(..7)
        .is_some_and(|s| s.eq_ignore_ascii_case("spiffe:"))
}

impl FromStr for SpiffeId {
    type Err = SpiffeIdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        SpiffeId::parse(s)
    }
}

impl fmt::Display for SpiffeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.id)
    }
}

impl AsRef<str> for SpiffeId {
    fn as_ref(&self) -> &str {
        &self.id
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_ids_keep_their_parts() {
        for (text, domain, path) in [
            ("spiffe://example.org", "example.org", ""),
            ("spiffe://example.org/api", "example.org", "/api"),
            (
                "spiffe://k8s-west.example_1.com/ns/Staging/sa/default",
                "k8s-west.example_1.com",
                "/ns/Staging/sa/default",
            ),
            ("spiffe://td/a.b/..c/-_", "td", "/a.b/..c/-_"),
        ] {
            let id = SpiffeId::parse(text).expect(text);
            assert_eq!((id.trust_domain(), id.path()), (domain, path), "{text}");
            assert_eq!(id.to_string(), text);
        }
    }

    #[test]
    fn every_rule_refuses_with_its_reason() {
        use SpiffeIdError::*;
        let long_domain = format!("spiffe://{}/a", "d".repeat(256));
        let long_id = format!("spiffe://td/{}", "p".repeat(MAX_LEN));
        for (text, want) in [
            ("https://example.org/api", Scheme),
            ("SPIFFE://example.org/api", Scheme),
            ("spiffe:/example.org/api", Scheme),
            ("alice", Scheme),
            ("spiffe://", NoTrustDomain),
            ("spiffe:///api", NoTrustDomain),
            ("spiffe://Example.org/api", TrustDomainChar('E')),
            ("spiffe://exa%6dple.org/api", TrustDomainChar('%')),
            ("spiffe://bob@example.org/api", UserInfo),
            ("spiffe://example.org:443/api", Port),
            ("spiffe://example.org/api?x=1", Query),
            ("spiffe://example.org/api#frag", Fragment),
            ("spiffe://example.org/", EmptySegment),
            ("spiffe://example.org/a//b", EmptySegment),
            ("spiffe://example.org/a/", EmptySegment),
            ("spiffe://example.org/a/./b", DotSegment),
            ("spiffe://example.org/..", DotSegment),
            ("spiffe://example.org/a b", PathChar(' ')),
            ("spiffe://example.org/a%20b", PathChar('%')),
            ("spiffe://example.org/caf\u{e9}", PathChar('\u{e9}')),
            (long_domain.as_str(), TrustDomainTooLong(256)),
            (long_id.as_str(), TooLong(long_id.len())),
        ] {
            assert_eq!(SpiffeId::parse(text), Err(want), "{text}");
        }
        // Exactly the limit is fine.
        let max = format!("spiffe://td/{}", "p".repeat(MAX_LEN - "spiffe://td/".len()));
        assert_eq!(max.len(), MAX_LEN);
        SpiffeId::parse(&max).expect("2048 bytes");
    }

    #[test]
    fn the_same_path_under_two_trust_domains_is_two_ids() {
        let a = SpiffeId::parse("spiffe://a.example/ns/x/sa/alice").unwrap();
        let b = SpiffeId::parse("spiffe://b.example/ns/x/sa/alice").unwrap();
        assert_eq!(a.path(), b.path());
        assert_ne!(a, b);
    }

    #[test]
    fn spiffe_ish_names_are_recognised_in_any_case() {
        assert!(looks_like_spiffe_id("spiffe://x"));
        assert!(looks_like_spiffe_id("SPIFFE://X"));
        assert!(!looks_like_spiffe_id("spiff"));
        assert!(!looks_like_spiffe_id("alice"));
    }
}

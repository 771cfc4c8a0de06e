//! Quota thresholds: the `rdma-monitor` file format and `--limit` flags.
//!
//! A file holds one limit a line, `KEY VALUE` for everyone or
//! `tenant NAME KEY VALUE` for one identity; `#` starts a comment, also after
//! an entry. `0` disables a limit.
//!
//! ```text
//! QP_COUNT 1000        # live QPs at most
//! MR_BYTES 1073741824  # registered MR bytes at most
//! MR_REG 200           # MR registrations per second
//! tenant alice QP_COUNT 4
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use crate::key::LimitKey;
use crate::verb::{Resource, Verb};

/// What is wrong with one limit entry, wherever it came from.
///
/// [`ConfigError`] adds where the entry was (file and line, or flag).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EntryError {
    /// The key names no limit.
    #[error("unknown key {key:?} (expected one of: {})", LimitKey::expected())]
    UnknownKey {
        /// The key as written.
        key: String,
    },
    /// The key names a destroying verb.
    #[error("{verb} cannot be limited: destruction is never limited, it only frees resources")]
    Destruction {
        /// The destroying verb.
        verb: Verb,
    },
    /// The value is not a number.
    #[error("value {value:?} for {key} is not a non-negative integer")]
    BadValue {
        /// The key the value was for.
        key: LimitKey,
        /// The value as written.
        value: String,
    },
    /// The value does not fit in 64 bits.
    #[error("value {value} for {key} is too large (at most {})", u64::MAX)]
    TooLarge {
        /// The key the value was for.
        key: LimitKey,
        /// The value as written.
        value: String,
    },
    /// A key without a value.
    #[error("missing value for {key}")]
    MissingValue {
        /// The key without a value.
        key: LimitKey,
    },
    /// `tenant NAME` without a key.
    #[error("missing key after \"tenant {tenant}\"")]
    MissingKey {
        /// The tenant whose line stops early.
        tenant: String,
    },
    /// `tenant` without a name.
    #[error("missing tenant name after \"tenant\"")]
    MissingTenant,
    /// More tokens than `KEY VALUE`.
    #[error("unexpected {extra:?} after \"{key} {value}\" (use '#' for comments)")]
    ExtraTokens {
        /// The key of the entry.
        key: LimitKey,
        /// The value of the entry, as written.
        value: String,
        /// Everything after the value.
        extra: String,
    },
    /// A tenant name that no client certificate can have.
    #[error(
        "invalid tenant name {name:?}: tenants are client certificate names, 1-64 characters \
         from A-Z, a-z, 0-9, '.', '_', '-', not starting with '.', not \"ca\" or \"server\", \
         whole cgroup paths such as /lab.slice/job.scope (rdma-collector --tenant-by cgroup), \
         or SPIFFE IDs such as spiffe://example.org/ns/prod/sa/alice"
    )]
    BadTenant {
        /// The name as written.
        name: String,
    },
    /// A tenant written as a SPIFFE ID that breaks the SPIFFE ID rules.
    #[error("invalid tenant {name:?}: not a valid SPIFFE ID: {reason}")]
    BadSpiffeId {
        /// The name as written.
        name: String,
        /// Which rule it breaks.
        reason: crate::spiffe::SpiffeIdError,
    },
    /// The same key twice for the same scope.
    #[error("duplicate {key}{} (first set on line {first_line})", for_tenant(.tenant))]
    Duplicate {
        /// The repeated key.
        key: LimitKey,
        /// The tenant, or `None` for a global limit.
        tenant: Option<String>,
        /// Where the key was first set.
        first_line: usize,
    },
    /// A `--limit` flag that is neither `KEY=VALUE` nor `tenant:NAME:KEY=VALUE`.
    #[error("expected KEY=VALUE or tenant:NAME:KEY=VALUE")]
    BadSetting,
}

fn for_tenant(tenant: &Option<String>) -> String {
    match tenant {
        Some(name) => format!(" for tenant {name}"),
        None => String::new(),
    }
}

/// A quota configuration that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A bad line in a quota file.
    #[error("{origin}:{line}: {problem}")]
    Line {
        /// The file name (or other origin) given to [`QuotaConfig::parse`].
        origin: String,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        problem: EntryError,
    },
    /// A bad `--limit` flag.
    #[error("limit {text:?}: {problem}")]
    Setting {
        /// The flag's value as given.
        text: String,
        /// What is wrong.
        problem: EntryError,
    },
    /// The quota file cannot be read.
    #[error("cannot read quota file {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// The limits of one scope: everyone together, or one tenant.
///
/// Only enabled limits are stored; a limit set to `0` is removed.
///
/// # Examples
///
/// ```
/// use rdma_quota::{LimitKey, Limits, Resource, Verb};
///
/// let mut limits = Limits::default();
/// limits.set(LimitKey::count(Resource::Qp), 4);
/// limits.set(LimitKey::MR_BYTES, 1 << 20);
/// assert_eq!(limits.count(Resource::Qp), Some(4));
/// assert_eq!(limits.rate(Verb::QpCreate), None);
///
/// limits.set(LimitKey::count(Resource::Qp), 0);
/// assert_eq!(limits.count(Resource::Qp), None);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Limits {
    values: BTreeMap<LimitKey, u64>,
}

impl Limits {
    /// The limit for `key`, if enabled.
    pub fn get(&self, key: LimitKey) -> Option<u64> {
        self.values.get(&key).copied()
    }

    /// The most live resources of this kind, if limited.
    pub fn count(&self, resource: Resource) -> Option<u64> {
        self.get(LimitKey::count(resource))
    }

    /// The most registered memory-region bytes, if limited.
    pub fn mr_bytes(&self) -> Option<u64> {
        self.get(LimitKey::MR_BYTES)
    }

    /// The most calls of `verb` per second, if limited.
    pub fn rate(&self, verb: Verb) -> Option<u64> {
        LimitKey::rate(verb).and_then(|key| self.get(key))
    }

    /// Sets a limit; `0` disables it.
    pub fn set(&mut self, key: LimitKey, value: u64) {
        if value == 0 {
            self.values.remove(&key);
        } else {
            self.values.insert(key, value);
        }
    }

    /// Whether no limit is enabled.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// The enabled limits, counts first, then `MR_BYTES`, then rates in verb
    /// order.
    pub fn iter(&self) -> impl Iterator<Item = (LimitKey, u64)> + '_ {
        self.values.iter().map(|(k, v)| (*k, *v))
    }
}

/// All quota thresholds: the global limits, which count every tenant
/// together, and each tenant's own limits.
///
/// # Examples
///
/// ```
/// use rdma_quota::{LimitSetting, QuotaConfig, Resource};
///
/// let text = "QP_COUNT 1000  # everyone\ntenant alice QP_COUNT 4\n";
/// let mut config = QuotaConfig::parse(text, "quota.conf")?;
/// assert_eq!(config.global.count(Resource::Qp), Some(1000));
/// assert_eq!(config.tenant("alice").and_then(|l| l.count(Resource::Qp)), Some(4));
///
/// // A --limit flag overrides the file.
/// config.apply(&"tenant:alice:QP_COUNT=8".parse::<LimitSetting>()?);
/// assert_eq!(config.to_string(), "QP_COUNT 1000\ntenant alice QP_COUNT 8\n");
///
/// let err = QuotaConfig::parse("QP_COUNT 1\nQP_CONT 2\n", "quota.conf").unwrap_err();
/// assert!(err.to_string().starts_with("quota.conf:2: unknown key \"QP_CONT\""));
/// # Ok::<(), rdma_quota::ConfigError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QuotaConfig {
    /// Limits on all tenants together.
    pub global: Limits,
    /// Limits on one tenant each, by identity (client certificate name).
    pub tenants: BTreeMap<String, Limits>,
}

impl QuotaConfig {
    /// Parses a quota file; `origin` names it in errors (usually the path).
    ///
    /// Every key may appear once per scope: a repeated key is an error, as it
    /// is almost always an edit that forgot the first one.
    pub fn parse(text: &str, origin: &str) -> Result<QuotaConfig, ConfigError> {
        let mut config = QuotaConfig::default();
        // Also disabled (0) entries, so that their repetition is caught too.
        let mut seen: BTreeMap<(Option<String>, LimitKey), usize> = BTreeMap::new();
        for (index, raw) in text.lines().enumerate() {
            let line = index + 1;
            let at = |problem| ConfigError::Line {
                origin: origin.to_owned(),
                line,
                problem,
            };
            let Some(entry) = parse_line(raw).map_err(at)? else {
                continue;
            };
            let scope = (entry.tenant.clone(), entry.key);
            if let Some(&first_line) = seen.get(&scope) {
                return Err(at(EntryError::Duplicate {
                    key: entry.key,
                    tenant: entry.tenant,
                    first_line,
                }));
            }
            seen.insert(scope, line);
            config.apply(&entry);
        }
        Ok(config)
    }

    /// Reads and parses a quota file.
    pub fn load(path: impl AsRef<Path>) -> Result<QuotaConfig, ConfigError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        QuotaConfig::parse(&text, &path.display().to_string())
    }

    /// Sets a global limit; `0` disables it.
    pub fn set(&mut self, key: LimitKey, value: u64) {
        self.global.set(key, value);
    }

    /// Sets a limit of one tenant; `0` disables it.
    pub fn set_tenant(
        &mut self,
        tenant: &str,
        key: LimitKey,
        value: u64,
    ) -> Result<(), EntryError> {
        validate_tenant(tenant)?;
        self.set_valid_tenant(tenant, key, value);
        Ok(())
    }

    fn set_valid_tenant(&mut self, tenant: &str, key: LimitKey, value: u64) {
        let limits = self.tenants.entry(tenant.to_owned()).or_default();
        limits.set(key, value);
        // An empty entry would render as nothing and only mislead `is_empty`.
        if limits.is_empty() {
            self.tenants.remove(tenant);
        }
    }

    /// Applies one setting, replacing an earlier value of the same key.
    pub fn apply(&mut self, setting: &LimitSetting) {
        match &setting.tenant {
            None => self.set(setting.key, setting.value),
            // The name was validated when the setting was made.
            Some(name) => self.set_valid_tenant(name, setting.key, setting.value),
        }
    }

    /// The limits of `tenant`, if it has any of its own.
    pub fn tenant(&self, tenant: &str) -> Option<&Limits> {
        self.tenants.get(tenant)
    }

    /// Whether no limit at all is enabled.
    pub fn is_empty(&self) -> bool {
        self.global.is_empty() && self.tenants.values().all(Limits::is_empty)
    }

    /// Every enabled limit, global ones first, as settings; each displays as
    /// one line of a quota file.
    pub fn entries(&self) -> impl Iterator<Item = LimitSetting> + '_ {
        let global = self.global.iter().map(|(key, value)| LimitSetting {
            tenant: None,
            key,
            value,
        });
        let tenants = self.tenants.iter().flat_map(|(name, limits)| {
            limits.iter().map(move |(key, value)| LimitSetting {
                tenant: Some(name.clone()),
                key,
                value,
            })
        });
        global.chain(tenants)
    }
}

/// Renders the effective configuration as a quota file, one line per limit;
/// parsing the result gives the same configuration.
impl fmt::Display for QuotaConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for entry in self.entries() {
            writeln!(f, "{entry}")?;
        }
        Ok(())
    }
}

/// One limit: a key, its value and whom it applies to.
///
/// As a `--limit` flag it parses from `KEY=VALUE` (a global limit) or
/// `tenant:NAME:KEY=VALUE` (a tenant's own limit). Keys never contain `:`, so
/// the key is what follows the last `:` and NAME may be a SPIFFE ID
/// (`tenant:spiffe://example.org/api:QP_COUNT=1`). It displays as a quota-file line
/// (`KEY VALUE` or `tenant NAME KEY VALUE`).
///
/// # Examples
///
/// ```
/// use rdma_quota::{LimitKey, LimitSetting, Resource};
///
/// let s: LimitSetting = "tenant:bob:QP_COUNT=4".parse()?;
/// assert_eq!(s.tenant(), Some("bob"));
/// assert_eq!(s.key(), LimitKey::count(Resource::Qp));
/// assert_eq!(s.value(), 4);
/// assert_eq!(s.to_string(), "tenant bob QP_COUNT 4");
///
/// let err = "QP_COUNT=four".parse::<LimitSetting>().unwrap_err();
/// assert_eq!(
///     err.to_string(),
///     "limit \"QP_COUNT=four\": value \"four\" for QP_COUNT is not a non-negative integer"
/// );
/// # Ok::<(), rdma_quota::ConfigError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitSetting {
    // Private so that every setting's tenant name has been validated.
    tenant: Option<String>,
    key: LimitKey,
    value: u64,
}

impl LimitSetting {
    /// The tenant, or `None` for a global limit.
    pub fn tenant(&self) -> Option<&str> {
        self.tenant.as_deref()
    }

    /// The limit.
    pub fn key(&self) -> LimitKey {
        self.key
    }

    /// The value; `0` disables the limit.
    pub fn value(&self) -> u64 {
        self.value
    }
}

impl FromStr for LimitSetting {
    type Err = ConfigError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        parse_setting(text).map_err(|problem| ConfigError::Setting {
            text: text.to_owned(),
            problem,
        })
    }
}

impl fmt::Display for LimitSetting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(name) = &self.tenant {
            write!(f, "tenant {name} ")?;
        }
        write!(f, "{} {}", self.key, self.value)
    }
}

fn parse_setting(text: &str) -> Result<LimitSetting, EntryError> {
    let (scope, value) = text.split_once('=').ok_or(EntryError::BadSetting)?;
    let (tenant, key) = match scope.strip_prefix("tenant:") {
        Some(rest) => {
            // The last ':': a SPIFFE ID tenant has two of its own.
            let (name, key) = rest.rsplit_once(':').ok_or(EntryError::BadSetting)?;
            validate_tenant(name)?;
            (Some(name.to_owned()), key)
        }
        None => (None, scope),
    };
    let key: LimitKey = key.trim().parse()?;
    let value = parse_value(key, value.trim())?;
    Ok(LimitSetting { tenant, key, value })
}

/// One line of a quota file: `None` for blank and comment-only lines.
fn parse_line(raw: &str) -> Result<Option<LimitSetting>, EntryError> {
    let content = raw.split_once('#').map_or(raw, |(before, _)| before);
    let mut tokens = content.split_whitespace();
    let Some(first) = tokens.next() else {
        return Ok(None);
    };
    let (tenant, key) = if first == "tenant" {
        let name = tokens.next().ok_or(EntryError::MissingTenant)?;
        validate_tenant(name)?;
        let key = tokens.next().ok_or_else(|| EntryError::MissingKey {
            tenant: name.to_owned(),
        })?;
        (Some(name.to_owned()), key)
    } else {
        (None, first)
    };
    let key: LimitKey = key.parse()?;
    let written = tokens.next().ok_or(EntryError::MissingValue { key })?;
    let value = parse_value(key, written)?;
    let extra: Vec<&str> = tokens.collect();
    if !extra.is_empty() {
        return Err(EntryError::ExtraTokens {
            key,
            value: written.to_owned(),
            extra: extra.join(" "),
        });
    }
    Ok(Some(LimitSetting { tenant, key, value }))
}

fn parse_value(key: LimitKey, written: &str) -> Result<u64, EntryError> {
    // `u64::from_str` alone would accept "+5"; a limit is plain digits.
    if written.is_empty() || !written.bytes().all(|b| b.is_ascii_digit()) {
        return Err(EntryError::BadValue {
            key,
            value: written.to_owned(),
        });
    }
    written.parse().map_err(|_| EntryError::TooLarge {
        key,
        value: written.to_owned(),
    })
}

/// Only names that can ever match a connection's tenant are accepted.
fn validate_tenant(name: &str) -> Result<(), EntryError> {
    // A name meant as a SPIFFE ID hears which SPIFFE rule it breaks.
    if crate::spiffe::looks_like_spiffe_id(name) {
        return crate::spiffe::SpiffeId::parse(name)
            .map(drop)
            .map_err(|reason| EntryError::BadSpiffeId {
                name: name.to_owned(),
                reason,
            });
    }
    if crate::tenant::is_valid_name(name) {
        Ok(())
    } else {
        Err(EntryError::BadTenant {
            name: name.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = "\
# comments with '#', also trailing
QP_COUNT 1000      # live QPs at most
MR_COUNT 5000
MR_BYTES 1073741824  # registered MR bytes at most
MR_REG 200         # MR registrations per second
QP_CREATE 100
PD_COUNT 0         # disabled

tenant alice QP_COUNT 4     # per-identity limit
tenant bob QP_CREATE 2
";

    fn error(text: &str) -> String {
        match QuotaConfig::parse(text, "quota.conf") {
            Ok(config) => panic!("accepted {text:?} as {config:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn parses_the_monitor_format() {
        let config = QuotaConfig::parse(EXAMPLE, "quota.conf").expect("example parses");
        assert_eq!(config.global.count(Resource::Qp), Some(1000));
        assert_eq!(config.global.count(Resource::Pd), None);
        assert_eq!(config.global.count(Resource::Mr), Some(5000));
        assert_eq!(config.global.mr_bytes(), Some(1 << 30));
        assert_eq!(config.global.rate(Verb::MrReg), Some(200));
        assert_eq!(config.global.rate(Verb::QpCreate), Some(100));
        assert_eq!(config.global.rate(Verb::QpModify), None);
        let alice = config.tenant("alice").expect("alice has limits");
        assert_eq!(alice.count(Resource::Qp), Some(4));
        assert_eq!(alice.rate(Verb::QpCreate), None);
        assert_eq!(
            config.tenant("bob").and_then(|l| l.rate(Verb::QpCreate)),
            Some(2)
        );
        assert!(!config.is_empty());
    }

    #[test]
    fn renders_the_effective_configuration_and_round_trips() {
        let config = QuotaConfig::parse(EXAMPLE, "quota.conf").expect("example parses");
        let rendered = config.to_string();
        assert_eq!(
            rendered,
            "QP_COUNT 1000\nMR_COUNT 5000\nMR_BYTES 1073741824\nQP_CREATE 100\nMR_REG 200\n\
             tenant alice QP_COUNT 4\ntenant bob QP_CREATE 2\n"
        );
        let again = QuotaConfig::parse(&rendered, "rendered").expect("rendering parses");
        assert_eq!(again, config);
    }

    #[test]
    fn empty_and_all_disabled_files_are_empty() {
        for text in ["", "# nothing\n\n   \n", "QP_COUNT 0\ntenant a MR_REG 0\n"] {
            let config = QuotaConfig::parse(text, "q").expect("parses");
            assert!(config.is_empty(), "{text:?}");
            assert_eq!(config.to_string(), "");
        }
    }

    #[test]
    fn unknown_key_lists_the_valid_ones() {
        assert_eq!(
            error("QP_COUNT 1\n\nQP_CONT 3\n"),
            "quota.conf:3: unknown key \"QP_CONT\" (expected one of: QP_COUNT, PD_COUNT, \
             CQ_COUNT, MR_COUNT, MR_BYTES, QP_CREATE, QP_MODIFY, PD_ALLOC, CQ_CREATE, MR_REG, \
             GID_QUERY, CM_SEND_REQ)"
        );
    }

    #[test]
    fn bad_values_are_named() {
        assert_eq!(
            error("\n\n\n\nQP_COUNT ten\n"),
            "quota.conf:5: value \"ten\" for QP_COUNT is not a non-negative integer"
        );
        assert_eq!(
            error("MR_BYTES -1"),
            "quota.conf:1: value \"-1\" for MR_BYTES is not a non-negative integer"
        );
        assert_eq!(
            error("MR_BYTES +1"),
            "quota.conf:1: value \"+1\" for MR_BYTES is not a non-negative integer"
        );
        assert_eq!(
            error("MR_BYTES 99999999999999999999"),
            "quota.conf:1: value 99999999999999999999 for MR_BYTES is too large \
             (at most 18446744073709551615)"
        );
    }

    #[test]
    fn destruction_is_never_limited() {
        assert_eq!(
            error("QP_DESTROY 5"),
            "quota.conf:1: QP_DESTROY cannot be limited: destruction is never limited, \
             it only frees resources"
        );
    }

    #[test]
    fn duplicates_name_both_lines() {
        assert_eq!(
            error("QP_COUNT 1\n# x\nQP_COUNT 0\n"),
            "quota.conf:3: duplicate QP_COUNT (first set on line 1)"
        );
        assert_eq!(
            error("tenant a QP_COUNT 1\nQP_COUNT 1\ntenant a QP_COUNT 2\n"),
            "quota.conf:3: duplicate QP_COUNT for tenant a (first set on line 1)"
        );
    }

    #[test]
    fn missing_and_extra_tokens() {
        assert_eq!(
            error("QP_COUNT"),
            "quota.conf:1: missing value for QP_COUNT"
        );
        assert_eq!(
            error("QP_COUNT 4 5 6 # c"),
            "quota.conf:1: unexpected \"5 6\" after \"QP_COUNT 4\" (use '#' for comments)"
        );
        assert_eq!(
            error("tenant"),
            "quota.conf:1: missing tenant name after \"tenant\""
        );
        assert_eq!(
            error("tenant alice # no key"),
            "quota.conf:1: missing key after \"tenant alice\""
        );
    }

    #[test]
    fn tenant_names_follow_certificate_names() {
        let long = "a".repeat(65);
        for bad in [".hidden", "a/b", "ca", "server", "ü", long.as_str()] {
            let msg = error(&format!("tenant {bad} QP_COUNT 1"));
            assert!(
                msg.starts_with(&format!("quota.conf:1: invalid tenant name {bad:?}")),
                "{msg}"
            );
        }
        let ok = "a".repeat(64);
        for good in ["alice", "a.b-c_d", "A9", ok.as_str()] {
            QuotaConfig::parse(&format!("tenant {good} QP_COUNT 1"), "q").expect(good);
        }
    }

    #[test]
    fn spiffe_ids_are_tenants_in_files_and_flags() {
        let text = "tenant spiffe://a.example/ns/x/sa/alice QP_COUNT 1 # a's alice\n\
                    tenant spiffe://b.example/ns/x/sa/alice QP_COUNT 3\n";
        let config = QuotaConfig::parse(text, "q").expect("SPIFFE tenants");
        let count = |t: &str| config.tenant(t).and_then(|l| l.count(Resource::Qp));
        // The same path under two trust domains: two tenants, each with its own limit.
        assert_eq!(count("spiffe://a.example/ns/x/sa/alice"), Some(1));
        assert_eq!(count("spiffe://b.example/ns/x/sa/alice"), Some(3));
        assert_eq!(count("alice"), None);
        // The rendered file parses back to the same configuration.
        assert_eq!(
            QuotaConfig::parse(&config.to_string(), "q").expect("round trip"),
            config
        );

        // As a flag the key follows the last ':'.
        let s: LimitSetting = "tenant:spiffe://a.example/ns/x/sa/alice:QP_COUNT=2"
            .parse()
            .expect("SPIFFE --limit");
        assert_eq!(s.tenant(), Some("spiffe://a.example/ns/x/sa/alice"));
        assert_eq!(s.key(), LimitKey::count(Resource::Qp));
        assert_eq!(s.value(), 2);
        assert_eq!(
            s.to_string(),
            "tenant spiffe://a.example/ns/x/sa/alice QP_COUNT 2"
        );
    }

    #[test]
    fn a_bad_spiffe_tenant_names_the_rule_it_breaks() {
        assert_eq!(
            error("tenant spiffe://Example.org/alice QP_COUNT 1"),
            "quota.conf:1: invalid tenant \"spiffe://Example.org/alice\": not a valid SPIFFE ID: \
             'E' is not allowed in a trust domain: use lowercase letters, digits, '.', '-', '_'"
        );
        let err = "tenant:spiffe://example.org:443/alice:QP_COUNT=1"
            .parse::<LimitSetting>()
            .unwrap_err()
            .to_string();
        assert!(
            err.ends_with(
                "not a valid SPIFFE ID: a SPIFFE ID has no port (':') in its trust domain"
            ),
            "{err}"
        );
    }

    #[test]
    fn unreadable_file_names_the_path() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("missing.conf");
        let err = QuotaConfig::load(&path).expect_err("missing file");
        let msg = err.to_string();
        assert!(
            msg.starts_with(&format!("cannot read quota file {}: ", path.display())),
            "{msg}"
        );
        assert!(matches!(err, ConfigError::Read { .. }));
    }

    #[test]
    fn load_reports_the_path_as_origin() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("quota.conf");
        std::fs::write(&path, "QP_COUNT 2\nMR_REG x\n").expect("write");
        let msg = QuotaConfig::load(&path).expect_err("bad value").to_string();
        assert!(
            msg.starts_with(&format!("{}:2: value \"x\"", path.display())),
            "{msg}"
        );
        std::fs::write(&path, EXAMPLE).expect("write");
        let config = QuotaConfig::load(&path).expect("good file");
        assert_eq!(config.global.rate(Verb::MrReg), Some(200));
    }

    #[test]
    fn settings_parse_and_override() {
        let mut config = QuotaConfig::parse("QP_COUNT 10\n", "q").expect("parses");
        for flag in ["QP_COUNT=4", " MR_BYTES = 4096 ", "tenant:alice:MR_REG=3"] {
            config.apply(&flag.parse().expect(flag));
        }
        assert_eq!(config.global.count(Resource::Qp), Some(4));
        assert_eq!(config.global.mr_bytes(), Some(4096));
        assert_eq!(
            config.tenant("alice").and_then(|l| l.rate(Verb::MrReg)),
            Some(3)
        );
        config.apply(&"tenant:alice:MR_REG=0".parse().expect("disable"));
        assert_eq!(config.tenant("alice"), None);
    }

    #[test]
    fn bad_settings_are_named() {
        let cases = [
            ("QP_COUNT", "limit \"QP_COUNT\": expected KEY=VALUE or tenant:NAME:KEY=VALUE"),
            ("tenant:alice=3", "limit \"tenant:alice=3\": expected KEY=VALUE or tenant:NAME:KEY=VALUE"),
            ("MR_DEREG=1", "limit \"MR_DEREG=1\": MR_DEREG cannot be limited: destruction is never limited, it only frees resources"),
            ("QP_COUNT=", "limit \"QP_COUNT=\": value \"\" for QP_COUNT is not a non-negative integer"),
        ];
        for (flag, expected) in cases {
            let err = flag.parse::<LimitSetting>().expect_err(flag);
            assert_eq!(err.to_string(), expected);
        }
        let err = "tenant:a b:QP_COUNT=1"
            .parse::<LimitSetting>()
            .expect_err("space");
        assert!(err.to_string().contains("invalid tenant name \"a b\""));
    }

    #[test]
    fn set_tenant_validates_and_prunes() {
        let mut config = QuotaConfig::default();
        let key = LimitKey::count(Resource::Cq);
        assert_eq!(
            config.set_tenant("../x", key, 1),
            Err(EntryError::BadTenant {
                name: "../x".into()
            })
        );
        config.set_tenant("carol", key, 2).expect("valid name");
        assert_eq!(
            config.tenant("carol").and_then(|l| l.count(Resource::Cq)),
            Some(2)
        );
        config.set_tenant("carol", key, 0).expect("valid name");
        assert!(config.is_empty());
        assert!(config.tenants.is_empty());
    }
}

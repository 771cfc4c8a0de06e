//! Log setup for the binaries: `tracing` to stderr, as text or JSON lines.

/// Log line format (`--log-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines (colored on a terminal).
    #[default]
    Text,
    /// One JSON object per line, for log shippers and tests.
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => Err(format!("unknown log format {other:?} (text or json)")),
        }
    }
}

/// Installs the process-wide subscriber, writing to stderr. `RUST_LOG` overrides
/// `default_filter` (an [`EnvFilter`](tracing_subscriber::EnvFilter) directive such as `info`).
///
/// Call it once, first thing in `main`; a second call (or another subscriber already set) is
/// ignored rather than a panic, so tests that share a process keep working.
///
/// ```no_run
/// use rdma_cli::logging::{self, LogFormat};
///
/// logging::init(LogFormat::Json, "info");
/// ```
pub fn init(format: LogFormat, default_filter: &str) {
    use tracing_subscriber::EnvFilter;
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .try_init(),
    };
}

#[cfg(test)]
mod tests {
    use super::LogFormat;

    #[test]
    fn formats_parse_and_name_the_choices() {
        assert_eq!("json".parse::<LogFormat>(), Ok(LogFormat::Json));
        assert_eq!("text".parse::<LogFormat>(), Ok(LogFormat::Text));
        let err = "xml".parse::<LogFormat>().unwrap_err();
        assert!(err.contains("text or json"), "{err}");
    }
}

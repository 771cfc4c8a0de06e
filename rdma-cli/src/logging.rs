//! Log setup for the binaries: `tracing` to stderr, as text or JSON lines.

/// Log line format: `--log-format text|json` on every long-running tool.
///
/// The one parser of it is clap's [`ValueEnum`](clap::ValueEnum): `--help` lists the values
/// and a bad one is clap's usage error (exit 2), the same in every tool.
///
/// ```
/// use clap::Parser;
/// use rdma_cli::logging::LogFormat;
///
/// #[derive(Parser)]
/// struct Cli {
///     /// Log format on stderr
///     #[arg(long, value_enum, default_value_t)]
///     log_format: LogFormat,
/// }
/// let cli = Cli::try_parse_from(["tool", "--log-format", "json"]).unwrap();
/// assert_eq!(cli.log_format, LogFormat::Json);
/// assert!(Cli::try_parse_from(["tool", "--log-format", "xml"]).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines (colored on a terminal).
    #[default]
    Text,
    /// One JSON object per line, for log shippers and tests.
    Json,
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
    use clap::ValueEnum;

    #[test]
    fn formats_parse_and_name_the_choices() {
        assert_eq!(LogFormat::from_str("json", false), Ok(LogFormat::Json));
        assert_eq!(LogFormat::from_str("text", false), Ok(LogFormat::Text));
        assert!(LogFormat::from_str("xml", false).is_err());
        let names: Vec<String> = LogFormat::value_variants()
            .iter()
            .filter_map(|v| v.to_possible_value())
            .map(|p| p.get_name().to_owned())
            .collect();
        assert_eq!(names, ["text", "json"]);
    }
}

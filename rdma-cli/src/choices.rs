//! Flag values that name secure-rdma types, as [`clap::ValueEnum`]s: `--help` lists them and
//! clap rejects anything else with its own error (exit 2), the same in secure-server and
//! secure-client.
//!
//! They are separate from the library's types because a library does not know about command
//! lines: `auto` is a choice of the command line, not a cipher.

use clap::ValueEnum;
use secure_rdma::protect::Cipher;
use secure_rdma::verbs::Poll;

/// `--poll busy|event`: how RDMA completions are awaited.
///
/// ```
/// use clap::ValueEnum;
/// use rdma_cli::choices::PollMode;
/// use secure_rdma::verbs::Poll;
///
/// let mode = PollMode::from_str("busy", false).unwrap();
/// assert_eq!(Poll::from(mode), Poll::Busy);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum PollMode {
    /// Poll the completion queue in a loop: the lowest latency, a core busy while waiting
    Busy,
    /// Sleep on the completion channel until a completion arrives: no CPU while idle
    #[default]
    Event,
}

impl From<PollMode> for Poll {
    fn from(mode: PollMode) -> Poll {
        match mode {
            PollMode::Busy => Poll::Busy,
            PollMode::Event => Poll::Event,
        }
    }
}

/// `--cipher auto|aes-256-gcm|chacha20-poly1305`: the payload ciphers a side accepts.
///
/// ```
/// use clap::ValueEnum;
/// use rdma_cli::choices::CipherChoice;
/// use secure_rdma::protect::Cipher;
///
/// let only = CipherChoice::from_str("chacha20-poly1305", false).unwrap();
/// assert_eq!(only.ciphers(), vec![Cipher::ChaCha20Poly1305]);
/// assert_eq!(CipherChoice::Auto.ciphers(), Cipher::preference().to_vec());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum CipherChoice {
    /// Either cipher, the fastest on this CPU first (AES-256-GCM where the CPU has AES
    /// instructions, else ChaCha20-Poly1305)
    #[default]
    Auto,
    /// AES-256-GCM only
    #[value(name = "aes-256-gcm")]
    Aes256Gcm,
    /// ChaCha20-Poly1305 only
    #[value(name = "chacha20-poly1305")]
    ChaCha20Poly1305,
}

impl CipherChoice {
    /// The ciphers this choice accepts, preferred first.
    pub fn ciphers(self) -> Vec<Cipher> {
        match self {
            CipherChoice::Auto => Cipher::preference().to_vec(),
            CipherChoice::Aes256Gcm => vec![Cipher::Aes256Gcm],
            CipherChoice::ChaCha20Poly1305 => vec![Cipher::ChaCha20Poly1305],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The spellings users already type keep working, and each cipher name is the library's.
    #[test]
    fn accepted_spellings_are_the_documented_ones() {
        let names = |vs: &[PollMode]| -> Vec<String> {
            vs.iter()
                .filter_map(|v| v.to_possible_value())
                .map(|p| p.get_name().to_owned())
                .collect()
        };
        assert_eq!(names(PollMode::value_variants()), ["busy", "event"]);
        let ciphers: Vec<String> = CipherChoice::value_variants()
            .iter()
            .filter_map(|v| v.to_possible_value())
            .map(|p| p.get_name().to_owned())
            .collect();
        assert_eq!(ciphers, ["auto", "aes-256-gcm", "chacha20-poly1305"]);
        for c in [Cipher::Aes256Gcm, Cipher::ChaCha20Poly1305] {
            let choice = CipherChoice::from_str(c.name(), false).expect("library name parses");
            assert_eq!(choice.ciphers(), vec![c]);
        }
        assert!(PollMode::from_str("spin", false).is_err());
    }
}

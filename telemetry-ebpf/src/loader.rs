//! Loading programs out of an aya [`Ebpf`] object: finding one by name and type, loading each
//! once, and turning aya's nested errors (with their verifier logs) into one readable line.
//!
//! Which programs a tool loads and where it attaches them is the tool's business
//! (`rdma-monitor`, `rdma-capture`); these are the pieces both need.

use std::collections::HashMap;

use aya::programs::{Program, ProgramError};
use aya::Ebpf;

/// The program `name` of `bpf`, as the program type `T` (`Xdp`, `KProbe`, ...).
///
/// A program missing from the object is [`ProgramError::UnexpectedProgramType`], as aya reports
/// a program of another type.
pub fn program<'a, T>(bpf: &'a mut Ebpf, name: &str) -> Result<&'a mut T, ProgramError>
where
    &'a mut T: TryFrom<&'a mut Program, Error = ProgramError>,
{
    bpf.program_mut(name)
        .ok_or(ProgramError::UnexpectedProgramType)?
        .try_into()
}

/// Loads programs into the kernel once each and remembers failures, for an object whose
/// programs attach to several functions (a program is loaded on first use).
#[derive(Debug)]
pub struct LoadOnce {
    object: &'static str,
    loaded: HashMap<&'static str, Result<(), String>>,
}

impl LoadOnce {
    /// Nothing loaded yet from `object` (its file name, for messages such as
    /// `program NAME missing from monitor.bpf.o`).
    pub fn new(object: &'static str) -> Self {
        Self {
            object,
            loaded: HashMap::new(),
        }
    }

    /// The program `name` as type `T`, loaded with `load` the first time it is asked for; a
    /// failure (missing, wrong type, rejected by the verifier) is a one-line description.
    pub fn program<'a, T>(
        &mut self,
        bpf: &'a mut Ebpf,
        name: &'static str,
        load: fn(&mut T) -> Result<(), ProgramError>,
    ) -> Result<&'a mut T, String>
    where
        &'a mut T: TryFrom<&'a mut Program, Error = ProgramError>,
    {
        let object = self.object;
        let prog: &mut T = bpf
            .program_mut(name)
            .ok_or_else(|| format!("program {name} missing from {object}"))?
            .try_into()
            .map_err(|e: ProgramError| format!("{name}: {e}"))?;
        let state = self.loaded.entry(name).or_insert_with(|| {
            load(prog).map_err(|e| format!("verifier rejected {name}: {}", error_chain(&e)))
        });
        state.clone()?;
        Ok(prog)
    }
}

/// `e` and each of its sources not already in the text, joined by `: `; a long result (a
/// verifier log) keeps its start and its last 500 bytes, where the rejection reason is.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(cause) = src {
        let c = cause.to_string();
        if !s.contains(&c) {
            s.push_str(": ");
            s.push_str(&c);
        }
        src = cause.source();
    }
    // Verifier logs are long: keep the end, where the rejection reason is.
    if s.len() > 600 {
        let cut = s.len() - 500;
        let cut = (cut..s.len())
            .find(|&i| s.is_char_boundary(i))
            .unwrap_or(cut);
        s = format!("{}... {}", &s[..80.min(s.len())], &s[cut..]);
    }
    s
}

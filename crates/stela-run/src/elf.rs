//! Whether a program can take a preload library: a dynamically linked ELF executable (one
//! with an interpreter, the dynamic loader that reads LD_PRELOAD). A statically linked one
//! (static-pie included: it has no interpreter) would run with its files unprotected, so
//! `stela run` refuses it. A script is left to its interpreter, which is checked when the
//! kernel runs it only in the sense that LD_PRELOAD reaches it.

use std::io::Read;
use std::path::{Path, PathBuf};

/// What a program file is.
#[derive(Debug, PartialEq, Eq)]
pub enum Linkage {
    /// An ELF file with a PT_INTERP header: the loader will read LD_PRELOAD.
    Dynamic,
    /// An ELF file without one: LD_PRELOAD would be ignored.
    Static,
    /// Not ELF (a script starting with `#!`, say).
    NotElf,
}

const PT_INTERP: u32 = 3;

/// Reads the ELF program headers of `path` (64- and 32-bit, little- and big-endian).
pub fn linkage(path: &Path) -> std::io::Result<Linkage> {
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(1 << 16)
        .read_to_end(&mut bytes)?;
    if bytes.len() < 52 || &bytes[..4] != b"\x7fELF" {
        return Ok(Linkage::NotElf);
    }
    let wide = bytes[4] == 2;
    let little = bytes[5] == 1;
    let read = |at: usize, len: usize| -> Option<u64> {
        let field = bytes.get(at..at + len)?;
        let mut value = 0u64;
        for i in 0..len {
            let byte = if little { field[len - 1 - i] } else { field[i] };
            value = (value << 8) | u64::from(byte);
        }
        Some(value)
    };
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, "truncated ELF header");
    let (phoff, phentsize, phnum) = if wide {
        (read(32, 8), read(54, 2), read(56, 2))
    } else {
        (read(28, 4), read(42, 2), read(44, 2))
    };
    let (phoff, phentsize, phnum) = (
        phoff.ok_or_else(bad)? as usize,
        phentsize.ok_or_else(bad)? as usize,
        phnum.ok_or_else(bad)? as usize,
    );
    for i in 0..phnum.min(256) {
        let kind = read(phoff + i * phentsize, 4).ok_or_else(bad)?;
        if kind as u32 == PT_INTERP {
            return Ok(Linkage::Dynamic);
        }
    }
    Ok(Linkage::Static)
}

/// The file `program` names: itself if it has a slash, else the first executable of that
/// name in `PATH`.
pub fn find_program(program: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    if program.as_os_str().as_encoded_bytes().contains(&b'/') {
        return Some(program.to_owned());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| {
            std::fs::metadata(candidate)
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dynamic_program_a_script_and_a_static_header_are_told_apart() {
        assert_eq!(linkage(Path::new("/bin/sh")).unwrap(), Linkage::Dynamic);
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("s");
        std::fs::write(&script, "#!/bin/sh\ntrue\n").unwrap();
        assert_eq!(linkage(&script).unwrap(), Linkage::NotElf);
        // A 64-bit little-endian header with one PT_LOAD program header and no PT_INTERP.
        let mut elf = vec![0u8; 64 + 56];
        elf[..4].copy_from_slice(b"\x7fELF");
        elf[4] = 2;
        elf[5] = 1;
        elf[32] = 64; // e_phoff
        elf[54] = 56; // e_phentsize
        elf[56] = 1; // e_phnum
        elf[64] = 1; // PT_LOAD
        let fixed = dir.path().join("static");
        std::fs::write(&fixed, &elf).unwrap();
        assert_eq!(linkage(&fixed).unwrap(), Linkage::Static);
        elf[64] = 3;
        std::fs::write(&fixed, &elf).unwrap();
        assert_eq!(linkage(&fixed).unwrap(), Linkage::Dynamic);
    }
}

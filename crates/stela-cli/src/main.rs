//! The `stela` command. Thin by design: it parses arguments and calls into the library, where
//! tests can reach the same code.

use std::process::ExitCode;

fn main() -> ExitCode {
    stela::run(std::env::args_os())
}

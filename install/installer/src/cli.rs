//! The command line of both binaries (`cni-installer`, `cni-rs-node`): the parsed options, or the
//! exit code after `--help` or a bad command line.

use std::fmt::Display;
use std::process::ExitCode;

/// `parsed` as an `Options::parse` returns it: the options; for `--help` (`Ok(None)`) the usage on
/// stdout and success; for an error the error and the usage on stderr and exit code 2.
pub fn options_or_exit<T>(parsed: Result<Option<T>, impl Display>, usage: &str) -> Result<T, ExitCode> {
    match parsed {
        Ok(Some(options)) => Ok(options),
        Ok(None) => {
            println!("{usage}");
            Err(ExitCode::SUCCESS)
        }
        Err(err) => {
            eprintln!("error: {err}\n{usage}");
            Err(ExitCode::from(2))
        }
    }
}

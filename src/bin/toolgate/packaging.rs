//! What a package installs beside the binary, printed by the binary itself
//! so it always matches the command line: shell completions
//! (`toolgate completions bash|zsh|fish|elvish|powershell`, clap_complete)
//! and the manual page (`toolgate man`, clap_mangen): the top-level page,
//! then a section per command with its own options.

use std::io::Write;
use std::process::ExitCode;

use clap::CommandFactory;

use crate::args::Cli;

pub fn print_completions(shell: clap_complete::Shell) -> ExitCode {
    let mut command = Cli::command();
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut command, "toolgate", &mut out);
    write_out(&out)
}

pub fn print_man_page() -> ExitCode {
    let mut out = Vec::new();
    match man_page(&mut out) {
        Ok(()) => write_out(&out),
        Err(error) => {
            eprintln!("error: cannot render the man page: {error}");
            ExitCode::from(2)
        }
    }
}

/// `toolgate(1)`: the top-level page, then each command's usage, text and
/// options (and its subcommands'), as further sections of the same page.
fn man_page(out: &mut Vec<u8>) -> std::io::Result<()> {
    let command = Cli::command();
    clap_mangen::Man::new(command.clone()).render(out)?;
    let mut pending: Vec<(String, clap::Command)> = command
        .get_subcommands()
        .filter(|sub| sub.get_name() != "help")
        .map(|sub| (format!("toolgate {}", sub.get_name()), sub.clone()))
        .collect();
    while !pending.is_empty() {
        let (path, sub) = pending.remove(0);
        let sub = sub.bin_name(path.clone());
        writeln!(out, ".SH \"{}\"", path.to_uppercase())?;
        let man = clap_mangen::Man::new(sub.clone());
        man.render_synopsis_section(out)?;
        man.render_description_section(out)?;
        if sub.get_arguments().any(|arg| !arg.is_hide_set()) {
            man.render_options_section(out)?;
        }
        let children: Vec<(String, clap::Command)> = sub
            .get_subcommands()
            .filter(|child| child.get_name() != "help")
            .map(|child| (format!("{path} {}", child.get_name()), child.clone()))
            .collect();
        pending.splice(0..0, children);
    }
    Ok(())
}

fn write_out(bytes: &[u8]) -> ExitCode {
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(bytes).and_then(|()| stdout.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        // A closed pipe (`| head`) is not worth a message.
        Err(_) => ExitCode::from(2),
    }
}

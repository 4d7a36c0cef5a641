//! The `toolgate` binary: parses the command line and runs the command.
//! `serve` ([`serve`]) runs the library's server; the offline tools and
//! the reviewer/operator clients live in the modules beside this one.

#![warn(clippy::unwrap_used, clippy::expect_used)]

use std::process::ExitCode;

use clap::Parser;

use crate::args::{Cli, Command, ManifestCommand};

mod approvals;
mod args;
mod assess;
mod check_config;
mod client;
mod offline;
mod output;
mod packaging;
mod pins;
mod policy_test;
mod resource;
mod serve;
mod store;

/// mimalloc rather than glibc's malloc: a Dispatch allocates and frees
/// many small buffers across threads (request, records, audit line), and
/// glibc's malloc was a fifth of the server's CPU per call.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => serve::serve(args),
        Command::Canonical(input) => offline::run_json_tool(&input, false),
        Command::Fingerprint(input) => offline::run_json_tool(&input, true),
        Command::Manifest(ManifestCommand::Fingerprint(args)) => {
            offline::run_manifest_fingerprint(&args)
        }
        Command::Manifest(ManifestCommand::Assess(args)) => assess::run_manifest_assess(&args),
        Command::Approvals(args) => approvals::run_approvals(args),
        Command::Pins(args) => pins::run_pins(args),
        Command::Resource(args) => resource::run_resource(args),
        Command::CheckConfig(args) => check_config::run_check_config(&args),
        Command::Eval(args) => policy_test::run_eval(&args),
        Command::Test(args) => policy_test::run_test(&args),
        Command::Store(args) => store::run_store(&args),
        Command::Completions(args) => packaging::print_completions(args.shell),
        Command::Man => packaging::print_man_page(),
    }
}

//! `toolgate pins …`: list, add and remove trusted manifest pins
//! (reviewer credential).

use std::path::Path;
use std::process::ExitCode;

use toolgate::domain::manifest::Manifest;
use toolgate::pb;
use toolgate::pb::manifest_pins_client::ManifestPinsClient;

use crate::args::{OutputFormat, PinsArgs, PinsCommand};
use crate::client::{MAX_ANSWER_BYTES, connect, run};
use crate::output::{Failure, cell, emit, emit_proto, record, table, time_cell};

fn pin_source_name(source: pb::PinSource) -> &'static str {
    match source {
        pb::PinSource::Unspecified => "unspecified",
        pb::PinSource::Policy => "policy",
        pb::PinSource::Api => "api",
    }
}

fn pin_record(pin: &pb::Pin) -> String {
    record(&[
        ("server_id", cell(&pin.server_id)),
        ("fingerprint", cell(&pin.fingerprint)),
        ("revision", cell(&pin.revision)),
        ("source", pin_source_name(pin.source()).to_string()),
        ("pinned_by", cell(&pin.pinned_by)),
        ("pinned_at", time_cell(pin.pinned_at.as_ref())),
        ("tool_count", pin.tool_count.to_string()),
    ])
}

fn pin_table(pins: &[pb::Pin]) -> String {
    let rows: Vec<Vec<String>> = pins
        .iter()
        .map(|pin| {
            vec![
                cell(&pin.server_id),
                pin_source_name(pin.source()).to_string(),
                cell(&pin.revision),
                pin.tool_count.to_string(),
                cell(&pin.pinned_by),
                time_cell(pin.pinned_at.as_ref()),
                cell(&pin.fingerprint),
            ]
        })
        .collect();
    table(
        &[
            "SERVER_ID",
            "SOURCE",
            "REVISION",
            "TOOLS",
            "PINNED_BY",
            "PINNED_AT",
            "FINGERPRINT",
        ],
        &rows,
    )
}

fn print_pin(pin: &pb::Pin, output: OutputFormat) -> Result<(), Failure> {
    match output {
        OutputFormat::Table => emit(&pin_record(pin)),
        OutputFormat::Json => emit_proto(pin, "toolgate.v1.Pin"),
    }
}

// ----- pins ---------------------------------------------------------------

/// `toolgate pins …`.
pub fn run_pins(args: PinsArgs) -> ExitCode {
    run(pins(args))
}

fn read_manifest(file: &Path) -> Result<Manifest, Failure> {
    let bytes = std::fs::read(file)
        .map_err(|error| Failure::Usage(format!("cannot read {}: {error}", file.display())))?;
    Manifest::from_json(&bytes)
        .map_err(|error| Failure::Usage(format!("{}: {error}", file.display())))
}

async fn pins(args: PinsArgs) -> Result<(), Failure> {
    let output = args.client.output;
    // Local input is checked before any connection is made.
    let manifest = match &args.command {
        PinsCommand::Add { file, .. } => Some(read_manifest(file)?),
        PinsCommand::List | PinsCommand::Remove { .. } => None,
    };
    let (channel, auth) = connect(&args.client).await?;
    let mut client = ManifestPinsClient::with_interceptor(channel, auth)
        .max_decoding_message_size(MAX_ANSWER_BYTES);
    match args.command {
        PinsCommand::List => {
            let pins = client.list_pins(pb::ListPinsRequest {}).await?.into_inner();
            match output {
                OutputFormat::Table => emit(&pin_table(&pins.pins)),
                OutputFormat::Json => emit_proto(&pins, "toolgate.v1.ListPinsResponse"),
            }
        }
        PinsCommand::Add { expect, .. } => {
            let request = pb::PinManifestRequest {
                manifest: manifest.as_ref().map(pb::Manifest::from),
                expected_fingerprint: expect.unwrap_or_default(),
            };
            let pin = client.pin_manifest(request).await?.into_inner();
            print_pin(&pin, output)
        }
        PinsCommand::Remove { server_id } => {
            let pin = client
                .remove_pin(pb::RemovePinRequest { server_id })
                .await?
                .into_inner();
            print_pin(&pin, output)
        }
    }
}

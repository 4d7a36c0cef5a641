//! `toolgate resource …`: read the versioned resources Dispatch changes
//! (host or reviewer credential).

use std::process::ExitCode;

use toolgate::pb;
use toolgate::pb::resources_client::ResourcesClient;

use crate::args::{OutputFormat, ResourceArgs, ResourceCommand};
use crate::client::{MAX_ANSWER_BYTES, connect, run};
use crate::output::{Failure, cell, clip, emit, emit_proto, fitted_table, json_cell, record};

/// `toolgate resource …`.
pub fn run_resource(args: ResourceArgs) -> ExitCode {
    run(resource(args))
}

/// Column cap of the resource table's names; the values take what is left.
const RESOURCE_NAME_WIDTH: usize = 32;

async fn resource(args: ResourceArgs) -> Result<(), Failure> {
    let output = args.client.output;
    let (channel, auth) = connect(&args.client).await?;
    let mut client = ResourcesClient::with_interceptor(channel, auth)
        .max_decoding_message_size(MAX_ANSWER_BYTES);
    match args.command {
        ResourceCommand::Get { name } => {
            let mut resource = client
                .get_resource(pb::GetResourceRequest {
                    name: name.clone(),
                    ..Default::default()
                })
                .await?
                .into_inner();
            // A queue comes a page at a time: join the pages' items.
            while !resource.next_page_token.is_empty() {
                let page = client
                    .get_resource(pb::GetResourceRequest {
                        name: name.clone(),
                        page_token: std::mem::take(&mut resource.next_page_token),
                        ..Default::default()
                    })
                    .await?
                    .into_inner();
                let items = |json: &str| {
                    json.strip_prefix('[')
                        .and_then(|rest| rest.strip_suffix(']'))
                        .unwrap_or_default()
                        .to_string()
                };
                let (head, tail) = (items(&resource.value_json), items(&page.value_json));
                resource.value_json = match (head.is_empty(), tail.is_empty()) {
                    (_, true) => format!("[{head}]"),
                    (true, false) => format!("[{tail}]"),
                    (false, false) => format!("[{head},{tail}]"),
                };
                resource.version = page.version;
                resource.next_page_token = page.next_page_token;
            }
            match output {
                OutputFormat::Table => emit(&record(&[
                    ("name", cell(&resource.name)),
                    ("value", json_cell(&resource.value_json)),
                    ("version", resource.version.to_string()),
                ])),
                OutputFormat::Json => emit_proto(&resource, "toolgate.v1.Resource"),
            }
        }
        ResourceCommand::List => {
            let mut resources = Vec::new();
            let mut page_token = String::new();
            loop {
                let request = pb::ListResourcesRequest {
                    page_size: 0,
                    page_token: page_token.clone(),
                };
                let page = client.list_resources(request).await?.into_inner();
                resources.extend(page.resources);
                if page.next_page_token.is_empty() {
                    break;
                }
                page_token = page.next_page_token;
            }
            match output {
                OutputFormat::Table => {
                    let rows = resources
                        .iter()
                        .map(|resource| {
                            vec![
                                clip(&cell(&resource.name), RESOURCE_NAME_WIDTH),
                                resource.version.to_string(),
                                json_cell(&resource.value_json),
                            ]
                        })
                        .collect();
                    emit(&fitted_table(&["NAME", "VERSION", "VALUE"], rows))
                }
                OutputFormat::Json => emit_proto(
                    &pb::ListResourcesResponse {
                        resources,
                        next_page_token: String::new(),
                    },
                    "toolgate.v1.ListResourcesResponse",
                ),
            }
        }
    }
}

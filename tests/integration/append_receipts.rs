//! The append effect over real gRPC (issue 13 item 5): a receipt and an
//! answer carry what the commit appended and where (index, version), never
//! the whole queue; a replay answers exactly the same; GetResource reads a
//! queue a page at a time, bounded in items and bytes; a commit whose answer
//! could not be sent is refused before it applies.

use tonic::Code;
use toolgate::domain::policy::Serving;

use crate::support::policies::{integer, policy_with};
use crate::support::tokens::ALICE;
use crate::support::{TestServer, assert_invalid, authed, pb, proposal, violation_field};

/// The server's message limit in these tests: small, so that a request that
/// fits can carry arguments whose answer would not.
const MAX_MESSAGE_BYTES: usize = 16 * 1024;

fn policy() -> String {
    policy_with(
        "append",
        &[("server.max_message_bytes", integer(MAX_MESSAGE_BYTES))],
    )
}

fn post(call_id: &str, version: u64, text: &str) -> pb::Proposal {
    let arguments = serde_json::json!({ "text": text }).to_string();
    proposal(call_id, "agent", "post", version, &arguments)
}

/// The canonical JSON of the item `post` appends.
fn item(text: &str) -> String {
    serde_json::json!({ "text": text }).to_string()
}

async fn page(
    server: &TestServer,
    name: &str,
    page_token: &str,
    page_size: u32,
) -> Result<pb::Resource, tonic::Status> {
    server
        .resources()
        .get_resource(authed(
            pb::GetResourceRequest {
                name: name.to_string(),
                page_token: page_token.to_string(),
                page_size,
            },
            ALICE,
        ))
        .await
        .map(tonic::Response::into_inner)
}

/// What a replay must repeat of the first answer.
fn receipt_fields(
    answer: &pb::DispatchResponse,
) -> (i32, u64, String, String, String, Option<u64>) {
    (
        answer.status,
        answer.version,
        answer.resource.clone(),
        answer.value_json.clone(),
        answer.receipt_id.clone(),
        answer.appended_index,
    )
}

#[tokio::test]
async fn an_append_answers_with_the_item_and_its_index_and_a_replay_repeats_it() {
    let server = TestServer::start(&policy()).await;
    let mut answers = Vec::new();
    for (index, text) in ["first", "second", "third"].into_iter().enumerate() {
        let answer = server
            .dispatch_agent(&post(&format!("c{index}"), index as u64, text))
            .await
            .expect("Dispatch answers");
        assert_eq!(answer.status(), pb::DispatchStatus::Ok, "{answer:?}");
        assert_eq!(answer.reason, "committed");
        assert_eq!(answer.version, index as u64 + 1);
        assert_eq!(answer.resource, "queue");
        assert_eq!(answer.value_json, item(text), "the item, not the queue");
        assert_eq!(answer.appended_index, Some(index as u64));
        assert!(!answer.replayed);
        answers.push(answer);
    }

    // A replay of the second commit: the same receipt, nothing appended.
    let replay = server
        .dispatch_agent(&post("c1", 1, "second"))
        .await
        .expect("Dispatch answers");
    assert!(replay.replayed);
    assert_eq!(replay.reason, "replayed");
    assert_eq!(receipt_fields(&replay), receipt_fields(&answers[1]));

    let queue = server.resource(ALICE, "queue").await;
    assert_eq!(
        queue.value_json,
        format!("[{},{},{}]", item("first"), item("second"), item("third"))
    );
    assert_eq!(
        (queue.version, queue.item_count, queue.first_index),
        (3, Some(3), 0)
    );
    assert_eq!(queue.next_page_token, "");

    // A `set` answers with the value set and no index; a plain value has no
    // item count.
    let set = server
        .dispatch_agent(&proposal(
            "c9",
            "agent",
            "replace",
            0,
            r#"{"target":"note","value":"m"}"#,
        ))
        .await
        .expect("Dispatch answers");
    assert_eq!(set.status(), pb::DispatchStatus::Ok, "{set:?}");
    assert_eq!(
        (set.value_json.as_str(), set.appended_index),
        (r#""m""#, None)
    );
    let note = server.resource(ALICE, "note").await;
    assert_eq!(
        (
            note.value_json.as_str(),
            note.item_count,
            note.next_page_token.as_str()
        ),
        (r#""m""#, None, "")
    );
    server.stop().await;
}

/// A server whose queue holds ten items of 3,512 bytes (a page holds at
/// most 16 KiB - 1 KiB of JSON), and the texts posted.
async fn server_with_ten_items() -> (TestServer, Vec<String>) {
    let server = TestServer::start(&policy()).await;
    let texts: Vec<String> = (0..10)
        .map(|index| format!("{index}{}", "x".repeat(3500)))
        .collect();
    for (index, text) in texts.iter().enumerate() {
        let answer = server
            .dispatch_agent(&post(&format!("c{index}"), index as u64, text))
            .await
            .expect("Dispatch answers");
        assert_eq!(answer.status(), pb::DispatchStatus::Ok, "{answer:?}");
    }
    (server, texts)
}

#[tokio::test]
async fn get_resource_pages_a_queue_in_items_and_in_bytes() {
    let (server, texts) = server_with_ten_items().await;

    // By count: pages of 3 items.
    let mut token = String::new();
    let mut firsts = Vec::new();
    let mut items: Vec<serde_json::Value> = Vec::new();
    loop {
        let resource = page(&server, "queue", &token, 3).await.expect("page");
        assert_eq!(resource.item_count, Some(10));
        assert_eq!(resource.version, 10);
        firsts.push(resource.first_index);
        let page: Vec<serde_json::Value> =
            serde_json::from_str(&resource.value_json).expect("a JSON array");
        assert!(page.len() <= 3, "{} items", page.len());
        items.extend(page);
        if resource.next_page_token.is_empty() {
            break;
        }
        token = resource.next_page_token;
    }
    assert_eq!(firsts, [0, 3, 6, 9]);
    let expected: Vec<serde_json::Value> = texts
        .iter()
        .map(|text| serde_json::json!({ "text": text }))
        .collect();
    assert_eq!(items, expected);

    // By bytes: the default page size would take all 10; the message limit
    // cuts each page to 4 items (4 × 3,512 + 5 ≤ 15,360 < 5 × 3,512 + 6).
    let mut token = String::new();
    let mut sizes = Vec::new();
    loop {
        let resource = page(&server, "queue", &token, 0).await.expect("page");
        assert!(resource.value_json.len() <= MAX_MESSAGE_BYTES - 1024);
        let page: Vec<serde_json::Value> =
            serde_json::from_str(&resource.value_json).expect("a JSON array");
        sizes.push(page.len());
        if resource.next_page_token.is_empty() {
            break;
        }
        token = resource.next_page_token;
    }
    assert_eq!(sizes, [4, 4, 2]);

    // Bad requests name the field and the rule.
    for (name, token, size, field, rule) in [
        (
            "queue",
            "nonsense",
            0,
            "page_token",
            "is not a page token this server issued",
        ),
        (
            "queue",
            "0.11",
            0,
            "page_token",
            "is not a page token this server issued",
        ),
        (
            "queue",
            "",
            10_001,
            "page_size",
            "must be at most 10000, got 10001",
        ),
        (
            "note",
            "0.0",
            0,
            "page_token",
            "resource \"note\" is not a queue",
        ),
    ] {
        let status = page(&server, name, token, size).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{token}: {status:?}");
        assert_eq!(violation_field(&status), field, "{token}");
        assert!(status.message().contains(rule), "{token}: {status:?}");
    }

    // A token of a queue that was replaced since no longer reads on.
    let first = page(&server, "queue", "", 3).await.expect("page");
    let replaced = server
        .dispatch_agent(&proposal(
            "c-reset",
            "agent",
            "replace",
            10,
            r#"{"target":"queue","value":[]}"#,
        ))
        .await
        .expect("Dispatch answers");
    assert_eq!(replaced.status(), pb::DispatchStatus::Ok, "{replaced:?}");
    let status = page(&server, "queue", &first.next_page_token, 3)
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert!(
        status
            .message()
            .contains("was replaced since the page token was issued"),
        "{status:?}"
    );
    server.stop().await;
}

/// ListResources lists a queue as GetResource reads its first page,
/// bounded by what one answer may carry, with the token to read on: a
/// queue grows without a bound of its own and was listed whole.
#[tokio::test]
async fn list_resources_lists_a_queue_by_its_first_page() {
    let (server, texts) = server_with_ten_items().await;
    let listed = server
        .resources()
        .list_resources(authed(pb::ListResourcesRequest::default(), ALICE))
        .await
        .expect("ListResources")
        .into_inner();
    let queue = listed
        .resources
        .iter()
        .find(|resource| resource.name == "queue")
        .expect("the queue is listed");
    assert!(
        queue.value_json.len() <= MAX_MESSAGE_BYTES - 1024,
        "{}",
        queue.value_json.len()
    );
    let first: Vec<serde_json::Value> = serde_json::from_str(&queue.value_json).expect("JSON");
    assert_eq!(first.len(), 4);
    assert_eq!((queue.item_count, queue.first_index), (Some(10), 0));
    let rest = page(&server, "queue", &queue.next_page_token, 0)
        .await
        .expect("GetResource reads on from the listed page");
    assert_eq!(rest.first_index, 4);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&rest.value_json).expect("JSON")[0],
        serde_json::json!({ "text": texts[4] })
    );
    server.stop().await;
}

#[tokio::test]
async fn a_commit_whose_answer_could_not_be_sent_is_refused_before_it_applies() {
    let server = TestServer::start(&policy()).await;
    // A reload that raises the limit is refused: the listener keeps its
    // own, and so does every check that must agree with it (a commit whose
    // answer the listener could not send would be accepted).
    let raised = crate::support::policies::parse(&policy_with(
        "append",
        &[("server.max_message_bytes", integer(1 << 20))],
    ));
    let refused = server
        .engine
        .reload(raised, &Serving::plain(server.addr))
        .unwrap_err();
    assert!(refused.contains("(max_message_bytes)"), "{refused}");
    // Fits in a request (~15.6 KB < 16 KiB) but its answer (the item plus up
    // to 1 KiB of other fields) would not.
    let too_big = "y".repeat(MAX_MESSAGE_BYTES - 800);
    let status = server
        .dispatch_agent(&post("c-big", 0, &too_big))
        .await
        .unwrap_err();
    assert_invalid(
        &status,
        "proposal.arguments_json",
        "over the 16384-byte message limit (server.max_message_bytes); nothing was committed",
    );
    let queue = server.resource(ALICE, "queue").await;
    assert_eq!((queue.value_json.as_str(), queue.version), ("[]", 0));
    assert_eq!(server.engine.stats().expect("stats").receipts, 0);

    // One that fits commits, and its replay answers the same.
    let fits = "z".repeat(MAX_MESSAGE_BYTES - 1100);
    let committed = server
        .dispatch_agent(&post("c-fits", 0, &fits))
        .await
        .expect("Dispatch answers");
    assert_eq!(committed.status(), pb::DispatchStatus::Ok, "{committed:?}");
    assert_eq!(committed.value_json, item(&fits));
    let replay = server
        .dispatch_agent(&post("c-fits", 0, &fits))
        .await
        .expect("Dispatch answers");
    assert!(replay.replayed);
    assert_eq!(receipt_fields(&replay), receipt_fields(&committed));
    server.stop().await;
}

/// A list's items are never evicted, so what appends add counts under the
/// state's byte budget: once it is full an append is RESOURCE_EXHAUSTED and
/// changes nothing, and a `set` of the list, which empties it, makes room.
/// (Receipts pass their retention between two commits here, so that they
/// always make room: the list alone fills the budget.)
#[tokio::test]
async fn appends_are_bounded_by_the_state_byte_budget() {
    let server = TestServer::start(&policy_with(
        "append",
        &[
            ("server.max_message_bytes", integer(MAX_MESSAGE_BYTES)),
            ("limits.max_state_bytes", integer(64 * 1024)),
            ("limits.receipt_retention_seconds", integer(1)),
        ],
    ))
    .await;
    let text = "x".repeat(2000);
    let mut version = 0;
    let refusal = loop {
        server.clock.advance(std::time::Duration::from_secs(2));
        let call_id = format!("c{version}");
        match server.dispatch_agent(&post(&call_id, version, &text)).await {
            Ok(answer) => {
                assert_eq!(answer.status(), pb::DispatchStatus::Ok, "{answer:?}");
                version = answer.version;
            }
            Err(status) => break status,
        }
        assert!(version < 100, "the budget never refused an append");
    };
    assert_eq!(refusal.code(), Code::ResourceExhausted, "{refusal:?}");
    assert!(
        refusal.message().contains("(limits.max_state_bytes)")
            && refusal.message().contains("the items of lists"),
        "{refusal:?}"
    );
    assert!(version >= 10, "only {version} appends fit");
    let queue = server.resource(ALICE, "queue").await;
    assert_eq!((queue.version, queue.item_count), (version, Some(version)));

    server.clock.advance(std::time::Duration::from_secs(2));
    let emptied = server
        .dispatch_agent(&proposal(
            "c-empty",
            "agent",
            "replace",
            version,
            r#"{"target":"queue","value":[]}"#,
        ))
        .await
        .expect("Dispatch answers");
    assert_eq!(emptied.status(), pb::DispatchStatus::Ok, "{emptied:?}");
    let after = server
        .dispatch_agent(&post("c-after", emptied.version, &text))
        .await
        .expect("Dispatch answers");
    assert_eq!(after.status(), pb::DispatchStatus::Ok, "{after:?}");
    assert_eq!(after.appended_index, Some(0));
    server.stop().await;
}

/// A resource is read by every host and reviewer: what a commit keeps
/// there of an argument the tool marks sensitive is `"[redacted]"`, as in
/// the approval request a reviewer reads; so is what the answer and its
/// replay carry (the host sent the value itself).
#[tokio::test]
async fn sensitive_arguments_are_redacted_in_what_a_commit_keeps() {
    let sensitive = |keys: &[&str]| {
        toml::Value::Array(keys.iter().map(|key| toml::Value::from(*key)).collect())
    };
    let policy = policy_with(
        "append",
        &[
            ("tools.post.sensitive", sensitive(&["text"])),
            ("tools.replace.sensitive", sensitive(&["value"])),
        ],
    );
    let server = TestServer::start(&policy).await;
    let posted = server
        .dispatch_agent(&post("c1", 0, "account 123456"))
        .await
        .expect("Dispatch answers");
    assert_eq!(posted.status(), pb::DispatchStatus::Ok, "{posted:?}");
    assert_eq!(posted.value_json, item("[redacted]"));
    let replay = server
        .dispatch_agent(&post("c1", 0, "account 123456"))
        .await
        .expect("Dispatch answers");
    assert!(replay.replayed);
    assert_eq!(receipt_fields(&replay), receipt_fields(&posted));
    let queue = server.resource(ALICE, "queue").await;
    assert_eq!(queue.value_json, format!("[{}]", item("[redacted]")));

    let set = server
        .dispatch_agent(&proposal(
            "c2",
            "agent",
            "replace",
            0,
            r#"{"target":"note","value":"pin 4321"}"#,
        ))
        .await
        .expect("Dispatch answers");
    assert_eq!(set.status(), pb::DispatchStatus::Ok, "{set:?}");
    assert_eq!(set.value_json, r#""[redacted]""#);
    let note = server.resource(ALICE, "note").await;
    assert_eq!(note.value_json, r#""[redacted]""#);
    assert!(!format!("{queue:?}{note:?}").contains("123456"));
}

//! `toolgate eval` and `toolgate test`: a policy asked offline, through the
//! server's own handlers ([`toolgate::in_process`]) on a fresh in-memory
//! state, so the answers are the ones a server on the policy gives: the
//! same validation, fingerprint, check order, reasons and statuses.
//!
//! A test file is TOML (README, "Testing a policy"): `[[case]]` tables,
//! each run on a fresh engine (the policy's initial state), its steps in
//! order on that one engine: calls (`decide`/`dispatch`) with what their
//! answer must be, reviewer actions on the latest approval, and clock
//! moves.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use tonic::{Code, Status};

use toolgate::domain::canonical::{self, Number, Object, Value};
use toolgate::domain::clock::{Clock, ManualClock, SystemClock};
use toolgate::domain::decision::Reason;
use toolgate::domain::policy::{Credential, Policy};
use toolgate::engine::Engine;
use toolgate::in_process::{InProcess, host_credential, reviewer_credential};
use toolgate::pb;

use crate::args::{EvalArgs, TestArgs};
use crate::output::{Failure, emit, emit_proto, printable, proto_json, say};

// ----- shared --------------------------------------------------------------

/// Loads the policy as `serve --config` does; warnings go to stderr.
fn load_policy(path: &Path, warn: bool) -> Result<Policy, Failure> {
    let policy = Policy::load(path).map_err(|error| Failure::Usage(error.to_string()))?;
    if warn {
        for warning in &policy.warnings {
            say(&format!(
                "warning: {}: {}: {}",
                path.display(),
                warning.key,
                warning.message
            ));
        }
    }
    Ok(policy)
}

fn runtime() -> Result<tokio::runtime::Runtime, Failure> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|error| Failure::Usage(format!("cannot start the runtime: {error}")))
}

fn engine(policy: Policy, clock: Arc<dyn Clock>) -> Result<InProcess, Failure> {
    let engine = Engine::new(policy, clock)
        .map_err(|error| Failure::Usage(format!("cannot start the engine: {error}")))?;
    Ok(InProcess::new(engine))
}

/// The keys of a proposal: exactly the ones its fingerprint is made of.
const PROPOSAL_KEYS: [&str; 5] = ["call_id", "actor", "name", "version", "arguments"];

/// A proposal JSON text (`{"call_id", "actor", "name", "version",
/// "arguments"}`) as the request message carries it; `arguments` is sent
/// as its canonical JSON. Keys left out are protobuf defaults (the server
/// then says what is missing).
fn proposal_from_json(bytes: &[u8], source: &str) -> Result<pb::Proposal, String> {
    let value = canonical::parse(bytes).map_err(|error| format!("{source}: {error}"))?;
    let Value::Object(object) = value else {
        return Err(format!(
            "{source}: a proposal must be a JSON object with the keys {}",
            PROPOSAL_KEYS.join(", ")
        ));
    };
    if let Some(unknown) = object.keys().find(|key| !PROPOSAL_KEYS.contains(key)) {
        return Err(format!(
            "{source}: unknown key {unknown:?} (a proposal has {})",
            PROPOSAL_KEYS.join(", ")
        ));
    }
    let text = |key: &str| -> Result<String, String> {
        match object.get(key) {
            None => Ok(String::new()),
            Some(Value::String(text)) => Ok(text.clone()),
            Some(other) => Err(format!(
                "{source}: {key}: expected a string, found {}",
                other.kind_name()
            )),
        }
    };
    let version = match object.get("version") {
        None => 0,
        Some(Value::Number(Number::Int(number))) => u64::try_from(*number)
            .map_err(|_| format!("{source}: version: must be a non-negative integer"))?,
        Some(other) => {
            return Err(format!(
                "{source}: version: expected a non-negative integer, found {}",
                other.kind_name()
            ));
        }
    };
    Ok(pb::Proposal {
        call_id: text("call_id")?,
        actor: text("actor")?,
        name: text("name")?,
        version,
        arguments_json: object
            .get("arguments")
            .map(canonical::to_canonical)
            .unwrap_or_default(),
    })
}

fn read_file(path: &Path) -> Result<Vec<u8>, String> {
    if path == Path::new("-") {
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin().lock(), &mut bytes)
            .map_err(|error| format!("cannot read stdin: {error}"))?;
        return Ok(bytes);
    }
    std::fs::read(path).map_err(|error| format!("cannot read {}: {error}", path.display()))
}

// ----- eval ------------------------------------------------------------------

/// `--session ACTOR,SESSION_ID,WORKSPACE` as the request's session (the
/// server validates each part).
fn session_option(text: &str) -> Result<pb::Session, Failure> {
    let parts: Vec<&str> = text.split(',').collect();
    match parts.as_slice() {
        [actor, session_id, workspace] => Ok(pb::Session {
            actor: (*actor).to_string(),
            session_id: (*session_id).to_string(),
            workspace: (*workspace).to_string(),
        }),
        _ => Err(Failure::Usage(format!(
            "--session must be ACTOR,SESSION_ID,WORKSPACE, not {:?}",
            printable(text)
        ))),
    }
}

/// `toolgate eval --config POLICY --session A,S,W [--host ID] [--dispatch] PROPOSAL.json`.
pub fn run_eval(args: &EvalArgs) -> ExitCode {
    match eval(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => failure.report(),
    }
}

fn eval(args: &EvalArgs) -> Result<(), Failure> {
    let session = session_option(&args.session)?;
    let source = args.proposal.display().to_string();
    let proposal = read_file(&args.proposal)
        .and_then(|bytes| proposal_from_json(&bytes, &source))
        .map_err(Failure::Usage)?;
    let policy = load_policy(&args.config, true)?;
    let host = host_credential(&policy, args.host.as_deref()).map_err(Failure::Usage)?;
    let calls = engine(policy, Arc::new(SystemClock))?;
    runtime()?.block_on(async {
        if args.dispatch {
            let request = pb::DispatchRequest {
                session: Some(session),
                proposal: Some(proposal),
            };
            let answer = calls.dispatch(&host, request).await?;
            emit_proto(&answer, "toolgate.v1.DispatchResponse")
        } else {
            let request = pb::DecideRequest {
                session: Some(session),
                proposal: Some(proposal),
            };
            let answer = calls.decide(&host, request).await?;
            emit_proto(&answer, "toolgate.v1.DecideResponse")
        }
    })
}

// ----- the test file, as written -------------------------------------------

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TestFile {
    /// Host identity to call as (default as for `eval`).
    host: Option<String>,
    /// Reviewer of review steps that name none.
    reviewer: Option<String>,
    #[serde(default)]
    case: Vec<CaseSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CaseSpec {
    name: String,
    session: Option<SessionSpec>,
    /// One call as the whole case (instead of `step`).
    rpc: Option<Rpc>,
    proposal: Option<ProposalSpec>,
    proposal_file: Option<PathBuf>,
    expect: Option<ExpectSpec>,
    #[serde(default)]
    step: Vec<StepSpec>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct StepSpec {
    session: Option<SessionSpec>,
    rpc: Option<Rpc>,
    proposal: Option<ProposalSpec>,
    proposal_file: Option<PathBuf>,
    expect: Option<ExpectSpec>,
    review: Option<ReviewAction>,
    reviewer: Option<String>,
    note: Option<String>,
    advance_seconds: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Rpc {
    Decide,
    Dispatch,
}

impl Rpc {
    fn as_str(self) -> &'static str {
        match self {
            Rpc::Decide => "decide",
            Rpc::Dispatch => "dispatch",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum ReviewAction {
    Grant,
    Deny,
    Revoke,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct SessionSpec {
    actor: String,
    session_id: String,
    workspace: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProposalSpec {
    #[serde(default)]
    call_id: String,
    #[serde(default)]
    actor: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    version: u64,
    arguments: Option<toml::Value>,
    arguments_json: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExpectSpec {
    outcome: Option<String>,
    status: Option<String>,
    reason: Option<String>,
    error: Option<String>,
    message: Option<String>,
    fingerprint: Option<String>,
    replayed: Option<bool>,
    version: Option<u64>,
    resource: Option<String>,
    value: Option<toml::Value>,
}

// ----- the test file, checked ----------------------------------------------

struct Case {
    name: String,
    steps: Vec<Step>,
}

enum Step {
    Call {
        rpc: Rpc,
        session: pb::Session,
        proposal: pb::Proposal,
        /// Boxed: the other steps are small.
        expect: Box<Expected>,
    },
    Review {
        action: ReviewAction,
        reviewer: String,
        note: String,
        error: Option<Code>,
        message: Option<String>,
    },
    Advance(Duration),
}

/// What a call's answer must be; `None` is not checked.
#[derive(Default)]
struct Expected {
    error: Option<Code>,
    message: Option<String>,
    /// The enum's short name (`ALLOW`, `OK`): an outcome for Decide, a
    /// status for Dispatch.
    verdict: Option<String>,
    reason: Option<String>,
    fingerprint: Option<String>,
    replayed: Option<bool>,
    version: Option<u64>,
    resource: Option<String>,
    value: Option<String>,
}

/// gRPC status codes by their canonical names.
const CODES: [(&str, Code); 16] = [
    ("CANCELLED", Code::Cancelled),
    ("UNKNOWN", Code::Unknown),
    ("INVALID_ARGUMENT", Code::InvalidArgument),
    ("DEADLINE_EXCEEDED", Code::DeadlineExceeded),
    ("NOT_FOUND", Code::NotFound),
    ("ALREADY_EXISTS", Code::AlreadyExists),
    ("PERMISSION_DENIED", Code::PermissionDenied),
    ("RESOURCE_EXHAUSTED", Code::ResourceExhausted),
    ("FAILED_PRECONDITION", Code::FailedPrecondition),
    ("ABORTED", Code::Aborted),
    ("OUT_OF_RANGE", Code::OutOfRange),
    ("UNIMPLEMENTED", Code::Unimplemented),
    ("INTERNAL", Code::Internal),
    ("UNAVAILABLE", Code::Unavailable),
    ("DATA_LOSS", Code::DataLoss),
    ("UNAUTHENTICATED", Code::Unauthenticated),
];

fn code_name(code: Code) -> &'static str {
    CODES
        .iter()
        .find(|(_, known)| *known == code)
        .map_or("OK", |(name, _)| name)
}

const OUTCOME_PREFIX: &str = "OUTCOME_";
const STATUS_PREFIX: &str = "DISPATCH_STATUS_";

/// An outcome or status name, short (`ALLOW`) or as the proto spells it
/// (`OUTCOME_ALLOW`), as its short name; `None` when there is no such value.
fn verdict_name(rpc: Rpc, name: &str) -> Option<String> {
    let prefix = match rpc {
        Rpc::Decide => OUTCOME_PREFIX,
        Rpc::Dispatch => STATUS_PREFIX,
    };
    let short = name.strip_prefix(prefix).unwrap_or(name);
    let known = match rpc {
        Rpc::Decide => pb::Outcome::from_str_name(&format!("{prefix}{short}")).is_some(),
        Rpc::Dispatch => pb::DispatchStatus::from_str_name(&format!("{prefix}{short}")).is_some(),
    };
    (known && short != "UNSPECIFIED").then(|| short.to_string())
}

fn toml_to_json(value: &toml::Value, key: &str) -> Result<Value, String> {
    Ok(match value {
        toml::Value::String(text) => Value::String(text.clone()),
        toml::Value::Integer(number) => Value::Number(Number::Int(i128::from(*number))),
        toml::Value::Float(number) if number.is_finite() => Value::Number(Number::Float(*number)),
        toml::Value::Float(_) => return Err(format!("{key}: nan and inf are not JSON numbers")),
        toml::Value::Boolean(flag) => Value::Bool(*flag),
        toml::Value::Datetime(_) => {
            return Err(format!(
                "{key}: a TOML date-time is not JSON; write it as a string"
            ));
        }
        toml::Value::Array(items) => Value::Array(
            items
                .iter()
                .enumerate()
                .map(|(index, item)| toml_to_json(item, &format!("{key}[{index}]")))
                .collect::<Result<_, _>>()?,
        ),
        toml::Value::Table(table) => {
            let mut object = Object::new();
            for (name, item) in table {
                object.insert(name.clone(), toml_to_json(item, &format!("{key}.{name}"))?);
            }
            Value::Object(object)
        }
    })
}

/// Checks a test file against the policy and makes its cases runnable.
struct Checker<'a> {
    policy: &'a Policy,
    dir: PathBuf,
    reviewer: Option<String>,
}

impl Checker<'_> {
    fn cases(&self, file: TestFile) -> Result<Vec<Case>, String> {
        if file.case.is_empty() {
            return Err("the file has no [[case]]".to_string());
        }
        file.case
            .into_iter()
            .enumerate()
            .map(|(index, case)| self.case(&format!("case[{index}]"), case))
            .collect()
    }

    fn case(&self, key: &str, case: CaseSpec) -> Result<Case, String> {
        let single = case.rpc.is_some()
            || case.proposal.is_some()
            || case.proposal_file.is_some()
            || case.expect.is_some();
        let specs = match (single, case.step.is_empty()) {
            (true, false) => {
                return Err(format!(
                    "{key}: a case is one call (rpc, proposal, expect) or a list of [[case.step]], not both"
                ));
            }
            (false, true) => {
                return Err(format!("{key}: the case has no call and no [[case.step]]"));
            }
            (true, true) => vec![(
                key.to_string(),
                StepSpec {
                    rpc: case.rpc,
                    proposal: case.proposal,
                    proposal_file: case.proposal_file,
                    expect: case.expect,
                    ..StepSpec::default()
                },
            )],
            (false, false) => case
                .step
                .into_iter()
                .enumerate()
                .map(|(index, step)| (format!("{key}.step[{index}]"), step))
                .collect(),
        };
        let mut previous: Option<pb::Proposal> = None;
        let mut steps = Vec::new();
        for (step_key, spec) in specs {
            steps.push(self.step(&step_key, spec, case.session.as_ref(), &mut previous)?);
        }
        Ok(Case {
            name: case.name,
            steps,
        })
    }

    fn step(
        &self,
        key: &str,
        spec: StepSpec,
        case_session: Option<&SessionSpec>,
        previous: &mut Option<pb::Proposal>,
    ) -> Result<Step, String> {
        let calls = spec.rpc.is_some()
            || spec.proposal.is_some()
            || spec.proposal_file.is_some()
            || spec.session.is_some();
        if let Some(seconds) = spec.advance_seconds {
            if calls
                || spec.review.is_some()
                || spec.expect.is_some()
                || spec.reviewer.is_some()
                || spec.note.is_some()
            {
                return Err(format!(
                    "{key}: a step with advance_seconds takes no other key"
                ));
            }
            return Ok(Step::Advance(Duration::from_secs(seconds)));
        }
        if let Some(action) = spec.review {
            if calls {
                return Err(format!(
                    "{key}: a review step takes only review, reviewer, note and expect"
                ));
            }
            let reviewer = self.reviewer(key, spec.reviewer)?;
            let expect = spec.expect.unwrap_or_default();
            let only_error = expect.outcome.is_none()
                && expect.status.is_none()
                && expect.reason.is_none()
                && expect.fingerprint.is_none()
                && expect.replayed.is_none()
                && expect.version.is_none()
                && expect.resource.is_none()
                && expect.value.is_none();
            if !only_error {
                return Err(format!(
                    "{key}.expect: a review step's expect takes only error and message"
                ));
            }
            return Ok(Step::Review {
                action,
                reviewer,
                note: spec.note.unwrap_or_default(),
                error: self.code(key, expect.error.as_deref())?,
                message: expect.message,
            });
        }
        if spec.reviewer.is_some() || spec.note.is_some() {
            return Err(format!("{key}: reviewer and note belong to a review step"));
        }
        let rpc = spec.rpc.unwrap_or(Rpc::Decide);
        let session =
            spec.session.as_ref().or(case_session).ok_or_else(|| {
                format!("{key}: no session (set session in the case or the step)")
            })?;
        let proposal = match (spec.proposal, spec.proposal_file) {
            (Some(_), Some(_)) => {
                return Err(format!("{key}: proposal or proposal_file, not both"));
            }
            (Some(proposal), None) => self.proposal(&format!("{key}.proposal"), proposal)?,
            (None, Some(file)) => {
                let path = self.dir.join(&file);
                let source = path.display().to_string();
                read_file(&path).and_then(|bytes| proposal_from_json(&bytes, &source))?
            }
            (None, None) => previous.clone().ok_or_else(|| {
                format!("{key}: no proposal (and no earlier call in the case to repeat)")
            })?,
        };
        *previous = Some(proposal.clone());
        let expect = spec
            .expect
            .ok_or_else(|| format!("{key}: no expect (what the answer must be)"))?;
        Ok(Step::Call {
            rpc,
            session: pb::Session {
                actor: session.actor.clone(),
                session_id: session.session_id.clone(),
                workspace: session.workspace.clone(),
            },
            proposal,
            expect: Box::new(self.expected(&format!("{key}.expect"), rpc, expect)?),
        })
    }

    fn reviewer(&self, key: &str, named: Option<String>) -> Result<String, String> {
        let reviewer = match named.or_else(|| self.reviewer.clone()) {
            Some(reviewer) => reviewer,
            None => {
                let mut names: Vec<&String> = self.policy.reviewers.keys().collect();
                names.sort();
                match names.first() {
                    Some(first) => (*first).clone(),
                    None => return Err(format!("{key}: the policy declares no reviewer")),
                }
            }
        };
        if !self.policy.reviewers.contains_key(&reviewer) {
            return Err(format!(
                "{key}: no reviewer {reviewer:?} in the policy's [reviewers]"
            ));
        }
        Ok(reviewer)
    }

    fn code(&self, key: &str, name: Option<&str>) -> Result<Option<Code>, String> {
        let Some(name) = name else { return Ok(None) };
        CODES
            .iter()
            .find(|(known, _)| *known == name)
            .map(|(_, code)| Some(*code))
            .ok_or_else(|| {
                format!(
                    "{key}.expect.error: {name:?} is not a gRPC status code name (INVALID_ARGUMENT, …)"
                )
            })
    }

    fn proposal(&self, key: &str, spec: ProposalSpec) -> Result<pb::Proposal, String> {
        let arguments_json = match (spec.arguments, spec.arguments_json) {
            (Some(_), Some(_)) => {
                return Err(format!("{key}: arguments or arguments_json, not both"));
            }
            (Some(arguments), None) => {
                canonical::to_canonical(&toml_to_json(&arguments, &format!("{key}.arguments"))?)
            }
            (None, Some(text)) => text,
            (None, None) => String::new(),
        };
        Ok(pb::Proposal {
            call_id: spec.call_id,
            actor: spec.actor,
            name: spec.name,
            version: spec.version,
            arguments_json,
        })
    }

    fn expected(&self, key: &str, rpc: Rpc, spec: ExpectSpec) -> Result<Expected, String> {
        let (verdict_key, verdict, wrong) = match rpc {
            Rpc::Decide => ("outcome", spec.outcome, spec.status.is_some()),
            Rpc::Dispatch => ("status", spec.status, spec.outcome.is_some()),
        };
        if wrong {
            return Err(match rpc {
                Rpc::Decide => format!("{key}: status is Dispatch's; Decide answers an outcome"),
                Rpc::Dispatch => format!("{key}: outcome is Decide's; Dispatch answers a status"),
            });
        }
        let dispatch_only = spec.replayed.is_some()
            || spec.version.is_some()
            || spec.resource.is_some()
            || spec.value.is_some();
        if rpc == Rpc::Decide && dispatch_only {
            return Err(format!(
                "{key}: replayed, version, resource and value are Dispatch's"
            ));
        }
        let error = self.code(key.trim_end_matches(".expect"), spec.error.as_deref())?;
        if error.is_some() {
            if verdict.is_some()
                || spec.reason.is_some()
                || spec.fingerprint.is_some()
                || dispatch_only
            {
                return Err(format!(
                    "{key}: an expected error takes only message (an error has no answer fields)"
                ));
            }
        } else if verdict.is_none() {
            return Err(format!("{key}: missing key {verdict_key} (or error)"));
        }
        let verdict = match verdict {
            None => None,
            Some(name) => Some(verdict_name(rpc, &name).ok_or_else(|| {
                format!(
                    "{key}.{verdict_key}: {name:?} is not a {} {verdict_key}",
                    rpc.as_str()
                )
            })?),
        };
        if let Some(reason) = &spec.reason
            && !Reason::ALL.iter().any(|known| known.as_str() == reason)
        {
            let known: Vec<&str> = Reason::ALL.iter().map(|known| known.as_str()).collect();
            return Err(format!(
                "{key}.reason: {reason:?} is not a reason (one of {})",
                known.join(", ")
            ));
        }
        let value = match &spec.value {
            Some(value) => Some(canonical::to_canonical(&toml_to_json(
                value,
                &format!("{key}.value"),
            )?)),
            None => None,
        };
        Ok(Expected {
            error,
            message: spec.message,
            verdict,
            reason: spec.reason,
            fingerprint: spec.fingerprint,
            replayed: spec.replayed,
            version: spec.version,
            resource: spec.resource,
            value,
        })
    }
}

// ----- running ---------------------------------------------------------------

/// `toolgate test --config POLICY TESTS.toml`.
pub fn run_test(args: &TestArgs) -> ExitCode {
    match test(args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(failure) => failure.report(),
    }
}

fn test(args: &TestArgs) -> Result<bool, Failure> {
    let policy = load_policy(&args.config, true)?;
    let source = args.tests.display().to_string();
    let text = String::from_utf8(read_file(&args.tests).map_err(Failure::Usage)?)
        .map_err(|_| Failure::Usage(format!("{source}: not UTF-8")))?;
    let file: TestFile = toml::from_str(&text).map_err(|error| {
        Failure::Usage(format!(
            "{source}: {}",
            error.to_string().trim_end().replace('\n', "\n  ")
        ))
    })?;
    let host = host_credential(&policy, file.host.as_deref())
        .map_err(|message| Failure::Usage(format!("{source}: host: {message}")))?;
    let checker = Checker {
        policy: &policy,
        dir: args
            .tests
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default(),
        reviewer: file.reviewer.clone(),
    };
    let cases = checker
        .cases(file)
        .map_err(|message| Failure::Usage(format!("{source}: {message}")))?;
    drop(policy);
    let runtime = runtime()?;
    let mut failed = 0usize;
    let mut report = String::new();
    for case in &cases {
        // Each case on a fresh engine: the policy's initial state.
        let policy = load_policy(&args.config, false)?;
        let clock = ManualClock::starting_at(SystemClock.now());
        let calls = engine(policy, Arc::new(clock.clone()))?;
        let differences = runtime.block_on(run_case(&calls, &clock, &host, case))?;
        if differences.is_empty() {
            report.push_str(&format!("ok    {}\n", case.name));
        } else {
            failed += 1;
            report.push_str(&format!("FAIL  {}\n", case.name));
            for line in differences {
                report.push_str(&format!("      {line}\n"));
            }
        }
    }
    report.push_str(&format!(
        "\n{} case{}: {} passed, {failed} failed\n",
        cases.len(),
        if cases.len() == 1 { "" } else { "s" },
        cases.len() - failed
    ));
    emit(&report)?;
    Ok(failed == 0)
}

/// Runs a case's steps in order; what differed at the first step that
/// failed (empty when the case passed).
async fn run_case(
    calls: &InProcess,
    clock: &ManualClock,
    host: &Arc<Credential>,
    case: &Case,
) -> Result<Vec<String>, Failure> {
    let mut approval_id = String::new();
    for (index, step) in case.steps.iter().enumerate() {
        let number = index + 1;
        let differences = match step {
            Step::Advance(duration) => {
                clock.advance(*duration);
                Vec::new()
            }
            Step::Call {
                rpc,
                session,
                proposal,
                expect,
            } => {
                let label = format!("step {number} ({} {})", rpc.as_str(), proposal.call_id);
                let answer = call(calls, host, *rpc, session, proposal).await?;
                if let Ok(got) = &answer
                    && !got.approval_id.is_empty()
                {
                    approval_id.clone_from(&got.approval_id);
                }
                compare(*rpc, expect, &answer)
                    .into_iter()
                    .map(|line| format!("{label}: {line}"))
                    .collect()
            }
            Step::Review {
                action,
                reviewer,
                note,
                error,
                message,
            } => {
                let label = format!("step {number} (review {action:?} as {reviewer})");
                if approval_id.is_empty() {
                    vec![format!(
                        "{label}: no approval to review: no earlier answer carried an approval id"
                    )]
                } else {
                    let answer =
                        review(calls, *action, reviewer, note.clone(), approval_id.clone()).await;
                    compare_review(error.as_ref(), message.as_deref(), answer)
                        .into_iter()
                        .map(|line| format!("{label}: {line}"))
                        .collect()
                }
            }
        };
        if !differences.is_empty() {
            return Ok(differences);
        }
    }
    Ok(Vec::new())
}

/// A call's answer in the fields the test compares, with its JSON.
struct Answer {
    verdict: String,
    reason: String,
    message: String,
    fingerprint: String,
    approval_id: String,
    replayed: bool,
    version: u64,
    resource: String,
    value: String,
    json: String,
}

async fn call(
    calls: &InProcess,
    host: &Arc<Credential>,
    rpc: Rpc,
    session: &pb::Session,
    proposal: &pb::Proposal,
) -> Result<Result<Answer, Status>, Failure> {
    let session = Some(session.clone());
    let proposal = Some(proposal.clone());
    match rpc {
        Rpc::Decide => {
            let request = pb::DecideRequest { session, proposal };
            match calls.decide(host, request).await {
                Ok(answer) => Ok(Ok(Answer {
                    verdict: short(answer.outcome().as_str_name(), OUTCOME_PREFIX),
                    json: proto_json(&answer, "toolgate.v1.DecideResponse", false)?,
                    reason: answer.reason,
                    message: answer.message,
                    fingerprint: answer.fingerprint,
                    approval_id: answer.approval_id,
                    replayed: false,
                    version: 0,
                    resource: String::new(),
                    value: String::new(),
                })),
                Err(status) => Ok(Err(status)),
            }
        }
        Rpc::Dispatch => {
            let request = pb::DispatchRequest { session, proposal };
            match calls.dispatch(host, request).await {
                Ok(answer) => Ok(Ok(Answer {
                    verdict: short(answer.status().as_str_name(), STATUS_PREFIX),
                    json: proto_json(&answer, "toolgate.v1.DispatchResponse", false)?,
                    reason: answer.reason,
                    message: answer.message,
                    fingerprint: answer.fingerprint,
                    approval_id: answer.approval_id,
                    replayed: answer.replayed,
                    version: answer.version,
                    resource: answer.resource,
                    value: answer.value_json,
                })),
                Err(status) => Ok(Err(status)),
            }
        }
    }
}

fn short(name: &str, prefix: &str) -> String {
    name.strip_prefix(prefix).unwrap_or(name).to_string()
}

async fn review(
    calls: &InProcess,
    action: ReviewAction,
    reviewer: &str,
    note: String,
    approval_id: String,
) -> Result<pb::Approval, Status> {
    let reviewer = reviewer_credential(reviewer);
    match action {
        ReviewAction::Grant => {
            let request = pb::GrantApprovalRequest {
                approval_id,
                comment: note,
            };
            calls.grant_approval(&reviewer, request).await
        }
        ReviewAction::Deny => {
            let request = pb::DenyApprovalRequest {
                approval_id,
                reason: note,
            };
            calls.deny_approval(&reviewer, request).await
        }
        ReviewAction::Revoke => {
            let request = pb::RevokeApprovalRequest {
                approval_id,
                reason: note,
            };
            calls.revoke_approval(&reviewer, request).await
        }
    }
}

fn got_error(status: &Status) -> String {
    format!(
        "error {}: {}",
        code_name(status.code()),
        printable(status.message())
    )
}

/// `field: expected X, got Y` for each expected field the answer differs in.
fn compare(rpc: Rpc, expect: &Expected, answer: &Result<Answer, Status>) -> Vec<String> {
    let got = match (answer, expect.error) {
        (Err(status), Some(code)) => {
            let mut differences = Vec::new();
            if status.code() != code {
                differences.push(format!(
                    "error: expected {}, got {}",
                    code_name(code),
                    got_error(status)
                ));
            }
            if let Some(message) = &expect.message
                && !status.message().contains(message.as_str())
            {
                differences.push(format!(
                    "message: expected to contain {message:?}, got {:?}",
                    printable(status.message())
                ));
            }
            return differences;
        }
        (Err(status), None) => {
            let expected = expect.verdict.as_deref().unwrap_or("an answer");
            return vec![format!("expected {expected}, got {}", got_error(status))];
        }
        (Ok(answer), Some(code)) => {
            return vec![
                format!(
                    "error: expected {}, got an answer: {} {:?}",
                    code_name(code),
                    answer.verdict,
                    answer.reason
                ),
                format!("answer: {}", answer.json),
            ];
        }
        (Ok(answer), None) => answer,
    };
    let mut differences = Vec::new();
    let mut check = |field: &str, expected: Option<String>, actual: String| {
        if let Some(expected) = expected
            && expected != actual
        {
            differences.push(format!("{field}: expected {expected}, got {actual}"));
        }
    };
    let quoted = |text: &str| format!("{text:?}");
    let verdict_field = match rpc {
        Rpc::Decide => "outcome",
        Rpc::Dispatch => "status",
    };
    check(verdict_field, expect.verdict.clone(), got.verdict.clone());
    check(
        "reason",
        expect.reason.as_deref().map(quoted),
        quoted(&got.reason),
    );
    check(
        "fingerprint",
        expect.fingerprint.clone(),
        got.fingerprint.clone(),
    );
    check(
        "replayed",
        expect.replayed.map(|flag| flag.to_string()),
        got.replayed.to_string(),
    );
    check(
        "version",
        expect.version.map(|version| version.to_string()),
        got.version.to_string(),
    );
    check(
        "resource",
        expect.resource.as_deref().map(quoted),
        quoted(&got.resource),
    );
    check("value", expect.value.clone(), got.value.clone());
    if let Some(message) = &expect.message
        && !got.message.contains(message.as_str())
    {
        differences.push(format!(
            "message: expected to contain {message:?}, got {:?}",
            printable(&got.message)
        ));
    }
    if !differences.is_empty() {
        differences.push(format!("answer: {}", got.json));
    }
    differences
}

fn compare_review(
    error: Option<&Code>,
    message: Option<&str>,
    answer: Result<pb::Approval, Status>,
) -> Vec<String> {
    match (answer, error) {
        (Ok(_), None) => Vec::new(),
        (Ok(approval), Some(code)) => vec![format!(
            "error: expected {}, got the approval, now {}",
            code_name(*code),
            approval.status().as_str_name()
        )],
        (Err(status), None) => vec![format!("expected success, got {}", got_error(&status))],
        (Err(status), Some(code)) => {
            let mut differences = Vec::new();
            if status.code() != *code {
                differences.push(format!(
                    "error: expected {}, got {}",
                    code_name(*code),
                    got_error(&status)
                ));
            }
            if let Some(message) = message
                && !status.message().contains(message)
            {
                differences.push(format!(
                    "message: expected to contain {message:?}, got {:?}",
                    printable(status.message())
                ));
            }
            differences
        }
    }
}

import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Outcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OUTCOME_UNSPECIFIED: _ClassVar[Outcome]
    OUTCOME_ALLOW: _ClassVar[Outcome]
    OUTCOME_DENY: _ClassVar[Outcome]
    OUTCOME_REQUIRE_APPROVAL: _ClassVar[Outcome]

class DispatchStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DISPATCH_STATUS_UNSPECIFIED: _ClassVar[DispatchStatus]
    DISPATCH_STATUS_OK: _ClassVar[DispatchStatus]
    DISPATCH_STATUS_FORBIDDEN: _ClassVar[DispatchStatus]
    DISPATCH_STATUS_UNKNOWN_TOOL: _ClassVar[DispatchStatus]
    DISPATCH_STATUS_DENIED: _ClassVar[DispatchStatus]
    DISPATCH_STATUS_CALL_ID_CONFLICT: _ClassVar[DispatchStatus]
    DISPATCH_STATUS_STALE_VERSION: _ClassVar[DispatchStatus]
    DISPATCH_STATUS_APPROVAL_REQUIRED: _ClassVar[DispatchStatus]
    DISPATCH_STATUS_MISSING_RESOURCE: _ClassVar[DispatchStatus]
    DISPATCH_STATUS_LOG_FULL: _ClassVar[DispatchStatus]

class AssessReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ASSESS_REASON_UNSPECIFIED: _ClassVar[AssessReason]
    ASSESS_REASON_MATCHED: _ClassVar[AssessReason]
    ASSESS_REASON_CHANGED: _ClassVar[AssessReason]
    ASSESS_REASON_UNPINNED: _ClassVar[AssessReason]

class ToolChange(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TOOL_CHANGE_UNSPECIFIED: _ClassVar[ToolChange]
    TOOL_CHANGE_ADDED: _ClassVar[ToolChange]
    TOOL_CHANGE_REMOVED: _ClassVar[ToolChange]
    TOOL_CHANGE_MODIFIED: _ClassVar[ToolChange]
    TOOL_CHANGE_UNSAFE: _ClassVar[ToolChange]

class PinSource(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PIN_SOURCE_UNSPECIFIED: _ClassVar[PinSource]
    PIN_SOURCE_POLICY: _ClassVar[PinSource]
    PIN_SOURCE_API: _ClassVar[PinSource]

class ApprovalStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    APPROVAL_STATUS_UNSPECIFIED: _ClassVar[ApprovalStatus]
    APPROVAL_STATUS_PENDING: _ClassVar[ApprovalStatus]
    APPROVAL_STATUS_GRANTED: _ClassVar[ApprovalStatus]
    APPROVAL_STATUS_DENIED: _ClassVar[ApprovalStatus]
    APPROVAL_STATUS_EXPIRED: _ClassVar[ApprovalStatus]
    APPROVAL_STATUS_CONSUMED: _ClassVar[ApprovalStatus]
    APPROVAL_STATUS_REVOKED: _ClassVar[ApprovalStatus]

class ApprovalEventKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    APPROVAL_EVENT_KIND_UNSPECIFIED: _ClassVar[ApprovalEventKind]
    APPROVAL_EVENT_KIND_REQUESTED: _ClassVar[ApprovalEventKind]
    APPROVAL_EVENT_KIND_GRANTED: _ClassVar[ApprovalEventKind]
    APPROVAL_EVENT_KIND_DENIED: _ClassVar[ApprovalEventKind]
    APPROVAL_EVENT_KIND_REVOKED: _ClassVar[ApprovalEventKind]
    APPROVAL_EVENT_KIND_EXPIRED: _ClassVar[ApprovalEventKind]
    APPROVAL_EVENT_KIND_CONSUMED: _ClassVar[ApprovalEventKind]
    APPROVAL_EVENT_KIND_LAGGED: _ClassVar[ApprovalEventKind]
OUTCOME_UNSPECIFIED: Outcome
OUTCOME_ALLOW: Outcome
OUTCOME_DENY: Outcome
OUTCOME_REQUIRE_APPROVAL: Outcome
DISPATCH_STATUS_UNSPECIFIED: DispatchStatus
DISPATCH_STATUS_OK: DispatchStatus
DISPATCH_STATUS_FORBIDDEN: DispatchStatus
DISPATCH_STATUS_UNKNOWN_TOOL: DispatchStatus
DISPATCH_STATUS_DENIED: DispatchStatus
DISPATCH_STATUS_CALL_ID_CONFLICT: DispatchStatus
DISPATCH_STATUS_STALE_VERSION: DispatchStatus
DISPATCH_STATUS_APPROVAL_REQUIRED: DispatchStatus
DISPATCH_STATUS_MISSING_RESOURCE: DispatchStatus
DISPATCH_STATUS_LOG_FULL: DispatchStatus
ASSESS_REASON_UNSPECIFIED: AssessReason
ASSESS_REASON_MATCHED: AssessReason
ASSESS_REASON_CHANGED: AssessReason
ASSESS_REASON_UNPINNED: AssessReason
TOOL_CHANGE_UNSPECIFIED: ToolChange
TOOL_CHANGE_ADDED: ToolChange
TOOL_CHANGE_REMOVED: ToolChange
TOOL_CHANGE_MODIFIED: ToolChange
TOOL_CHANGE_UNSAFE: ToolChange
PIN_SOURCE_UNSPECIFIED: PinSource
PIN_SOURCE_POLICY: PinSource
PIN_SOURCE_API: PinSource
APPROVAL_STATUS_UNSPECIFIED: ApprovalStatus
APPROVAL_STATUS_PENDING: ApprovalStatus
APPROVAL_STATUS_GRANTED: ApprovalStatus
APPROVAL_STATUS_DENIED: ApprovalStatus
APPROVAL_STATUS_EXPIRED: ApprovalStatus
APPROVAL_STATUS_CONSUMED: ApprovalStatus
APPROVAL_STATUS_REVOKED: ApprovalStatus
APPROVAL_EVENT_KIND_UNSPECIFIED: ApprovalEventKind
APPROVAL_EVENT_KIND_REQUESTED: ApprovalEventKind
APPROVAL_EVENT_KIND_GRANTED: ApprovalEventKind
APPROVAL_EVENT_KIND_DENIED: ApprovalEventKind
APPROVAL_EVENT_KIND_REVOKED: ApprovalEventKind
APPROVAL_EVENT_KIND_EXPIRED: ApprovalEventKind
APPROVAL_EVENT_KIND_CONSUMED: ApprovalEventKind
APPROVAL_EVENT_KIND_LAGGED: ApprovalEventKind

class Session(_message.Message):
    __slots__ = ("actor", "session_id", "workspace")
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_FIELD_NUMBER: _ClassVar[int]
    actor: str
    session_id: str
    workspace: str
    def __init__(self, actor: _Optional[str] = ..., session_id: _Optional[str] = ..., workspace: _Optional[str] = ...) -> None: ...

class Proposal(_message.Message):
    __slots__ = ("call_id", "actor", "name", "version", "arguments_json")
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    call_id: str
    actor: str
    name: str
    version: int
    arguments_json: str
    def __init__(self, call_id: _Optional[str] = ..., actor: _Optional[str] = ..., name: _Optional[str] = ..., version: _Optional[int] = ..., arguments_json: _Optional[str] = ...) -> None: ...

class DecideRequest(_message.Message):
    __slots__ = ("session", "proposal")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    PROPOSAL_FIELD_NUMBER: _ClassVar[int]
    session: Session
    proposal: Proposal
    def __init__(self, session: _Optional[_Union[Session, _Mapping]] = ..., proposal: _Optional[_Union[Proposal, _Mapping]] = ...) -> None: ...

class DecideResponse(_message.Message):
    __slots__ = ("outcome", "reason", "message", "fingerprint", "policy_revision", "approval_id", "approval_expires_at")
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    POLICY_REVISION_FIELD_NUMBER: _ClassVar[int]
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    APPROVAL_EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    outcome: Outcome
    reason: str
    message: str
    fingerprint: str
    policy_revision: str
    approval_id: str
    approval_expires_at: _timestamp_pb2.Timestamp
    def __init__(self, outcome: _Optional[_Union[Outcome, str]] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ..., fingerprint: _Optional[str] = ..., policy_revision: _Optional[str] = ..., approval_id: _Optional[str] = ..., approval_expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class DispatchRequest(_message.Message):
    __slots__ = ("session", "proposal")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    PROPOSAL_FIELD_NUMBER: _ClassVar[int]
    session: Session
    proposal: Proposal
    def __init__(self, session: _Optional[_Union[Session, _Mapping]] = ..., proposal: _Optional[_Union[Proposal, _Mapping]] = ...) -> None: ...

class DispatchResponse(_message.Message):
    __slots__ = ("status", "reason", "message", "fingerprint", "version", "resource", "value_json", "receipt_id", "replayed", "approval_id", "policy_revision")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    VALUE_JSON_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_ID_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_REVISION_FIELD_NUMBER: _ClassVar[int]
    status: DispatchStatus
    reason: str
    message: str
    fingerprint: str
    version: int
    resource: str
    value_json: str
    receipt_id: str
    replayed: bool
    approval_id: str
    policy_revision: str
    def __init__(self, status: _Optional[_Union[DispatchStatus, str]] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ..., fingerprint: _Optional[str] = ..., version: _Optional[int] = ..., resource: _Optional[str] = ..., value_json: _Optional[str] = ..., receipt_id: _Optional[str] = ..., replayed: _Optional[bool] = ..., approval_id: _Optional[str] = ..., policy_revision: _Optional[str] = ...) -> None: ...

class GetSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class SessionInfo(_message.Message):
    __slots__ = ("session_id", "actor", "workspace", "decisions", "tool_attempts", "executed_tools", "work_units", "stopped_reason", "started_at")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_FIELD_NUMBER: _ClassVar[int]
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    TOOL_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    EXECUTED_TOOLS_FIELD_NUMBER: _ClassVar[int]
    WORK_UNITS_FIELD_NUMBER: _ClassVar[int]
    STOPPED_REASON_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    actor: str
    workspace: str
    decisions: int
    tool_attempts: int
    executed_tools: int
    work_units: int
    stopped_reason: str
    started_at: _timestamp_pb2.Timestamp
    def __init__(self, session_id: _Optional[str] = ..., actor: _Optional[str] = ..., workspace: _Optional[str] = ..., decisions: _Optional[int] = ..., tool_attempts: _Optional[int] = ..., executed_tools: _Optional[int] = ..., work_units: _Optional[int] = ..., stopped_reason: _Optional[str] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Manifest(_message.Message):
    __slots__ = ("server_id", "revision", "tools")
    SERVER_ID_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    server_id: str
    revision: str
    tools: _containers.RepeatedCompositeFieldContainer[ManifestTool]
    def __init__(self, server_id: _Optional[str] = ..., revision: _Optional[str] = ..., tools: _Optional[_Iterable[_Union[ManifestTool, _Mapping]]] = ...) -> None: ...

class ManifestTool(_message.Message):
    __slots__ = ("name", "description", "parameters", "read_only", "scopes", "input_schema_json", "title", "output_schema_json", "annotations_json")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    READ_ONLY_FIELD_NUMBER: _ClassVar[int]
    SCOPES_FIELD_NUMBER: _ClassVar[int]
    INPUT_SCHEMA_JSON_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_SCHEMA_JSON_FIELD_NUMBER: _ClassVar[int]
    ANNOTATIONS_JSON_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    parameters: _containers.RepeatedScalarFieldContainer[str]
    read_only: bool
    scopes: _containers.RepeatedScalarFieldContainer[str]
    input_schema_json: str
    title: str
    output_schema_json: str
    annotations_json: str
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., parameters: _Optional[_Iterable[str]] = ..., read_only: _Optional[bool] = ..., scopes: _Optional[_Iterable[str]] = ..., input_schema_json: _Optional[str] = ..., title: _Optional[str] = ..., output_schema_json: _Optional[str] = ..., annotations_json: _Optional[str] = ...) -> None: ...

class AssessManifestRequest(_message.Message):
    __slots__ = ("manifest",)
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    manifest: Manifest
    def __init__(self, manifest: _Optional[_Union[Manifest, _Mapping]] = ...) -> None: ...

class ToolDiff(_message.Message):
    __slots__ = ("tool", "change", "description_changed", "parameters_changed", "scopes_changed", "read_only_changed", "input_schema_changed", "parameters_added", "parameters_removed", "scopes_added", "scopes_removed", "widened", "title_changed", "output_schema_changed", "annotations_changed", "problem", "problem_message")
    TOOL_FIELD_NUMBER: _ClassVar[int]
    CHANGE_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_CHANGED_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_CHANGED_FIELD_NUMBER: _ClassVar[int]
    SCOPES_CHANGED_FIELD_NUMBER: _ClassVar[int]
    READ_ONLY_CHANGED_FIELD_NUMBER: _ClassVar[int]
    INPUT_SCHEMA_CHANGED_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_ADDED_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_REMOVED_FIELD_NUMBER: _ClassVar[int]
    SCOPES_ADDED_FIELD_NUMBER: _ClassVar[int]
    SCOPES_REMOVED_FIELD_NUMBER: _ClassVar[int]
    WIDENED_FIELD_NUMBER: _ClassVar[int]
    TITLE_CHANGED_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_SCHEMA_CHANGED_FIELD_NUMBER: _ClassVar[int]
    ANNOTATIONS_CHANGED_FIELD_NUMBER: _ClassVar[int]
    PROBLEM_FIELD_NUMBER: _ClassVar[int]
    PROBLEM_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    tool: str
    change: ToolChange
    description_changed: bool
    parameters_changed: bool
    scopes_changed: bool
    read_only_changed: bool
    input_schema_changed: bool
    parameters_added: _containers.RepeatedScalarFieldContainer[str]
    parameters_removed: _containers.RepeatedScalarFieldContainer[str]
    scopes_added: _containers.RepeatedScalarFieldContainer[str]
    scopes_removed: _containers.RepeatedScalarFieldContainer[str]
    widened: bool
    title_changed: bool
    output_schema_changed: bool
    annotations_changed: bool
    problem: str
    problem_message: str
    def __init__(self, tool: _Optional[str] = ..., change: _Optional[_Union[ToolChange, str]] = ..., description_changed: _Optional[bool] = ..., parameters_changed: _Optional[bool] = ..., scopes_changed: _Optional[bool] = ..., read_only_changed: _Optional[bool] = ..., input_schema_changed: _Optional[bool] = ..., parameters_added: _Optional[_Iterable[str]] = ..., parameters_removed: _Optional[_Iterable[str]] = ..., scopes_added: _Optional[_Iterable[str]] = ..., scopes_removed: _Optional[_Iterable[str]] = ..., widened: _Optional[bool] = ..., title_changed: _Optional[bool] = ..., output_schema_changed: _Optional[bool] = ..., annotations_changed: _Optional[bool] = ..., problem: _Optional[str] = ..., problem_message: _Optional[str] = ...) -> None: ...

class AssessManifestResponse(_message.Message):
    __slots__ = ("accepted", "reason", "fingerprint", "pinned_fingerprint", "diffs", "diff_available", "pinned_revision")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    PINNED_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    DIFFS_FIELD_NUMBER: _ClassVar[int]
    DIFF_AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    PINNED_REVISION_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    reason: AssessReason
    fingerprint: str
    pinned_fingerprint: str
    diffs: _containers.RepeatedCompositeFieldContainer[ToolDiff]
    diff_available: bool
    pinned_revision: str
    def __init__(self, accepted: _Optional[bool] = ..., reason: _Optional[_Union[AssessReason, str]] = ..., fingerprint: _Optional[str] = ..., pinned_fingerprint: _Optional[str] = ..., diffs: _Optional[_Iterable[_Union[ToolDiff, _Mapping]]] = ..., diff_available: _Optional[bool] = ..., pinned_revision: _Optional[str] = ...) -> None: ...

class Pin(_message.Message):
    __slots__ = ("server_id", "fingerprint", "revision", "source", "pinned_by", "pinned_at", "tool_count")
    SERVER_ID_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    PINNED_BY_FIELD_NUMBER: _ClassVar[int]
    PINNED_AT_FIELD_NUMBER: _ClassVar[int]
    TOOL_COUNT_FIELD_NUMBER: _ClassVar[int]
    server_id: str
    fingerprint: str
    revision: str
    source: PinSource
    pinned_by: str
    pinned_at: _timestamp_pb2.Timestamp
    tool_count: int
    def __init__(self, server_id: _Optional[str] = ..., fingerprint: _Optional[str] = ..., revision: _Optional[str] = ..., source: _Optional[_Union[PinSource, str]] = ..., pinned_by: _Optional[str] = ..., pinned_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., tool_count: _Optional[int] = ...) -> None: ...

class PinManifestRequest(_message.Message):
    __slots__ = ("manifest", "expected_fingerprint")
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    manifest: Manifest
    expected_fingerprint: str
    def __init__(self, manifest: _Optional[_Union[Manifest, _Mapping]] = ..., expected_fingerprint: _Optional[str] = ...) -> None: ...

class ListPinsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListPinsResponse(_message.Message):
    __slots__ = ("pins",)
    PINS_FIELD_NUMBER: _ClassVar[int]
    pins: _containers.RepeatedCompositeFieldContainer[Pin]
    def __init__(self, pins: _Optional[_Iterable[_Union[Pin, _Mapping]]] = ...) -> None: ...

class RemovePinRequest(_message.Message):
    __slots__ = ("server_id",)
    SERVER_ID_FIELD_NUMBER: _ClassVar[int]
    server_id: str
    def __init__(self, server_id: _Optional[str] = ...) -> None: ...

class Approval(_message.Message):
    __slots__ = ("approval_id", "fingerprint", "actor", "session_id", "workspace", "tool", "call_id", "arguments_json", "reason", "status", "requested_at", "expires_at", "decided_by", "decided_at", "decision_note", "version")
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_AT_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    DECIDED_BY_FIELD_NUMBER: _ClassVar[int]
    DECIDED_AT_FIELD_NUMBER: _ClassVar[int]
    DECISION_NOTE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    approval_id: str
    fingerprint: str
    actor: str
    session_id: str
    workspace: str
    tool: str
    call_id: str
    arguments_json: str
    reason: str
    status: ApprovalStatus
    requested_at: _timestamp_pb2.Timestamp
    expires_at: _timestamp_pb2.Timestamp
    decided_by: str
    decided_at: _timestamp_pb2.Timestamp
    decision_note: str
    version: int
    def __init__(self, approval_id: _Optional[str] = ..., fingerprint: _Optional[str] = ..., actor: _Optional[str] = ..., session_id: _Optional[str] = ..., workspace: _Optional[str] = ..., tool: _Optional[str] = ..., call_id: _Optional[str] = ..., arguments_json: _Optional[str] = ..., reason: _Optional[str] = ..., status: _Optional[_Union[ApprovalStatus, str]] = ..., requested_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., decided_by: _Optional[str] = ..., decided_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., decision_note: _Optional[str] = ..., version: _Optional[int] = ...) -> None: ...

class GetApprovalRequest(_message.Message):
    __slots__ = ("approval_id",)
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    approval_id: str
    def __init__(self, approval_id: _Optional[str] = ...) -> None: ...

class ListApprovalsRequest(_message.Message):
    __slots__ = ("status", "actor", "tool", "page_size", "page_token", "approval_id_prefix")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    APPROVAL_ID_PREFIX_FIELD_NUMBER: _ClassVar[int]
    status: ApprovalStatus
    actor: str
    tool: str
    page_size: int
    page_token: str
    approval_id_prefix: str
    def __init__(self, status: _Optional[_Union[ApprovalStatus, str]] = ..., actor: _Optional[str] = ..., tool: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., approval_id_prefix: _Optional[str] = ...) -> None: ...

class ListApprovalsResponse(_message.Message):
    __slots__ = ("approvals", "next_page_token")
    APPROVALS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    approvals: _containers.RepeatedCompositeFieldContainer[Approval]
    next_page_token: str
    def __init__(self, approvals: _Optional[_Iterable[_Union[Approval, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class GrantApprovalRequest(_message.Message):
    __slots__ = ("approval_id", "comment")
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    COMMENT_FIELD_NUMBER: _ClassVar[int]
    approval_id: str
    comment: str
    def __init__(self, approval_id: _Optional[str] = ..., comment: _Optional[str] = ...) -> None: ...

class DenyApprovalRequest(_message.Message):
    __slots__ = ("approval_id", "reason")
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    approval_id: str
    reason: str
    def __init__(self, approval_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class RevokeApprovalRequest(_message.Message):
    __slots__ = ("approval_id", "reason")
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    approval_id: str
    reason: str
    def __init__(self, approval_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class WatchApprovalsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ApprovalEvent(_message.Message):
    __slots__ = ("kind", "approval", "lagged")
    KIND_FIELD_NUMBER: _ClassVar[int]
    APPROVAL_FIELD_NUMBER: _ClassVar[int]
    LAGGED_FIELD_NUMBER: _ClassVar[int]
    kind: ApprovalEventKind
    approval: Approval
    lagged: int
    def __init__(self, kind: _Optional[_Union[ApprovalEventKind, str]] = ..., approval: _Optional[_Union[Approval, _Mapping]] = ..., lagged: _Optional[int] = ...) -> None: ...

class GetResourceRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class Resource(_message.Message):
    __slots__ = ("name", "value_json", "version")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_JSON_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    name: str
    value_json: str
    version: int
    def __init__(self, name: _Optional[str] = ..., value_json: _Optional[str] = ..., version: _Optional[int] = ...) -> None: ...

class ListResourcesRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListResourcesResponse(_message.Message):
    __slots__ = ("resources", "next_page_token")
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    resources: _containers.RepeatedCompositeFieldContainer[Resource]
    next_page_token: str
    def __init__(self, resources: _Optional[_Iterable[_Union[Resource, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

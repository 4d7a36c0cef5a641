#!/usr/bin/env node
// A toolgate host in Node.js: Decide, wait for a reviewer, Dispatch.
//
//   (cd examples/node && npm ci)
//   examples/node/host.mjs --server 127.0.0.1:50051 [--session ID] [--timeout 120] [--token T]
//   examples/node/host.mjs --server https://localhost:50051 --ca ca.pem [--cert host.pem --key host.key]
//
// against `toolgate serve --config examples/tickets.toml`. The host reads the
// current version of `lamp` (GetResource), proposes set_ticket lamp -> done at
// that version and asks Decide; on REQUIRE_APPROVAL it prints
// `waiting approval_id=<id>` and asks Decide again with the same proposal
// every 100 ms (same call id and fingerprint: it costs nothing) until a
// reviewer granted it (ALLOW `approved`, e.g. `toolgate approvals grant <id>`
// from a second terminal) or denied it, then commits it with Dispatch and
// prints the receipt. Every run is a new session (a random id unless
// --session is given; the call id is `<session>-1`), so it can run again and
// again on one server. `--token` (or TOOLGATE_HOST_TOKEN: not TOOLGATE_TOKEN,
// which the CLI reads as a reviewer's) is sent as `authorization: Bearer
// <token>` when the policy has host credentials; over plaintext only to
// loopback, unless --insecure-plaintext.
// `https://` speaks TLS, trusting `--ca` (the system's roots without it);
// `--cert`/`--key` add a client certificate (mTLS), which may be the host's
// credential by itself.
// Output lines and exit status are those of examples/python/host.py: 0 when
// committed, 1 on any other outcome, 2 on bad usage.
//
// The .proto is loaded at run time with @grpc/proto-loader from ../../proto;
// google/protobuf/timestamp.proto resolves from the well-known types bundled
// with protobufjs. keepCase keeps the proto field names (`call_id`), enums
// arrive as their names, and every 64-bit integer (`version`) is a decimal
// string both ways.

import { randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";

import grpc from "@grpc/grpc-js";
import protoLoader from "@grpc/proto-loader";

const HERE = path.dirname(fileURLToPath(import.meta.url));
const PROTO_ROOT = path.resolve(HERE, "..", "..", "proto");
const ACTOR = "learner";
const WORKSPACE = "desk";
const POLL_MS = 100;
const DEFAULT_TIMEOUT_SECONDS = 120;
const RPC_TIMEOUT_MS = 5000;
const ID_PATTERN = /^[A-Za-z][A-Za-z0-9_-]{0,36}$/;

class HostError extends Error {}

function usage(message) {
  process.stderr.write(
    "usage: host.mjs --server HOST:PORT|https://HOST:PORT [--session SESSION_ID] [--timeout SECONDS] [--token TOKEN]\n" +
      "                [--ca PEM] [--cert PEM --key PEM] [--insecure-plaintext]\n" +
      `host.mjs: ${message}\n`,
  );
  process.exit(2);
}

function parse() {
  let values;
  try {
    ({ values } = parseArgs({
      options: {
        server: { type: "string" },
        session: { type: "string", default: `node-${randomBytes(4).toString("hex")}` },
        timeout: { type: "string", default: String(DEFAULT_TIMEOUT_SECONDS) },
        token: { type: "string", default: process.env.TOOLGATE_HOST_TOKEN ?? "" },
        "insecure-plaintext": { type: "boolean", default: false },
        ca: { type: "string" },
        cert: { type: "string" },
        key: { type: "string" },
      },
      strict: true,
    }));
  } catch (error) {
    usage(error.message);
  }
  if (!values.server) usage("--server is required");
  // Call ids are `<session>-<n>` and must fit the 40-character id pattern.
  if (!ID_PATTERN.test(values.session)) {
    usage("--session must match [A-Za-z][A-Za-z0-9_-]* and have at most 37 characters");
  }
  const timeout = Number(values.timeout);
  if (!(timeout > 0)) usage("--timeout must be a positive number of seconds");
  const https = values.server.startsWith("https://");
  if (!https && (values.ca || values.cert || values.key)) usage("--ca, --cert and --key need an https:// --server");
  if (!values.cert !== !values.key) usage("--cert and --key go together");
  if (values.token && !https && !isLoopback(values.server) && !values["insecure-plaintext"]) {
    usage(
      `a token goes over plaintext only to loopback, not to ${values.server}: ` +
        "use https:// (with --ca), or --insecure-plaintext behind a mesh that encrypts it",
    );
  }
  return {
    server: values.server.replace(/^https?:\/\//, ""),
    session: values.session,
    timeoutMs: timeout * 1000,
    token: values.token,
    tls: https ? { ca: values.ca, cert: values.cert, key: values.key } : null,
  };
}

// Whether a `host:port` (or http://host:port) server is this machine.
function isLoopback(server) {
  const host = new URL(`http://${server.replace(/^http:\/\//, "")}`).hostname.replace(/^\[|\]$/g, "");
  return host === "localhost" || host === "::1" || /^127\.\d+\.\d+\.\d+$/.test(host);
}

// Plaintext, or TLS (with a client certificate for mTLS) for https://.
function channelCredentials(tls) {
  if (!tls) return grpc.credentials.createInsecure();
  const read = (file) => (file ? readFileSync(file) : null);
  return grpc.credentials.createSsl(read(tls.ca), read(tls.key), read(tls.cert));
}

function loadClients(server, tls) {
  const definition = protoLoader.loadSync("toolgate/v1/toolgate.proto", {
    includeDirs: [PROTO_ROOT],
    keepCase: true,
    longs: String,
    enums: String,
    defaults: true,
  });
  const { toolgate } = grpc.loadPackageDefinition(definition);
  const pdp = new toolgate.v1.PolicyDecisionPoint(server, channelCredentials(tls));
  // The second client shares the first one's channel.
  const resources = new toolgate.v1.Resources(server, null, { channelOverride: pdp.getChannel() });
  return { pdp, resources };
}

function metadataFor(token) {
  const metadata = new grpc.Metadata();
  if (token) metadata.set("authorization", `Bearer ${token}`);
  return metadata;
}

function unary(client, method, request, metadata) {
  return new Promise((resolve, reject) => {
    client[method](request, metadata, { deadline: Date.now() + RPC_TIMEOUT_MS }, (error, response) =>
      error ? reject(error) : resolve(response),
    );
  });
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const emit = (line) => process.stdout.write(`${line}\n`);
const outcomeName = (outcome) => outcome.replace(/^OUTCOME_/, "");

async function waitUntilDecided(pdp, request, first, timeoutMs, metadata) {
  emit(`waiting approval_id=${first.approval_id}`);
  const deadline = Date.now() + timeoutMs;
  let waitingFor = first.approval_id;
  let answer = first;
  while (answer.outcome === "OUTCOME_REQUIRE_APPROVAL") {
    if (answer.approval_id !== waitingFor) {
      // The request expired and Decide opened a new one: a reviewer must look again.
      waitingFor = answer.approval_id;
      emit(`waiting approval_id=${waitingFor}`);
    }
    if (Date.now() >= deadline) {
      throw new HostError(`no reviewer decided approval ${waitingFor} within ${timeoutMs / 1000} s`);
    }
    await sleep(POLL_MS);
    answer = await unary(pdp, "Decide", request, metadata);
  }
  return answer;
}

async function run({ server, session: sessionId, timeoutMs, token, tls }) {
  const { pdp, resources } = loadClients(server, tls);
  const metadata = metadataFor(token);
  try {
    const lamp = await unary(resources, "GetResource", { name: "lamp" }, metadata);
    const session = { actor: ACTOR, session_id: sessionId, workspace: WORKSPACE };
    const callId = `${sessionId}-1`;
    const argumentsJson = JSON.stringify({ ticket: "lamp", status: "done" });
    const proposal = {
      call_id: callId,
      actor: ACTOR,
      name: "set_ticket",
      version: lamp.version,
      arguments_json: argumentsJson,
    };
    emit(`propose call_id=${callId} tool=set_ticket version=${proposal.version} arguments=${argumentsJson}`);
    const request = { session, proposal };
    let answer = await unary(pdp, "Decide", request, metadata);
    emit(`decide call_id=${callId} outcome=${outcomeName(answer.outcome)} reason=${answer.reason}`);
    if (answer.outcome === "OUTCOME_REQUIRE_APPROVAL") {
      answer = await waitUntilDecided(pdp, request, answer, timeoutMs, metadata);
      emit(`decide call_id=${callId} outcome=${outcomeName(answer.outcome)} reason=${answer.reason}`);
    }
    if (answer.outcome !== "OUTCOME_ALLOW") {
      throw new HostError(`${callId} may not run: ${answer.reason} (${answer.message})`);
    }

    const result = await unary(pdp, "Dispatch", request, metadata);
    if (result.status !== "DISPATCH_STATUS_OK") {
      throw new HostError(`${callId} was not committed: ${result.status} ${result.reason} (${result.message})`);
    }
    emit(
      `receipt call_id=${callId} resource=${result.resource} receipt_id=${result.receipt_id}` +
        ` version=${result.version} replayed=${result.replayed} value=${result.value_json}`,
    );
  } finally {
    pdp.close();
  }
}

const options = parse();
try {
  await run(options);
  emit("done");
} catch (error) {
  if (error instanceof HostError) {
    process.stderr.write(`host: ${error.message}\n`);
  } else if (error && typeof error.code === "number" && error.details !== undefined) {
    process.stderr.write(`host: ${grpc.status[error.code]}: ${error.details}\n`);
  } else {
    process.stderr.write(`host: ${error && error.stack ? error.stack : error}\n`);
  }
  process.exitCode = 1;
}

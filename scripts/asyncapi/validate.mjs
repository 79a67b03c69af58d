// Checks an AsyncAPI document with the real tools, and (optionally) frames against it.
//
//   node validate.mjs DOCUMENT.yaml [FRAMES.jsonl]
//
// 1. Parses and validates DOCUMENT with @asyncapi/parser: any diagnostic of severity error
//    is printed and the exit status is 1 (warnings are printed, and do not fail).
// 2. With FRAMES, a file of JSON lines {"direction":"send"|"receive","frame":{...}}, validates
//    each frame with ajv against the payload schema of the message whose `type` const is the
//    frame's `type`. `direction` is the client's point of view: "send" is a frame the client
//    sent (a message of the server's `receive` operations), "receive" one it received (of the
//    server's `send` operations). Where several messages share a type (`auth`), the frame must
//    match one of them. A frame whose type has no message, or that matches none, is printed
//    as `FAIL line N: ...` and the exit status is 1.
// The last line printed is a JSON summary: {"ok":…,"frames":…,"failed":[line numbers],"types":…}.

import { readFileSync } from "node:fs";
import { Parser, fromFile } from "@asyncapi/parser";
import Ajv from "ajv";

const SEVERITY = ["error", "warning", "information", "hint"];
// The client's direction -> the action of the server's operations that carry the message.
const ACTION = { send: "receive", receive: "send" };

function usage() {
  console.error("usage: node validate.mjs DOCUMENT.yaml [FRAMES.jsonl]");
  process.exit(2);
}

async function parseDocument(path) {
  const parser = new Parser();
  const { document, diagnostics } = await fromFile(parser, path).parse();
  let errors = 0;
  for (const d of diagnostics) {
    const severity = SEVERITY[d.severity] ?? String(d.severity);
    if (d.severity === 0) errors += 1;
    console.log(`${severity}: ${d.code}: ${d.message} at ${JSON.stringify(d.path)}`);
  }
  if (errors > 0 || document === undefined) {
    console.log(`${path}: ${errors} error(s): not a valid AsyncAPI document`);
    process.exit(1);
  }
  console.log(`${path}: valid AsyncAPI ${document.version()} (${diagnostics.length} diagnostics)`);
  return document;
}

// { send: Map(type -> [{name, validate}]), receive: … } from the document's operations.
function validatorsByType(document) {
  const ajv = new Ajv({ strict: false, allErrors: true });
  const byDirection = { send: new Map(), receive: new Map() };
  for (const operation of document.operations()) {
    const direction = operation.action() === "receive" ? "send" : "receive";
    for (const message of operation.messages()) {
      const payload = message.payload()?.json();
      const kind = typeOf(payload);
      if (kind === undefined) {
        console.log(`FAIL message ${message.id()}: its payload has no "type" const`);
        process.exitCode = 1;
        continue;
      }
      const entries = byDirection[direction].get(kind) ?? [];
      if (!entries.some((e) => e.name === message.id())) {
        entries.push({ name: message.id(), validate: ajv.compile(payload) });
      }
      byDirection[direction].set(kind, entries);
    }
  }
  return byDirection;
}

// The `type` const of a payload schema (directly, or in the one schema it is made of).
function typeOf(schema) {
  if (!schema || typeof schema !== "object") return undefined;
  const direct = schema.properties?.type?.const;
  if (direct !== undefined) return direct;
  for (const key of ["allOf", "oneOf", "anyOf"]) {
    for (const part of schema[key] ?? []) {
      const found = typeOf(part);
      if (found !== undefined) return found;
    }
  }
  return undefined;
}

function checkFrames(document, path) {
  const validators = validatorsByType(document);
  const lines = readFileSync(path, "utf8").split("\n");
  const failed = [];
  const types = {};
  let frames = 0;
  lines.forEach((text, index) => {
    if (text.trim() === "") return;
    const line = index + 1;
    frames += 1;
    let record;
    try {
      record = JSON.parse(text);
    } catch (err) {
      failed.push(line);
      console.log(`FAIL line ${line}: not JSON: ${err.message}`);
      return;
    }
    const { direction, frame } = record ?? {};
    if (!(direction in ACTION) || frame === null || typeof frame !== "object") {
      failed.push(line);
      console.log(`FAIL line ${line}: needs "direction" (send|receive) and an object "frame"`);
      return;
    }
    const kind = frame.type;
    const candidates = validators[direction].get(kind);
    if (candidates === undefined) {
      failed.push(line);
      console.log(
        `FAIL line ${line}: no ${direction === "send" ? "client" : "server"} message has ` +
          `type ${JSON.stringify(kind)} (the server's ${ACTION[direction]} operations): ` +
          JSON.stringify(frame),
      );
      return;
    }
    const problems = [];
    for (const { name, validate } of candidates) {
      if (validate(frame)) {
        const key = `${direction} ${kind}`;
        types[key] = (types[key] ?? 0) + 1;
        return;
      }
      for (const e of validate.errors) {
        problems.push(`${name}${e.instancePath || ""} ${e.message} ${JSON.stringify(e.params)}`);
      }
    }
    failed.push(line);
    console.log(`FAIL line ${line}: ${direction} ${JSON.stringify(frame)}`);
    for (const problem of problems) console.log(`    ${problem}`);
  });
  return { frames, failed, types };
}

const [documentPath, framesPath, ...rest] = process.argv.slice(2);
if (documentPath === undefined || rest.length > 0) usage();
const document = await parseDocument(documentPath);
if (framesPath !== undefined) {
  const { frames, failed, types } = checkFrames(document, framesPath);
  const ok = failed.length === 0 && !process.exitCode;
  console.log(`${frames} frames, ${failed.length} failed`);
  console.log(JSON.stringify({ ok, frames, failed, types }));
  if (!ok) process.exit(1);
}

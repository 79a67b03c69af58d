// The TypeScript SDK's conformance driver: tests/test_conformance.py runs the same scenarios
// against every SDK through a driver like this one. One JSON object a line on stdin, a
// command: {"seq": N, "op": OP, "client": NAME, ...}; one a line on stdout: its answer
// {"seq": N, "result": ...} or {"seq": N, "error": {"code": CODE, "message": M}}, and every
// event of every client, as it happens: {"client": NAME, "event": TYPE, "detail": {...}}.
// Ops: connect {url, name?, tokens?, options?} (answered at hello), join/leave {room},
// send {room, text, cid?} / send_to {user, text, cid?} / edit {room, id, text} /
// react {room, id, emoji} / delete {room, id} (answered with the ack), history {room},
// direct_history {user}, typing {room}, create_room {room, private?}, invite {room, user},
// mark_read {room, id}, state, close, exit. HUBBUB_SDK: the build to drive; HUBBUB_TRANSPORTS:
// the clients' `transports` (comma-separated).
import { createInterface } from "node:readline";
import WebSocket from "ws";

const sdk = await import(process.env.HUBBUB_SDK ?? "../dist/index.js");
const clients = new Map();
const EVENTS = [
  "state", "hello", "joined", "left", "message", "direct", "edited", "deleted", "reaction",
  "receipt", "receipts", "room", "rooms", "member", "invited", "inbox", "resync", "presence",
  "typing", "ack", "error", "authenticated",
];

const out = (object) => process.stdout.write(`${JSON.stringify(object)}\n`);

function connect(command) {
  const tokens = command.tokens ?? [];
  let asked = 0;
  const getToken = tokens.length
    ? async () => tokens[Math.min(asked++, tokens.length - 1)]
    : undefined;
  // HUBBUB_TRANSPORTS=sse: every client on the HTTP fallback transport.
  const transports = process.env.HUBBUB_TRANSPORTS?.split(",");
  const client = new sdk.HubbubClient({
    url: command.url, name: command.name, getToken, WebSocket,
    ...(transports ? { transports } : {}), ...(command.options ?? {}),
  });
  for (const type of EVENTS) {
    client.on(type, (detail) => out({ client: command.client, event: type, detail }));
  }
  clients.set(command.client, client);
  return new Promise((resolve, reject) => {
    const stopHello = client.on("hello", (hello) => { stopHello(); stopState(); resolve({ user: hello.user }); });
    const stopState = client.on("state", ({ state, code }) => {
      if (state === "closed") { stopHello(); stopState(); reject(Object.assign(new Error("closed"), { code: `close_${code}` })); }
    });
    client.connect();
  });
}

function answerOf(client, type, room) {
  return new Promise((resolve, reject) => {
    const stops = [
      client.on(type, (frame) => { if (frame.room === room) { stops.forEach((stop) => stop()); resolve(frame); } }),
      client.on("error", (frame) => {
        if (frame.room === room && frame.cid === undefined) { stops.forEach((stop) => stop()); reject(frame); }
      }),
    ];
  });
}

async function run(command) {
  const client = clients.get(command.client);
  switch (command.op) {
    case "connect": return connect(command);
    case "join": { const answer = answerOf(client, "joined", command.room); client.join(command.room); return answer; }
    case "leave": { const answer = answerOf(client, "left", command.room); client.leave(command.room); return answer; }
    case "send": return client.send(command.room, command.text, command.cid === undefined ? {} : { cid: command.cid });
    case "send_to": return client.sendTo(command.user, command.text, command.cid === undefined ? {} : { cid: command.cid });
    case "edit": return client.edit(command.room, command.id, command.text);
    case "react": return client.react(command.room, command.id, command.emoji);
    case "delete": return client.deleteMessage(command.room, command.id);
    case "history": return client.roomHistory(command.room);
    case "direct_history": return (await client.directHistory(command.user)).messages;
    case "typing": client.typing(command.room); return null;
    case "mark_read": client.markRead(command.room, command.id); return null;
    case "create_room": {
      const answer = answerOf(client, "room", command.room);
      client.createRoom(command.room, { private: command.private ?? false });
      return answer;
    }
    case "invite": { const answer = answerOf(client, "room", command.room); client.invite(command.room, command.user); return answer; }
    case "state": return client.state;
    case "close": client.close(); return null;
    case "exit": for (const each of clients.values()) each.close(); setTimeout(() => process.exit(0), 10); return null;
    default: throw Object.assign(new Error(`unknown op ${command.op}`), { code: "unknown_op" });
  }
}

for await (const line of createInterface({ input: process.stdin })) {
  if (!line.trim()) continue;
  const command = JSON.parse(line);
  run(command).then(
    (result) => out({ seq: command.seq, result: result ?? null }),
    (error) => out({ seq: command.seq, error: { code: String(error.code ?? error.name ?? "error"), message: String(error.message ?? error) } }),
  );
}

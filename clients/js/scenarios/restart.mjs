// A server restart, as the SDK lives it (a scenario, not a `node --test` file: driven by
// tests/test_sdk_js.py, which owns the servers): ada on server A, bob on server B, one Redis. Lines on stdin tell the steps:
// after "ready" is printed, the test drains A (1012) and says "down"; ada writes a message
// while disconnected and bob sends ten; the test restarts A on its port and says "up". Ada
// must come back by herself and see every message once, in order, her own queued one acked.
// Prints one JSON line: {"states": [...], "texts": [...], "ids_increasing": bool, "acked": bool}.
import { createInterface } from "node:readline";
import WebSocket from "ws";
const { HubbubClient } = await import(process.env.HUBBUB_SDK ?? "../dist/index.js");

const [urlA, urlB] = process.argv.slice(2);
const lines = createInterface({ input: process.stdin })[Symbol.asyncIterator]();
const step = async (expected) => {
  const { value } = await lines.next();
  if (value !== expected) throw new Error(`expected ${expected}, got ${value}`);
};
const until = async (condition, ms = 20000) => {
  for (let waited = 0; !condition(); waited += 20) {
    if (waited > ms) throw new Error("timed out");
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
};

const ada = new HubbubClient({ url: urlA, name: "ada", WebSocket, baseDelayMs: 100, maxDelayMs: 500 });
const bob = new HubbubClient({ url: urlB, name: "bob", WebSocket });
const states = [];
const seen = [];
ada.on("state", ({ state, code }) => states.push(`${state}${code ? `:${code}` : ""}`));
ada.on("message", (frame) => seen.push(frame));
for (const client of [ada, bob]) {
  client.connect();
  client.join("rec");
}
await until(() => ada.state === "open" && bob.state === "open");
await until(() => ada.lastId.has("rec") && bob.lastId.has("rec")); // both joined
await bob.send("rec", "before");
await until(() => seen.length === 1);
console.log("ready");
await step("down");
await until(() => ada.state === "reconnecting");
const queued = ada.send("rec", "offline");
for (let k = 0; k < 10; k += 1) await bob.send("rec", `m${k}`);
console.log("sent");
await step("up");
const ack = await queued;
await until(() => seen.length >= 12);
await new Promise((resolve) => setTimeout(resolve, 300)); // a duplicate would come now
const ids = seen.map((frame) => frame.id);
console.log(JSON.stringify({
  states,
  texts: seen.map((frame) => frame.text),
  ids_increasing: ids.every((id, k) => k === 0 || id > ids[k - 1]),
  acked: ack.id === seen.find((frame) => frame.text === "offline")?.id,
}));
ada.close();
bob.close();
process.exit(0);

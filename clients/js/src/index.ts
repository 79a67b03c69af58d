/**
 * Hubbub's client SDK: `HubbubClient` (one connection, kept open), the protocol's frames as
 * types, and helpers. Works in browsers and in Node (pass `WebSocket`, e.g. the `ws`
 * package's, before Node 22). Where WebSockets are blocked it falls back to HTTP (server-sent
 * events down, POSTs up) by itself.
 *
 * @example
 * ```ts
 * import { HubbubClient } from "hubbub-client";
 * const client = new HubbubClient({ url: "ws://127.0.0.1:8000/ws", name: "ada" });
 * client.on("message", (m) => console.log(`${m.user}: ${m.text}`));
 * client.connect();
 * client.join("lobby");
 * await client.send("lobby", "hello");
 * ```
 *
 * @module
 */

export * from "./frames.js";
export * from "./client.js";
export * from "./sse.js";
/** The SDK's version; the compatibility rule with servers is in the README. */
export const VERSION = "0.1.0";

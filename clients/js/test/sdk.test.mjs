// The SDK against a real Hubbub server (HUBBUB_URL: `names` identities, a store), started by
// tests/test_sdk_js.py; and its link-health logic against a server that goes silent.
// Run: HUBBUB_URL=ws://127.0.0.1:8000/ws node --test test/
import assert from "node:assert/strict";
import { createECDH, randomBytes } from "node:crypto";
import { once } from "node:events";
import { test } from "node:test";
import WebSocket, { WebSocketServer } from "ws";
// HUBBUB_SDK: the build under test (tests/test_sdk_js.py builds one of its own).
const { AckTimeoutError, HubbubClient, HubbubError, applyEvent } = await import(
  process.env.HUBBUB_SDK ?? "../dist/index.js"
);

const URL_ = process.env.HUBBUB_URL;
const unique = (prefix) => `${prefix}${Math.random().toString(36).slice(2, 8)}`;

/** Resolves with the first `type` event's detail that `match` accepts (5 s at most). */
function next(client, type, match = () => true, ms = 5000) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => { stop(); reject(new Error(`no ${type} in ${ms} ms`)); }, ms);
    const stop = client.on(type, (detail) => {
      if (!match(detail)) return;
      clearTimeout(timer);
      stop();
      resolve(detail);
    });
  });
}

async function connected(name, options = {}) {
  const client = new HubbubClient({ url: URL_, name, WebSocket, ...options });
  const states = [];
  client.on("state", ({ state }) => states.push(state));
  const hello = next(client, "hello");
  client.connect();
  await hello;
  return { client, states };
}

async function joined(client, room) {
  const answer = next(client, "joined", (frame) => frame.room === room);
  client.join(room);
  return answer;
}

test("connects, says hello, and goes idle → connecting → open → closed", { skip: !URL_, timeout: 20_000 }, async () => {
  const { client, states } = await connected(unique("ada"));
  assert.equal(client.state, "open");
  assert.match(client.hello.user, /^ada/);
  assert.ok(client.hello.limits.heartbeat_interval_s > 0);
  client.close();
  assert.deepEqual(states, ["connecting", "open", "closed"]);
});

/** A WebSocket class whose first `refusals` connections (all, if Infinity) go to a port
 * where nothing listens, as when the server is down or a proxy refuses the upgrade; counts
 * the connections made in `made`. */
function refusing(refusals) {
  const made = [];
  class Refusing extends WebSocket {
    constructor(url) {
      const refused = made.length < refusals;
      made.push(refused ? "refused" : "sent");
      super(refused ? "ws://127.0.0.1:9/ws" : url);
    }
  }
  return { Refusing, made };
}

/** The transports of `client`'s state changes to `open`. */
function opens(client) {
  const seen = [];
  client.on("state", ({ state, transport }) => { if (state === "open") seen.push(transport); });
  return seen;
}

test("a WebSocket refused once while plain HTTP works (a server back from a restart in between): back on a WebSocket at once, nothing remembered", { skip: !URL_, timeout: 20_000 }, async () => {
  const url = `${URL_}?case=${unique("restart")}`; // the page's memory is per URL
  const { Refusing, made } = refusing(1);
  const ada = new HubbubClient({ url, name: unique("ada"), WebSocket: Refusing });
  const seen = opens(ada);
  const bob = new HubbubClient({ url, name: unique("bob"), WebSocket });
  try {
    ada.connect();
    await until(() => seen.length === 2, "two connections open");
    assert.deepEqual(seen, ["sse", "websocket"]);
    assert.deepEqual(made, ["refused", "sent", "sent"]); // refused, then the one more try, then the connection
    assert.equal(ada.transport, "websocket");
    const room = unique("room");
    await joined(ada, room); // the rooms are the WebSocket's now
    const tries = [];
    bob.on("state", ({ transport }) => { if (transport) tries.push(transport); });
    const hello = next(bob, "hello");
    bob.connect();
    await hello;
    assert.deepEqual(tries, ["websocket", "websocket"]); // this page does not use the fallback
  } finally {
    ada.close();
    bob.close();
  }
});

test("a WebSocket refused always while plain HTTP works (a proxy that blocks it): one more try beside the fallback, then the page uses the fallback", { skip: !URL_, timeout: 20_000 }, async () => {
  const url = `${URL_}?case=${unique("blocked")}`;
  const { Refusing, made } = refusing(Infinity);
  const ada = new HubbubClient({ url, name: unique("ada"), WebSocket: Refusing, websocketRetryMs: 1_000 });
  const seen = opens(ada);
  const { Refusing: RefusingToo, made: madeToo } = refusing(Infinity);
  const bob = new HubbubClient({ url, name: unique("bob"), WebSocket: RefusingToo });
  try {
    ada.connect();
    await until(() => seen.length === 1 && made.length === 2, "the fallback open, and one more WebSocket tried");
    assert.deepEqual(seen, ["sse"]);
    const room = unique("room");
    await joined(ada, room);
    const hello = next(bob, "hello");
    bob.connect(); // remembered: this page's next client takes the fallback first
    await hello;
    assert.equal(bob.transport, "sse");
    assert.deepEqual(madeToo, []);
    bob.close();
    // After websocketRetryMs a WebSocket is tried again (refused: back on the fallback, with
    // one more try beside it).
    await until(() => made.length === 4 && seen.length === 2, "a WebSocket tried again after websocketRetryMs");
    assert.deepEqual(seen, ["sse", "sse"]);
    assert.equal(ada.transport, "sse");
  } finally {
    ada.close();
    bob.close();
  }
});

test("a send resolves with its ack; the other member gets the message once; a retry with the same cid is a duplicate", { skip: !URL_, timeout: 20_000 }, async () => {
  const room = unique("room");
  const { client: ada } = await connected(unique("ada"));
  const { client: bob } = await connected(unique("bob"));
  try {
    await joined(ada, room);
    await joined(bob, room);
    const received = [];
    bob.on("message", (frame) => received.push(frame));
    const ack = await ada.send(room, "hello bob", { cid: "c-1" });
    assert.equal(ack.cid, "c-1");
    assert.equal(ack.duplicate, false);
    assert.ok(Number.isInteger(ack.id));
    const again = await ada.send(room, "hello bob", { cid: "c-1" });
    assert.deepEqual(again, { cid: "c-1", id: ack.id, duplicate: true });
    const second = next(bob, "message", (frame) => frame.text === "second");
    await ada.send(room, "second");
    await second;
    assert.deepEqual(received.map((frame) => frame.text), ["hello bob", "second"]);
    assert.equal(received[0].id, ack.id);
    assert.equal(received[0].user, ada.hello.user);
  } finally {
    ada.close();
    bob.close();
  }
});

test("a refused send rejects with the server's code, and a send to a room not joined too", { skip: !URL_, timeout: 20_000 }, async () => {
  const room = unique("room");
  const { client } = await connected(unique("ada"));
  try {
    await joined(client, room);
    const tooLong = "x".repeat(client.hello.limits.max_text_chars + 1);
    await assert.rejects(client.send(room, tooLong), (error) => {
      assert.ok(error instanceof HubbubError);
      assert.equal(error.code, "text_too_long");
      return true;
    });
    await assert.rejects(client.send(unique("elsewhere"), "hi"), (error) => error.code === "not_joined");
  } finally {
    client.close();
  }
});

test("history, direct messages, edits, reactions and typing", { skip: !URL_, timeout: 20_000 }, async () => {
  const room = unique("room");
  const { client: ada } = await connected(unique("ada"));
  const { client: bob } = await connected(unique("bob"));
  try {
    await joined(ada, room);
    await joined(bob, room);
    const { id } = await ada.send(room, "original");
    const page = await bob.roomHistory(room);
    assert.deepEqual(page.map((frame) => frame.text), ["original"]);

    const edited = next(bob, "edited", (frame) => frame.target === id);
    await ada.edit(room, id, "changed");
    const reaction = next(bob, "reaction", (frame) => frame.target === id);
    await bob.react(room, id, "👍");
    const edit = await edited;
    const react = await reaction;
    const shown = applyEvent(applyEvent(page[0], edit), react);
    assert.equal(shown.text, "changed");
    assert.deepEqual(shown.reactions, { "👍": [bob.hello.user] });

    const typing = next(bob, "typing", (frame) => frame.user === ada.hello.user);
    ada.typing(room);
    assert.equal((await typing).room, room);

    const direct = next(bob, "direct", (frame) => frame.text === "psst");
    await ada.sendTo(bob.hello.user, "psst");
    const dm = await direct;
    assert.equal(dm.user, ada.hello.user);
    const dms = await bob.directHistory(ada.hello.user);
    assert.deepEqual(dms.messages.map((frame) => frame.text), ["psst"]);
  } finally {
    ada.close();
    bob.close();
  }
});

test("findRooms lists the public rooms with a record, never a private one", { skip: !URL_, timeout: 20_000 }, async () => {
  const open = unique("town");
  const closed = unique("team");
  const { client: ada } = await connected(unique("ada"));
  const { client: bob } = await connected(unique("bob"));
  try {
    for (const [room, options] of [[open, { title: "Town square" }], [closed, { private: true }]]) {
      const made = next(ada, "room", (frame) => frame.room === room);
      ada.createRoom(room, options);
      await made;
    }
    const found = next(bob, "rooms", (frame) => frame.public === true);
    bob.findRooms(open.slice(-6));
    assert.deepEqual((await found).rooms.map((record) => [record.room, record.title]), [[open, "Town square"]]);
    const none = next(bob, "rooms", (frame) => frame.public === true);
    bob.findRooms(closed);
    assert.deepEqual((await none).rooms, []);
  } finally {
    ada.close();
    bob.close();
  }
});

test("search finds what you may read, with highlights, and refuses a private room", { skip: !URL_, timeout: 30_000 }, async () => {
  const room = unique("room");
  const hidden = unique("hidden");
  const word = unique("zebra");
  const { client: ada } = await connected(unique("ada"));
  const { client: bob } = await connected(unique("bob"));
  try {
    await joined(ada, room);
    const made = next(ada, "room", (frame) => frame.room === hidden);
    ada.createRoom(hidden, { private: true });
    await made;
    const { id } = await ada.send(room, `the ${word} crossed`);
    let found = { results: [] };
    // Stored, then indexed: about a second behind. Asked at most once a second (the server's
    // CHAT_USER_SEARCHES_PER_S, 1 with a burst of 5).
    const pause = () => new Promise((resolve) => setTimeout(resolve, 1_100));
    for (let tries = 0; tries < 15 && !found.results.length; tries++) {
      found = await bob.search(word.toUpperCase());
      if (!found.results.length) await pause();
    }
    assert.deepEqual(found.results.map((r) => [r.room, r.id, r.highlights]), [[room, id, [[4, 4 + word.length]]]]);
    assert.equal(found.next_offset, null);
    await pause();
    await assert.rejects(bob.search(word, { room: hidden }), (error) => error.code === "not_found");
  } finally {
    ada.close();
    bob.close();
  }
});

test("upload, a message with the file, links to read it (absolute, working); refusals and abort", { skip: !URL_, timeout: 20_000 }, async () => {
  const room = unique("room");
  const { client: ada } = await connected(unique("ada"));
  const { client: bob } = await connected(unique("bob"));
  try {
    await joined(ada, room);
    await joined(bob, room);
    const bytes = new TextEncoder().encode("%PDF-1.4\n% a tiny file for the SDK's test\n");
    const progress = [];
    const id = await ada.upload(room, new Blob([bytes]), {
      name: "notes.pdf", onProgress: (sent, total) => progress.push([sent, total]),
    });
    assert.match(id, /^[A-Za-z0-9_-]{16,32}$/);
    assert.deepEqual(progress.at(-1), [bytes.length, bytes.length]);
    const received = next(bob, "message", (frame) => frame.room === room);
    const ack = await ada.send(room, "", { attachments: [id] });
    const message = await received;
    assert.equal(message.id, ack.id);
    assert.equal(message.text, "");
    assert.deepEqual(message.attachments, [
      { id, name: "notes.pdf", size: bytes.length, type: "application/pdf", image: false },
    ]);
    const links = await bob.fileLinks(id);
    assert.equal(links.id, id);
    assert.equal(links.name, "notes.pdf");
    assert.equal(links.thumbnail, null);
    assert.ok(links.expires > Date.now() / 1000);
    const url = new URL(links.url); // absolute: on the server the client talks to
    assert.equal(url.host, new URL(URL_).host);
    assert.equal(url.protocol, "http:");
    const download = await fetch(url);
    assert.equal(download.status, 200);
    assert.deepEqual(new Uint8Array(await download.arrayBuffer()), bytes);
    // A deleted message carries no files any more.
    assert.equal(applyEvent(message, { type: "deleted", room, id: ack.id + 1, target: ack.id, user: ada.hello.user, ts: 1 }).attachments, undefined);

    // Refusals: a file the server will not take, links to a file that is not there (two
    // asked at once: each answer goes to its own request).
    await assert.rejects(
      ada.upload(room, { size: 1 << 30, name: "huge.bin" }),
      (error) => error instanceof HubbubError && error.code === "file_too_large",
    );
    const [missing, found] = await Promise.allSettled([bob.fileLinks("A".repeat(22)), bob.fileLinks(id)]);
    assert.equal(missing.status, "rejected");
    assert.equal(missing.reason.code, "not_found");
    assert.equal(found.status, "fulfilled");
    assert.equal(found.value.id, id);
    // Aborted: before it starts, and while it asks.
    const early = new AbortController();
    early.abort();
    await assert.rejects(ada.upload(room, new Blob(["x"]), { signal: early.signal, name: "x.txt" }), { name: "AbortError" });
    const late = new AbortController();
    const pending = ada.upload(room, new Blob(["x"]), { signal: late.signal, name: "x.txt" });
    late.abort();
    await assert.rejects(pending, { name: "AbortError" });
  } finally {
    ada.close();
    bob.close();
  }
});

/** Polls `check` (an async function) until it returns a truthy value, every 100 ms, 10 s at
 * most; resolves with that value. */
async function until(check, what, ms = 10_000) {
  const deadline = Date.now() + ms;
  for (;;) {
    const value = await check();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`not in ${ms} ms: ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

/** A room made by `owner` with `member` invited, both in it. */
async function sharedRoom(owner, member) {
  const room = unique("room");
  const made = next(owner, "room", (frame) => frame.room === room);
  owner.createRoom(room);
  await made;
  const invited = next(member, "invited", (frame) => frame.room === room);
  owner.invite(room, member.hello.user);
  await invited;
  await joined(owner, room);
  await joined(member, room);
  return room;
}

/** The entry of `room` in `client`'s inbox, asked for afresh. */
async function inboxEntry(client, room) {
  const inbox = next(client, "inbox");
  client.refreshInbox();
  return (await inbox).conversations.find((entry) => entry.room === room);
}

test("a mention: the message carries it, the mention event, mentions() unread then read, the inbox counts it", { skip: !URL_, timeout: 30_000 }, async () => {
  const { client: ada } = await connected(unique("ada"));
  const { client: bob } = await connected(unique("bob"));
  try {
    const room = await sharedRoom(ada, bob);
    const me = bob.hello.user;
    const mentioned = [];
    bob.on("mention", (frame) => mentioned.push(frame));
    const adaMentioned = [];
    ada.on("mention", (frame) => adaMentioned.push(frame));
    const plain = next(bob, "message", (frame) => frame.text === "no one here");
    const { id: plainId } = await ada.send(room, "no one here");
    assert.equal((await plain).mentions, undefined);
    bob.markRead(room, plainId); // bob takes part in the room (and has it in his inbox)

    const text = `hey @${me}, and @nobody${unique("x")}: look`;
    const message = next(bob, "message", (frame) => frame.text === text);
    const mention = next(bob, "mention");
    const { id } = await ada.send(room, text);
    const frame = await message;
    assert.equal(frame.id, id);
    assert.deepEqual(frame.mentions, [me]); // never a user who takes no part
    assert.equal(frame.here, undefined);
    assert.equal((await mention).id, id);
    const deleted = applyEvent(frame, { type: "deleted", room, id: id + 1, target: id, user: ada.hello.user, ts: 1 });
    assert.equal(deleted.mentions, undefined); // a tombstone mentions no one (as history shows it)
    await new Promise((resolve) => setTimeout(resolve, 5)); // a later ts
    const { id: id2 } = await ada.send(room, `again @${me}.`);

    // Stored a fraction of a second after delivery: listed unread, newest first, counted in
    // the inbox.
    const listed = await until(async () => {
      const page = await bob.mentions({ limit: 10 });
      return page.mentions.length === 2 && page;
    }, "the mentions listed");
    assert.deepEqual(listed.mentions.map((m) => [m.id, m.unread]), [[id2, true], [id, true]]);
    const entry = listed.mentions[1];
    assert.deepEqual([entry.room, entry.user, entry.text], [room, ada.hello.user, text]);
    assert.equal(entry.with, undefined);
    assert.equal(typeof entry.ts, "number");
    assert.deepEqual([listed.unread, listed.more], [2, false]);
    const first = await bob.mentions({ limit: 1 });
    assert.deepEqual([first.mentions.map((m) => m.id), first.more], [[id2], true]);
    const second = await bob.mentions({ before: first.mentions[0].ts, limit: 1 });
    assert.deepEqual([second.mentions.map((m) => m.id), second.more], [[id], false]);
    assert.deepEqual((await ada.mentions()).mentions, []); // bob's, not ada's
    const counted = await until(async () => {
      const found = await inboxEntry(bob, room);
      return found?.mentions === 2 && found;
    }, "the inbox counting the mentions");
    assert.equal(counted.unread, 2);

    // Read up to the first: only the second is unread, in the list and in the inbox.
    bob.markRead(room, id);
    const half = await until(async () => {
      const page = await bob.mentions();
      return page.unread === 1 && page;
    }, "the first mention read");
    assert.deepEqual(half.mentions.map((m) => [m.id, m.unread]), [[id2, true], [id, false]]);
    assert.equal((await until(async () => {
      const found = await inboxEntry(bob, room);
      return found?.mentions === 1 && found;
    }, "the inbox counting one")).unread, 1);
    bob.markRead(room, id2);
    await until(async () => (await bob.mentions()).unread === 0, "both read");
    assert.equal((await until(async () => {
      const found = await inboxEntry(bob, room);
      return found?.mentions === 0 && found;
    }, "the inbox counting none")).unread, 0);

    // @here: for everyone present (a mention event for bob, not for its sender).
    const here = next(bob, "mention", (m) => m.here === true);
    const { id: hereId } = await ada.send(room, "@here lunch");
    assert.equal((await here).id, hereId);
    assert.deepEqual(mentioned.map((m) => m.id), [id, id2, hereId]);
    assert.deepEqual(adaMentioned, []);
  } finally {
    ada.close();
    bob.close();
  }
});

test("notification levels: defaults, set, list, unmute, a refusal; asked at once, each gets its own answer", { skip: !URL_, timeout: 20_000 }, async () => {
  const room = unique("room");
  const { client: ada } = await connected(unique("ada"));
  const { client: bob } = await connected(unique("bob"));
  try {
    const peer = { with: bob.hello.user };
    // A room nobody uses answers as a private room does to outsiders.
    await assert.rejects(ada.notificationLevel(room), (error) => error instanceof HubbubError && error.code === "not_found");
    await joined(ada, room);
    const [ofRoom, ofPeer, none] = await Promise.all([
      ada.notificationLevel(room), ada.notificationLevel(peer), ada.notificationLevels(),
    ]);
    assert.deepEqual([ofRoom.room, ofRoom.level, ofRoom.mute_until], [room, "mentions", null]);
    assert.deepEqual([ofPeer.with, ofPeer.level, ofPeer.mute_until], [bob.hello.user, "all", null]);
    assert.deepEqual(none, []);

    const until_ = Date.now() + 3_600_000;
    const set = await ada.setNotificationLevel(room, { level: "all", muteUntil: new Date(until_) });
    assert.deepEqual([set.room, set.level, set.mute_until], [room, "all", until_]);
    const quiet = await ada.setNotificationLevel(peer, { level: "none" });
    assert.deepEqual([quiet.with, quiet.level, quiet.mute_until], [bob.hello.user, "none", null]);
    assert.equal((await ada.notificationLevel(room)).level, "all");
    const listed = await ada.notificationLevels();
    const key = (s) => s.room ?? `@${s.with}`;
    assert.deepEqual(
      listed.map((s) => [key(s), s.level, s.mute_until]).sort(),
      [[room, "all", until_], [`@${bob.hello.user}`, "none", null]].sort(),
    );
    // Levels are per user: bob's are untouched.
    assert.deepEqual(await bob.notificationLevels(), []);
    // Unmuted (0), the level kept.
    const unmuted = await ada.setNotificationLevel(room, { muteUntil: 0 });
    assert.deepEqual([unmuted.level, unmuted.mute_until], ["all", null]);

    // Refused: a conversation nobody uses (the server's refusal names it: each request gets
    // its own answer); a level that does not exist (never sent).
    const [refused, after] = await Promise.allSettled([
      ada.notificationLevel(unique("nowhere")), ada.notificationLevel(room),
    ]);
    assert.equal(refused.status, "rejected");
    assert.ok(refused.reason instanceof HubbubError);
    assert.equal(refused.reason.code, "not_found");
    assert.equal(after.status, "fulfilled");
    assert.deepEqual([after.value.room, after.value.level], [room, "all"]);
    await assert.rejects(ada.setNotificationLevel(room, { level: "loud" }), RangeError);
    await assert.rejects(ada.setNotificationLevel(room, { muteUntil: -1 }), RangeError);
    await assert.rejects(ada.mentions({ limit: 0 }), RangeError);
    assert.equal((await ada.notificationLevel(room)).level, "all");
  } finally {
    ada.close();
    bob.close();
  }
});

test("block and mute: mute, block, unmute, unblock and hidden() resolve with the lists; refusals reject; another tab is told", { skip: !URL_, timeout: 20_000 }, async () => {
  const me = unique("ada");
  const { client: ada } = await connected(me);
  const { client: tab } = await connected(me); // the same user on a second connection
  const bob = unique("bob");
  const carol = unique("carol");
  const errors = [];
  ada.on("error", (error) => errors.push(error));
  const told = [];
  ada.on("hidden", ({ muted, blocked }) => told.push({ muted, blocked }));
  try {
    assert.deepEqual(await ada.hidden(), { muted: [], blocked: [] });
    // The other tab gets the change by itself, as a `hidden` event.
    const onTab = next(tab, "hidden", (frame) => frame.muted.includes(bob));
    assert.deepEqual(await ada.mute(bob), { muted: [bob], blocked: [] });
    const pushed = await onTab;
    assert.deepEqual([pushed.type, pushed.muted, pushed.blocked], ["hidden", [bob], []]);
    assert.deepEqual(await ada.block(carol), { muted: [bob], blocked: [carol] });
    // Blocking a muted user makes the mute a block; unmuting a blocked user leaves it.
    assert.deepEqual(await ada.block(bob), { muted: [], blocked: [bob, carol].sort() });
    assert.deepEqual(await ada.unmute(bob), { muted: [], blocked: [bob, carol].sort() });

    // Asked at once, each gets its own answer: yourself and a name that is none are refused
    // (`bad_frame`), the others answered in between.
    const [self, unblocked, invalid, lists] = await Promise.allSettled([
      ada.mute(me), ada.unblock(bob), ada.block("not a name!"), ada.hidden(),
    ]);
    for (const refused of [self, invalid]) {
      assert.equal(refused.status, "rejected");
      assert.ok(refused.reason instanceof HubbubError);
      assert.equal(refused.reason.code, "bad_frame");
    }
    assert.deepEqual(unblocked, { status: "fulfilled", value: { muted: [], blocked: [carol] } });
    assert.deepEqual(lists, { status: "fulfilled", value: { muted: [], blocked: [carol] } });
    const cleared = next(tab, "hidden", (frame) => frame.blocked.length === 0);
    assert.deepEqual(await ada.unblock(carol), { muted: [], blocked: [] });
    assert.deepEqual((await cleared).muted, []);
    assert.deepEqual(await tab.hidden(), { muted: [], blocked: [] });
    // Every answer was a `hidden` event too; the refusals answered their requests, not the
    // error event.
    assert.deepEqual(told.at(-1), { muted: [], blocked: [] });
    assert.ok(told.length >= 8, JSON.stringify(told));
    assert.deepEqual(errors, []);
  } finally {
    ada.close();
    tab.close();
  }
});

test("reports and previews: a report resolves with the report (again: the same one); a loopback link is no preview; moderators' calls are forbidden to others", { skip: !URL_, timeout: 20_000 }, async () => {
  const room = unique("room");
  const { client: ada } = await connected(unique("ada"));
  const { client: bob } = await connected(unique("bob"));
  const errors = [];
  bob.on("error", (error) => errors.push(error));
  try {
    await joined(ada, room);
    await joined(bob, room);
    const { id } = await ada.send(room, "something rude");
    const report = await bob.report(room, id, "insulting");
    assert.equal(report.room, room);
    assert.deepEqual(report.message, { id, user: ada.hello.user, text: "something rude" });
    assert.deepEqual([report.reporter, report.reason, report.resolved], [bob.hello.user, "insulting", null]);
    const refusedCode = (code) => (error) => error instanceof HubbubError && error.code === code;

    // Asked at once, each gets its own answer, in the order the server gives them.
    const [again, missing, loopback, queue, resolve, kick, ban] = await Promise.allSettled([
      bob.report(room, id, "again"),
      bob.report(room, id + 1000, "no such message"),
      bob.preview("http://127.0.0.1:9/page"),
      bob.reports(),
      bob.resolve(report.id, "dismiss"),
      bob.kick(ada.hello.user, "no reason"),
      bob.ban(ada.hello.user, 60, "no reason"),
    ]);
    assert.deepEqual(again, { status: "fulfilled", value: report }); // the first one, unchanged
    assert.ok(refusedCode("not_found")(missing.reason), String(missing.reason));
    assert.ok(refusedCode("preview_unavailable")(loopback.reason), String(loopback.reason));
    for (const refused of [queue, resolve, kick, ban]) {
      assert.ok(refusedCode("forbidden")(refused.reason), String(refused.reason));
    }
    // Bad arguments never leave the client.
    await assert.rejects(bob.reports({ limit: 0 }), RangeError);
    await assert.rejects(bob.ban(ada.hello.user, 0), RangeError);
    assert.deepEqual(errors, []); // the refusals answered their requests, not the error event
    assert.equal(ada.state, "open");
  } finally {
    ada.close();
    bob.close();
  }
});

test("setVisible is taken; push subscriptions: one on an allowed push service, one elsewhere refused", { skip: !URL_, timeout: 20_000 }, async () => {
  const { client: ada } = await connected(unique("ada"));
  const errors = [];
  ada.on("error", (error) => errors.push(error));
  try {
    ada.setVisible(true);
    ada.setVisible(false);
    ada.setVisible(true);
    await ada.notificationLevels(); // a round trip: the visibility frames were handled by now
    assert.deepEqual(errors, []);

    const keys = {
      p256dh: createECDH("prime256v1").generateKeys().toString("base64url"),
      auth: randomBytes(16).toString("base64url"),
    };
    const allowed = process.env.HUBBUB_PUSH_SERVICE;
    if (allowed) {
      assert.match(ada.hello.push_key, /^[A-Za-z0-9_-]{80,90}$/); // a P-256 public key
      const endpoint = `${allowed}${unique("sub")}`;
      assert.equal(await ada.subscribePush({ endpoint, keys, expirationTime: null }), endpoint);
      assert.equal(await ada.unsubscribePush(endpoint), endpoint);
    }
    // An endpoint on no allowed push service (a server-side request forgery): refused.
    await assert.rejects(
      ada.subscribePush({ endpoint: "https://attacker.example/push/1", keys }),
      (error) => error instanceof HubbubError && error.code === "forbidden",
    );
    // A subscription without keys never leaves the client.
    await assert.rejects(ada.subscribePush({ endpoint: "https://attacker.example/push/2" }), TypeError);
    assert.deepEqual(errors, []); // the refusal answered the request, not the error event
  } finally {
    ada.close();
  }
});

test("a terminal close code (1008: an invalid name) leaves the client closed, not reconnecting", { skip: !URL_, timeout: 20_000 }, async () => {
  const client = new HubbubClient({ url: URL_, name: "not a valid name!", WebSocket, baseDelayMs: 50 });
  const states = [];
  client.on("state", (change) => states.push(change));
  const closed = next(client, "state", ({ state }) => state === "closed");
  client.connect();
  const change = await closed;
  assert.equal(change.code, 1008);
  await new Promise((resolve) => setTimeout(resolve, 300)); // time for a wrong reconnect
  assert.deepEqual(states.map(({ state }) => state), ["connecting", "closed"]);
  assert.equal(client.state, "closed");
});

test("close() rejects the sends still waiting for their ack", { skip: !URL_, timeout: 20_000 }, async () => {
  const { client } = await connected(unique("ada"));
  const room = unique("room");
  await joined(client, room);
  const sending = client.send(room, "in flight");
  client.close();
  await assert.rejects(sending, (error) => error instanceof HubbubError && error.code === "closed");
});

// -- link health, against a server that says hello and then nothing ----------------------------

async function silentServer(limits) {
  const server = new WebSocketServer({ host: "127.0.0.1", port: 0 });
  await once(server, "listening");
  const sockets = [];
  const received = []; // every frame the clients sent, parsed
  server.on("connection", (socket) => {
    sockets.push(socket);
    socket.on("message", (data) => received.push(JSON.parse(String(data))));
    socket.once("message", () => {
      socket.send(JSON.stringify({ type: "hello", user: "ada", conn: String(sockets.length), node: "n", limits }));
    });
  });
  const url = `ws://127.0.0.1:${server.address().port}/ws`;
  return { url, sockets, received, close: () => new Promise((resolve) => { for (const s of sockets) s.terminate(); server.close(resolve); }) };
}

const QUICK = { heartbeat_interval_s: 0.2, heartbeat_timeout_s: 0.1, max_frame_bytes: 65536, max_text_chars: 4000, max_rooms: 10, rate_limit_frames_per_s: 10, rate_limit_burst: 10 };

test("no ping within the heartbeat's deadline: the link is dead, the client reconnects", { timeout: 20_000 }, async () => {
  const server = await silentServer(QUICK);
  const client = new HubbubClient({ url: server.url, name: "ada", WebSocket, heartbeatSlackMs: 100, baseDelayMs: 50 });
  try {
    const reconnecting = next(client, "state", ({ state }) => state === "reconnecting");
    client.connect();
    const change = await reconnecting; // 0.2 + 0.1 + 0.1 s of silence
    assert.equal(change.code, 4000);
    await next(client, "hello"); // and it is back
    assert.equal(server.sockets.length, 2);
  } finally {
    client.close();
    await server.close();
  }
});

test("a send without an ack in ackTimeoutMs rejects (AckTimeoutError) and says so", { timeout: 20_000 }, async () => {
  const server = await silentServer({ ...QUICK, heartbeat_interval_s: 30 });
  const client = new HubbubClient({ url: server.url, name: "ada", WebSocket, ackTimeoutMs: 200 });
  try {
    const hello = next(client, "hello");
    client.connect();
    await hello;
    const said = next(client, "error", (error) => error.code === "ack_timeout");
    await assert.rejects(client.send("lobby", "into the void", { cid: "v1" }), AckTimeoutError);
    assert.equal((await said).cid, "v1");
  } finally {
    client.close();
    await server.close();
  }
});

test("setVisible is remembered: said again on every new connection", { timeout: 20_000 }, async () => {
  const server = await silentServer({ ...QUICK, heartbeat_interval_s: 30 });
  const client = new HubbubClient({ url: server.url, name: "ada", WebSocket, baseDelayMs: 50 });
  const visibility = () => server.received.filter((frame) => frame.type === "visibility");
  try {
    client.setVisible(true); // before connecting: sent once open
    let hello = next(client, "hello");
    client.connect();
    await hello;
    await until(() => visibility().length === 1, "the visibility frame");
    hello = next(client, "hello");
    server.sockets[0].terminate(); // lost: the client reconnects, and says it again
    await hello;
    await until(() => visibility().length === 2, "the visibility frame again");
    assert.deepEqual(visibility(), [{ type: "visibility", visible: true }, { type: "visibility", visible: true }]);
    client.setVisible(false);
    await until(() => visibility().length === 3, "visible: false");
    hello = next(client, "hello");
    server.sockets[1].terminate();
    await hello;
    await new Promise((resolve) => setTimeout(resolve, 200));
    assert.equal(visibility().length, 3); // not visible: nothing to say on the new connection
  } finally {
    client.close();
    await server.close();
  }
});

test("a hidden frame the server sends by itself before an answer is only the event; each request gets its own answer", { timeout: 20_000 }, async () => {
  const server = await silentServer({ ...QUICK, heartbeat_interval_s: 30 });
  const client = new HubbubClient({ url: server.url, name: "ada", WebSocket });
  const events = [];
  const errors = [];
  client.on("hidden", (frame) => events.push(frame));
  client.on("error", (error) => errors.push(error));
  try {
    const hello = next(client, "hello");
    client.connect();
    await hello;
    const asked = [client.mute("bob"), client.mute("ada"), client.hidden()];
    const hides = () => server.received.filter((frame) => ["mute", "hidden"].includes(frame.type));
    await until(() => hides().length === 3, "the three frames");
    assert.deepEqual(hides(), [{ type: "mute", user: "bob" }, { type: "mute", user: "ada" }, { type: "hidden" }]);
    const lists = { muted: ["bob"], blocked: ["carol"] };
    server.sockets[0].send([
      // Another tab blocked carol: it cannot be the answer to "mute bob" (bob is in neither).
      { type: "hidden", muted: [], blocked: ["carol"] },
      { type: "hidden", ...lists },
      { type: "error", code: "bad_frame", message: "you cannot mute or block yourself", ref: "mute" },
      { type: "hidden", ...lists },
    ].map((frame) => JSON.stringify(frame)).join("\n"));
    const [muted, self, listed] = await Promise.allSettled(asked);
    assert.deepEqual(muted, { status: "fulfilled", value: lists });
    assert.equal(self.status, "rejected");
    assert.ok(self.reason instanceof HubbubError);
    assert.equal(self.reason.code, "bad_frame");
    assert.deepEqual(listed, { status: "fulfilled", value: lists });
    assert.deepEqual(events.map(({ muted, blocked }) => ({ muted, blocked })), [
      { muted: [], blocked: ["carol"] }, lists, lists,
    ]);
    assert.deepEqual(errors, []);
    // Not connected: refused at once, nothing waits.
    client.close();
    await assert.rejects(client.hidden(), /not connected/);
  } finally {
    client.close();
    await server.close();
  }
});

test("sends made while disconnected wait and go out once connected", { timeout: 20_000 }, async () => {
  const server = await silentServer({ ...QUICK, heartbeat_interval_s: 30 });
  const received = server.received;
  const client = new HubbubClient({ url: server.url, name: "ada", WebSocket, ackTimeoutMs: 5000 });
  try {
    const queued = client.send("lobby", "written offline", { cid: "q1" });
    queued.catch(() => undefined);
    const hello = next(client, "hello");
    client.connect();
    await hello;
    for (let waited = 0; !received.some((frame) => frame.type === "send") && waited < 5000; waited += 20) {
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    assert.deepEqual(received.find((frame) => frame.type === "send"), { type: "send", room: "lobby", text: "written offline", cid: "q1" });
  } finally {
    client.close();
    await server.close();
  }
});

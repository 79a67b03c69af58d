// Hubbub browser client: one WebSocket, reconnects with backoff, rejoins rooms with `since`,
// delivers every room message once and in order, retries unacknowledged sends safely.
// No dependencies, no build step: `import { HubbubClient } from "/static/hubbub.js"`.
// Protocol and API: docs/protocol.md.

/** Close codes after which reconnecting would fail again the same way (docs/protocol.md). */
export const TERMINAL_CLOSE_CODES = new Set([1000, 1007, 1008, 1009, 4001, 4003]);
// Error codes after which a refused join is sent again (the server did not join the room).
const RETRY_JOIN_CODES = new Set(["broker_unavailable", "rate_limited"]);

const STABLE_AFTER_MS = 10_000; // a connection this old resets the backoff
const HEARTBEAT_SLACK_MS = 5_000;

/**
 * A chat connection. Events (`addEventListener(type, e => e.detail)`):
 * - `state`    {state: "connecting"|"open"|"reconnecting"|"closed", delayMs?, code?, reason?}
 * - `hello`    the server's hello frame (user, conn, node, limits)
 * - `joined`   {room, count, users, recovered | last}
 * - `left`     {room}
 * - `message`  a room message frame, at most once per id and in id order per room
 * - `direct`   a direct message frame (`to` instead of `room`), at most once per id; after
 *               a reconnect the ones missed meanwhile are fetched and delivered too
 * - `edited`, `deleted`, `reaction`  an event on a message (`target`), of a room or (`to`) a
 *               direct conversation: delivered like messages, at most once and in order
 *               (`applyEvent` applies one to a message frame)
 * - `receipt`  {room | to, user, id}: `user` has read up to `id`; `receipts` {room, read}
 * - `room`     a room's record {room, private, title, topic, role?, members?}; `rooms` {rooms};
 *               `member` {room, event, user, role, by}; `invited` {room, …, by}; `left`
 *               {room, reason?} (reason "removed": out of a private room, not rejoined)
 * - `inbox`    {conversations: [{room} | {with, last, unread, read, peer_read}]} (servers
 *               with a store)
 * - `resync`   {room}: messages may be missing; reload the room with `history(room)`;
 *               {to}: direct messages with `to` may be missing (the newest page was
 *               delivered: older ones with `directHistory(to, {before})`)
 * - `presence` a presence frame; `typing` {room, user}
 * - `ack`      {cid, id, duplicate}; `error` an error frame {code, message, ref?, cid?}
 */
/** The message frame `message` as event `event` (`edited`, `deleted`, `reaction` on it)
 * leaves it: a new object, as the server's history pages show messages. */
export function applyEvent(message, event) {
  const next = { ...message };
  if (event.type === "edited") {
    next.text = event.text;
    next.edited = event.ts;
  } else if (event.type === "deleted") {
    next.text = "";
    next.deleted = true;
    delete next.reactions;
    delete next.reply_to;
  } else if (event.type === "reaction") {
    const reactions = { ...(next.reactions ?? {}) };
    const users = (reactions[event.emoji] ?? []).filter((user) => user !== event.user);
    if (event.on) users.push(event.user);
    if (users.length) reactions[event.emoji] = users; else delete reactions[event.emoji];
    if (Object.keys(reactions).length) next.reactions = reactions; else delete next.reactions;
  }
  return next;
}

/** The display name of a user id: a guest's id is its name plus "-" and 16 hex digits. */
export function displayName(user) {
  return user.replace(/-[0-9a-f]{16}$/, "");
}

export class HubbubClient extends EventTarget {
  /**
   * @param {{url?: string, name?: string, guestKey?: string, getToken?: () => Promise<string>,
   *          baseDelayMs?: number, maxDelayMs?: number}} options
   *   `url` defaults to this page's host (`ws[s]://HOST/ws`). `name`: the display name on
   *   `guest` servers (the user on `names` servers); `guestKey`: the key that makes this browser
   *   the same guest on every reconnect (the server makes one if none is given: it is then in
   *   `guestKey` after `hello`, for the page to keep); `getToken` for `jwt` mode: called on
   *   every (re)connect and when the server asks for a refresh, it returns a fresh token (sent
   *   in an `auth` frame, never in the URL).
   */
  constructor({ url, name, guestKey, getToken, baseDelayMs = 500, maxDelayMs = 15_000 }) {
    super();
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    this.url = url ?? `${scheme}//${location.host}/ws`;
    this.name = name;
    this.guestKey = guestKey;
    this.getToken = getToken;
    this.baseDelayMs = baseDelayMs;
    this.maxDelayMs = maxDelayMs;
    this.state = "idle";
    this.hello = null;
    /** @type {Set<string>} rooms this client wants to be in (kept across reconnects) */
    this.rooms = new Set();
    /** @type {Map<string, number>} newest message id seen per room */
    this.lastId = new Map();
    this._ws = null;
    this._attempt = 0;
    this._retryTimer = null;
    this._watchdog = null;
    this._stableTimer = null;
    this._pending = new Map(); // cid -> send frame, until acknowledged
    this._seenDirect = new Set();
    /** @type {Map<string, number>} newest direct message id seen per other user */
    this.lastDirect = new Map();
    this._answers = new Map(); // "history:<conversation>" -> [resolve, ...] in request order
    this._stopped = false;
  }

  /** Open the connection (and keep it open until `close()`). */
  connect() {
    this._stopped = false;
    this._open();
  }

  /** Close for good: no reconnect. */
  close() {
    this._stopped = true;
    clearTimeout(this._retryTimer);
    this._clearTimers();
    if (this._ws) this._ws.close(1000, "bye");
    this._setState("closed", { code: 1000, reason: "closed by the client" });
  }

  join(room) {
    this.rooms.add(room);
    this._joinFrame(room);
  }

  leave(room) {
    this.rooms.delete(room);
    this.lastId.delete(room);
    this._send({ type: "leave", room });
  }

  /** Publish `text` to `room` (`replyTo`: the id of the message it answers); resent after a
   * reconnect until acknowledged (the server drops duplicates by `cid`). Returns the `cid`. */
  send(room, text, { replyTo } = {}) {
    return this._sendMessage({ type: "send", room, text, ...(replyTo ? { reply_to: replyTo } : {}) });
  }

  /** A direct message to every connection of `user`. Returns the `cid`. */
  sendTo(user, text, { replyTo } = {}) {
    return this._sendMessage({ type: "send", to: user, text, ...(replyTo ? { reply_to: replyTo } : {}) });
  }

  /** Replace the text of your message `id` in `conversation` (a room, or `{with: user}`);
   * retried like a send. Returns the `cid`. */
  edit(conversation, id, text) {
    return this._sendMessage({ type: "edit", ...this._target(conversation), id, text });
  }

  /** Delete message `id` (yours; anyone's for a moderator). Returns the `cid`. */
  deleteMessage(conversation, id) {
    return this._sendMessage({ type: "delete", ...this._target(conversation), id });
  }

  /** Toggle your reaction `emoji` on message `id`. Returns the `cid`. */
  react(conversation, id, emoji) {
    return this._sendMessage({ type: "react", ...this._target(conversation), id, emoji });
  }

  /** Create `room` with you as its owner (`private`: members only). Answered by `room`. */
  createRoom(room, { private: isPrivate = false, title = "", topic = "" } = {}) {
    this._send({ type: "create", room, private: isPrivate, title, topic });
  }

  /** Make `user` a member of `room` ("member" or "admin"). Answered by `room`. */
  invite(room, user, role = "member") {
    this._send({ type: "invite", room, user, role });
  }

  /** Take `user` out of `room`'s members (yourself: leave it for good). */
  removeMember(room, user) {
    this._send({ type: "remove", room, user });
  }

  /** Ask for the rooms you are a member of (answered by `rooms`). */
  listRooms() {
    this._send({ type: "rooms" });
  }

  /** Tell the room you are typing (call it at most every few seconds). */
  typing(room) {
    this._send({ type: "typing", room });
  }

  /** The room's history over HTTP, oldest first: the newest `limit` messages, or those
   * before `before`. Without `before`, it also moves this client's position in the room
   * forward, so the next reconnect asks only for what came after. */
  async history(room, { before, limit = 50 } = {}) {
    const http = new URL(this.url.replace(/^ws/, "http"));
    http.pathname = `/rooms/${encodeURIComponent(room)}/messages`;
    http.search = "";
    http.searchParams.set("limit", String(limit));
    if (before !== undefined) http.searchParams.set("before", String(before));
    // A jwt server wants the socket's token here too (and honours its rooms claim).
    const headers = this.getToken ? { Authorization: `Bearer ${await this.getToken()}` } : {};
    const response = await fetch(http, { headers });
    if (!response.ok) throw new Error(`history of ${room}: HTTP ${response.status}`);
    const { messages } = await response.json();
    if (before === undefined && messages.length && this.rooms.has(room)) {
      const newest = messages[messages.length - 1].id;
      if (newest > (this.lastId.get(room) ?? 0)) this.lastId.set(room, newest);
    }
    return messages;
  }

  /** A page of `room`'s history over the socket (any identity mode; a private room's
   * members only), oldest first: the newest `limit` messages, or those before `before`.
   * Resolves to the messages; without `before`, moves this client's position forward as
   * `history()` does. */
  async roomHistory(room, { before, limit = 50 } = {}) {
    const frame = { type: "history", room, limit };
    if (before !== undefined) frame.before = before;
    const { messages } = await this._ask(`history:${room}`, frame);
    if (before === undefined && messages.length && this.rooms.has(room)) {
      const newest = messages[messages.length - 1].id;
      if (newest > (this.lastId.get(room) ?? 0)) this.lastId.set(room, newest);
    }
    return messages;
  }

  /** A page of direct messages with `user`, over the socket, oldest first: the newest
   * `limit` before `before` (the newest of all without it), or the oldest after `after`.
   * Resolves to the `history` frame ({messages, more, recovered?}). */
  directHistory(user, { before, after, limit = 50 } = {}) {
    const frame = { type: "history", with: user, limit };
    if (before !== undefined) frame.before = before;
    if (after !== undefined) frame.after = after;
    return this._ask(`history:@${user}`, frame);
  }

  /** Everything up to message `id` is read, in `room` or (`{with: user}`) a direct
   * conversation. Needs a server with a store; the position never moves back. */
  markRead(conversation, id) {
    this._send({ type: "read", ...this._target(conversation), id });
  }

  /** Ask for the inbox again (it also comes by itself after every `hello`). */
  refreshInbox() {
    this._send({ type: "inbox" });
  }

  // -- internals ------------------------------------------------------------------------

  _target(conversation) {
    return typeof conversation === "string" ? { room: conversation } : { with: conversation.with };
  }

  _ask(key, frame) {
    return new Promise((resolve, reject) => {
      if (this.state !== "open") { reject(new Error("not connected")); return; }
      const waiting = this._answers.get(key) ?? [];
      waiting.push({ resolve, reject });
      this._answers.set(key, waiting);
      this._send(frame);
    });
  }

  _answer(key, value, failed = false) {
    const waiting = this._answers.get(key);
    const next = waiting?.shift();
    if (!next) return false;
    if (!waiting.length) this._answers.delete(key);
    if (failed) next.reject(value); else next.resolve(value);
    return true;
  }

  /** After a reconnect: fetch the direct messages that came while this client was away. */
  async _catchUpDirect(user) {
    let after = this.lastDirect.get(user);
    for (;;) {
      const page = await this.directHistory(user, { after, limit: 100 });
      if (page.recovered === false) {
        // Some cannot be vouched for (e.g. a conversation quiet for a day): deliver the
        // newest page, and say that older ones may be missing (page back with `before`).
        const newest = await this.directHistory(user, { limit: 100 });
        for (const frame of newest.messages) this._deliverDirect(frame);
        this._emit("resync", { to: user });
        return;
      }
      for (const frame of page.messages) this._deliverDirect(frame);
      if (!page.more || !page.messages.length) return;
      after = page.messages[page.messages.length - 1].id;
    }
  }

  _deliverDirect(frame) {
    if (this._seenDirect.has(frame.id)) return;
    this._seenDirect.add(frame.id);
    if (this._seenDirect.size > 1000) this._seenDirect.delete(this._seenDirect.values().next().value);
    const peer = frame.user === this.hello?.user ? frame.to : frame.user;
    if (frame.id > (this.lastDirect.get(peer) ?? 0)) this.lastDirect.set(peer, frame.id);
    this._emit(frame.type === "message" ? "direct" : frame.type, frame);
  }

  _open() {
    clearTimeout(this._retryTimer);
    this._setState(this._attempt === 0 ? "connecting" : "reconnecting");
    const url = new URL(this.url);
    // Who we are goes in the first frame, never in the URL: URLs end up in access logs,
    // proxies' logs and the console's connection errors. `auth=frame` tells the server so.
    url.searchParams.set("auth", "frame");
    const ws = new WebSocket(url);
    this._ws = ws;
    ws.onopen = async () => {
      const frame = { type: "auth" };
      if (this.getToken) {
        try {
          frame.token = await this.getToken();
        } catch (error) {
          this._emit("error", { code: "token_unavailable", message: String(error) });
          ws.close();
          return;
        }
      } else {
        // A guest (or a `names` user): the name, and the key once the server gave us one.
        if (this.name) frame.name = this.name;
        if (this.guestKey) frame.guest = this.guestKey;
      }
      if (ws === this._ws) ws.send(JSON.stringify(frame));
    };
    ws.onmessage = (event) => {
      if (ws !== this._ws) return;
      this._armWatchdog();
      for (const line of String(event.data).split("\n")) {
        if (line) this._handle(JSON.parse(line));
      }
    };
    ws.onclose = (event) => {
      if (ws === this._ws) this._closed(event.code, event.reason);
    };
  }

  _closed(code, reason) {
    this._ws = null;
    this._clearTimers();
    for (const waiting of this._answers.values()) {
      for (const { reject } of waiting) reject(new Error("disconnected"));
    }
    this._answers.clear();
    if (this._stopped) return;
    if (TERMINAL_CLOSE_CODES.has(code)) {
      this._setState("closed", { code, reason: reason || "closed by the server" });
      return;
    }
    // Full jitter: a random delay up to an exponentially growing cap, so that the clients of
    // a drained or restarted server do not all come back at the same moment.
    const cap = Math.min(this.maxDelayMs, this.baseDelayMs * 2 ** this._attempt);
    const delayMs = Math.max(100, Math.round(Math.random() * cap));
    this._attempt += 1;
    this._setState("reconnecting", { delayMs, code, reason });
    this._retryTimer = setTimeout(() => this._open(), delayMs);
  }

  _handle(frame) {
    switch (frame.type) {
      case "hello":
        this.hello = frame;
        if (frame.guest) this.guestKey = frame.guest; // made for us: reconnect as the same guest
        this._setState("open");
        this._stableTimer = setTimeout(() => { this._attempt = 0; }, STABLE_AFTER_MS);
        this.dispatchEvent(new CustomEvent("hello", { detail: frame }));
        for (const room of this.rooms) this._joinFrame(room);
        for (const pending of this._pending.values()) this._send(pending);
        for (const user of this.lastDirect.keys()) {
          this._catchUpDirect(user).catch(() => {}); // a later reconnect tries again
        }
        break;
      case "ping":
        this._send({ type: "pong" });
        break;
      case "refresh":
        // The token expires soon: hand the server a new one (same user).
        if (this.getToken) {
          this.getToken().then(
            (token) => this._send({ type: "auth", token }),
            (error) => this._emit("error", { code: "token_unavailable", message: String(error) }),
          );
        }
        break;
      case "message":
      case "edited":
      case "deleted":
      case "reaction":
        // Messages and the events on them share one id sequence per conversation.
        if (frame.room !== undefined) {
          if (frame.id <= (this.lastId.get(frame.room) ?? 0)) return; // already delivered
          this.lastId.set(frame.room, frame.id);
          this._emit(frame.type, frame);
        } else {
          this._deliverDirect(frame);
        }
        break;
      case "history": {
        const key = `history:${frame.room ?? `@${frame.with}`}`;
        this._answer(key, frame);
        break;
      }
      case "inbox":
        for (const entry of frame.conversations) {
          // Where a reconnect's catch-up of each direct conversation starts.
          if (entry.with !== undefined && !this.lastDirect.has(entry.with)) {
            this.lastDirect.set(entry.with, entry.last ? entry.last.id : entry.read);
          }
        }
        this._emit("inbox", frame);
        break;
      case "joined":
        // A room that had no message for us yet: recover from where it stood at the join.
        if (typeof frame.last === "number" && !this.lastId.has(frame.room)) {
          this.lastId.set(frame.room, frame.last);
        }
        this._emit("joined", frame);
        if (frame.recovered === false) this._emit("resync", { room: frame.room });
        break;
      case "ack":
        this._pending.delete(frame.cid);
        this._emit("ack", frame);
        break;
      case "error":
        if (frame.code === "resync" && frame.room) {
          // The server lost track of a room: rejoin it from our position.
          this._joinFrame(frame.room);
          return;
        }
        if (frame.code === "resync" && frame.to) {
          // Live direct messages may have been missed: fetch them from the history.
          for (const user of this.lastDirect.keys()) {
            this._catchUpDirect(user).catch(() => this._emit("resync", { to: user }));
          }
          return;
        }
        if (frame.ref === "history") {
          const key = `history:${frame.room ?? `@${frame.with}`}`;
          if (this._answer(key, new Error(`${frame.code}: ${frame.message}`), true)) return;
        }
        if (frame.ref === "join" && frame.room && RETRY_JOIN_CODES.has(frame.code)) {
          // The join did not happen: try again later (from our position), or the room would
          // stay silent until the next reconnect.
          setTimeout(() => { if (this.rooms.has(frame.room)) this._joinFrame(frame.room); }, 1000);
        }
        if (frame.cid !== undefined && frame.code !== "broker_unavailable") {
          this._pending.delete(frame.cid); // refused for good (too long, not joined...)
        } else if (frame.cid !== undefined) {
          setTimeout(() => { const p = this._pending.get(frame.cid); if (p) this._send(p); }, 1000);
        }
        this._emit("error", frame);
        break;
      case "left":
        if (frame.reason === "removed") {
          // Out of a private room's members: do not rejoin it on the next reconnect.
          this.rooms.delete(frame.room);
          this.lastId.delete(frame.room);
        }
        this._emit("left", frame);
        break;
      case "room":
      case "rooms":
      case "member":
      case "invited":
      case "presence":
      case "typing":
      case "receipt":
      case "receipts":
      case "authenticated":
        this._emit(frame.type, frame);
        break;
      default:
        break; // pong, and frame types of newer servers
    }
  }

  _joinFrame(room) {
    const since = this.lastId.get(room);
    this._send(since === undefined ? { type: "join", room } : { type: "join", room, since });
  }

  _sendMessage(frame) {
    const cid = crypto.randomUUID ? crypto.randomUUID() : `${Date.now()}-${Math.random()}`;
    const full = { ...frame, cid };
    this._pending.set(cid, full);
    this._send(full);
    return cid;
  }

  _send(frame) {
    if (this._ws && this._ws.readyState === WebSocket.OPEN && this.state === "open") {
      this._ws.send(JSON.stringify(frame));
    }
  }

  _armWatchdog() {
    // The server pings every heartbeat_interval_s: silence for longer means the connection
    // is dead even if the browser has not noticed (no FIN on a lost network).
    clearTimeout(this._watchdog);
    const limits = this.hello?.limits;
    if (!limits) return;
    const ms = (limits.heartbeat_interval_s + limits.heartbeat_timeout_s) * 1000 + HEARTBEAT_SLACK_MS;
    this._watchdog = setTimeout(() => {
      const ws = this._ws;
      if (!ws) return;
      this._ws = null;
      ws.close();
      this._closed(4000, "no heartbeat from the server");
    }, ms);
  }

  _clearTimers() {
    clearTimeout(this._watchdog);
    clearTimeout(this._stableTimer);
  }

  _setState(state, extra = {}) {
    this.state = state;
    this._emit("state", { state, ...extra });
  }

  _emit(type, detail) {
    this.dispatchEvent(new CustomEvent(type, { detail }));
  }
}

/**
 * The Hubbub client: one WebSocket, kept open (reconnects with jittered backoff), rooms
 * rejoined with `since`, every room message delivered once and in order, sends retried safely
 * (same `cid`) and answered as promises. Where no WebSocket gets through (a proxy that blocks
 * or breaks the upgrade), it falls back to the HTTP transport by itself (`./sse.js`).
 *
 * @module
 */

import {
  TERMINAL_CLOSE_CODES,
  type AckFrame, type AuthFrame, type AuthenticatedFrame, type Cid, type ClientFrame,
  type Conversation, type DeletedFrame, type EditedFrame, type ErrorFrame, type FileFrame,
  type FileId, type HelloFrame, type HiddenFrame, type HiddenLists, type HideFrame,
  type HistoryFrame, type InboxFrame, type InvitedFrame,
  type JoinedFrame, type LeftFrame, type MemberFrame, type MentionsFrame,
  type MentionsRequestFrame, type MessageEventFrame, type MessageFrame, type NotificationLevel,
  type NotificationSetting, type NotificationsFrame, type NotificationsListFrame,
  type NotificationsRequestFrame, type PresenceFrame, type PushSubscriptionInput, type PushSubscribedFrame,
  type PushUnsubscribedFrame, type ReactionFrame, type ReceiptFrame, type ReceiptsFrame,
  type RoomFrame, type RoomName, type RoomsFrame, type SearchFrame, type SendFrame,
  type ServerFrame, type TypingNoticeFrame, type UploadFrame, type UserId,
  type BanFrame, type BannedFrame, type KickFrame, type KickedFrame, type PreviewFrame,
  type Report, type ReportedFrame, type ReportsFrame, type ReportsRequestFrame,
  type ResolvedFrame,
} from "./frames.js";
import { SseSocket, type FetchLike } from "./sse.js";

/** Where the connection stands. `idle`: before `connect()`; `closed`: for good (after
 * `close()` or a terminal close code); `reconnecting`: waiting `delayMs` before the next try. */
export type ConnectionState = "idle" | "connecting" | "open" | "reconnecting" | "closed";

/** How frames travel: a WebSocket, or the HTTP fallback (server-sent events down, POSTs up). */
export type Transport = "websocket" | "sse";

export interface StateChange {
  state: ConnectionState;
  /** `connecting`, `reconnecting`, `open`: the transport of that connection. */
  transport?: Transport;
  /** `reconnecting`: how long until the next try. */
  delayMs?: number;
  /** The close code and reason that ended the last connection. */
  code?: number;
  reason?: string;
}

/** Messages may be missing: in `room` (reload it, e.g. with `roomHistory`), or in the direct
 * messages with `to` (the newest page was delivered; older ones with `directHistory`). */
export interface Discontinuity { room?: RoomName; to?: UserId }

/** An error the client itself reports: its `getToken` failed, or a send got no ack in
 * `ackTimeoutMs` (`cid`: the send's; it is no longer retried). */
export interface ClientError {
  type?: undefined; code: "token_unavailable" | "ack_timeout"; message: string; cid?: Cid;
}

/** The events of a client and what each carries (`on(type, detail => …)`, or
 * `addEventListener(type, event => event.detail)`). */
export interface HubbubEventMap {
  state: StateChange;
  hello: HelloFrame;
  joined: JoinedFrame;
  left: LeftFrame;
  /** A room message: at most once per id, in id order per room. */
  message: MessageFrame;
  /** A direct message: at most once per id; those missed while away are fetched. */
  direct: MessageFrame;
  /** A room or direct message of someone else that mentions you (`mentions` holds your
   * user) or everyone present (`here`): right after its `message` or `direct` event. */
  mention: MessageFrame;
  edited: EditedFrame;
  deleted: DeletedFrame;
  reaction: ReactionFrame;
  receipt: ReceiptFrame;
  receipts: ReceiptsFrame;
  room: RoomFrame;
  rooms: RoomsFrame;
  member: MemberFrame;
  invited: InvitedFrame;
  inbox: InboxFrame;
  /** The discontinuity event: a join answered `recovered: false`, or a `resync`. */
  resync: Discontinuity;
  presence: PresenceFrame;
  typing: TypingNoticeFrame;
  ack: AckFrame;
  error: ErrorFrame | ClientError;
  authenticated: AuthenticatedFrame;
  /** Whom you mute and block, as they are now: every `hidden` frame, the answers to `mute`,
   * `unmute`, `block`, `unblock` and `hidden()` included, and those the server sends by
   * itself when another connection of yours (or the HTTP API) changes the lists. */
  hidden: HiddenFrame;
}

/** The event a client dispatches: `detail` carries what happened, as a `CustomEvent`'s does
 * (built on `Event`, which every supported runtime has: Node 18 has no global CustomEvent). */
export class HubbubEvent<T> extends Event {
  readonly detail: T;

  constructor(type: string, detail: T) {
    super(type);
    this.detail = detail;
  }
}

/** What an acknowledged send resolves to. */
export interface Ack {
  cid: Cid;
  /** The message's id (the first one's, for a duplicate). */
  id: number;
  /** The server had it already (a retry): not delivered again. */
  duplicate: boolean;
}

/** How a send is made: a reply (`replyTo`), a retry of an earlier send (`cid`), with files
 * (`attachments`: ids that `upload` resolved to, for this conversation), in a trace of yours
 * (`traceparent`: a W3C trace context, e.g. your tracer's current span). */
export interface SendOptions {
  replyTo?: number;
  cid?: Cid;
  attachments?: FileId[];
  traceparent?: string;
}

/** What `upload` reports and obeys: `onProgress(sent, total)` in bytes of the file, as it
 * goes; `signal` aborts it (the promise rejects with an `AbortError`); `name`: the file's name
 * (default: the `File`'s own). */
export interface UploadOptions {
  onProgress?: (sent: number, total: number) => void;
  signal?: AbortSignal;
  name?: string;
}

/** A request or a send the server refused (`code`: see docs/protocol.md, "Error codes"), or
 * an upload the storage refused (`file_too_large`, `storage_unavailable`, `upload_failed`). */
export class HubbubError extends Error {
  readonly code: string;
  readonly frame: ErrorFrame | undefined;

  constructor(code: string, message: string, frame?: ErrorFrame) {
    super(`${code}: ${message}`);
    this.name = "HubbubError";
    this.code = code;
    this.frame = frame;
  }
}

/** No ack within `ackTimeoutMs` of an open connection: the send is no longer retried (it
 * may still have been published: send it again with the same `cid` to be sure). */
export class AckTimeoutError extends Error {
  readonly cid: Cid;

  constructor(cid: Cid) {
    super(`no ack for ${String(cid)}`);
    this.name = "AckTimeoutError";
    this.cid = cid;
  }
}

/** The WebSocket the client needs (the browser's, or e.g. the `ws` package's in Node). */
export interface WebSocketLike {
  readonly readyState: number;
  onopen: ((event: unknown) => void) | null;
  onmessage: ((event: { data: unknown }) => void) | null;
  onclose: ((event: { code: number; reason: string }) => void) | null;
  onerror: ((event: unknown) => void) | null;
  send(data: string): void;
  close(code?: number, reason?: string): void;
}
export type WebSocketConstructor = new (url: string) => WebSocketLike;

export interface ClientOptions {
  /** `ws[s]://HOST/ws`; defaults to the page's host in a browser. */
  url?: string;
  /** `guest` servers: the display name (`names` servers: the user). */
  name?: string;
  /** `guest` servers: the key that makes this client the same guest on every connection
   * (none: the server makes one, in `guestKey` after `hello`: keep it). */
  guestKey?: string;
  /** `jwt` servers: a fresh token, asked at every (re)connect and on the server's `refresh`.
   * Sent in the first frame, never in the URL. */
  getToken?: () => Promise<string>;
  /** Backoff: the first retry within `baseDelayMs`, doubling up to `maxDelayMs` (full jitter). */
  baseDelayMs?: number;
  maxDelayMs?: number;
  /** How long a send waits for its ack on an open connection before it is given up (and a
   * request, such as `roomHistory`, for its answer). */
  ackTimeoutMs?: number;
  /** A connection up this long resets the backoff. */
  stableAfterMs?: number;
  /** Slack on top of the server's heartbeat (its hello's limits) before the link is dead. */
  heartbeatSlackMs?: number;
  /** The WebSocket class (Node before 22: `import WebSocket from "ws"`). */
  WebSocket?: WebSocketConstructor;
  /** The transports to use, in order of preference: by default a WebSocket, and the HTTP
   * fallback when no WebSocket opens (or none brings a frame within `fallbackAfterMs`);
   * `["sse"]` uses the fallback only. */
  transports?: readonly Transport[];
  /** How long an open WebSocket may bring no frame before the client falls back. */
  fallbackAfterMs?: number;
  /** After falling back, how long the client stays on the fallback before it tries a
   * WebSocket again (remembered by every client of the page for that URL meanwhile). */
  websocketRetryMs?: number;
  /** The `fetch` of the HTTP fallback (the global one by default). */
  fetch?: FetchLike;
}

interface PendingSend {
  frame: ClientFrame & { cid: Cid };
  resolve: (ack: Ack) => void;
  reject: (error: Error) => void;
  timer: ReturnType<typeof setTimeout> | undefined;
}

/** What a request over the socket is answered with. */
type Answer =
  | HistoryFrame | SearchFrame | UploadFrame | FileFrame | MentionsFrame | NotificationsFrame
  | NotificationsListFrame | PushSubscribedFrame | PushUnsubscribedFrame | HiddenFrame
  | PreviewFrame | ReportedFrame | ReportsFrame | ResolvedFrame | KickedFrame | BannedFrame;

/** How `setNotificationLevel` changes a conversation's level: `level` what notifies you,
 * `muteUntil` nothing until then (epoch ms, or a Date; 0 unmutes). Either may be left out. */
export interface NotificationLevelOptions {
  level?: NotificationLevel;
  muteUntil?: number | Date;
}

/** How `reports` pages the queue: open reports (oldest first) after `before`, or with
 * `resolved` the resolved ones (newest first) before it; `limit` 1–100 (default 20). */
export interface ReportsOptions {
  resolved?: boolean;
  before?: number;
  limit?: number;
}

/** The request frames whose refusals name no key of their own (the server answers a
 * connection's frames in order: an error answers the oldest request of its type). */
type OrderedRef =
  | "file" | "notifications" | "push_subscribe" | "push_unsubscribe" | ModerationRef;
/** The requests of link previews, reports and moderation: each answered (or refused, with
 * its type as `ref`) in the order asked, among those of its type. */
type ModerationRef = "preview" | "report" | "reports" | "resolve" | "kick" | "ban";
const MODERATION_REFS: ReadonlySet<string> = new Set<ModerationRef>([
  "preview", "report", "reports", "resolve", "kick", "ban",
]);
interface Waiter { resolve: (frame: Answer) => void; reject: (error: Error) => void }

/** The request frames answered with `hidden` (and refused with their type as `ref`). */
const HIDE_REFS: ReadonlySet<string> = new Set(["mute", "unmute", "block", "unblock", "hidden"]);
const NOTIFICATION_LEVELS: readonly NotificationLevel[] = ["all", "mentions", "none"];
// The largest page of mentions the server gives (its `limit` bound).
const MENTIONS_PAGE_MAX = 500;
// The largest page of the reports queue the server gives.
const REPORTS_PAGE_MAX = 100;
// The longest ban the server takes (10 years), in seconds.
const BAN_MAX_S = 10 * 365 * 86_400;

/** `value` if it is an integer in [min, max] (a time in ms at most 2^53); else a RangeError. */
function integer(name: string, value: number, min: number, max = 2 ** 53): number {
  if (!Number.isSafeInteger(value) || value < min || value > max) {
    throw new RangeError(`${name} must be an integer from ${min} to ${max}, not ${String(value)}`);
  }
  return value;
}

// Error codes after which a refused join is sent again (the server did not join the room).
const RETRY_JOIN_CODES = new Set(["broker_unavailable", "rate_limited"]);
const OPEN = 1;
/** Why a client left a WebSocket for the HTTP fallback: none opened, or one opened and
 * brought nothing. */
type FallbackReason = "refused" | "silent";
/** Per server URL, until when this page's clients use the HTTP fallback (epoch ms). */
const fallbackUntil = new Map<string, number>();

/** The message frame `message` as event `event` leaves it: a new object, as history pages
 * show messages. */
export function applyEvent(message: MessageFrame, event: MessageEventFrame): MessageFrame {
  const next: MessageFrame = { ...message };
  if (event.type === "edited") {
    next.text = event.text;
    next.edited = event.ts;
  } else if (event.type === "deleted") {
    next.text = "";
    next.deleted = true;
    delete next.reactions;
    delete next.reply_to;
    delete next.attachments;
    delete next.mentions;
    delete next.here;
  } else {
    const reactions = { ...(next.reactions ?? {}) };
    const users = (reactions[event.emoji] ?? []).filter((user) => user !== event.user);
    if (event.on) users.push(event.user);
    if (users.length) reactions[event.emoji] = users;
    else delete reactions[event.emoji];
    if (Object.keys(reactions).length) next.reactions = reactions;
    else delete next.reactions;
  }
  return next;
}

/** The display name of a user id: a guest's id is its name plus "-" and 16 hex digits. */
export function displayName(user: UserId): string {
  return user.replace(/-[0-9a-f]{16}$/, "");
}

/** A random delay in [0, min(max, base·2^attempt)] (full jitter), at least 100 ms. */
export function backoffDelay(attempt: number, baseMs: number, maxMs: number): number {
  const cap = Math.min(maxMs, baseMs * 2 ** attempt);
  return Math.max(100, Math.round(Math.random() * cap));
}

function abortError(): Error {
  return new DOMException("the upload was aborted", "AbortError");
}

/** An upload's HTTP status as the error `upload` rejects with (null: no answer at all). */
function uploadError(status: number | null): HubbubError {
  if (status === 413) return new HubbubError("file_too_large", "the storage refused the file as too large");
  if (status === null || status >= 500) {
    return new HubbubError("storage_unavailable", `the file storage ${status === null ? "could not be reached" : `answered ${status}`}, try again`);
  }
  return new HubbubError("upload_failed", `the file storage answered ${status}`);
}

function newCid(): string {
  const crypto = globalThis.crypto;
  return crypto?.randomUUID ? crypto.randomUUID() : `${Date.now()}-${Math.random()}`;
}

function defaultUrl(): string {
  const location = (globalThis as { location?: { protocol: string; host: string } }).location;
  if (!location) throw new Error("HubbubClient: give `url` (no page to take it from)");
  return `${location.protocol === "https:" ? "wss:" : "ws:"}//${location.host}/ws`;
}

/**
 * A chat connection. Nothing happens before `connect()`. Events: see {@link HubbubEventMap}.
 */
export class HubbubClient extends EventTarget {
  readonly url: string;
  name: string | undefined;
  guestKey: string | undefined;
  getToken: (() => Promise<string>) | undefined;
  readonly baseDelayMs: number;
  readonly maxDelayMs: number;
  readonly ackTimeoutMs: number;
  state: ConnectionState = "idle";
  hello: HelloFrame | null = null;
  /** Rooms this client wants to be in (kept across reconnects). */
  readonly rooms = new Set<RoomName>();
  /** Newest message id seen per room (the `since` of the next join). */
  readonly lastId = new Map<RoomName, number>();
  /** Newest direct message id seen per other user. */
  readonly lastDirect = new Map<UserId, number>();

  private readonly stableAfterMs: number;
  private readonly heartbeatSlackMs: number;
  private readonly WebSocketClass: WebSocketConstructor | undefined;
  private ws: WebSocketLike | null = null;
  /** The transport of the current (or last) connection. */
  transport: Transport | null = null;
  private readonly transports: readonly Transport[];
  private readonly fallbackAfterMs: number;
  private readonly websocketRetryMs: number;
  private readonly fetchImpl: FetchLike | undefined;
  private fallbackTimer: ReturnType<typeof setTimeout> | undefined;
  /** The next connection's transport, once (a switch under way). */
  private nextTransport: Transport | null = null;
  /** Why this connection is the fallback, if it is one tried after a WebSocket failed:
   * `silent` (one opened but brought nothing: once the fallback is open the page remembers
   * to use it) or `refused` (none opened: once the fallback is open a WebSocket is tried once
   * more, since a server back from a restart between the two tries looks the same). */
  private fallingBack: FallbackReason | null = null;
  /** The WebSocket tried once more beside an open fallback (see `fallingBack`). */
  private probe: WebSocketLike | null = null;
  private attempt = 0;
  private retryTimer: ReturnType<typeof setTimeout> | undefined;
  private watchdog: ReturnType<typeof setTimeout> | undefined;
  private stableTimer: ReturnType<typeof setTimeout> | undefined;
  private readonly pending = new Map<Cid, PendingSend>();
  private readonly seenDirect = new Set<number>();
  private readonly answers = new Map<string, Waiter[]>();
  /** Per request type, the keys of the requests not answered yet, in the order asked: an
   * error that names none answers the oldest (the server answers a connection's frames in
   * order). */
  private readonly asked = new Map<OrderedRef, string[]>();
  /** The `mute`, `unmute`, `block`, `unblock` and `hidden` frames not answered yet, in the
   * order written (their waiters are under the key `hidden`). */
  private readonly hiding: HideFrame[] = [];
  /** What `setVisible` said last (sent again on every new connection). */
  private visible = false;
  private stopped = false;
  private readonly onOnline = (): void => {
    // The browser is back online: try now rather than at the end of the backoff.
    if (this.state === "reconnecting" && !this.ws) this.open();
  };

  constructor(options: ClientOptions = {}) {
    super();
    this.url = options.url ?? defaultUrl();
    this.name = options.name;
    this.guestKey = options.guestKey;
    this.getToken = options.getToken;
    this.baseDelayMs = options.baseDelayMs ?? 500;
    this.maxDelayMs = options.maxDelayMs ?? 15_000;
    this.ackTimeoutMs = options.ackTimeoutMs ?? 10_000;
    this.stableAfterMs = options.stableAfterMs ?? 10_000;
    this.heartbeatSlackMs = options.heartbeatSlackMs ?? 5_000;
    this.transports = options.transports ?? ["websocket", "sse"];
    if (!this.transports.length) throw new Error("HubbubClient: `transports` names none");
    this.fallbackAfterMs = options.fallbackAfterMs ?? 5_000;
    this.websocketRetryMs = options.websocketRetryMs ?? 300_000;
    this.fetchImpl = options.fetch;
    this.WebSocketClass =
      options.WebSocket ?? (globalThis as { WebSocket?: WebSocketConstructor }).WebSocket;
    if (!this.WebSocketClass && !this.transports.includes("sse")) {
      throw new Error("HubbubClient: no WebSocket here: pass `WebSocket`");
    }
  }

  /** Listen to `type`; returns the function that stops listening. */
  on<K extends keyof HubbubEventMap>(type: K, listener: (detail: HubbubEventMap[K]) => void): () => void {
    const wrapped = (event: Event): void => listener((event as HubbubEvent<HubbubEventMap[K]>).detail);
    this.addEventListener(type, wrapped);
    return () => this.removeEventListener(type, wrapped);
  }

  /** Open the connection, and keep it open until `close()`. */
  connect(): void {
    this.stopped = false;
    (globalThis as { addEventListener?: typeof addEventListener }).addEventListener?.(
      "online", this.onOnline,
    );
    this.open();
  }

  /** Close for good: no reconnect; the sends not acked yet fail. */
  close(): void {
    this.stopped = true;
    clearTimeout(this.retryTimer);
    this.clearTimers();
    (globalThis as { removeEventListener?: typeof removeEventListener }).removeEventListener?.(
      "online", this.onOnline,
    );
    const ws = this.ws;
    this.ws = null;
    ws?.close(1000, "bye");
    this.failAnswers(new Error("closed"));
    for (const [cid, pending] of this.pending) {
      clearTimeout(pending.timer);
      pending.reject(new HubbubError("closed", `the client was closed before ${String(cid)} was acked`));
    }
    this.pending.clear();
    this.setState("closed", { code: 1000, reason: "closed by the client" });
  }

  /** Join `room` (and rejoin it after every reconnect, from the newest message seen). */
  join(room: RoomName): void {
    this.rooms.add(room);
    this.joinFrame(room);
  }

  leave(room: RoomName): void {
    this.rooms.delete(room);
    this.lastId.delete(room);
    this.write({ type: "leave", room });
  }

  /** Publish `text` to `room`. Resolves with its ack; rejects with a {@link HubbubError} if
   * refused, an {@link AckTimeoutError} without an ack in time. Resent (same `cid`) after a
   * reconnect until acked; `cid`: retry an earlier send. */
  send(room: RoomName, text: string, options: SendOptions = {}): Promise<Ack> {
    return this.sendAcked(sendFrame({ type: "send", room, text, cid: options.cid ?? newCid() }, options));
  }

  /** A direct message to every connection of `user` (as `send`). */
  sendTo(user: UserId, text: string, options: SendOptions = {}): Promise<Ack> {
    return this.sendAcked(sendFrame({ type: "send", to: user, text, cid: options.cid ?? newCid() }, options));
  }

  /** Replace the text of your message `id` (acked and retried like a send). */
  edit(conversation: Conversation, id: number, text: string): Promise<Ack> {
    return this.sendAcked({ type: "edit", ...target(conversation), id, text, cid: newCid() });
  }

  /** Delete message `id` (yours; anyone's for a moderator). */
  deleteMessage(conversation: Conversation, id: number): Promise<Ack> {
    return this.sendAcked({ type: "delete", ...target(conversation), id, cid: newCid() });
  }

  /** Toggle your reaction `emoji` on message `id`. */
  react(conversation: Conversation, id: number, emoji: string): Promise<Ack> {
    return this.sendAcked({ type: "react", ...target(conversation), id, emoji, cid: newCid() });
  }

  /** Create `room` with you as its owner (`private`: members only). Answered by `room`. */
  createRoom(room: RoomName, options: { private?: boolean; title?: string; topic?: string } = {}): void {
    this.write({
      type: "create", room, private: options.private ?? false, title: options.title ?? "",
      topic: options.topic ?? "",
    });
  }

  /** Change `room`'s title and/or topic (its owner or an admin). Answered by `room`. */
  describeRoom(room: RoomName, options: { title?: string; topic?: string }): void {
    this.write({ type: "describe", room, ...options });
  }

  /** Make `user` a member of `room`. Answered by `room`. */
  invite(room: RoomName, user: UserId, role: "member" | "admin" = "member"): void {
    this.write({ type: "invite", room, user, role });
  }

  /** Take `user` out of `room`'s members (yourself: leave it for good). */
  removeMember(room: RoomName, user: UserId): void {
    this.write({ type: "remove", room, user });
  }

  /** Ask for the rooms you are a member of (answered by `rooms`). */
  listRooms(): void {
    this.write({ type: "rooms" });
  }

  /** Ask for the directory: public rooms with a record, by name; with `q` (at most 64
   * characters) those whose name, title or topic holds it. Answered by `rooms` with
   * `public: true`; private rooms are never listed. */
  findRooms(q?: string): void {
    this.write(q ? { type: "rooms", public: true, q } : { type: "rooms", public: true });
  }

  /** Tell the room you are typing (at most every few seconds). */
  typing(room: RoomName): void {
    this.write({ type: "typing", room });
  }

  /** Everything up to message `id` is read (servers with a store). */
  markRead(conversation: Conversation, id: number): void {
    this.write({ type: "read", ...target(conversation), id });
  }

  /** Ask for the inbox again (it also comes by itself after every `hello`). */
  refreshInbox(): void {
    this.write({ type: "inbox" });
  }

  /** A page of `room`'s history over HTTP (`GET /rooms/{room}/messages`), oldest first. */
  async history(room: RoomName, options: { before?: number; limit?: number } = {}): Promise<MessageFrame[]> {
    const http = new URL(this.url.replace(/^ws/, "http"));
    http.pathname = `/rooms/${encodeURIComponent(room)}/messages`;
    http.search = "";
    http.searchParams.set("limit", String(options.limit ?? 50));
    if (options.before !== undefined) http.searchParams.set("before", String(options.before));
    // A jwt server wants the socket's token here too (and honours its rooms claim).
    const headers: Record<string, string> = this.getToken
      ? { Authorization: `Bearer ${await this.getToken()}` } : {};
    const response = await fetch(http, { headers });
    if (!response.ok) throw new Error(`history of ${room}: HTTP ${response.status}`);
    const { messages } = (await response.json()) as { messages: MessageFrame[] };
    if (options.before === undefined) this.advance(room, messages);
    return messages;
  }

  /** A page of `room`'s history over the socket (any identity mode; private rooms' members
   * only), oldest first. Without `before`, moves this client's position forward. */
  async roomHistory(room: RoomName, options: { before?: number; limit?: number } = {}): Promise<MessageFrame[]> {
    const frame: ClientFrame = { type: "history", room, limit: options.limit ?? 50 };
    if (options.before !== undefined) frame.before = options.before;
    const { messages } = await this.ask<HistoryFrame>(`history:${room}`, frame);
    if (options.before === undefined) this.advance(room, messages);
    return messages;
  }

  /** A page of direct messages with `user`: the newest `limit` before `before` (the newest of
   * all without it), or the oldest after `after`. */
  directHistory(user: UserId, options: { before?: number; after?: number; limit?: number } = {}): Promise<HistoryFrame> {
    const frame: ClientFrame = { type: "history", with: user, limit: options.limit ?? 50 };
    if (options.before !== undefined) frame.before = options.before;
    if (options.after !== undefined) frame.after = options.after;
    return this.ask<HistoryFrame>(`history:@${user}`, frame);
  }

  /** Messages you may read now whose text matches `q` (words, "quoted phrases", `-word`;
   * servers with a store): in one conversation (`room` or `with`) or in all, newest first or
   * best match first. Rejects with a {@link HubbubError} if refused (`not_found` for a
   * conversation you may not read, `no_store`, `rate_limited`). Page on with `next_offset`. */
  search(q: string, options: { room?: RoomName; with?: UserId; order?: "newest" | "best"; limit?: number; offset?: number } = {}): Promise<SearchFrame> {
    return this.ask<SearchFrame>("search", { type: "search", q, ...options });
  }

  /** Upload `file` to attach it to a message of `conversation` (servers with a store and
   * file storage): asks the server where to (an `upload` frame), then sends the bytes there
   * (an `XMLHttpRequest` where there is one, for progress and abort; else `fetch`). Resolves
   * with the file's id, for `send(…, {attachments: [id]})`. Rejects with a
   * {@link HubbubError}: the server's refusal (`file_too_large`, `rate_limited`,
   * `storage_unavailable`, `no_store`...), or the storage's (`file_too_large`,
   * `storage_unavailable`, `upload_failed`); with an `AbortError` once `signal` aborts. */
  async upload(conversation: Conversation, file: Blob & { name?: string }, options: UploadOptions = {}): Promise<FileId> {
    const { signal } = options;
    if (signal?.aborted) throw abortError();
    const name = options.name || file.name || "file";
    const cid = newCid();
    let stop = (): void => undefined;
    const aborted = new Promise<never>((_, reject) => {
      const onAbort = (): void => reject(abortError());
      signal?.addEventListener("abort", onAbort, { once: true });
      stop = () => signal?.removeEventListener("abort", onAbort);
    });
    aborted.catch(() => undefined); // settled after the upload's end: nobody waits for it
    try {
      const asked = await Promise.race([
        this.ask<UploadFrame>(`upload:${cid}`, {
          type: "upload", ...target(conversation), name, size: file.size, cid,
        }),
        aborted,
      ]);
      await Promise.race([this.transfer(asked, file, name, options), aborted]);
      return asked.file;
    } finally {
      stop();
    }
  }

  /** Links to read file `id` (of a message you may read now): `url`, `thumbnail` (an image's
   * preview, else null), absolute, and until when they work (`expires`, epoch seconds: ask
   * again after). Rejects with a {@link HubbubError} (`not_found` for a file you may not
   * read, `storage_unavailable`). */
  async fileLinks(id: FileId): Promise<FileFrame> {
    const links = await this.askInOrder<FileFrame>("file", `file:${id}`, { type: "file", id });
    return {
      ...links, url: this.absolute(links.url),
      thumbnail: links.thumbnail === null ? null : this.absolute(links.thumbnail),
    };
  }

  /** The messages that mention you (servers with a store), newest first, in conversations
   * you may read now, with their text as it is now and whether each is `unread`; `unread`
   * (top level) counts all the unread ones. Page back with `before` = the last one's `ts`
   * while `more`. Rejects with a {@link HubbubError} (`no_store`, `rate_limited`), or a
   * `RangeError` for a `limit` out of 1–500 or a negative `before`. */
  async mentions(options: { before?: number; limit?: number } = {}): Promise<MentionsFrame> {
    const frame: MentionsRequestFrame = { type: "mentions" };
    if (options.before !== undefined) frame.before = integer("before", options.before, 0);
    if (options.limit !== undefined) frame.limit = integer("limit", options.limit, 1, MENTIONS_PAGE_MAX);
    return this.ask<MentionsFrame>("mentions", frame);
  }

  /** Your notification level of `conversation` (servers with a store): `level` and
   * `mute_until` (epoch ms, null: not muted). Rooms default to `mentions`, direct
   * conversations to `all`. */
  notificationLevel(conversation: Conversation): Promise<NotificationsFrame> {
    return this.askInOrder<NotificationsFrame>(
      "notifications", notificationsKey(target(conversation)),
      { type: "notifications", ...target(conversation) },
    );
  }

  /** Change your notification level of `conversation`: `level` what notifies you (`all`,
   * `mentions`: mentions and direct messages, `none`), `muteUntil` nothing until then (0
   * unmutes). Resolves with the level as it is now; rejects with a {@link HubbubError}
   * (`not_found` for a conversation you may not read, `no_store`...), or a `RangeError` for
   * a level that does not exist or a time that is not one. */
  async setNotificationLevel(conversation: Conversation, options: NotificationLevelOptions): Promise<NotificationsFrame> {
    const frame: NotificationsRequestFrame = { type: "notifications", ...target(conversation) };
    if (options.level !== undefined) {
      // Checked here: the server's refusal of a malformed frame names no request to answer.
      if (!NOTIFICATION_LEVELS.includes(options.level)) throw new RangeError(`no notification level ${String(options.level)}`);
      frame.level = options.level;
    }
    if (options.muteUntil !== undefined) {
      const ms = options.muteUntil instanceof Date ? options.muteUntil.getTime() : options.muteUntil;
      frame.mute_until = integer("muteUntil", ms, 0);
    }
    return this.askInOrder<NotificationsFrame>("notifications", notificationsKey(frame), frame);
  }

  /** Every conversation whose notification level or mute you changed. */
  async notificationLevels(): Promise<NotificationSetting[]> {
    const answer = await this.askInOrder<NotificationsListFrame>(
      "notifications", notificationsKey({}), { type: "notifications" },
    );
    return answer.conversations;
  }

  /** Say whether this connection shows the chat to someone now (a page: its tab visible and
   * used in the last minutes). While one of your connections is visible, nothing is pushed
   * to you. Remembered: a new connection starts not visible, so it is said again after every
   * reconnect. */
  setVisible(visible: boolean): void {
    this.visible = visible;
    this.write({ type: "visibility", visible });
  }

  /** Have the server push notifications to this browser (servers with a store and Web Push):
   * `subscription` is what `registration.pushManager.subscribe({userVisibleOnly: true,
   * applicationServerKey: hello.push_key})` gave, as `toJSON()` makes it. Resolves with its
   * endpoint; rejects with a {@link HubbubError} (a push service the server does not allow,
   * `no_store`...), or a `TypeError` for a subscription without endpoint or keys. */
  async subscribePush(subscription: PushSubscriptionInput): Promise<string> {
    const { endpoint, keys } = subscription;
    const p256dh = keys?.["p256dh"];
    const auth = keys?.["auth"];
    if (!endpoint || !p256dh || !auth) throw new TypeError("a push subscription has an endpoint and keys p256dh and auth");
    const answer = await this.askInOrder<PushSubscribedFrame>("push_subscribe", `push_subscribe:${endpoint}`, {
      type: "push_subscribe", subscription: { endpoint, keys: { p256dh, auth } },
    });
    return answer.endpoint;
  }

  /** Stop pushing to `endpoint` (a subscription of yours, e.g. after
   * `PushSubscription.unsubscribe()`). Resolves with the endpoint. */
  async unsubscribePush(endpoint: string): Promise<string> {
    const answer = await this.askInOrder<PushUnsubscribedFrame>(
      "push_unsubscribe", `push_unsubscribe:${endpoint}`, { type: "push_unsubscribe", endpoint },
    );
    return answer.endpoint;
  }

  /** Mute `user` (servers with a store): their messages, the events on them and their typing
   * are hidden from you everywhere (live, history, search, the inbox, mentions,
   * notifications) until `unmute`; nothing is deleted, and everyone else sees them as
   * before. Muting a blocked user leaves the block. Resolves with the lists as they are now
   * (the `hidden` event comes too, on every connection of yours); rejects with a
   * {@link HubbubError}: `bad_frame` (yourself, or not a user name), `too_many_hidden`,
   * `no_store`, `store_unavailable`, `rate_limited`. */
  mute(user: UserId): Promise<HiddenLists> {
    return this.hide({ type: "mute", user });
  }

  /** End a mute of `user` (a block stays: `unblock` ends it). As `mute`. */
  unmute(user: UserId): Promise<HiddenLists> {
    return this.hide({ type: "unmute", user });
  }

  /** Block `user` (servers with a store): muted, and they cannot write to you directly
   * (messages, edits, reactions, files) nor invite you to a room; you may still write to
   * them. Blocking a muted user makes the mute a block. As `mute`. */
  block(user: UserId): Promise<HiddenLists> {
    return this.hide({ type: "block", user });
  }

  /** End a block of `user`. As `mute`. */
  unblock(user: UserId): Promise<HiddenLists> {
    return this.hide({ type: "unblock", user });
  }

  /** Whom you mute and block (empty lists on a server without a store). Changes made while
   * this client was disconnected are not sent to it: ask again after a reconnect (`hello`)
   * to be sure. */
  hidden(): Promise<HiddenLists> {
    return this.hide({ type: "hidden" });
  }

  /** The preview of link `url` (`http(s)://…`, at most 2048 characters) found in a message:
   * `title`, `description` and `site` as plain text (show them as text, never as markup),
   * and `image` as a link to the server's file storage (absolute; never the site's; null
   * without one). Rejects with a {@link HubbubError}: `preview_unavailable` (not a public address,
   * not a page, too slow, nothing to show, or previews off), `rate_limited`, `bad_frame`
   * (not an http(s) link). The server caches previews and failures: asking again is cheap. */
  async preview(url: string): Promise<PreviewFrame> {
    const answer = await this.askInOrder<PreviewFrame>("preview", `preview:${url}`, { type: "preview", url });
    const { image } = answer;
    return image ? { ...answer, image: { ...image, url: this.absolute(image.url) } } : answer;
  }

  /** Report message `id` of `conversation` (one you may read now; servers with a store) to
   * the moderators, with `reason` (1–500 characters). Resolves with the report as stored
   * (reporting the same message again resolves with the first report); rejects with a
   * {@link HubbubError}: `not_found` (no such message, deleted, or a conversation you may
   * not read), `bad_frame` (a reason out of bounds), `rate_limited`, `no_store`. */
  async report(conversation: Conversation, id: number, reason: string): Promise<Report> {
    const answer = await this.askInOrder<ReportedFrame>("report", "report", {
      type: "report", ...target(conversation), id, reason,
    });
    return answer.report;
  }

  /** Moderators (a token whose `roles` claim holds `"moderator"`): a page of the reports
   * queue, of the conversations you may read now: open reports oldest first after `before`,
   * or with `resolved` resolved ones newest first before it. `next` is the `before` of the
   * next page (null: the last). Rejects with a {@link HubbubError} (`forbidden` for anyone
   * else, `no_store`), or a `RangeError` for a `limit` out of 1–100 or a negative `before`. */
  async reports(options: ReportsOptions = {}): Promise<ReportsFrame> {
    const frame: ReportsRequestFrame = { type: "reports" };
    if (options.resolved !== undefined) frame.resolved = options.resolved;
    if (options.before !== undefined) frame.before = integer("before", options.before, 0);
    if (options.limit !== undefined) frame.limit = integer("limit", options.limit, 1, REPORTS_PAGE_MAX);
    return this.askInOrder<ReportsFrame>("reports", "reports", frame);
  }

  /** Moderators: resolve report `id`: `dismiss` it, or `delete` its message (everyone in
   * the conversation gets `deleted`). Resolves with the report as it is now (one resolved
   * already: as it was); rejects with a {@link HubbubError} (`forbidden`, `not_found` for a
   * report you may not read). */
  async resolve(id: number, action: "dismiss" | "delete"): Promise<Report> {
    const answer = await this.askInOrder<ResolvedFrame>("resolve", `resolve:${id}`, {
      type: "resolve", id, action,
    });
    return answer.report;
  }

  /** Moderators: close every connection of `user` on every server (close code 4003; they may
   * reconnect), with `reason` (at most 200 characters) in the close. Resolves once done;
   * rejects with a {@link HubbubError} (`forbidden`, `broker_unavailable`). */
  async kick(user: UserId, reason?: string): Promise<void> {
    const frame: KickFrame = { type: "kick", user };
    if (reason !== undefined) frame.reason = reason;
    await this.askInOrder<KickedFrame>("kick", `kick:${user}`, frame);
  }

  /** Moderators: close `user`'s connections and refuse new ones for `durationS` seconds (at
   * most 10 years), with `reason` (at most 200 characters). Resolves once done; rejects with
   * a {@link HubbubError} (`forbidden`, `broker_unavailable`), or a `RangeError` for a
   * duration out of bounds. */
  async ban(user: UserId, durationS: number, reason?: string): Promise<void> {
    if (!(Number.isFinite(durationS) && durationS > 0 && durationS <= BAN_MAX_S)) {
      throw new RangeError(`durationS must be above 0 and at most ${BAN_MAX_S}, not ${String(durationS)}`);
    }
    const frame: BanFrame = { type: "ban", user, duration_s: durationS };
    if (reason !== undefined) frame.reason = reason;
    await this.askInOrder<BannedFrame>("ban", `ban:${user}`, frame);
  }

  // -- internals ------------------------------------------------------------------------

  /** `url` (relative: on this client's server) as an absolute http(s) URL. */
  private absolute(url: string): string {
    return new URL(url, this.url.replace(/^ws/, "http")).toString();
  }

  /** Send the bytes where an `upload` answer says; resolves once the storage took them. */
  private transfer(asked: UploadFrame, file: Blob, name: string, options: UploadOptions): Promise<void> {
    const url = this.absolute(asked.url);
    let body: Blob | FormData = file;
    if (asked.method === "POST") {
      const form = new FormData();
      for (const [key, value] of Object.entries(asked.fields)) form.append(key, value);
      form.append("file", file, name); // last: S3 takes the fields before the file
      body = form;
    }
    const { onProgress, signal } = options;
    const total = file.size;
    const XHR = (globalThis as { XMLHttpRequest?: typeof XMLHttpRequest }).XMLHttpRequest;
    if (!XHR) {
      onProgress?.(0, total);
      const init: RequestInit = { method: asked.method, body };
      if (signal) init.signal = signal;
      return fetch(url, init).then((response) => {
        if (!response.ok) throw uploadError(response.status);
        onProgress?.(total, total);
      }, (error: unknown) => {
        throw signal?.aborted ? abortError() : error instanceof Error && error.name === "AbortError" ? error : uploadError(null);
      });
    }
    return new Promise<void>((resolve, reject) => {
      if (signal?.aborted) {
        reject(abortError());
        return;
      }
      const xhr = new XHR();
      const onAbort = (): void => xhr.abort();
      xhr.open(asked.method, url);
      xhr.upload.onprogress = (event) => {
        // In bytes of the file (a form's are a little more than the file's).
        const of = event.lengthComputable && event.total > 0 ? event.total : total;
        onProgress?.(Math.min(total, Math.round((event.loaded / of) * total)), total);
      };
      xhr.onload = () => {
        signal?.removeEventListener("abort", onAbort);
        if (xhr.status >= 200 && xhr.status < 300) {
          onProgress?.(total, total);
          resolve();
        } else {
          reject(uploadError(xhr.status));
        }
      };
      xhr.onerror = () => {
        signal?.removeEventListener("abort", onAbort);
        reject(uploadError(null));
      };
      xhr.onabort = () => reject(abortError());
      signal?.addEventListener("abort", onAbort, { once: true });
      onProgress?.(0, total);
      xhr.send(body);
    });
  }

  private advance(room: RoomName, messages: MessageFrame[]): void {
    const newest = messages[messages.length - 1];
    if (newest && this.rooms.has(room) && newest.id > (this.lastId.get(room) ?? 0)) {
      this.lastId.set(room, newest.id);
    }
  }

  private sendAcked(frame: ClientFrame & { cid: Cid }): Promise<Ack> {
    const promise = new Promise<Ack>((resolve, reject) => {
      this.pending.set(frame.cid, { frame, resolve, reject, timer: undefined });
    });
    // Handled here too: a caller that does not await (the page) leaves no unhandled
    // rejection; one that does still gets it.
    promise.catch(() => undefined);
    this.writePending(frame.cid);
    return promise;
  }

  /** Write a pending send if the connection is open, and time its ack from now. */
  private writePending(cid: Cid): void {
    const pending = this.pending.get(cid);
    if (!pending || !this.write(pending.frame)) return;
    clearTimeout(pending.timer);
    pending.timer = setTimeout(() => {
      if (this.pending.get(cid) !== pending) return;
      this.pending.delete(cid);
      pending.reject(new AckTimeoutError(cid));
      this.emit("error", { code: "ack_timeout", message: `no ack for ${String(cid)}`, cid });
    }, this.ackTimeoutMs);
  }

  private settle(cid: Cid, outcome: Ack | Error): void {
    const pending = this.pending.get(cid);
    if (!pending) return;
    this.pending.delete(cid);
    clearTimeout(pending.timer);
    if (outcome instanceof Error) pending.reject(outcome);
    else pending.resolve(outcome);
  }

  private ask<T extends Answer>(key: string, frame: ClientFrame): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      if (this.state !== "open") {
        reject(new Error("not connected"));
        return;
      }
      // No answer within ackTimeoutMs: the caller gets an AckTimeoutError. The waiter keeps
      // its place, so that a late answer is taken (and dropped) by it, not by the next asker.
      const timer = setTimeout(() => reject(new AckTimeoutError(key)), this.ackTimeoutMs);
      const waiter: Waiter = {
        resolve: (answer) => { clearTimeout(timer); resolve(answer as T); },
        reject: (error) => { clearTimeout(timer); reject(error); },
      };
      const waiting = this.answers.get(key) ?? [];
      waiting.push(waiter);
      this.answers.set(key, waiting);
      this.write(frame);
    });
  }

  /** `ask`, noting the key in the order asked: a refusal of `ref` that names no key answers
   * the oldest (see {@link answerInOrder}). */
  private askInOrder<T extends Answer>(ref: OrderedRef, key: string, frame: ClientFrame): Promise<T> {
    if (this.state === "open") {
      const keys = this.asked.get(ref) ?? [];
      keys.push(key);
      this.asked.set(ref, keys);
    }
    return this.ask<T>(key, frame);
  }

  /** Hand `value` to the request of type `ref` waiting on `key`, or, for an error without a
   * key (undefined), on the oldest request of that type. */
  private answerInOrder(ref: OrderedRef, key: string | undefined, value: Answer | Error): boolean {
    const keys = this.asked.get(ref) ?? [];
    let found = key;
    const at = key === undefined ? -1 : keys.indexOf(key);
    if (at >= 0) keys.splice(at, 1);
    else if (value instanceof Error) found = keys.shift(); // names no request asked: the oldest
    if (!keys.length) this.asked.delete(ref);
    return found !== undefined && this.answer(found, value);
  }

  private answer(key: string, value: Answer | Error): boolean {
    const waiting = this.answers.get(key);
    const next = waiting?.shift();
    if (!waiting || !next) return false;
    if (!waiting.length) this.answers.delete(key);
    if (value instanceof Error) next.reject(value);
    else next.resolve(value);
    return true;
  }

  /** Write `frame` and resolve with the `hidden` frame that answers it. The server answers a
   * connection's frames in order, but also sends `hidden` by itself when the lists change
   * elsewhere, which may come first: a `hidden` frame answers the oldest request waiting
   * only when its lists can be that request's answer (see `answersHide`); any other is
   * only the `hidden` event. A refusal (its type as `ref`) answers the oldest. */
  private async hide(frame: HideFrame): Promise<HiddenLists> {
    if (this.state === "open") this.hiding.push(frame);
    const { muted, blocked } = await this.ask<HiddenFrame>("hidden", frame);
    return { muted, blocked };
  }

  /** Hand a `hidden` frame or a refusal of a hide request to the oldest one waiting; whether
   * one took it. */
  private answerHide(value: HiddenFrame | Error): boolean {
    const oldest = this.hiding[0];
    if (!oldest || (!(value instanceof Error) && !answersHide(oldest, value))) return false;
    this.hiding.shift();
    return this.answer("hidden", value);
  }

  private failAnswers(error: Error): void {
    this.asked.clear();
    this.hiding.length = 0;
    for (const waiting of this.answers.values()) {
      for (const { reject } of waiting) reject(error);
    }
    this.answers.clear();
  }

  /** After a reconnect: fetch the direct messages that came while this client was away. */
  private async catchUpDirect(user: UserId): Promise<void> {
    let after = this.lastDirect.get(user);
    for (;;) {
      const page = await this.directHistory(user, after === undefined ? { limit: 100 } : { after, limit: 100 });
      if (page.recovered === false) {
        // Some cannot be vouched for: deliver the newest page, and say older ones may miss.
        const newest = await this.directHistory(user, { limit: 100 });
        for (const frame of newest.messages) this.deliverDirect(frame);
        this.emit("resync", { to: user });
        return;
      }
      for (const frame of page.messages) this.deliverDirect(frame);
      const last = page.messages[page.messages.length - 1];
      if (!page.more || !last) return;
      after = last.id;
    }
  }

  private deliverDirect(frame: MessageFrame | MessageEventFrame): void {
    if (this.seenDirect.has(frame.id)) return;
    this.seenDirect.add(frame.id);
    if (this.seenDirect.size > 1000) {
      const oldest = this.seenDirect.values().next().value;
      if (oldest !== undefined) this.seenDirect.delete(oldest);
    }
    const peer = frame.user === this.hello?.user ? frame.to : frame.user;
    if (peer !== undefined && frame.id > (this.lastDirect.get(peer) ?? 0)) this.lastDirect.set(peer, frame.id);
    if (frame.type === "message") {
      this.emit("direct", frame);
      this.emitMention(frame);
    } else {
      this.emitEvent(frame);
    }
  }

  /** The `mention` event, for a message of someone else that mentions this user or `here`. */
  private emitMention(frame: MessageFrame): void {
    const me = this.hello?.user;
    if (me === undefined || frame.user === me) return;
    if (frame.here === true || frame.mentions?.includes(me)) this.emit("mention", frame);
  }

  private emitEvent(frame: MessageFrame | MessageEventFrame): void {
    switch (frame.type) {
      case "message":
        this.emit("message", frame);
        this.emitMention(frame);
        break;
      case "edited": this.emit("edited", frame); break;
      case "deleted": this.emit("deleted", frame); break;
      case "reaction": this.emit("reaction", frame); break;
    }
  }

  /** The transport of the next connection: a WebSocket unless there is none, or this page
   * fell back lately. */
  private pickTransport(): Transport {
    const next = this.nextTransport;
    this.nextTransport = null;
    if (!this.transports.includes("websocket") || !this.WebSocketClass) return "sse";
    if (!this.transports.includes("sse")) return "websocket";
    if (next) return next;
    return (fallbackUntil.get(this.url) ?? 0) > Date.now() ? "sse" : "websocket";
  }

  /** Leave `ws` now for the HTTP fallback (a WebSocket failed as `fallback` says), or for a
   * WebSocket again (`fallback` null). */
  private switchTransport(ws: WebSocketLike, fallback: FallbackReason | null): void {
    if (ws !== this.ws) return;
    if (!fallback) fallbackUntil.delete(this.url);
    this.nextTransport = fallback ? "sse" : "websocket";
    this.fallingBack = fallback;
    this.ws = null;
    this.clearTimers();
    ws.close(1000, fallback ? "falling back" : "trying a WebSocket again");
    this.open();
  }

  /** The fallback `ws` is open after a WebSocket failed for `reason`: remember it for every
   * client of this page, `websocketRetryMs` long (then try a WebSocket again) — at once if
   * the WebSocket opened and brought nothing; if none opened, only once one more WebSocket,
   * tried beside the open fallback, fails too: one that opens means the server merely
   * restarted between the two tries, and the client goes back to a WebSocket. */
  private fellBack(ws: WebSocketLike, reason: FallbackReason): void {
    const remember = (): void => {
      fallbackUntil.set(this.url, Date.now() + this.websocketRetryMs);
      this.fallbackTimer = setTimeout(() => this.switchTransport(ws, null), this.websocketRetryMs);
    };
    if (reason === "silent") {
      remember();
      return;
    }
    const probe = new this.WebSocketClass!(this.connectUrl());
    this.probe = probe;
    let opened = false;
    probe.onopen = () => {
      opened = true;
      probe.close(1000, "the WebSocket works");
    };
    probe.onclose = () => {
      if (probe !== this.probe) return;
      this.probe = null;
      if (opened) this.switchTransport(ws, null);
      else if (ws === this.ws) remember();
    };
    probe.onerror = () => undefined;
  }

  /** The server's URL to connect to: who we are goes in the first frame, never in the URL
   * (URLs end up in logs). */
  private connectUrl(): string {
    const url = new URL(this.url);
    url.searchParams.set("auth", "frame");
    return url.toString();
  }

  private open(): void {
    clearTimeout(this.retryTimer);
    const transport = this.pickTransport();
    this.transport = transport;
    this.setState(this.attempt === 0 ? "connecting" : "reconnecting", { transport });
    const url = this.connectUrl();
    const ws: WebSocketLike = transport === "sse"
      ? new SseSocket(url, this.fetchImpl)
      : new this.WebSocketClass!(url);
    this.ws = ws;
    let opened = false;
    let heard = false;
    if (transport === "websocket" && this.transports.includes("sse")) {
      // Upgraded, but nothing comes through (a proxy that breaks WebSockets): fall back.
      this.fallbackTimer = setTimeout(() => {
        if (!heard) this.switchTransport(ws, "silent");
      }, this.fallbackAfterMs);
    }
    ws.onopen = () => {
      opened = true;
      void this.authenticate(ws);
    };
    ws.onmessage = (event) => {
      if (ws !== this.ws) return;
      if (!heard) {
        heard = true;
        clearTimeout(this.fallbackTimer); // the WebSocket works (the timer is not yet the retry's)
      }
      this.armWatchdog();
      for (const line of String(event.data).split("\n")) {
        if (line) this.handle(JSON.parse(line) as ServerFrame);
      }
    };
    ws.onclose = (event) => {
      if (ws !== this.ws) return;
      if (transport === "websocket" && !opened && this.transports.includes("sse")) {
        this.switchTransport(ws, "refused"); // no upgrade: try the HTTP fallback at once
        return;
      }
      this.closed(event.code, event.reason);
    };
    // A failed connection is followed by its close event, which decides what comes next. (In
    // Node, the `ws` package throws an `error` nobody listens to.)
    ws.onerror = () => undefined;
  }

  private async authenticate(ws: WebSocketLike): Promise<void> {
    const frame: AuthFrame = { type: "auth" };
    if (this.getToken) {
      try {
        frame.token = await this.getToken();
      } catch (error) {
        this.emit("error", { code: "token_unavailable", message: String(error) });
        ws.close();
        return;
      }
    } else {
      if (this.name) frame.name = this.name;
      if (this.guestKey) frame.guest = this.guestKey;
    }
    if (ws === this.ws && ws.readyState === OPEN) ws.send(JSON.stringify(frame));
  }

  private closed(code: number, reason: string): void {
    this.ws = null;
    this.fallingBack = null; // the fallback failed too: the server is down, not the upgrade
    this.clearTimers();
    this.failAnswers(new Error("disconnected"));
    for (const pending of this.pending.values()) clearTimeout(pending.timer); // resent later
    if (this.stopped) return;
    if (TERMINAL_CLOSE_CODES.has(code)) {
      this.stopped = true;
      for (const [cid] of this.pending) this.settle(cid, new HubbubError("closed", `closed with ${code}`));
      this.setState("closed", { code, reason: reason || "closed by the server" });
      return;
    }
    // Full jitter, so that the clients of a restarted server do not all come back at once.
    const delayMs = backoffDelay(this.attempt, this.baseDelayMs, this.maxDelayMs);
    this.attempt += 1;
    this.setState("reconnecting", { delayMs, code, reason });
    this.retryTimer = setTimeout(() => this.open(), delayMs);
  }

  private handle(frame: ServerFrame): void {
    switch (frame.type) {
      case "hello":
        this.hello = frame;
        if (frame.guest) this.guestKey = frame.guest; // made for us: reconnect as the same guest
        this.setState("open", this.transport ? { transport: this.transport } : {});
        this.stableTimer = setTimeout(() => { this.attempt = 0; }, this.stableAfterMs);
        if (this.transport === "sse" && this.transports.includes("websocket") && this.ws) {
          // A WebSocket failed where plain HTTP works; or this page's fallback time is not
          // over yet: try a WebSocket again once it is (a reconnect: the rooms are rejoined
          // with `since`, nothing is lost).
          const ws = this.ws;
          const retryIn = (fallbackUntil.get(this.url) ?? 0) - Date.now();
          if (this.fallingBack) this.fellBack(ws, this.fallingBack);
          else if (retryIn > 0) this.fallbackTimer = setTimeout(() => this.switchTransport(ws, null), retryIn);
        }
        this.fallingBack = null;
        this.armWatchdog();
        this.emit("hello", frame);
        if (this.visible) this.write({ type: "visibility", visible: true });
        for (const room of this.rooms) this.joinFrame(room);
        for (const cid of this.pending.keys()) this.writePending(cid);
        for (const user of this.lastDirect.keys()) {
          this.catchUpDirect(user).catch(() => undefined); // a later reconnect tries again
        }
        break;
      case "ping":
        this.write({ type: "pong" });
        break;
      case "refresh":
        if (this.getToken) {
          this.getToken().then(
            (token) => this.write({ type: "auth", token }),
            (error: unknown) => this.emit("error", { code: "token_unavailable", message: String(error) }),
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
          this.emitEvent(frame);
        } else {
          this.deliverDirect(frame);
        }
        break;
      case "history":
        this.answer(`history:${frame.room ?? `@${frame.with ?? ""}`}`, frame);
        break;
      case "search": this.answer("search", frame); break;
      case "upload": this.answer(`upload:${String(frame.cid)}`, frame); break;
      case "file": this.answerInOrder("file", `file:${frame.id}`, frame); break;
      case "mentions": this.answer("mentions", frame); break;
      case "notifications":
        this.answerInOrder("notifications", notificationsKey("conversations" in frame ? {} : frame), frame);
        break;
      case "push_subscribed":
        this.answerInOrder("push_subscribe", `push_subscribe:${frame.endpoint}`, frame);
        break;
      case "push_unsubscribed":
        this.answerInOrder("push_unsubscribe", `push_unsubscribe:${frame.endpoint}`, frame);
        break;
      case "hidden":
        this.answerHide(frame);
        this.emit("hidden", frame);
        break;
      case "preview": this.answerInOrder("preview", `preview:${frame.url}`, frame); break;
      case "reported": this.answerInOrder("report", "report", frame); break;
      case "reports": this.answerInOrder("reports", "reports", frame); break;
      case "resolved": this.answerInOrder("resolve", `resolve:${frame.report.id}`, frame); break;
      case "kicked": this.answerInOrder("kick", `kick:${frame.user}`, frame); break;
      case "banned": this.answerInOrder("ban", `ban:${frame.user}`, frame); break;
      case "inbox":
        for (const entry of frame.conversations) {
          if (entry.with !== undefined && !this.lastDirect.has(entry.with)) {
            this.lastDirect.set(entry.with, entry.last ? entry.last.id : entry.read);
          }
        }
        this.emit("inbox", frame);
        break;
      case "joined":
        if (typeof frame.last === "number" && !this.lastId.has(frame.room)) {
          this.lastId.set(frame.room, frame.last);
        }
        this.emit("joined", frame);
        if (frame.recovered === false) this.emit("resync", { room: frame.room });
        break;
      case "ack":
        this.settle(frame.cid, { cid: frame.cid, id: frame.id, duplicate: frame.duplicate === true });
        this.emit("ack", frame);
        break;
      case "error":
        this.handleError(frame);
        break;
      case "left":
        if (frame.reason === "removed") {
          // Out of a private room's members: do not rejoin it on the next reconnect.
          this.rooms.delete(frame.room);
          this.lastId.delete(frame.room);
        }
        this.emit("left", frame);
        break;
      case "room": this.emit("room", frame); break;
      case "rooms": this.emit("rooms", frame); break;
      case "member": this.emit("member", frame); break;
      case "invited": this.emit("invited", frame); break;
      case "presence": this.emit("presence", frame); break;
      case "typing": this.emit("typing", frame); break;
      case "receipt": this.emit("receipt", frame); break;
      case "receipts": this.emit("receipts", frame); break;
      case "authenticated": this.emit("authenticated", frame); break;
      default:
        break; // pong, and the frame types of newer servers
    }
  }

  private handleError(frame: ErrorFrame): void {
    if (frame.code === "resync" && frame.room) {
      this.joinFrame(frame.room); // the server lost track of the room: rejoin from our position
      return;
    }
    if (frame.code === "resync" && frame.to) {
      for (const user of this.lastDirect.keys()) {
        this.catchUpDirect(user).catch(() => this.emit("resync", { to: user }));
      }
      return;
    }
    if (frame.ref === "history") {
      const key = `history:${frame.room ?? `@${frame.with ?? ""}`}`;
      if (this.answer(key, new HubbubError(frame.code, frame.message, frame))) return;
    }
    if (frame.ref === "search" && this.answer("search", new HubbubError(frame.code, frame.message, frame))) {
      return;
    }
    if (frame.ref === "upload" && frame.cid !== undefined
        && this.answer(`upload:${String(frame.cid)}`, new HubbubError(frame.code, frame.message, frame))) {
      return;
    }
    if (frame.ref === "mentions" && this.answer("mentions", new HubbubError(frame.code, frame.message, frame))) {
      return;
    }
    if (frame.ref === "file" || frame.ref === "notifications" || frame.ref === "push_subscribe"
        || frame.ref === "push_unsubscribe") {
      // Most name no request: the oldest is answered (frames are answered in order). A
      // refused `notifications` of a conversation names it.
      const named = frame.ref === "notifications" && (frame.room !== undefined || frame.with !== undefined);
      const key = named ? notificationsKey(frame) : undefined;
      if (this.answerInOrder(frame.ref, key, new HubbubError(frame.code, frame.message, frame))) return;
    }
    if (frame.ref !== undefined && MODERATION_REFS.has(frame.ref)
        && this.answerInOrder(frame.ref as ModerationRef, undefined, new HubbubError(frame.code, frame.message, frame))) {
      return; // none names its request: the oldest of its type is answered
    }
    if (frame.ref !== undefined && HIDE_REFS.has(frame.ref)
        && this.answerHide(new HubbubError(frame.code, frame.message, frame))) {
      return;
    }
    const room = frame.room;
    if (frame.ref === "join" && room && RETRY_JOIN_CODES.has(frame.code)) {
      // The join did not happen: try again later, or the room stays silent.
      setTimeout(() => { if (this.rooms.has(room)) this.joinFrame(room); }, 1000);
    }
    const cid = frame.cid;
    if (cid !== undefined && frame.code === "broker_unavailable") {
      setTimeout(() => this.writePending(cid), 1000); // not published: the same cid again
    } else if (cid !== undefined) {
      this.settle(cid, new HubbubError(frame.code, frame.message, frame)); // refused for good
    }
    this.emit("error", frame);
  }

  private joinFrame(room: RoomName): void {
    const since = this.lastId.get(room);
    this.write(since === undefined ? { type: "join", room } : { type: "join", room, since });
  }

  /** Write `frame` if the connection is open; whether it was. */
  private write(frame: ClientFrame): boolean {
    const ws = this.ws;
    if (!ws || ws.readyState !== OPEN || this.state !== "open") return false;
    ws.send(JSON.stringify(frame));
    return true;
  }

  private armWatchdog(): void {
    // The server pings every heartbeat_interval_s: silence for longer means the link is dead
    // even if the socket has not noticed (no FIN on a lost network).
    clearTimeout(this.watchdog);
    const limits = this.hello?.limits;
    if (!limits) return;
    const ms = (limits.heartbeat_interval_s + limits.heartbeat_timeout_s) * 1000 + this.heartbeatSlackMs;
    this.watchdog = setTimeout(() => {
      const ws = this.ws;
      if (!ws) return;
      this.ws = null;
      ws.close(4000, "no heartbeat");
      this.closed(4000, "no heartbeat from the server");
    }, ms);
  }

  /** Stops what watches the current connection: its timers, and a WebSocket tried beside it. */
  private clearTimers(): void {
    clearTimeout(this.watchdog);
    clearTimeout(this.stableTimer);
    clearTimeout(this.fallbackTimer);
    const probe = this.probe;
    this.probe = null;
    probe?.close(1000, "not needed");
  }

  private setState(state: ConnectionState, extra: Omit<StateChange, "state"> = {}): void {
    this.state = state;
    this.emit("state", { state, ...extra });
  }

  private emit<K extends keyof HubbubEventMap>(type: K, detail: HubbubEventMap[K]): void {
    this.dispatchEvent(new HubbubEvent(type, detail));
  }
}

function sendFrame(frame: SendFrame & { cid: Cid }, options: SendOptions): SendFrame & { cid: Cid } {
  if (options.replyTo !== undefined) frame.reply_to = options.replyTo;
  if (options.attachments?.length) frame.attachments = [...options.attachments];
  if (options.traceparent !== undefined) frame.traceparent = options.traceparent;
  return frame;
}

/** Whether `lists` can be the answer to `frame`: the lists as they are after it (`mute`: the
 * user muted or blocked; `block`: blocked; `unmute`: not muted; `unblock`: not blocked; the
 * request for the lists: any). A `hidden` frame that cannot is one the server sent by itself. */
function answersHide(frame: HideFrame, lists: HiddenLists): boolean {
  switch (frame.type) {
    case "mute": return lists.muted.includes(frame.user) || lists.blocked.includes(frame.user);
    case "block": return lists.blocked.includes(frame.user);
    case "unmute": return !lists.muted.includes(frame.user);
    case "unblock": return !lists.blocked.includes(frame.user);
    case "hidden": return true;
  }
}

/** Where the answers to `notifications` frames are paired: per conversation; `*` the list. */
function notificationsKey(frame: { room?: RoomName | undefined; with?: UserId | undefined }): string {
  if (frame.room !== undefined) return `notifications:${frame.room}`;
  return frame.with !== undefined ? `notifications:@${frame.with}` : "notifications:*";
}

function target(conversation: Conversation): { room: RoomName } | { with: UserId } {
  return typeof conversation === "string" ? { room: conversation } : { with: conversation.with };
}

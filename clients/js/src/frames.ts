/**
 * The wire protocol's frames, typed (docs/protocol.md; docs/asyncapi.yaml describes the same).
 * A server text frame holds one JSON object, or several separated by "\n".
 *
 * @module
 */

/** A room's name: `^[A-Za-z0-9][A-Za-z0-9_.:\-]{0,63}$`. */
export type RoomName = string;
/** A user's id (a guest's is its name, "-" and 16 hex digits). */
export type UserId = string;
/** A client message id: identifies a send for retries (dedup); ≤ 64 characters or an integer. */
export type Cid = string | number;
/** A conversation: a room, or the direct messages with a user. */
export type Conversation = RoomName | { with: UserId };
/** A file's id, from an `upload` answer: `^[A-Za-z0-9_\-]{16,32}$`. */
export type FileId = string;
/** What notifies you of a conversation's messages: `all` of them (direct conversations'
 * default), `mentions` (mentions and direct messages; rooms' default) or `none`. */
export type NotificationLevel = "all" | "mentions" | "none";

/** Error codes of `error` frames: the connection stays open after each. */
export const ERROR_CODES = [
  "bad_json", "bad_frame", "unknown_type", "binary_unsupported", "text_too_long",
  "not_joined", "too_many_rooms", "too_many_members", "rate_limited", "broker_unavailable",
  "resync", "forbidden", "store_unavailable", "no_store", "not_found", "exists",
  "file_too_large", "storage_unavailable", "too_many_hidden", "rejected",
  "moderation_unavailable", "preview_unavailable",
] as const;
export type ErrorCode = (typeof ERROR_CODES)[number];

/** Close codes after which reconnecting would fail again the same way: the client stays
 * closed (every other code: reconnect with jittered backoff). */
export const TERMINAL_CLOSE_CODES: ReadonlySet<number> = new Set([1000, 1007, 1008, 1009, 4001, 4003]);

// -- client → server ------------------------------------------------------------------------

export interface JoinFrame { type: "join"; room: RoomName; since?: number }
export interface LeaveFrame { type: "leave"; room: RoomName }
export interface SendFrame {
  type: "send"; room?: RoomName; to?: UserId; text: string; cid?: Cid; reply_to?: number;
  /** Files uploaded for this conversation (ids from `upload` answers; `text` may be empty). */
  attachments?: FileId[];
  /** Your W3C trace context: with tracing on, the message's spans continue this trace. */
  traceparent?: string;
}
export interface EditFrame {
  type: "edit"; room?: RoomName; with?: UserId; id: number; text: string; cid?: Cid;
}
export interface DeleteFrame { type: "delete"; room?: RoomName; with?: UserId; id: number; cid?: Cid }
export interface ReactFrame {
  type: "react"; room?: RoomName; with?: UserId; id: number; emoji: string; cid?: Cid;
}
export interface TypingFrame { type: "typing"; room: RoomName }
export interface AuthFrame { type: "auth"; token?: string; name?: string; guest?: string }
export interface HistoryRequestFrame {
  type: "history"; room?: RoomName; with?: UserId; before?: number; after?: number; limit?: number;
}
export interface ReadFrame { type: "read"; room?: RoomName; with?: UserId; id: number; receipt?: boolean }
export interface InboxRequestFrame { type: "inbox" }
export interface CreateFrame {
  type: "create"; room: RoomName; private?: boolean; title?: string; topic?: string;
}
export interface DescribeFrame { type: "describe"; room: RoomName; title?: string; topic?: string }
export interface InviteFrame { type: "invite"; room: RoomName; user: UserId; role?: "member" | "admin" }
export interface RemoveFrame { type: "remove"; room: RoomName; user: UserId }
export interface RoomsRequestFrame { type: "rooms"; public?: boolean; q?: string }
/** Messages you may read now whose text matches `q` (words, "quoted phrases", `-word`). */
export interface SearchRequestFrame {
  type: "search"; q: string; room?: RoomName; with?: UserId; order?: "newest" | "best";
  limit?: number; offset?: number;
}
/** A file to attach to a message of the conversation: answered with where to upload it
 * (`upload`). `name`: 1–255 characters (no control characters, `/` or `\\`). */
export interface UploadRequestFrame {
  type: "upload"; room?: RoomName; with?: UserId; name: string; size: number; cid?: Cid;
}
/** Links to read file `id` (answered with `file`). */
export interface FileRequestFrame { type: "file"; id: FileId }
/** The messages that mention you, newest first (answered with `mentions`): `before` a `ts` to
 * page back from, `limit` default 20. */
export interface MentionsRequestFrame { type: "mentions"; before?: number; limit?: number }
/** Your notification level of a conversation (`room` or `with`); with `level` and/or
 * `mute_until` (epoch ms, 0 unmutes), set it; with neither `room` nor `with`, every
 * conversation whose level you changed. Answered with `notifications`. */
export interface NotificationsRequestFrame {
  type: "notifications"; room?: RoomName; with?: UserId; level?: NotificationLevel;
  mute_until?: number;
}
/** Whether this connection shows the chat to someone now (a tab in view, used lately): while
 * one of your connections is visible, nothing is pushed to you. No answer. */
export interface VisibilityFrame { type: "visibility"; visible: boolean }
/** A browser's Web Push subscription as the `push_subscribe` frame carries it. */
export interface WebPushSubscription { endpoint: string; keys: { p256dh: string; auth: string } }
/** A browser's Web Push subscription as `PushSubscription.toJSON()` gives it (the DOM's
 * `PushSubscriptionJSON`), or any object of that shape. */
export interface PushSubscriptionInput {
  endpoint?: string | undefined;
  expirationTime?: number | null | undefined;
  keys?: Record<string, string> | undefined;
}
/** Deliver Web Push notifications to this subscription (made with `hello`'s `push_key`).
 * Answered with `push_subscribed`. */
export interface PushSubscribeFrame { type: "push_subscribe"; subscription: WebPushSubscription }
/** Stop pushing to `endpoint` (answered with `push_unsubscribed`). */
export interface PushUnsubscribeFrame { type: "push_unsubscribe"; endpoint: string }
/** Mute `user`: their messages, the events on them and their typing are hidden from you
 * everywhere until `unmute` (a blocked user stays blocked). Answered with `hidden`. */
export interface MuteFrame { type: "mute"; user: UserId }
/** End a mute of `user` (a block stays). Answered with `hidden`. */
export interface UnmuteFrame { type: "unmute"; user: UserId }
/** Block `user`: muted, and they cannot write to you directly nor invite you. Answered with
 * `hidden`. */
export interface BlockFrame { type: "block"; user: UserId }
/** End a block of `user`. Answered with `hidden`. */
export interface UnblockFrame { type: "unblock"; user: UserId }
/** Whom you mute and block (answered with `hidden`). */
export interface HiddenRequestFrame { type: "hidden" }
/** The frames answered with `hidden`: a change of whom you hide, or the request for the lists. */
export type HideFrame = MuteFrame | UnmuteFrame | BlockFrame | UnblockFrame | HiddenRequestFrame;
/** Report message `id` of a conversation you may read now (`room` or `with`), with `reason`
 * (1–500 characters). Answered with `reported`. */
export interface ReportFrame {
  type: "report"; room?: RoomName; with?: UserId; id: number; reason: string;
}
/** Moderators: a page of the reports queue: open reports oldest first after `before`, or with
 * `resolved` resolved ones newest first before it (`limit` default 20, at most 100). Answered
 * with `reports`. */
export interface ReportsRequestFrame {
  type: "reports"; resolved?: boolean; before?: number; limit?: number;
}
/** Moderators: resolve report `id`: `dismiss` it, or `delete` its message. Answered with
 * `resolved`. */
export interface ResolveFrame { type: "resolve"; id: number; action: "dismiss" | "delete" }
/** Moderators: close every connection of `user` (they may come back). Answered with `kicked`. */
export interface KickFrame { type: "kick"; user: UserId; reason?: string }
/** Moderators: keep `user` out for `duration_s` (their connections are closed). Answered with
 * `banned`. */
export interface BanFrame { type: "ban"; user: UserId; duration_s: number; reason?: string }
/** The preview of link `url` (`http(s)://…`) found in a message. Answered with `preview`. */
export interface PreviewRequestFrame { type: "preview"; url: string }
export interface PingFrame { type: "ping" }
export interface PongFrame { type: "pong" }

/** Every frame a client may send. */
export type ClientFrame =
  | JoinFrame | LeaveFrame | SendFrame | EditFrame | DeleteFrame | ReactFrame | TypingFrame
  | AuthFrame | HistoryRequestFrame | ReadFrame | InboxRequestFrame | CreateFrame
  | DescribeFrame | InviteFrame | RemoveFrame | RoomsRequestFrame | SearchRequestFrame
  | UploadRequestFrame | FileRequestFrame | MentionsRequestFrame | NotificationsRequestFrame
  | VisibilityFrame | PushSubscribeFrame | PushUnsubscribeFrame | MuteFrame | UnmuteFrame
  | BlockFrame | UnblockFrame | HiddenRequestFrame | ReportFrame | ReportsRequestFrame
  | ResolveFrame | KickFrame | BanFrame | PreviewRequestFrame | PingFrame | PongFrame;

// -- server → client ------------------------------------------------------------------------

export interface Limits {
  heartbeat_interval_s: number;
  heartbeat_timeout_s: number;
  max_frame_bytes: number;
  max_text_chars: number;
  max_rooms: number;
  rate_limit_frames_per_s: number;
  rate_limit_burst: number;
  [more: string]: unknown;
}
export interface HelloFrame {
  type: "hello"; user: UserId; conn: string; node: string; limits: Limits;
  /** A new guest's key: keep it to be the same guest on the next connection. */
  guest?: string;
  /** jwt mode: when the token expires (epoch seconds). */
  exp?: number;
  /** When the server sends Web Push: its application server key (base64url), the
   * `applicationServerKey` of `pushManager.subscribe`. */
  push_key?: string;
}
export interface JoinedFrame {
  type: "joined"; room: RoomName; count: number; users?: UserId[];
  /** Only for a join with `since`: false means messages may be missing (reload). */
  recovered?: boolean;
  /** Only for a join without `since`: where this client's position starts. */
  last?: number;
}
export interface LeftFrame { type: "left"; room: RoomName; reason?: "removed" | string }
/** A file a message carries: `type` is sniffed from its bytes (not what the uploader said);
 * `image`: a PNG, JPEG, GIF or WebP with a thumbnail, then `width` and `height` (of the
 * original). Ask for links with `fileLinks(id)`. */
export interface Attachment {
  id: FileId; name: string; size: number; type: string; image: boolean; width?: number;
  height?: number;
}
/** A message of a room (`room`) or a direct message (`to`). */
export interface MessageFrame {
  type: "message"; room?: RoomName; to?: UserId; id: number; user: UserId; text: string;
  ts: number; reply_to?: number; cid?: Cid;
  /** The files it carries (none on a deleted message). */
  attachments?: Attachment[];
  /** In history pages: the message as its events left it. */
  edited?: number; deleted?: boolean; reactions?: Record<string, UserId[]>;
  /** The users it mentions (`@name`, each one who may read the conversation and takes part
   * in it; never the sender). */
  mentions?: UserId[];
  /** `@here`: it is for everyone present in the room. */
  here?: true;
  /** A traced message's W3C trace context (the server's publish span). */
  traceparent?: string;
}
interface EventBase { room?: RoomName; to?: UserId; id: number; target: number; user: UserId; ts: number }
export interface EditedFrame extends EventBase { type: "edited"; text: string }
export interface DeletedFrame extends EventBase { type: "deleted" }
export interface ReactionFrame extends EventBase { type: "reaction"; emoji: string; on: boolean }
/** An event on a message (its `target`). */
export type MessageEventFrame = EditedFrame | DeletedFrame | ReactionFrame;
export interface PresenceFrame {
  type: "presence"; room: RoomName; event?: "join" | "leave"; user?: UserId; count: number;
}
export interface TypingNoticeFrame { type: "typing"; room: RoomName; user: UserId }
export interface ReceiptFrame { type: "receipt"; room?: RoomName; to?: UserId; user: UserId; id: number }
export interface ReceiptsFrame { type: "receipts"; room: RoomName; read: Record<UserId, number> }
export interface AckFrame { type: "ack"; cid: Cid; id: number; duplicate?: boolean }
export interface ErrorFrame {
  type: "error"; code: ErrorCode; message: string; ref?: string; room?: RoomName;
  with?: UserId; to?: UserId; cid?: Cid; id?: number;
}
export interface RefreshFrame { type: "refresh"; exp: number }
export interface AuthenticatedFrame { type: "authenticated"; user: UserId; exp?: number }
export interface HistoryFrame {
  type: "history"; room?: RoomName; with?: UserId; more: boolean; messages: MessageFrame[];
  recovered?: boolean;
}
/** A room in the inbox (its newest message and unread count when the server gives them). */
export interface RoomInboxEntry {
  room: RoomName; with?: undefined; last?: MessageFrame | null; unread?: number; read?: number;
  /** How many of the unread messages mention you. */
  mentions?: number;
}
/** A direct conversation in the inbox: its newest message, unread count and read positions. */
export interface DirectInboxEntry {
  with: UserId; room?: undefined; last: MessageFrame | null; unread: number; read: number;
  peer_read: number;
  /** How many of the unread messages mention you. */
  mentions?: number;
}
export type InboxEntry = RoomInboxEntry | DirectInboxEntry;
export interface InboxFrame { type: "inbox"; conversations: InboxEntry[] }
export type Role = "owner" | "admin" | "member";
export interface RoomRecord {
  room: RoomName; private: boolean; title: string; topic: string; role?: Role;
  members?: Record<UserId, Role>;
}
export interface RoomFrame extends RoomRecord { type: "room" }
/** The answer to `rooms`; `public: true`: to a directory request (`findRooms`). */
export interface RoomsFrame { type: "rooms"; public?: true; rooms: RoomRecord[] }
/** A message found, with its text as it is now; `highlights`: where the matched words are in
 * `text`, [start, end) in Unicode code points (`[...text].slice(start, end)`, not UTF-16
 * `text.slice`: they differ after an emoji). */
export interface SearchResult {
  room?: RoomName; with?: UserId; id: number; user: UserId; ts: number; text: string;
  highlights: [number, number][];
}
/** The answer to `search`: `next_offset` is null on the last page. */
export interface SearchFrame {
  type: "search"; q: string; results: SearchResult[]; next_offset: number | null;
}
export interface MemberFrame {
  type: "member"; room: RoomName; event: "added" | "removed"; user: UserId; role: Role | null;
  by: UserId | null;
}
export interface InvitedFrame extends RoomRecord { type: "invited"; by: UserId | null }
/** The answer to `upload`: send the file's bytes before `expires` (epoch seconds). `PUT`: the
 * bytes as the body, to `url` (relative to the server: `local` storage). `POST` (S3 storage):
 * a `multipart/form-data` form to `url` with every entry of `fields` first and the file last,
 * as field `file`. At most the size the request declared. */
export interface UploadFrame {
  type: "upload"; file: FileId; cid: Cid | null; method: "PUT" | "POST"; url: string;
  fields: Record<string, string>; expires: number;
}
/** The answer to `file`: URLs that work until `expires` (epoch seconds; ask again after).
 * `url` serves the file (an image inline, anything else as a download), `thumbnail` a WebP
 * preview of an image. Relative URLs are on the server (`fileLinks` makes them absolute). */
export interface FileFrame {
  type: "file"; id: FileId; name: string; size: number; content_type: string; url: string;
  thumbnail: string | null; expires: number;
}

/** A message that mentions you, with its text as it is now; `unread`: after your read
 * position. */
export interface MentionEntry {
  room?: RoomName; with?: UserId; id: number; user: UserId; text: string; ts: number;
  unread: boolean;
}
/** The answer to `mentions`, newest first, in conversations you may read now: `unread` (top
 * level) how many of all are unread; `more`: older ones follow (ask with `before` = the last
 * `ts`). */
export interface MentionsFrame {
  type: "mentions"; mentions: MentionEntry[]; unread: number; more: boolean;
}
/** Your notification level of a conversation (`room` or `with`), and until when it is muted
 * (epoch ms; null: not muted). */
export interface NotificationSetting {
  room?: RoomName; with?: UserId; level: NotificationLevel; mute_until: number | null;
}
/** The answer to `notifications` for one conversation. */
export interface NotificationsFrame extends NotificationSetting { type: "notifications" }
/** The answer to `notifications` without a conversation: those whose level you changed. */
export interface NotificationsListFrame { type: "notifications"; conversations: NotificationSetting[] }
/** The answer to `push_subscribe`: notifications are pushed to `endpoint`. */
export interface PushSubscribedFrame { type: "push_subscribed"; endpoint: string }
/** The answer to `push_unsubscribe`: nothing is pushed to `endpoint` any more. */
export interface PushUnsubscribedFrame { type: "push_unsubscribed"; endpoint: string }

/** Whom you hide (sorted; disjoint: a blocked user is muted too, and listed as blocked only). */
export interface HiddenLists {
  /** Muted: their messages, the events on them and their typing are hidden from you. */
  muted: UserId[];
  /** Blocked: hidden as muted ones are, and they cannot write to you directly nor invite you. */
  blocked: UserId[];
}
/** Whom you mute and block: the answer to `hidden`, `mute`, `unmute`, `block` and `unblock`,
 * and sent by itself to every connection of yours when the lists change (from another tab,
 * another device or the HTTP API). */
export interface HiddenFrame extends HiddenLists { type: "hidden" }

/** A report of a message, as the moderators' queue shows it: the message as it was when
 * reported, in `room` or the direct conversation of the two users `with`; `resolved`: by
 * whom, how and when (null: open). */
export interface Report {
  id: number; room?: RoomName; with?: [UserId, UserId];
  message: { id: number; user: UserId; text: string };
  reporter: UserId; reason: string; ts: number;
  resolved: { by: UserId; outcome: "dismissed" | "deleted"; ts: number } | null;
}
/** The answer to `report`: the report as stored (reporting a message again answers the first). */
export interface ReportedFrame { type: "reported"; report: Report }
/** The answer to `reports` (moderators): reports of conversations you may read now; `next`: the
 * `before` of the next page (null: the last). */
export interface ReportsFrame { type: "reports"; reports: Report[]; next: number | null }
/** The answer to `resolve`: the report as it is now. */
export interface ResolvedFrame { type: "resolved"; report: Report }
/** The answer to `preview`: plain texts (show them as text, never as markup) and the image as a
 * link to the server's file storage (never the site's). */
export interface PreviewFrame {
  type: "preview"; url: string; title: string | null; description: string | null;
  site: string | null; image: { url: string; width: number; height: number } | null;
}
/** The answer to `kick`. */
export interface KickedFrame { type: "kicked"; user: UserId }
/** The answer to `ban`. */
export interface BannedFrame { type: "banned"; user: UserId; duration_s: number; reason: string }

/** Every frame a server sends (a newer server may send more types: ignore unknown ones). */
export type ServerFrame =
  | HelloFrame | JoinedFrame | LeftFrame | MessageFrame | EditedFrame | DeletedFrame
  | ReactionFrame | PresenceFrame | TypingNoticeFrame | ReceiptFrame | ReceiptsFrame | AckFrame
  | ErrorFrame | RefreshFrame | AuthenticatedFrame | HistoryFrame | InboxFrame | RoomFrame
  | RoomsFrame | MemberFrame | InvitedFrame | SearchFrame | UploadFrame | FileFrame
  | MentionsFrame | NotificationsFrame | NotificationsListFrame | PushSubscribedFrame
  | PushUnsubscribedFrame | HiddenFrame | ReportedFrame | ReportsFrame | ResolvedFrame
  | KickedFrame | BannedFrame | PreviewFrame | PingFrame | PongFrame;

// The chat page: rooms, direct messages, presence, typing, unread counts, "seen by", replies,
// edits, deletions, reactions and files, mentions and notifications, muting and blocking,
// reports (and the moderators' queue), link previews, connection state — on top of
// hubbub.js. Messages are kept per conversation (a room, or "@user" for the direct
// messages with a user) by id and shown in id order, so a message replayed after a reconnect or
// reloaded over HTTP appears exactly once; scrolling up loads older ones. Text is always set as
// text, never HTML. People are shown by `personLabel` (a suffix from the id tells two alices
// apart) with an avatar coloured from the id; the invite box invites only a person picked, and
// an invitation waits for Join or Decline.
import { HubbubClient, applyEvent, displayName } from "./hubbub.js";
import { render as renderText } from "./format.js";

// A display name (what guest servers take; other modes take it too).
const NAME = /^[A-Za-z0-9][A-Za-z0-9_.]{0,14}$/;
const ROOM = /^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$/;
const USER = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,31}$/;
const NAME_HINT = "Use 1 to 15 letters, digits, _ or . (starting with a letter or digit)";
const ROOM_HINT = "A room name is 1 to 64 letters, digits, _ . : or - (starting with a letter or digit)";
const TYPING_EVERY_MS = 3000;
const TYPING_SHOWN_MS = 4000;
const PAGE = 50; // messages per history page
const READ_EVERY_MS = 1000;
const REACTIONS = ["👍", "❤️", "😂", "🎉", "👀"];
// A guest's user id: its display name, "-" and 16 hex digits of its key's hash (app/access/guest.py).
const GUEST_ID = /-([0-9a-f]{16})$/;
const SUFFIX_DIGITS = 4; // shown of an id's hash; more while two known people share them
const INVITATIONS_SHOWN = 3; // the rest are counted
const INVITE_OPTIONS_SHOWN = 8;
const DECLINE_EVERY_MS = 100; // "Decline all" stays under the connection's frame rate
const GROUP_WITHIN_MS = 5 * 60_000; // a message this soon after its author's last is grouped
const MAX_TEXT_CHARS = 8000; // until hello says (its limits.max_text_chars)
const MENTION_OPTIONS_SHOWN = 8;
const IDLE_AFTER_MS = 5 * 60_000; // no pointer, key or focus for this long: the page is not "visible"
const NOTIFY_FRESH_MS = 5 * 60_000; // older messages (replays after a reconnect) notify no one
const APP_TITLE = "Hubbub";
const LEVEL_LABELS = { all: "All messages", mentions: "Mentions & DMs", none: "Nothing" };
const MORE_EMOJI = ["👍", "👎", "❤️", "😂", "🎉", "👀", "🙏", "🔥", "✅", "❌", "😮", "😢", "😡", "🤔", "👏",
  "🙌", "💯", "🚀", "☕", "🍕", "😀", "😅", "😍", "😎", "🤝", "👋", "💡", "⚠️", "📌", "🐛"];
// Close codes in words (the status line says why, never a bare number).
const CLOSE_REASONS = {
  1000: "closed", 1001: "the server is going away", 1006: "the connection dropped",
  1008: "refused by the server's policy", 1009: "a message was too big", 1011: "a server error",
  1012: "the server is restarting", 1013: "the server is busy", 4001: "your sign-in expired",
  4003: "you were disconnected by the service",
};
const $ = (id) => document.getElementById(id);

/** conversation ("lobby", or "@user" for direct messages) -> {kind: "room"|"dm", peer?,
 * messages: Map<id, frame> (as they are now: events applied), count, users: Set|null, unread,
 * typing: Map<user, timer>, read: Map<user, id> (others' read positions), complete: no older
 * history, loading, pending: Map<cid, {text, failed?}> (sends not acked yet: written while
 * offline, they go out on reconnect), firstUnread: id|null (where "New messages" is),
 * uploads: [{key, name, size, sent, id: file id once uploaded, controller}] (the files above
 * the composer, for the next message), mentions: unread messages that mention you (the
 * inbox's count, then live ones), away / awayMentions: messages (mentioning you) that came
 * into the shown conversation while nobody could read it (a hidden or unfocused tab)} */
const rooms = new Map();
let active = null;
/** What the composer does with its text: a new message, `{reply: id}`, or `{edit: id}`. */
let composing = {};
let client = null;
let lastTyping = 0;
let hasStore = false; // the server sent an inbox: read positions are kept
/** conversation -> the text being written there (kept in localStorage: a reload keeps it). */
const drafts = new Map(Object.entries(JSON.parse(localStorage.getItem("hubbub.drafts") || "{}")));
let countdown = null; // the reconnect countdown's interval
/** display name -> Set of the user ids the page has seen with it (presence, members, authors,
 * readers, DM peers, the inbox, invitations): the people it knows, and who to warn about. */
const people = new Map();
let namesRefresh = false; // a refresh of every shown name is scheduled
/** room -> its `invited` frame, oldest first: invitations waiting for Join or Decline. */
const invitations = new Map();
/** {room|with, id}: the message the address named, opened once connected. */
let openOnConnect = null;

function conversationOf(frame) {
  if (frame.room !== undefined) return frame.room;
  const me = client.hello?.user;
  return `@${frame.user === me ? frame.to : frame.user}`;
}

function newConversation(kind, peer) {
  return { kind, peer, messages: new Map(), count: 0, users: kind === "room" ? new Set() : null,
           unread: 0, mentions: 0, away: 0, awayMentions: 0, typing: new Map(), read: new Map(),
           complete: false, loading: false, pending: new Map(), firstUnread: null, uploads: [] };
}

/** Whether message `frame` is for you in particular: it mentions you, or everyone present
 * (`@here`); never your own. */
function forMe(frame) {
  const me = client?.hello?.user;
  return Boolean(me) && frame.user !== me && (frame.mentions?.includes(me) || frame.here === true);
}

/** Whether `frame` mentions you by name (what the inbox counts). */
function mentionsMe(frame) {
  const me = client?.hello?.user;
  return Boolean(me) && frame.user !== me && frame.mentions?.includes(me) === true;
}

/** A message's text as read, without its formatting marks (for quotes). */
function plain(text) {
  return renderText(text).textContent ?? text;
}

/** A message as quoted: its text, or its files' names when it has no text. */
function summary(frame) {
  return plain(frame.text) || (frame.attachments ?? []).map((file) => `📎 ${file.name}`).join(", ");
}

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text; // text, never markup
  return node;
}

// -- people: who is who --------------------------------------------------------------------

/** 32-bit FNV-1a of `text` from `basis`, as 8 hex digits. */
function fnv(text, basis) {
  let hash = basis;
  for (const char of text) {
    hash ^= char.codePointAt(0);
    hash = Math.imul(hash, 0x01000193) >>> 0;
  }
  return hash.toString(16).padStart(8, "0");
}

/** 16 hex digits that stand for `user`: a guest's own hash, else one made from the id. */
function digestOf(user) {
  return GUEST_ID.exec(user)?.[1] ?? fnv(user, 0x811c9dc5) + fnv(user, 0x2f8e4d1b);
}

/** Remember `user` as someone the page knows. A second person with a display name changes
 * how everybody with it is shown: every shown name is refreshed (once, after this task). */
function know(user) {
  if (typeof user !== "string" || !user) return;
  const name = displayName(user);
  const group = people.get(name) ?? new Set();
  if (group.has(user)) return;
  group.add(user);
  people.set(name, group);
  if (group.size > 1 && !namesRefresh) {
    namesRefresh = true;
    queueMicrotask(() => { namesRefresh = false; refreshNames(); });
  }
}

/** How a person is shown everywhere: the display name, then "·" and the first 4 hex digits of
 * the id's hash (alice·7e1f), and more digits while another known person with that name has
 * the same ones. A guest always has the suffix (so you can tell others who you are); another
 * id only when its display name is shared. */
function personLabel(user) {
  know(user);
  const name = displayName(user);
  const group = people.get(name);
  if (!GUEST_ID.test(user) && group.size < 2) return name;
  const digest = digestOf(user);
  const others = [...group].filter((other) => other !== user).map(digestOf);
  let digits = SUFFIX_DIGITS;
  while (digits < digest.length && others.some((other) => other.slice(0, digits) === digest.slice(0, digits))) {
    digits += 1;
  }
  return `${name}·${digest.slice(0, digits)}`;
}

/** How many people the page knows with `user`'s display name. */
function namesakes(user) {
  return people.get(displayName(user))?.size ?? 0;
}

/** A small round avatar: the name's first letter (CSS shows it: not part of the text) on a hue
 * from the id. The hue is set through the CSSOM, which the page's CSP allows (no style=). */
function avatar(user) {
  const dot = el("span", "avatar");
  dot.dataset.initial = ([...displayName(user)][0] ?? "?").toUpperCase();
  dot.style.setProperty("--hue", String(parseInt(digestOf(user).slice(8, 12), 16) % 360));
  dot.setAttribute("aria-hidden", "true");
  return dot;
}

/** A person as an element: avatar and label, the full id as its tooltip; marked when the
 * display name is shared. */
function personNode(user, tag = "span", className = "person") {
  const node = el(tag, className);
  node.append(avatar(user), el("span", "who", personLabel(user)));
  node.title = user;
  if (namesakes(user) > 1) node.classList.add("shared-name");
  return node;
}

/** Show every name again (someone with a known display name arrived: labels change). */
function refreshNames() {
  if (!client) return;
  const me = client.hello?.user;
  if (me) $("me-name").replaceChildren(personNode(me));
  for (const item of $("dms").children) {
    const user = rooms.get(item.dataset.room)?.peer;
    if (user) item.querySelector(".room").replaceChildren(avatar(user), personLabel(user));
  }
  renderMessagesInPlace();
  renderRoomHead();
  renderPresence();
  renderTyping();
  renderInvitations();
  invitePicker.render();
  directPicker.render();
  renderHiddenPeople();
}

// -- name and start ------------------------------------------------------------------------

/** Connect as `name`; `renamed`: the person changed names (they are told who they are now). */
function start(name, renamed = false) {
  localStorage.setItem("hubbub.name", name);
  $("me-name").textContent = name;
  // This browser's guest key (guest servers): the same guest on every visit and reconnect.
  const guestKey = localStorage.getItem("hubbub.guest") || undefined;
  client = new HubbubClient({ name, guestKey });
  window.hubbub = { client, rooms }; // for debugging in the console
  client.addEventListener("state", (e) => showState(e.detail));
  client.addEventListener("hello", (e) => {
    if (e.detail.guest) localStorage.setItem("hubbub.guest", e.detail.guest);
    // Your own label has your suffix too: tell others which alice you are.
    $("me-name").replaceChildren(personNode(e.detail.user));
    if (renamed) {
      renamed = false;
      showAlert(`You are now ${personLabel(e.detail.user)}`, "info");
    }
    subscribePush(); // with the server's key, when notifications are on
    // Whom you hide, and whether you moderate: asked on every connection (changes made
    // while it was down were not pushed).
    client.hidden().catch(() => undefined); // answered by the `hidden` event too
    askModerator();
    if (openOnConnect) { // the address named a message (a notification's link)
      const target = openOnConnect;
      openOnConnect = null;
      openAt(target);
    }
  });
  client.addEventListener("joined", (e) => onJoined(e.detail));
  client.addEventListener("message", (e) => addMessage(e.detail));
  client.addEventListener("direct", (e) => {
    const key = conversationOf(e.detail);
    openDirect(key.slice(1), false);
    addMessage(e.detail);
  });
  for (const type of ["edited", "deleted", "reaction"]) {
    client.addEventListener(type, (e) => onEvent(e.detail));
  }
  client.addEventListener("receipt", (e) => onReceipt(conversationOf(e.detail), e.detail.user, e.detail.id));
  client.addEventListener("receipts", (e) => {
    for (const [user, id] of Object.entries(e.detail.read)) onReceipt(e.detail.room, user, id);
  });
  client.addEventListener("inbox", (e) => onInbox(e.detail));
  client.addEventListener("resync", (e) => {
    // A room: reload its newest messages. A direct conversation: the client delivered its
    // newest page already; older ones load on scroll.
    if (e.detail.room) loadHistory(e.detail.room);
  });
  client.addEventListener("presence", (e) => onPresence(e.detail));
  client.addEventListener("room", (e) => onRoomRecord(e.detail));
  client.addEventListener("rooms", (e) => { if (e.detail.public) renderFound(e.detail.rooms); });
  client.addEventListener("invited", (e) => onInvited(e.detail));
  client.addEventListener("member", (e) => {
    const { room, event, user, role } = e.detail;
    know(user);
    if (event === "removed" && user === client.hello?.user && invitations.delete(room)) {
      renderInvitations(); // taken back before you answered
    }
    const state = rooms.get(room);
    if (!state?.record?.members) return;
    if (event === "added") state.record.members[user] = role;
    else delete state.record.members[user];
    if (room === active) renderRoomHead();
  });
  client.addEventListener("left", (e) => {
    if (e.detail.reason !== "removed") return;
    showAlert(`You were removed from ${e.detail.room}`);
    forgetRoom(e.detail.room);
  });
  client.addEventListener("typing", (e) => onTyping(e.detail));
  client.addEventListener("hidden", (e) => applyHidden(e.detail));
  client.addEventListener("error", (e) => onError(e.detail));
  visibleSaid = null; // a new client: told (it says it again on every connection)
  reportVisibility();
  client.connect();
  // Every saved conversation comes back; the one being read when the page was left is shown
  // (or the one in the address: ?room=R or ?with=U, and &message=ID opens it at that message,
  // as a notification's link does).
  const params = new URLSearchParams(location.search);
  const wanted = params.get("room");
  const peer = params.get("with");
  const saved = JSON.parse(localStorage.getItem("hubbub.rooms") || "[]").filter((key) => typeof key === "string");
  const initial = saved.length ? saved : ["lobby"];
  if (wanted && ROOM.test(wanted) && !initial.includes(wanted)) initial.push(wanted);
  for (const key of initial) {
    if (key.startsWith("@")) openDirect(key.slice(1), false);
    else if (ROOM.test(key)) joinRoom(key, false);
  }
  if (peer && USER.test(peer)) openDirect(peer, false);
  const last = localStorage.getItem("hubbub.active");
  const show = peer && rooms.has(`@${peer}`) ? `@${peer}`
    : wanted && rooms.has(wanted) ? wanted : last && rooms.has(last) ? last : [...rooms.keys()][0] ?? null;
  const message = Number(params.get("message"));
  if (Number.isSafeInteger(message) && message > 0 && show !== null && (show === wanted || show === `@${peer}`)) {
    openOnConnect = show.startsWith("@") ? { with: show.slice(1), id: message } : { room: show, id: message };
  }
  setActive(show);
  renderNotifyState();
  if (notifyEnabled()) setUpWorker(); // allowed before: no question asked
}

/** An error frame: a refused join of a private room leaves the sidebar (and is not tried
 * again on the next visit); other refusals are shown. */
function onError(error) {
  const { code, message, ref, room } = error;
  if (ref === "join" && room && (code === "forbidden" || code === "not_found") && rooms.has(room)
      && !rooms.get(room).historyLoaded && !invitations.has(room)) {
    showAlert(`You cannot join ${room}: ${message}`);
    forgetRoom(room);
    client.rooms.delete(room); // not joined again on reconnect (no leave: it was never joined)
    return;
  }
  if (code === "ack_timeout" || (ref === "send" && error.cid)) return; // the message says it (sendText)
  // An older server that knows no `visibility` frame: nothing to tell anyone.
  if (ref === "visibility") return;
  showAlert(`${message} (${code})`);
}

function askName() {
  const dialog = $("name-dialog");
  const input = $("name-input");
  input.value = localStorage.getItem("hubbub.name") || "";
  const me = client?.hello?.user;
  const warning = $("name-warning");
  // A guest's id is its name and its key's hash: another name is another person to everyone
  // else, and your messages stay with the name they were written under.
  warning.hidden = !me;
  if (me) {
    warning.textContent = `You are ${personLabel(me)}. Another name makes you a different person to `
      + `everyone: your messages stay ${displayName(me)}'s, and only ${displayName(me)} can edit or `
      + `delete them (pick ${displayName(me)} again to get them back).`;
  }
  $("name-cancel").hidden = !client;
  dialog.showModal();
  input.focus();
}

// Esc (or Cancel) before a name is picked: the page has nothing to do without one.
$("name-dialog").addEventListener("cancel", (event) => {
  if (!client) event.preventDefault();
});
$("name-cancel").addEventListener("click", () => $("name-dialog").close());

$("name-form").addEventListener("submit", (event) => {
  const name = $("name-input").value.trim();
  if (!NAME.test(name)) {
    event.preventDefault();
    $("name-input").setCustomValidity(NAME_HINT);
    $("name-input").reportValidity();
    return;
  }
  if (client && name === displayName(client.hello?.user ?? "")) return; // the same name: nothing changes
  const renamed = client !== null;
  if (client) {
    // A new name is a new connection: keep the rooms.
    client.close();
    for (const state of rooms.values()) state.messages.clear();
    const joined = [...rooms.keys()].filter((key) => rooms.get(key).kind === "room");
    rooms.clear();
    people.clear();
    invitations.clear();
    renderInvitations();
    applyHidden({ muted: [], blocked: [] }); // the new name's lists and role come with its hello
    setModerator(false);
    $("rooms").replaceChildren();
    $("dms").replaceChildren();
    localStorage.setItem("hubbub.rooms", JSON.stringify(joined));
  }
  start(name, renamed);
});
$("change-name").addEventListener("click", askName);

// -- connection state and alerts -----------------------------------------------------------

/** Why a connection closed, in words. */
function closeReason(code, reason) {
  return CLOSE_REASONS[code] ?? (reason || "the connection was lost");
}

function showState({ state, delayMs, code, reason, transport }) {
  const status = $("status");
  if (state !== undefined) status.dataset.state = state;
  if (transport !== undefined) status.dataset.transport = transport;
  clearInterval(countdown);
  countdown = null;
  if (state === "reconnecting") {
    // Counts down each second to the next try (the SDK tries then by itself).
    const why = code ? ` — ${closeReason(code, reason)}` : "";
    const at = Date.now() + (delayMs ?? 0);
    const tick = () => {
      const left = Math.ceil((at - Date.now()) / 1000);
      const text = left > 0 ? `Reconnecting in ${left} s${why}` : `Reconnecting…${why}`;
      if (status.textContent !== text) status.textContent = text;
      if (left <= 0) { clearInterval(countdown); countdown = null; }
    };
    tick();
    if (delayMs) countdown = setInterval(tick, 250);
  } else if (state !== undefined) {
    // Over the HTTP fallback (no WebSocket got through on the way here), it says so.
    const connected = transport === "sse" ? "Connected (HTTP fallback)" : "Connected";
    const texts = { idle: "Not connected", connecting: "Connecting…", open: connected,
                    closed: `Disconnected: ${closeReason(code, reason)}` };
    status.textContent = texts[state] ?? state;
    status.title = transport === "sse" && state === "open"
      ? "WebSockets are blocked between you and the server: messages go over plain HTTP" : "";
  }
  if (state === "open") {
    relinkAttachments(); // links asked while offline: ask again
    pumpPreviews(); // previews waiting for the connection
  }
  renderComposer();
}

/** A notice at the top: `kind` "error" (red) or "info" (good news, neutral). */
function showAlert(text, kind = "error") {
  const box = el("p", kind === "info" ? "alert info" : "alert");
  box.append(el("span", "", text));
  const dismiss = el("button", "", "×");
  dismiss.type = "button";
  dismiss.setAttribute("aria-label", "Dismiss");
  dismiss.addEventListener("click", () => box.remove());
  box.append(dismiss);
  const alerts = $("alerts");
  alerts.append(box);
  while (alerts.children.length > 3) alerts.firstElementChild.remove();
  setTimeout(() => box.remove(), 10_000);
}

// -- invitations: joined only with your consent -----------------------------------------------

/** An `invited` frame: you are now a member of a room. The page does not join it: the
 * invitation waits for Join or Decline (a stranger cannot pull the page into rooms). In a room
 * the page has joined already, it is a change of your role. */
function onInvited(invitation) {
  const { room, by, role } = invitation;
  know(by);
  if (rooms.get(room)?.historyLoaded) { // joined (a refused join, e.g. a saved room, is not)
    showAlert(`${by ? personLabel(by) : "The service"} made you ${role === "admin" ? "an admin" : "a member"} of ${room}`, "info");
    onRoomRecord(invitation);
    return;
  }
  invitations.delete(room); // invited again: moves to the end
  invitations.set(room, invitation);
  renderInvitations();
}

/** The oldest few invitations, each with Join and Decline; the others counted. */
function renderInvitations() {
  const box = $("invitations");
  box.replaceChildren();
  box.hidden = invitations.size === 0;
  for (const [room, { by, private: isPrivate }] of [...invitations].slice(0, INVITATIONS_SHOWN)) {
    const card = el("p", "invitation");
    card.dataset.room = room;
    const text = el("span", "invitation-text");
    if (by) text.append(personNode(by), " invited you to ");
    else text.append("The service added you to ");
    text.append(el("strong", "", isPrivate ? `🔒 ${room}` : room));
    const join = el("button", "", "Join");
    join.type = "button";
    join.setAttribute("aria-label", `Join ${room}`);
    join.addEventListener("click", () => acceptInvitation(room));
    const decline = el("button", "secondary", "Decline");
    decline.type = "button";
    decline.setAttribute("aria-label", `Decline ${room}`);
    decline.addEventListener("click", () => declineInvitation(room));
    card.append(text, join, decline);
    box.append(card);
  }
  const more = invitations.size - INVITATIONS_SHOWN;
  if (more > 0) {
    const line = el("p", "invitation-more", `and ${more} more invitation${more === 1 ? "" : "s"}`);
    const all = el("button", "link", "Decline all");
    all.type = "button";
    all.addEventListener("click", declineAllInvitations);
    line.append(" ", all);
    box.append(line);
  }
}

/** Join: into the room, as a member. */
function acceptInvitation(room) {
  const invitation = invitations.get(room);
  if (!invitation) return;
  invitations.delete(room);
  renderInvitations();
  if (rooms.has(room)) client.join(room); // in the sidebar, its join refused before
  joinRoom(room);
  onRoomRecord(invitation);
}

/** Decline: out of the room's members (a member may remove itself), and the card goes. */
function declineInvitation(room) {
  if (!invitations.delete(room)) return;
  renderInvitations();
  client.removeMember(room, client.hello?.user);
}

/** Decline every waiting invitation, a few a second (each is a frame). */
function declineAllInvitations() {
  const waiting = [...invitations.keys()];
  invitations.clear();
  renderInvitations();
  waiting.forEach((room, n) => {
    setTimeout(() => client.removeMember(room, client.hello?.user), n * DECLINE_EVERY_MS);
  });
}

// -- rooms ---------------------------------------------------------------------------------

function sidebarItem(list, key, label, title) {
  const item = el("li");
  item.dataset.room = key;
  const open = el("button", "room");
  open.append(...[label].flat());
  open.type = "button";
  if (title) open.title = title;
  open.addEventListener("click", () => setActive(key));
  const mentions = el("span", "mention-badge");
  mentions.hidden = true;
  const unread = el("span", "unread");
  unread.hidden = true;
  item.append(open, mentions, unread);
  list.append(item);
  return item;
}

function joinRoom(room, show = true) {
  if (!rooms.has(room)) {
    rooms.set(room, newConversation("room"));
    elsewhereMentions.delete(room); // counted on its row now
    const item = sidebarItem($("rooms"), room, room);
    const leave = el("button", "leave", "×");
    leave.type = "button";
    leave.setAttribute("aria-label", `Leave ${room}`);
    leave.addEventListener("click", () => leaveRoom(room));
    item.append(leave);
    client.join(room);
    saveRooms();
  }
  if (show) setActive(room);
}

/** A room's record (`room` frames): private, title, your role and its members. */
function onRoomRecord(record) {
  const state = rooms.get(record.room);
  if (!state) return;
  for (const user of Object.keys(record.members ?? {})) know(user);
  state.record = { ...(state.record ?? {}), ...record };
  const button = document.querySelector(`#rooms li[data-room="${CSS.escape(record.room)}"] .room`);
  if (button) button.textContent = record.private ? `🔒 ${record.room}` : record.room;
  if (record.room === active) renderRoomHead();
}

/** The title (with the room's record), its members and, for its owner and admins, the invite
 * form; a direct conversation's title is the other person. */
function renderRoomHead() {
  const state = active === null ? null : rooms.get(active);
  const record = state?.record;
  const form = $("invite-form");
  form.hidden = !(state?.kind === "room" && (record?.role === "owner" || record?.role === "admin"));
  if (form.hidden) invitePicker.close();
  const members = $("room-members");
  members.hidden = !(state?.kind === "room" && record?.members);
  $("room-title").title = state?.kind === "dm" ? state.peer : "";
  $("room-status").hidden = true;
  renderDirectHide(state);
  if (!state) {
    $("room-title").textContent = "No room";
  } else if (state.kind === "dm") {
    $("room-title").textContent = `@${personLabel(state.peer)}`;
    // Online: in one of your rooms now (presence tells; direct conversations have none).
    const online = [...rooms.values()].some((other) => other.users?.has(state.peer));
    $("room-status").textContent = online ? "● online" : "";
    $("room-status").hidden = !online;
  } else {
    const title = record?.title ? `${active} — ${record.title}` : active;
    $("room-title").textContent = record?.private ? `🔒 ${title}` : title;
  }
  if (members.hidden) return;
  const roles = Object.entries(record.members)
    .map(([user, role]) => [personLabel(user), user, role])
    .sort(([a], [b]) => a.localeCompare(b));
  members.replaceChildren("Members: ");
  roles.forEach(([, user, role], n) => {
    if (n) members.append(", ");
    members.append(personNode(user, "span", role === "member" ? "person" : `person ${role}`));
    if (role !== "member") members.append(` (${role})`);
  });
}

/** Out of a room for good (removed from its members): off the sidebar. */
function forgetRoom(room) {
  rooms.delete(room);
  document.querySelector(`#rooms li[data-room="${CSS.escape(room)}"]`)?.remove();
  saveRooms();
  if (active === room) setActive(rooms.size ? [...rooms.keys()][0] : null);
}

/** The direct conversation with `user` in the sidebar (made if new); shown when `show`. */
function openDirect(user, show = true) {
  const key = `@${user}`;
  if (!rooms.has(key)) {
    rooms.set(key, newConversation("dm", user));
    sidebarItem($("dms"), key, [avatar(user), personLabel(user)], user);
  }
  if (show) setActive(key);
}

function onInbox({ conversations }) {
  const first = !hasStore;
  hasStore = true;
  markReadSoon(); // what is shown already
  elsewhereMentions.clear();
  for (const entry of conversations) {
    if (entry.room !== undefined) {
      if (rooms.has(entry.room) && entry.room !== active) showUnread(entry.room, entry.unread, entry.mentions ?? 0);
      else if (!rooms.has(entry.room) && entry.mentions) elsewhereMentions.set(entry.room, entry.mentions);
      continue;
    }
    openDirect(entry.with, false);
    const state = rooms.get(`@${entry.with}`);
    if (entry.peer_read) onReceipt(`@${entry.with}`, entry.with, entry.peer_read);
    if (active !== `@${entry.with}` && entry.unread > state.unread) {
      showUnread(`@${entry.with}`, entry.unread, entry.mentions ?? state.mentions);
    }
  }
  renderUnreadTotals();
  $("mentions-entry").hidden = false; // kept by the server: listed
  $("hidden-settings").hidden = false; // mute and block lists are kept too
  renderDirectHide(active === null ? null : rooms.get(active));
  if (first) { // the levels you chose (to honour them in this page's notifications)
    client.notificationLevels().then((list) => onLevels(list), levelsRefused);
    renderNotifyControl();
  }
}

/** Conversation `key`'s unread count (and how many of those mention you), on its sidebar row:
 * the count, and an "@N" badge for the mentions. */
function showUnread(key, count, mentions = count === 0 ? 0 : rooms.get(key).mentions) {
  const state = rooms.get(key);
  state.unread = count;
  state.mentions = Math.min(mentions, count || mentions);
  const row = document.querySelector(`[data-room="${CSS.escape(key)}"]`);
  const badge = row?.querySelector(".unread");
  if (badge) {
    badge.textContent = count > 999 ? "999+" : String(count);
    badge.hidden = count === 0;
  }
  const mark = row?.querySelector(".mention-badge");
  if (mark) {
    mark.replaceChildren(`@${state.mentions > 999 ? "999+" : state.mentions}`,
      el("span", "visually-hidden", state.mentions === 1 ? " mention" : " mentions"));
    mark.hidden = state.mentions === 0;
  }
  renderUnreadTotals();
}

function leaveRoom(room) {
  client.leave(room);
  forgetRoom(room);
}

function saveRooms() {
  localStorage.setItem("hubbub.rooms", JSON.stringify([...rooms.keys()]));
}

/** The composer's text is the shown conversation's draft (not while editing a message). */
function saveDraft() {
  if (active === null || composing.edit) return;
  const text = $("composer-input").value;
  if (text) drafts.set(active, text);
  else drafts.delete(active);
  localStorage.setItem("hubbub.drafts", JSON.stringify(Object.fromEntries(drafts)));
}

/** The id of the first of the shown conversation's `unread` newest messages by others. */
function firstUnreadOf(state) {
  const me = client.hello?.user;
  const theirs = [...state.messages.values()].filter((m) => m.user !== me).sort((a, b) => a.id - b.id);
  return theirs.length ? theirs[Math.max(0, theirs.length - state.unread)].id : null;
}

function setActive(key) {
  saveDraft();
  active = key;
  if (key !== null) localStorage.setItem("hubbub.active", key);
  // The address names the conversation being read: a reload (or a shared link) opens it.
  const address = new URL(location.href);
  address.searchParams.delete("message");
  if (key !== null && !key.startsWith("@")) address.searchParams.set("room", key);
  else address.searchParams.delete("room");
  if (key?.startsWith("@")) address.searchParams.set("with", key.slice(1));
  else address.searchParams.delete("with");
  history.replaceState(null, "", address);
  closeMentionOptions();
  closeNotifyPanel(false);
  document.body.classList.remove("drawer-open");
  $("drawer-toggle").setAttribute("aria-expanded", "false");
  const state = key === null ? null : rooms.get(key);
  renderRoomHead();
  for (const item of [...$("rooms").children, ...$("dms").children]) {
    const current = item.dataset.room === key;
    item.querySelector(".room").setAttribute("aria-current", String(current));
  }
  if (state) {
    // Where the unread messages begin: a "New messages" line, and a way to jump there.
    state.firstUnread = state.unread ? firstUnreadOf(state) : null;
    state.away = state.awayMentions = 0;
    showUnread(key, 0);
  }
  renderNotifyControl();
  $("history-state").textContent = "";
  setComposing({});
  $("composer-input").value = key === null ? "" : drafts.get(key) ?? "";
  renderUploads();
  renderMessages();
  renderPresence();
  renderTyping();
  renderComposer();
  if (state?.kind === "dm" && !state.loaded) {
    state.loaded = true;
    loadOlder(key);
  }
  markReadSoon();
}

async function loadHistory(room) {
  try {
    // Unread counts come from the inbox (with a store) and from live messages, not from this.
    // It shows messages as they are now: after a resync (events may have been missed), it
    // replaces what is shown.
    for (const frame of await client.roomHistory(room, { limit: 100 })) addMessage(frame, false, false, true);
  } catch (error) {
    showAlert(`Could not load the history of ${room}: ${error.message}`);
  }
}

/** One page of older messages of conversation `key` (before the oldest shown). */
async function loadOlder(key) {
  const state = rooms.get(key);
  if (!state || state.complete || state.loading || client.state !== "open") return;
  state.loading = true;
  if (key === active) $("history-state").textContent = "Loading older messages…";
  const ids = [...state.messages.keys()];
  const before = ids.length ? Math.min(...ids) : undefined;
  try {
    const page = state.kind === "dm"
      ? (await client.directHistory(state.peer, { before, limit: PAGE })).messages
      : await client.roomHistory(key, { before, limit: PAGE });
    if (page.length < PAGE) state.complete = true;
    const list = $("messages");
    const fromBottom = list.scrollHeight - list.scrollTop;
    for (const frame of page) addMessage(frame, true);
    if (key === active) {
      list.scrollTop = list.scrollHeight - fromBottom; // what was shown stays in place
      $("history-state").textContent = state.complete ? "Beginning of the conversation" : "";
    }
  } catch (error) {
    if (key === active) $("history-state").textContent = "";
    showAlert(`Could not load older messages: ${error.message}`);
  } finally {
    state.loading = false;
  }
}

$("messages").addEventListener("scroll", () => {
  if (active !== null && $("messages").scrollTop < 40) loadOlder(active);
  markReadSoon();
  renderJump();
});

/** Whether the person can be reading: the page is visible and has the focus. */
function canRead() {
  return document.visibilityState === "visible" && document.hasFocus();
}

/** The newest message of the shown conversation that is on screen (null: none). */
function newestOnScreen() {
  const list = $("messages");
  const view = list.getBoundingClientRect();
  let newest = null;
  for (const node of list.querySelectorAll(".message[data-id]")) {
    const box = node.getBoundingClientRect();
    if (box.height > 0 && box.bottom > view.top + 4 && box.top < view.bottom - 4) {
      newest = Math.max(newest ?? 0, Number(node.dataset.id));
    }
  }
  return newest;
}

/** Tell the server what was read (with a store): the newest message on screen, once it has
 * been there READ_EVERY_MS in a visible, focused page. A conversation only glanced at, a
 * hidden tab, or messages below the fold stay unread. */
function markReadSoon() {
  const key = active;
  const state = key === null ? null : rooms.get(key);
  if (!hasStore || !state || state.readTimer || !canRead()) return;
  state.readTimer = setTimeout(() => {
    state.readTimer = null;
    if (active !== key || !canRead() || client.state !== "open") return;
    const newest = newestOnScreen();
    if (newest === null || newest <= (state.readUpTo ?? 0)) return;
    state.readUpTo = newest;
    client.markRead(state.kind === "dm" ? { with: state.peer } : key, newest);
    if (state.firstUnread !== null && state.firstUnread !== undefined && newest >= Math.max(...state.messages.keys())) {
      state.firstUnread = null; // all read: the jump goes (the line stays until you leave)
      renderJump();
    }
  }, READ_EVERY_MS);
}
document.addEventListener("visibilitychange", () => markReadSoon());
window.addEventListener("focus", () => markReadSoon());

$("create-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const input = $("create-input");
  const room = input.value.trim();
  if (!ROOM.test(room)) {
    input.setCustomValidity(ROOM_HINT);
    input.reportValidity();
    return;
  }
  input.value = "";
  // Created first, then joined: a private room admits its members only. A refusal (the
  // room exists...) is shown as an alert, and ends the wait.
  const answered = (e) => {
    if (e.detail.room !== room || (e.type === "error" && e.detail.ref !== "create")) return;
    client.removeEventListener("room", answered);
    client.removeEventListener("error", answered);
    if (e.type === "room") joinRoom(room);
  };
  client.addEventListener("room", answered);
  client.addEventListener("error", answered);
  client.createRoom(room, { private: true });
});

// -- search: messages you may read, a result opens its conversation at it --------------------

let searching = null; // {q, next}: the search shown

$("search-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const q = $("search-input").value.trim();
  if (!q || !client) return;
  searching = { q, next: 0 };
  $("search-list").replaceChildren();
  runSearch();
});

async function runSearch() {
  const { q, next } = searching;
  $("search-results").hidden = false;
  $("search-summary").textContent = `Searching for “${q}”…`;
  try {
    const page = await client.search(q, { order: "newest", limit: 20, offset: next });
    if (searching?.q !== q) return; // another search began meanwhile
    $("search-list").append(...page.results.map(resultItem));
    searching.next = page.next_offset;
    const count = $("search-list").children.length;
    $("search-summary").textContent = count
      ? `${count} message${count === 1 ? "" : "s"} with “${q}”` : `No message with “${q}”`;
    $("search-more").hidden = page.next_offset === null;
  } catch (error) {
    $("search-summary").textContent = `Search failed: ${error.message}`;
  }
}

$("search-more").addEventListener("click", () => { if (searching?.next !== null) runSearch(); });
$("search-close").addEventListener("click", () => {
  $("search-results").hidden = true;
  searching = null;
  $("search-input").focus();
});

/** A result: where, who, when, and the text with the matched words marked (as nodes; the
 * offsets count code points). A click opens the conversation at that message. */
function resultItem(result) {
  const item = el("li", "search-result");
  const open = el("button", "result-open");
  open.type = "button";
  const where = result.room !== undefined ? result.room : `@${personLabel(result.with)}`;
  const head = el("span", "result-head");
  head.append(el("strong", "", where), " · ", personNode(result.user), " · ",
    el("time", "", new Date(result.ts).toLocaleString([], { dateStyle: "medium", timeStyle: "short" })));
  const text = el("span", "result-text");
  const chars = [...result.text];
  let at = 0;
  for (const [start, end] of result.highlights) {
    if (start < at || end > chars.length) continue;
    text.append(chars.slice(at, start).join(""), el("mark", "", chars.slice(start, end).join("")));
    at = end;
  }
  text.append(chars.slice(at).join(""));
  open.append(head, text);
  open.addEventListener("click", () => openAt(result));
  item.append(open);
  return item;
}

/** Show the result's conversation with the message on screen (older pages loaded until it
 * is, 20 at most), marked for a moment. */
async function openAt(result) {
  const key = result.room !== undefined ? result.room : `@${result.with}`;
  if (result.room !== undefined) joinRoom(result.room);
  else openDirect(result.with);
  const state = rooms.get(key);
  for (let pages = 0; pages < 20 && state && !state.messages.has(result.id) && !state.complete; pages++) {
    await new Promise((resolve) => setTimeout(resolve, 50)); // the join's history first
    if (!state.messages.has(result.id)) await loadOlder(key);
  }
  const node = $("messages").querySelector(`.message[data-id="${result.id}"]`);
  if (!node) {
    showAlert("That message is not in the conversation any more");
    return;
  }
  node.scrollIntoView({ block: "center" });
  node.classList.add("found");
  setTimeout(() => node.classList.remove("found"), 3000);
}

// -- the directory: public rooms to find and join --------------------------------------------

$("find-form").addEventListener("submit", (event) => {
  event.preventDefault();
  if (!client) return;
  client.findRooms($("find-input").value.trim() || undefined);
});

/** The public rooms found, each with its title and a Join button (the ones you are in: Open). */
function renderFound(records) {
  const list = $("found-rooms");
  list.hidden = false;
  if (!records.length) {
    list.replaceChildren(el("li", "found-none", "No public room found"));
    return;
  }
  list.replaceChildren(...records.map((record) => {
    const item = el("li", "found-room");
    const text = el("span", "found-name", record.room);
    if (record.title) text.append(el("small", "found-title", ` — ${record.title}`));
    if (record.topic) text.title = record.topic;
    const inIt = rooms.has(record.room);
    const button = el("button", "secondary", inIt ? "Open" : "Join");
    button.type = "button";
    button.setAttribute("aria-label", `${inIt ? "Open" : "Join"} ${record.room}`);
    button.addEventListener("click", () => {
      joinRoom(record.room);
      list.hidden = true;
    });
    item.append(text, button);
    return item;
  }));
}

// -- picking a person: from those the page knows, never resolved from a typed name --------

/** Everyone the page knows (presence, members, authors, readers, the inbox…), but you. */
function knownPeople() {
  const me = client?.hello?.user;
  return [...people.values()].flatMap((group) => [...group]).filter((user) => user !== me);
}

/** Who a picker's text stands for: the person picked from the list, a known person's full
 * label (alice·7e1f), a known id, or (not on a guest server) a user id typed in full. A
 * display name alone is never resolved to someone: {refused: why} says to pick. */
function personFrom(text, pick) {
  if (pick && text === pick.label) return pick.user;
  const me = client.hello?.user;
  const known = knownPeople();
  const labelled = known.filter((user) => personLabel(user) === text);
  if (labelled.length === 1) return labelled[0];
  const sharing = people.get(text)?.size ?? 0; // known people (you too) with this display name
  if (sharing > 1) return { refused: `Pick the person from the list: ${sharing} people are called ${text}` };
  if (known.includes(text)) return text;
  if (known.some((user) => displayName(user) === text)) {
    return { refused: `Pick the person from the list: a name alone could be anyone called ${text}` };
  }
  if (!USER.test(text)) return { refused: "Pick the person from the list (or type a user id in full)" };
  // A guest server's users all have a hash in their ids: a bare name is nobody's id there.
  if (me && GUEST_ID.test(me) && !GUEST_ID.test(text)) {
    return { refused: `Pick the person from the list: nobody the page knows is called ${text}` };
  }
  return text; // a user id typed in full
}

/** A form whose box picks a person: a list of `candidates()` (filtered by what is typed,
 * arrow keys and Enter, or a click) under the box; on submit, `onPick(user id)` — or an
 * alert that says to pick, when the text is not someone (see personFrom). */
function personPicker(form, input, list, candidates, onPick) {
  let pick = null; // {user, label}: the person picked
  let option = -1; // the highlighted option
  const render = () => {
    const typed = input.value.trim().toLowerCase();
    const shown = candidates()
      .map((user) => ({ user, label: personLabel(user) }))
      .filter(({ user, label }) => label.toLowerCase().includes(typed) || user.toLowerCase().includes(typed))
      .sort((a, b) => a.label.localeCompare(b.label))
      .slice(0, INVITE_OPTIONS_SHOWN);
    option = Math.min(option, shown.length - 1);
    list.replaceChildren(...shown.map(({ user }, n) => {
      const item = personNode(user, "li", "person option");
      item.id = `${list.id}-${n}`;
      item.dataset.user = user;
      item.setAttribute("role", "option");
      item.setAttribute("aria-selected", String(n === option));
      item.addEventListener("click", () => choose(user));
      return item;
    }));
    list.hidden = shown.length === 0;
    input.setAttribute("aria-expanded", String(!list.hidden));
    if (option >= 0) input.setAttribute("aria-activedescendant", `${list.id}-${option}`);
    else input.removeAttribute("aria-activedescendant");
  };
  const close = () => {
    list.hidden = true;
    input.setAttribute("aria-expanded", "false");
    input.removeAttribute("aria-activedescendant");
    option = -1;
  };
  const choose = (user) => {
    pick = { user, label: personLabel(user) };
    input.value = pick.label;
    close();
    input.focus();
  };
  input.addEventListener("input", () => {
    if (pick && input.value !== pick.label) pick = null;
    option = -1;
    render();
  });
  input.addEventListener("focus", render);
  input.addEventListener("blur", close);
  list.addEventListener("mousedown", (event) => event.preventDefault()); // a click must not blur first
  input.addEventListener("keydown", (event) => {
    if (event.key === "ArrowDown" || event.key === "ArrowUp") {
      event.preventDefault();
      if (list.hidden) render();
      const count = list.children.length;
      if (!count) return;
      if (event.key === "ArrowDown") option = (option + 1) % count;
      else option = option <= 0 ? count - 1 : option - 1;
      render();
    } else if (event.key === "Enter" && !list.hidden && option >= 0) {
      event.preventDefault(); // Enter on a highlighted option picks it; the next one submits
      choose(list.children[option].dataset.user);
    } else if (event.key === "Escape" && !list.hidden) {
      event.stopPropagation();
      close();
    }
  });
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const text = input.value.trim();
    if (!text || !client) return;
    const user = personFrom(text, pick);
    if (typeof user !== "string") {
      showAlert(user.refused);
      return;
    }
    input.value = "";
    pick = null;
    close();
    onPick(user);
  });
  return { render: () => { if (!list.hidden) render(); }, close };
}

/** Invite to the shown room: the people the page knows who are not its members yet. */
const invitePicker = personPicker($("invite-form"), $("invite-input"), $("invite-options"), () => {
  const members = rooms.get(active)?.record?.members ?? {};
  return knownPeople().filter((user) => !Object.hasOwn(members, user));
}, (user) => { if (active) client.invite(active, user); });

/** A direct conversation: with someone the page knows. */
const directPicker = personPicker($("dm-form"), $("dm-input"), $("dm-options"), knownPeople,
  (user) => openDirect(user));

$("join-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const input = $("join-input");
  const room = input.value.trim();
  if (!ROOM.test(room)) {
    input.setCustomValidity(ROOM_HINT);
    input.reportValidity();
    return;
  }
  input.value = "";
  joinRoom(room);
});

// -- messages ------------------------------------------------------------------------------

function actionButton(label, title, onClick) {
  const button = el("button", "action", label);
  button.type = "button";
  button.title = title;
  button.setAttribute("aria-label", title);
  button.addEventListener("click", onClick);
  return button;
}

function conversationTarget(key) {
  const state = rooms.get(key);
  return state.kind === "dm" ? { with: state.peer } : key;
}

/** A message's time (hours and minutes; the full time for machines). */
function timeNode(ts) {
  const time = el("time", "meta", new Date(ts).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" }));
  time.dateTime = new Date(ts).toISOString();
  return time;
}

function messageItem(frame) {
  const key = conversationOf(frame);
  const me = client.hello?.user;
  const hiddenAs = frame.user === me ? null : hiddenKind(frame.user);
  if (hiddenAs !== null) return hiddenItem(frame, hiddenAs);
  const item = el("li", frame.deleted ? "message deleted" : "message");
  item.dataset.id = String(frame.id);
  if (frame.reply_to) {
    const quoted = rooms.get(key)?.messages.get(frame.reply_to);
    const quote = el("p", "quote", !quoted ? "↪ an earlier message"
      : quoted.user !== me && hiddenKind(quoted.user) !== null ? "↪ a hidden message"
        : `↪ ${personLabel(quoted.user)}: ${quoted.deleted ? "(deleted)" : summary(quoted).slice(0, 80)}`);
    item.append(quote);
  }
  const time = timeNode(frame.ts);
  // Guests may share a display name: the suffix and the avatar tell them apart (the id is
  // the tooltip).
  const author = personNode(frame.user, "span", "author person");
  item.append(time, author);
  if (frame.deleted) {
    item.append(el("span", "text", "Message deleted"));
    return item;
  }
  const text = el("span", "text");
  text.append(renderText(frame.text)); // links and formatting, built as nodes: never markup
  labelMentions(text, frame);
  item.append(text);
  if (forMe(frame)) {
    // For you: highlighted, and said (the highlight is not read out).
    item.classList.add("mentioned");
    item.append(el("span", "visually-hidden", frame.mentions?.includes(me) ? " (mentions you)" : " (to everyone here)"));
  }
  if (frame.edited) item.append(el("span", "edited", " (edited)"));
  if (frame.attachments?.length) item.append(attachmentsOf(frame.attachments));
  const link = firstLink(text);
  if (link !== null) item.append(previewSlot(link));
  const reactions = el("span", "reactions");
  for (const [emoji, users] of Object.entries(frame.reactions ?? {})) {
    const chip = actionButton(`${emoji} ${users.length}`, `${emoji} ${users.length}, by ${users.map(personLabel).join(", ")}`,
      () => client.react(conversationTarget(key), frame.id, emoji));
    chip.classList.add("reaction");
    chip.setAttribute("aria-pressed", String(users.includes(me)));
    reactions.append(chip);
  }
  item.append(reactions);
  const actions = el("span", "actions");
  actions.append(actionButton("↪", "Reply", () => setComposing({ reply: frame.id })));
  for (const emoji of REACTIONS) {
    actions.append(actionButton(emoji, `React ${emoji}`, () => client.react(conversationTarget(key), frame.id, emoji)));
  }
  const more = actionButton("+", "React with another emoji", () => {
    openEmojiPicker(more, (emoji) => client.react(conversationTarget(key), frame.id, emoji));
  });
  actions.append(more);
  if (frame.user === me) {
    actions.append(actionButton("✎", "Edit", () => setComposing({ edit: frame.id })));
    actions.append(actionButton("🗑", "Delete", () => {
      if (confirm("Delete this message for everyone?")) client.deleteMessage(conversationTarget(key), frame.id);
    }));
  } else {
    const report = actionButton("⚑", "Report this message", () => openReport(key, frame, report));
    actions.append(report, actionButton("🔇", `Mute ${personLabel(frame.user)}`, () => hide("mute", frame.user)));
    if (moderator) {
      actions.append(actionButton("🗑", "Delete as a moderator", () => {
        if (confirm(`Delete this message of ${personLabel(frame.user)} for everyone?`)) {
          client.deleteMessage(conversationTarget(key), frame.id); // a refusal is an alert (onError)
        }
      }));
    }
  }
  item.append(actions);
  const seen = el("p", "seen");
  seen.hidden = true;
  item.append(seen);
  return item;
}

/** The "@name" chips in a message's text: those the server resolved (the message's
 * `mentions`, and `@here` when it has `here`) show the person as everywhere (alice·7e1f, the
 * id as tooltip), yours marked; any other "@word" was no mention and stays plain text. */
function labelMentions(text, frame) {
  const me = client.hello?.user;
  for (const chip of text.querySelectorAll(".mention[data-user]")) {
    const user = chip.dataset.user;
    if (user === "here" ? frame.here === true : frame.mentions?.includes(user)) {
      if (user === "here") continue;
      chip.textContent = `@${personLabel(user)}`;
      chip.title = user;
      if (user === me) chip.classList.add("me");
    } else {
      chip.replaceWith(chip.textContent ?? "");
    }
  }
}

/** An edit, deletion or reaction: the message is shown as it is now. */
function onEvent(event) {
  const key = conversationOf(event);
  const state = rooms.get(key);
  if (!state) return;
  const message = state.messages.get(event.target);
  if (!message) return; // not loaded: history pages show it as it is now
  const changed = applyEvent(message, event);
  state.messages.set(event.target, changed);
  if (key !== active) return;
  const node = $("messages").querySelector(`[data-id="${event.target}"]`);
  if (node) node.replaceWith(messageItem(changed));
  // Replies quote it: show them as it is now too.
  for (const reply of state.messages.values()) {
    if (reply.reply_to === event.target) {
      $("messages").querySelector(`[data-id="${reply.id}"]`)?.replaceWith(messageItem(reply));
    }
  }
  if (composing.edit === event.target && changed.deleted) setComposing({});
  renderSeen();
}

function onReceipt(key, user, id) {
  const state = rooms.get(key);
  if (!state) return;
  if (user === client.hello?.user) {
    // Read on another tab, up to the newest message this page has: nothing is unread.
    const newest = Math.max(0, ...state.messages.keys());
    if (newest && id >= newest && key !== active) showUnread(key, 0);
    return;
  }
  if (id <= (state.read.get(user) ?? 0)) return;
  know(user);
  state.read.set(user, id);
  if (key === active) renderSeen();
}

/** "Seen by …" under the newest message each other reader has read up to. */
function renderSeen() {
  const state = rooms.get(active);
  const list = $("messages");
  for (const node of list.querySelectorAll(".seen")) { node.hidden = true; node.textContent = ""; }
  if (!state) return;
  const ids = [...state.messages.keys()].sort((a, b) => a - b);
  // The people of the conversation now: not those who left, nor identities gone since.
  const current = state.kind === "dm" ? new Set([state.peer])
    : new Set([...(state.users ?? []), ...Object.keys(state.record?.members ?? {})]);
  const readers = new Map(); // message id -> users
  for (const [user, position] of state.read) {
    if (!current.has(user)) continue;
    // Under the newest message they have read that is not theirs (an author saw their own).
    let upTo = null;
    for (const id of ids) {
      if (id > position) break;
      if (state.messages.get(id).user !== user) upTo = id;
    }
    if (upTo === null) continue;
    readers.set(upTo, [...(readers.get(upTo) ?? []), user]);
  }
  for (const [id, users] of readers) {
    const node = list.querySelector(`[data-id="${id}"] .seen`);
    if (!node) continue;
    node.textContent = `Seen by ${users.map(personLabel).join(", ")}`;
    node.hidden = false;
  }
}

function addMessage(frame, older = false, counts = !older, refresh = false) {
  const key = conversationOf(frame);
  const state = rooms.get(key);
  if (!state) return;
  know(frame.user); // an author seen
  if (state.messages.has(frame.id)) { // exactly once; a reload shows it as it is now
    if (refresh) {
      state.messages.set(frame.id, frame);
      if (key === active) $("messages").querySelector(`[data-id="${frame.id}"]`)?.replaceWith(messageItem(frame));
    }
    return;
  }
  state.messages.set(frame.id, frame);
  if (!older && state.typing.has(frame.user)) { // the message is what they were typing
    clearTimeout(state.typing.get(frame.user));
    state.typing.delete(frame.user);
    if (key === active) renderTyping();
  }
  if (counts) notifyOf(key, frame);
  if (key !== active) {
    if (counts && frame.user !== client.hello?.user) {
      showUnread(key, state.unread + 1, state.mentions + (mentionsMe(frame) ? 1 : 0));
    }
    return;
  }
  if (counts && frame.user !== client.hello?.user && !canRead()) {
    // Shown, but nobody is looking: the tab's title counts it until the page is read again.
    state.away += 1;
    if (mentionsMe(frame)) state.awayMentions += 1;
    renderUnreadTotals();
  }
  const list = $("messages");
  const atBottom = list.scrollHeight - list.scrollTop - list.clientHeight < 40;
  const item = messageItem(frame);
  // In id order: usually at the end (before messages still being sent); history and replays
  // may land earlier.
  const next = [...list.querySelectorAll(".message[data-id]")].find((node) => Number(node.dataset.id) > frame.id)
    ?? list.querySelector(".message.pending");
  list.insertBefore(item, next);
  decorate();
  renderSeen();
  if (!older && (atBottom || frame.user === client.hello?.user)) list.scrollTop = list.scrollHeight;
  markReadSoon();
  renderJump();
}

/** Day lines, the "New messages" line, and messages grouped under their author's previous
 * one (same day, within minutes, not a reply). */
function decorate() {
  const list = $("messages");
  for (const node of list.querySelectorAll(".day-divider, .new-divider")) node.remove();
  const state = rooms.get(active);
  if (!state) return;
  let previous = null;
  for (const node of list.querySelectorAll(".message[data-id]")) {
    const frame = state.messages.get(Number(node.dataset.id));
    if (!frame) continue;
    const day = new Date(frame.ts).toDateString();
    const newDay = !previous || new Date(previous.ts).toDateString() !== day;
    if (newDay) node.before(dayDivider(frame.ts));
    const firstUnread = state.firstUnread === frame.id;
    if (firstUnread) node.before(el("li", "new-divider", "New messages"));
    node.classList.toggle("grouped", !newDay && !firstUnread && previous.user === frame.user
      && !frame.reply_to && frame.ts - previous.ts < GROUP_WITHIN_MS);
    previous = frame;
  }
}

function dayDivider(ts) {
  const date = new Date(ts);
  const today = new Date();
  const yesterday = new Date(today.getTime() - 86_400_000);
  const text = date.toDateString() === today.toDateString() ? "Today"
    : date.toDateString() === yesterday.toDateString() ? "Yesterday"
      : date.toLocaleDateString([], { weekday: "long", year: "numeric", month: "long", day: "numeric" });
  const line = el("li", "day-divider");
  line.append(el("span", "", text));
  return line;
}

/** "Jump to first unread": shown while the first unread message is above what is shown. */
function renderJump() {
  const button = $("jump-unread");
  const state = active === null ? null : rooms.get(active);
  const line = $("messages").querySelector(".new-divider");
  if (!state?.firstUnread || !line) { button.hidden = true; return; }
  button.hidden = line.getBoundingClientRect().bottom > $("messages").getBoundingClientRect().top;
}
$("jump-unread").addEventListener("click", () => {
  $("messages").querySelector(".new-divider")?.scrollIntoView({ block: "start" });
  renderJump();
});

function renderMessages() {
  const list = $("messages");
  linkObserver.disconnect(); // the nodes shown are about to go; the new ones are watched
  previewObserver.disconnect();
  list.replaceChildren();
  const state = rooms.get(active);
  if (!state) return;
  const ordered = [...state.messages.values()].sort((a, b) => a.id - b.id);
  list.append(...ordered.map(messageItem), ...[...state.pending].map(([cid, entry]) => pendingItem(cid, entry)));
  decorate();
  renderSeen();
  const line = list.querySelector(".new-divider");
  if (line) line.scrollIntoView({ block: "start" }); // where the unread begin
  else list.scrollTop = list.scrollHeight;
  renderJump();
}

/** Show the messages again where they are: what was on screen stays in place (at the bottom:
 * stays at the bottom). */
function renderMessagesInPlace() {
  const list = $("messages");
  const fromBottom = list.scrollHeight - list.scrollTop;
  const atBottom = fromBottom - list.clientHeight < 40;
  renderMessages();
  if (!atBottom) list.scrollTop = list.scrollHeight - fromBottom;
}

// -- presence and typing -------------------------------------------------------------------

function onJoined({ room, count, users }) {
  const state = rooms.get(room);
  if (!state) return;
  if (!state.historyLoaded) {
    // Over the socket, once a member: a private room's history is its members' only.
    state.historyLoaded = true;
    loadHistory(room);
  }
  state.count = count;
  state.users = users ? new Set(users) : null;
  for (const user of users ?? []) know(user);
  if (room === active) renderPresence();
}

function onPresence({ room, event, user, count }) {
  const state = rooms.get(room);
  if (!state) return;
  state.count = count;
  if (event === "join") know(user);
  if (state.users && user) {
    if (event === "join") state.users.add(user);
    else state.users.delete(user);
  }
  if (room === active) renderPresence();
  else if (rooms.get(active)?.kind === "dm") renderRoomHead();
}

/** The room's people (each with avatar and suffix), then a warning for every display name
 * that two or more people the page knows share. */
function renderPresence() {
  const list = $("presence");
  list.replaceChildren();
  renderNameWarnings();
  const state = rooms.get(active);
  $("presence-count").textContent = state?.kind === "room" ? `(${state.count})` : "";
  if (!state || !state.users) return;
  for (const user of [...state.users].sort()) {
    const item = el("li");
    if (user === client.hello?.user) {
      item.append(personNode(user));
    } else {
      // A guest's id is not what people type: clicking a name opens the conversation.
      const open = personNode(user, "button", "link person");
      open.type = "button";
      open.title = `Message ${user}`;
      open.addEventListener("click", () => openDirect(user));
      item.append(open);
    }
    item.title = user;
    list.append(item);
  }
}

/** "⚠ 2 people are called alice", for every display name shared among the people known. */
function renderNameWarnings() {
  const shared = [...people].filter(([, group]) => group.size > 1).sort(([a], [b]) => a.localeCompare(b));
  $("name-warnings").replaceChildren(...shared.map(([name, group]) => {
    const item = el("li", "name-warning", `⚠ ${group.size} people are called ${name}`);
    item.title = `Tell them apart by the suffix after the name: ${[...group].map(personLabel).join(", ")}`;
    return item;
  }));
}

function onTyping({ room, user }) {
  const state = rooms.get(room);
  if (!state || user === client.hello?.user) return;
  clearTimeout(state.typing.get(user));
  state.typing.set(user, setTimeout(() => { state.typing.delete(user); renderTyping(); }, TYPING_SHOWN_MS));
  renderTyping();
}

function renderTyping() {
  const state = rooms.get(active);
  const users = state ? [...state.typing.keys()] : [];
  $("typing").textContent = users.length === 0 ? ""
    : users.length === 1 ? `${personLabel(users[0])} is typing…`
      : `${users.slice(0, 3).map(personLabel).join(", ")} are typing…`;
}

// -- composer ------------------------------------------------------------------------------

/** Reply to or edit a message of the shown conversation (`{}`: a new message). */
function setComposing(next) {
  if (next.edit && !composing.edit) saveDraft(); // the draft waits for the edit to end
  composing = next;
  const state = rooms.get(active);
  const target = state?.messages.get(next.reply ?? next.edit);
  const banner = $("composing");
  if (!target) {
    composing = {};
    banner.hidden = true;
    return;
  }
  $("composing-text").textContent = next.edit
    ? "Editing your message"
    : `Replying to ${personLabel(target.user)}: ${summary(target).slice(0, 80)}`;
  banner.hidden = false;
  const input = $("composer-input");
  if (next.edit) input.value = target.text;
  renderComposer();
  input.focus();
}
$("composing-cancel").addEventListener("click", () => {
  if (composing.edit) $("composer-input").value = drafts.get(active) ?? "";
  setComposing({});
  renderComposer();
});

/** The most characters a message may have (the server's, from hello). */
function maxChars() {
  return client?.hello?.limits?.max_text_chars ?? MAX_TEXT_CHARS;
}

/** The composer: usable with a conversation shown, online or not (sends wait for the
 * connection); a character counter near and over the limit. */
function renderComposer() {
  const input = $("composer-input");
  const usable = client !== null && active !== null && client.state !== "closed";
  input.disabled = !usable;
  input.placeholder = active === null ? "Message…"
    : client?.state === "open" ? `Message ${rooms.get(active)?.kind === "dm" ? `@${personLabel(rooms.get(active).peer)}` : active}`
      : "Message (sent when you are back online)";
  const length = [...input.value].length;
  const limit = maxChars();
  const counter = $("counter");
  counter.textContent = length > limit * 0.8 ? `${length}/${limit}` : "";
  counter.classList.toggle("over", length > limit);
  // Files go with a new message (an edit changes the text only). Send waits for every
  // upload of the conversation to finish; a message may be files alone.
  const uploads = active === null ? [] : rooms.get(active)?.uploads ?? [];
  const uploading = !composing.edit && uploads.some((upload) => upload.id === null);
  const files = !composing.edit && uploads.length > 0;
  const send = $("send-button");
  send.disabled = !usable || length > limit || uploading || !(input.value.trim() || files);
  send.title = uploading ? "Waiting for the files to finish uploading" : "";
  $("attach-button").disabled = !usable;
}

/** A message written but not acked yet: "Sending…", or "Not sent" with Retry and Edit. */
function pendingItem(cid, entry) {
  const item = el("li", entry.failed ? "message pending failed" : "message pending");
  item.dataset.cid = cid;
  const me = client.hello?.user;
  item.append(el("span", "meta", entry.failed ? "Not sent" : "Sending…"));
  if (me) item.append(personNode(me, "span", "author person"));
  item.append(el("span", "text", entry.text));
  if (entry.uploads.length) {
    item.append(el("span", "pending-files", ` 📎 ${entry.uploads.map((upload) => upload.name).join(", ")}`));
  }
  if (entry.failed) {
    item.append(el("span", "failure", ` — ${entry.failed}`));
    const actions = el("span", "actions visible");
    actions.append(actionButton("Retry", "Send it again", () => {
      const state = rooms.get(active);
      state?.pending.delete(cid);
      item.remove();
      if (state) sendText(active, entry.text, entry.replyTo, entry.uploads);
    }));
    actions.append(actionButton("Edit", "Back to the composer", () => {
      const state = rooms.get(active);
      state?.pending.delete(cid);
      item.remove();
      $("composer-input").value = entry.text;
      if (state) state.uploads.push(...entry.uploads); // its files wait above the composer again
      saveDraft();
      renderUploads();
      renderComposer();
      $("composer-input").focus();
    }));
    item.append(actions);
  }
  return item;
}

/** Send `text` (and the files `uploads`, uploaded) to conversation `key`, shown as pending
 * until acked (the SDK writes it when the connection is open, and again after a reconnect,
 * with the same cid: once). Refused, it stays as "Not sent" with the reason: nothing typed
 * (or attached) is lost. */
function sendText(key, text, replyTo, uploads = []) {
  const state = rooms.get(key);
  const cid = crypto.randomUUID();
  const entry = { text, replyTo, uploads };
  const options = { replyTo, cid };
  if (uploads.length) options.attachments = uploads.map((upload) => upload.id);
  state.pending.set(cid, entry);
  if (key === active) {
    $("messages").append(pendingItem(cid, entry));
    $("messages").scrollTop = $("messages").scrollHeight;
  }
  const sent = state.kind === "dm" ? client.sendTo(state.peer, text, options) : client.send(key, text, options);
  const node = () => (key === active ? $("messages").querySelector(`[data-cid="${CSS.escape(cid)}"]`) : null);
  sent.then(() => {
    state.pending.delete(cid);
    node()?.remove(); // the message itself is shown by its id
  }, (error) => {
    entry.failed = error.code === "ack_timeout" || error.name === "AckTimeoutError"
      ? "no answer from the server"
      : error.code === "storage_unavailable" ? "the file storage cannot be reached right now: retry in a moment"
        : error.code === "not_found" && uploads.length ? "a file is not available any more (Edit, and attach it again)"
          : error.message ?? String(error);
    node()?.replaceWith(pendingItem(cid, entry));
  });
}

function sendCurrent() {
  const input = $("composer-input");
  const text = input.value.trim();
  if (!active || input.disabled) return;
  const uploads = composing.edit ? [] : rooms.get(active).uploads;
  if (uploads.some((upload) => upload.id === null)) return; // Send waits for the uploads
  if (!text && !uploads.length) return;
  if ([...text].length > maxChars()) {
    showAlert(`A message has at most ${maxChars()} characters: this one has ${[...text].length}`);
    return; // kept in the composer
  }
  const state = rooms.get(active);
  const target = conversationTarget(active);
  if (composing.edit) {
    if (text !== state.messages.get(composing.edit)?.text) {
      client.edit(target, composing.edit, text); // refused: an alert (onError)
    }
    input.value = drafts.get(active) ?? ""; // back to what was being written before the edit
  } else {
    sendText(active, text, composing.reply, uploads);
    state.uploads = [];
    renderUploads();
    input.value = "";
  }
  closeMentionOptions();
  lastTyping = 0;
  setComposing({});
  saveDraft();
  renderComposer();
}

$("composer").addEventListener("submit", (event) => {
  event.preventDefault();
  sendCurrent();
});
$("composer-input").addEventListener("keydown", (event) => {
  if (mentionKey(event)) return; // the list of people to mention has it
  if (event.key === "Escape" && (composing.edit || composing.reply)) {
    if (composing.edit) $("composer-input").value = drafts.get(active) ?? "";
    setComposing({});
    renderComposer();
    return;
  }
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    sendCurrent();
  }
});
$("composer-input").addEventListener("input", () => {
  saveDraft();
  renderComposer();
  renderMentionOptions();
  const now = Date.now();
  if (active && rooms.get(active)?.kind === "room" && client.state === "open" && now - lastTyping > TYPING_EVERY_MS) {
    lastTyping = now;
    client.typing(active);
  }
});

// -- files: picked, dropped or pasted; uploaded at once; shown in messages --------------------

const THUMBNAIL_BOX = 320; // px: an image's preview fits a square this big
const LINKS_SPARE_S = 15; // links that end this soon are asked for again
/** file id -> {links} (a `file` answer, its URLs absolute; they expire), {asking} (the
 * request on its way) or {gone} (not found: deleted, or not yours to read). Links are asked
 * for the attachments on screen only, and again once expired. */
const fileLinks = new Map();
let uploadCount = 0; // names the uploads' chips

/** A size in words: 512 B, 4.2 KB, 31 MB. */
function humanSize(bytes) {
  if (bytes < 1024) return `${bytes} B`;
  const units = ["KB", "MB", "GB", "TB"];
  let value = bytes / 1024;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return `${value < 10 ? value.toFixed(1) : Math.round(value)} ${units[unit]}`;
}

/** A file's type in words: "PDF", "MP4 video", "file". */
function typeLabel(type) {
  if (!type || type === "application/octet-stream") return "file";
  const [kind, sub = ""] = type.split("/");
  const name = sub.replace(/^(x-|vnd\.)/, "").toUpperCase();
  return ["image", "audio", "video"].includes(kind) ? `${name} ${kind}` : name;
}

/** Why file `name` was not attached, in words. */
function fileFailure(error, name) {
  const message = error?.message ?? String(error);
  switch (error?.code) {
    case "file_too_large": {
      const limit = /at most (\d+)/.exec(message)?.[1];
      return `${name} is too large to send${limit ? ` (at most ${humanSize(Number(limit))})` : ""}`;
    }
    case "rate_limited":
      return /keep/.test(message)
        ? `${name} was not attached: you keep too many files already (delete messages with files first)`
        : `${name} was not attached: too many files at once, wait a moment and attach it again`;
    case "storage_unavailable":
      return `${name} was not attached: the file storage cannot be reached right now, try again in a moment`;
    case "no_store":
      return `${name} was not attached: this server keeps no files`;
    case "not_found":
      return `${name} is not available any more`;
    default:
      return message === "not connected"
        ? `${name} was not attached: you are offline, attach it again once connected`
        : `${name} was not attached: ${message}`;
  }
}

/** Upload `files` for the shown conversation at once, each a chip above the composer (its
 * name, size, progress and ×) until the message is sent. A failure is an alert. */
function attachFiles(files) {
  const key = active;
  const state = key === null ? null : rooms.get(key);
  if (!state || $("composer-input").disabled) return;
  for (const file of files) {
    const upload = { key: `upload-${++uploadCount}`, name: file.name || "pasted file", size: file.size,
                     sent: 0, id: null, controller: new AbortController() };
    if (!file.size) {
      showAlert(`${upload.name} is empty: there is nothing to send`);
      continue;
    }
    state.uploads.push(upload);
    client.upload(conversationTarget(key), file, {
      name: upload.name,
      signal: upload.controller.signal,
      onProgress: (sent) => {
        upload.sent = sent;
        showProgress(key, upload);
      },
    }).then((id) => {
      upload.id = id;
      upload.sent = upload.size;
      showProgress(key, upload);
      if (key === active) renderComposer();
    }, (error) => {
      if (error?.name === "AbortError") return; // removed with its ×: gone already
      dropUpload(key, upload);
      showAlert(fileFailure(error, upload.name));
    });
  }
  if (key === active) {
    renderUploads();
    renderComposer();
  }
}

/** The shown conversation's files waiting to be sent, as chips. */
function renderUploads() {
  const list = $("uploads");
  const key = active;
  const uploads = key === null ? [] : rooms.get(key)?.uploads ?? [];
  list.replaceChildren(...uploads.map((upload) => {
    const chip = el("li", "upload");
    chip.dataset.upload = upload.key;
    chip.title = upload.name;
    const bar = el("progress");
    bar.max = Math.max(1, upload.size);
    const cancel = el("button", "upload-cancel", "×");
    cancel.type = "button";
    cancel.setAttribute("aria-label", `Remove ${upload.name}`);
    cancel.addEventListener("click", () => {
      upload.controller.abort(); // an upload on its way stops
      dropUpload(key, upload);
      $("composer-input").focus();
    });
    chip.append(el("span", "upload-name", upload.name), el("span", "upload-size", humanSize(upload.size)), bar, cancel);
    return chip;
  }));
  for (const upload of uploads) showProgress(key, upload);
  list.hidden = uploads.length === 0;
}

/** An upload's chip says how far it is. */
function showProgress(key, upload) {
  if (key !== active) return;
  const chip = $("uploads").querySelector(`[data-upload="${upload.key}"]`);
  if (!chip) return;
  const bar = chip.querySelector("progress");
  bar.value = upload.sent;
  const done = upload.id !== null;
  bar.setAttribute("aria-label", done ? `${upload.name} uploaded` : `Uploading ${upload.name}`);
  chip.classList.toggle("done", done);
}

/** Forget an upload (sent, removed, or failed). */
function dropUpload(key, upload) {
  const state = rooms.get(key);
  if (state) state.uploads = state.uploads.filter((other) => other !== upload);
  if (key === active) {
    renderUploads();
    renderComposer();
  }
}

$("attach-button").addEventListener("click", () => $("file-input").click());
$("file-input").addEventListener("change", () => {
  const input = $("file-input");
  attachFiles([...(input.files ?? [])]);
  input.value = ""; // the same file may be picked again
});
// A pasted screenshot or file is attached (rich text with pictures is pasted as text).
$("composer-input").addEventListener("paste", (event) => {
  const data = event.clipboardData;
  const files = [...(data?.files ?? [])];
  if (!files.length || data.types.includes("text/html")) return;
  event.preventDefault();
  attachFiles(files);
});
// Files dropped on the conversation are attached; dropped elsewhere, they are ignored (the
// browser would leave the page to show them).
{
  const chat = document.querySelector("main.chat");
  const carriesFiles = (event) => event.dataTransfer?.types.includes("Files") ?? false;
  let depth = 0; // dragenter/dragleave of the conversation's children
  chat.addEventListener("dragenter", (event) => {
    if (!carriesFiles(event) || $("composer-input").disabled) return;
    depth += 1;
    chat.classList.add("dropping");
  });
  chat.addEventListener("dragleave", () => {
    depth = Math.max(0, depth - 1);
    if (!depth) chat.classList.remove("dropping");
  });
  chat.addEventListener("dragover", (event) => {
    if (!carriesFiles(event) || $("composer-input").disabled) return;
    event.preventDefault();
    event.dataTransfer.dropEffect = "copy";
  });
  chat.addEventListener("drop", (event) => {
    depth = 0;
    chat.classList.remove("dropping");
    if (!carriesFiles(event)) return;
    event.preventDefault();
    attachFiles([...event.dataTransfer.files]);
  });
  window.addEventListener("dragover", (event) => { if (carriesFiles(event)) event.preventDefault(); });
  window.addEventListener("drop", (event) => { if (carriesFiles(event)) event.preventDefault(); });
}

/** Watches the attachments shown: those that come on screen get their links. */
const linkObserver = new IntersectionObserver((entries) => {
  for (const entry of entries) {
    if (!entry.target.isConnected) linkObserver.unobserve(entry.target); // replaced
    else if (entry.isIntersecting) showLinks(entry.target);
  }
}, { root: $("messages"), rootMargin: "300px 0px" });

/** A message's files: images as previews that open the full image, other files as a row
 * with name, size, type and a download link. Their links come once they are on screen. */
function attachmentsOf(files) {
  const box = el("div", "attachments");
  for (const file of files) {
    let node;
    if (file.image) {
      node = el("a", "attachment attachment-image");
      node.target = "_blank";
      node.rel = "noopener";
      node.title = `${file.name} (${humanSize(file.size)}): open the full image`;
      const image = el("img");
      image.alt = file.name;
      image.loading = "lazy";
      if (file.width && file.height) { // its room kept before it loads
        const scale = Math.min(1, THUMBNAIL_BOX / Math.max(file.width, file.height));
        image.width = Math.max(1, Math.round(file.width * scale));
        image.height = Math.max(1, Math.round(file.height * scale));
      }
      node.append(image);
    } else {
      node = el("div", "attachment attachment-file");
      const icon = el("span", "file-icon", "📄");
      icon.setAttribute("aria-hidden", "true");
      const download = el("a", "file-download", "Download");
      download.rel = "noopener";
      download.download = file.name;
      download.setAttribute("aria-label", `Download ${file.name}`);
      node.append(icon, el("span", "file-name", file.name),
        el("span", "file-meta", `${humanSize(file.size)} · ${typeLabel(file.type)}`), download);
    }
    node.dataset.file = file.id;
    // A link that has expired meanwhile: fresh links first, then it opens.
    node.addEventListener("click", (event) => {
      const anchor = event.target.closest("a[href]");
      if (!anchor || linksFresh(fileLinks.get(file.id))) return;
      event.preventDefault();
      linksFor(file.id).then(() => anchor.click(), (error) => showAlert(fileFailure(error, file.name)));
    });
    const known = fileLinks.get(file.id);
    if (linksFresh(known)) applyLinks(node, known.links);
    else if (known?.gone) node.classList.add("unavailable");
    linkObserver.observe(node);
    box.append(node);
  }
  return box;
}

function linksFresh(entry) {
  return entry?.links !== undefined && entry.links.expires - LINKS_SPARE_S > Date.now() / 1000;
}

/** The links of file `id`: kept until they expire, asked for once at a time. The nodes
 * shown for it get them. */
function linksFor(id) {
  const known = fileLinks.get(id);
  if (linksFresh(known)) return Promise.resolve(known.links);
  if (known?.asking) return known.asking;
  if (known?.gone) return Promise.reject(known.gone);
  const asking = client.fileLinks(id).then((links) => {
    fileLinks.set(id, { links });
    for (const node of $("messages").querySelectorAll(`[data-file="${CSS.escape(id)}"]`)) applyLinks(node, links);
    return links;
  }, (error) => {
    if (error?.code === "not_found") fileLinks.set(id, { gone: error }); // deleted, or not yours
    else fileLinks.delete(id); // offline, storage down: asked again when shown again
    for (const node of $("messages").querySelectorAll(`[data-file="${CSS.escape(id)}"]`)) {
      node.classList.toggle("unavailable", error?.code === "not_found");
    }
    throw error;
  });
  fileLinks.set(id, { asking });
  return asking;
}

/** An attachment on screen: its links (asked for if needed). */
function showLinks(node) {
  const id = node.dataset.file;
  const known = fileLinks.get(id);
  if (known?.gone || (linksFresh(known) && node.dataset.linked === String(known.links.expires))) return;
  // Failed: shown as unavailable (not found), or asked again when shown again.
  linksFor(id).then((links) => { if (node.isConnected) applyLinks(node, links); }, () => undefined);
}

function applyLinks(node, links) {
  node.dataset.linked = String(links.expires);
  node.classList.remove("unavailable");
  if (node.classList.contains("attachment-image")) {
    node.href = links.url;
    const image = node.querySelector("img");
    // A preview shown stays (its old link loaded it); only one not loaded yet gets the new.
    if (!image.getAttribute("src") || !image.complete || !image.naturalWidth) image.src = links.thumbnail ?? links.url;
  } else {
    node.querySelector(".file-download").href = links.url;
  }
}

/** After a reconnect: the attachments on screen whose links did not come are asked again. */
function relinkAttachments() {
  for (const node of $("messages").querySelectorAll(".attachment:not([data-linked])")) {
    linkObserver.unobserve(node);
    linkObserver.observe(node); // reports it again: asked for if on screen
  }
}

// -- the emoji picker: into the composer, or as a reaction ---------------------------------

let emojiClose = null; // closes the open picker (null: none open)

/** A popover of emoji under `opener`, and a box for any other emoji: `onPick(emoji)` gets
 * the one picked. Esc or a click elsewhere closes it; the focus goes back to `opener`. */
function openEmojiPicker(opener, onPick) {
  emojiClose?.();
  const box = el("div", "emoji-picker");
  box.setAttribute("role", "dialog");
  box.setAttribute("aria-label", "Pick an emoji");
  const grid = el("div", "emoji-grid");
  for (const emoji of MORE_EMOJI) {
    const button = el("button", "emoji", emoji);
    button.type = "button";
    button.setAttribute("aria-label", emoji);
    button.addEventListener("click", () => { close(); onPick(emoji); });
    grid.append(button);
  }
  const other = el("form", "emoji-other");
  const label = el("label", "visually-hidden", "Any other emoji");
  const input = el("input");
  input.id = "emoji-other-input";
  label.htmlFor = input.id;
  input.placeholder = "Any emoji…";
  input.maxLength = 16;
  input.autocomplete = "off";
  const use = el("button", "", "Use");
  use.type = "submit";
  other.append(label, input, use);
  other.addEventListener("submit", (event) => {
    event.preventDefault();
    const emoji = input.value.trim();
    if (!emoji) return;
    close();
    onPick(emoji);
  });
  box.append(grid, other);
  const onKey = (event) => { if (event.key === "Escape") { event.preventDefault(); close(); } };
  const onOutside = (event) => { if (!box.contains(event.target) && event.target !== opener) close(); };
  function close() {
    box.remove();
    document.removeEventListener("keydown", onKey, true);
    document.removeEventListener("mousedown", onOutside, true);
    opener.setAttribute("aria-expanded", "false");
    emojiClose = null;
    opener.focus();
  }
  emojiClose = close;
  document.addEventListener("keydown", onKey, true);
  document.addEventListener("mousedown", onOutside, true);
  opener.setAttribute("aria-expanded", "true");
  const place = opener.getBoundingClientRect();
  document.body.append(box);
  const width = box.offsetWidth;
  box.style.left = `${Math.max(8, Math.min(place.left, window.innerWidth - width - 8))}px`;
  box.style.top = `${Math.max(8, place.top - box.offsetHeight - 6)}px`;
  grid.firstElementChild.focus();
}

$("emoji-button").addEventListener("click", () => {
  const button = $("emoji-button");
  if (emojiClose) { emojiClose(); return; }
  openEmojiPicker(button, (emoji) => {
    const input = $("composer-input");
    const at = input.selectionStart ?? input.value.length;
    input.value = input.value.slice(0, at) + emoji + input.value.slice(input.selectionEnd ?? at);
    saveDraft();
    renderComposer();
    input.focus();
    input.selectionStart = input.selectionEnd = at + emoji.length;
  });
});

// -- mentions: "@" in the composer, the list of messages that mention you -------------------

/** The people "@" offers in the shown conversation: those present, the room's members and
 * the authors of its loaded messages (a direct conversation: the other person); not you.
 * In a room, "@here" (everyone present) comes last. */
function mentionCandidates() {
  const state = active === null ? null : rooms.get(active);
  if (!state) return [];
  const users = new Set(state.kind === "dm" ? [state.peer] : [...(state.users ?? []), ...Object.keys(state.record?.members ?? {})]);
  for (const message of state.messages.values()) users.add(message.user);
  users.delete(client.hello?.user);
  return [...users];
}

/** The "@name" being typed just before the caret: {start: where its "@" is, typed}, or null.
 * An "@" after a letter, digit, "_" or "@" (an e-mail address) is not a mention. */
function mentionBeingTyped() {
  const input = $("composer-input");
  const caret = input.selectionStart;
  if (caret === null || caret !== input.selectionEnd) return null;
  const match = /(?:^|[^\p{L}\p{N}_@])@([A-Za-z0-9][A-Za-z0-9_.-]{0,31})?$/u.exec(input.value.slice(0, caret));
  if (!match) return null;
  const typed = match[1] ?? "";
  return { start: caret - typed.length - 1, typed };
}

const mentionPick = { shown: [], option: -1 }; // the options listed, the highlighted one

/** The autocomplete under "@": the people whose label or id starts with (or holds) what is
 * typed after it, the first highlighted; hidden when nothing is being typed after an "@". */
function renderMentionOptions() {
  const input = $("composer-input");
  const list = $("mention-options");
  const typing = input.disabled ? null : mentionBeingTyped();
  if (!typing) {
    closeMentionOptions();
    return;
  }
  const typed = typing.typed.toLowerCase();
  const candidates = mentionCandidates().map((user) => ({ user, label: personLabel(user) }));
  const rank = ({ user, label }) => {
    const name = label.toLowerCase();
    return name.startsWith(typed) || user.toLowerCase().startsWith(typed) ? 0
      : name.includes(typed) || user.toLowerCase().includes(typed) ? 1 : 2;
  };
  const shown = candidates
    .filter((option) => rank(option) < 2)
    .sort((a, b) => rank(a) - rank(b) || a.label.localeCompare(b.label))
    .slice(0, MENTION_OPTIONS_SHOWN)
    .map(({ user }) => user);
  if (rooms.get(active)?.kind === "room" && "here".startsWith(typed)) shown.push("@here");
  const previous = mentionPick.shown[mentionPick.option];
  mentionPick.shown = shown;
  mentionPick.option = shown.length ? Math.max(0, shown.indexOf(previous)) : -1;
  list.replaceChildren(...shown.map((user, n) => {
    let item;
    if (user === "@here") {
      item = el("li", "option mention-here");
      item.append(el("strong", "", "@here"), el("small", "option-id", "everyone present in the room"));
    } else {
      item = personNode(user, "li", "person option");
      // Two people with one display name (guests): the id says which is which.
      if (namesakes(user) > 1) item.append(el("small", "option-id", user));
    }
    item.id = `mention-option-${n}`;
    item.dataset.user = user;
    item.setAttribute("role", "option");
    item.setAttribute("aria-selected", String(n === mentionPick.option));
    item.addEventListener("click", () => chooseMention(user));
    return item;
  }));
  list.hidden = shown.length === 0;
  input.setAttribute("aria-expanded", String(!list.hidden));
  if (mentionPick.option >= 0) input.setAttribute("aria-activedescendant", `mention-option-${mentionPick.option}`);
  else input.removeAttribute("aria-activedescendant");
}

function closeMentionOptions() {
  const list = $("mention-options");
  list.hidden = true;
  list.replaceChildren();
  mentionPick.shown = [];
  mentionPick.option = -1;
  $("composer-input").setAttribute("aria-expanded", "false");
  $("composer-input").removeAttribute("aria-activedescendant");
}

/** Put "@user " in place of the "@…" being typed. */
function chooseMention(user) {
  const input = $("composer-input");
  const typing = mentionBeingTyped();
  if (!typing) return;
  const mention = user === "@here" ? "@here " : `@${user} `;
  const after = input.value.slice(input.selectionStart ?? input.value.length);
  input.value = input.value.slice(0, typing.start) + mention + after.replace(/^ /, "");
  const caret = typing.start + mention.length;
  input.focus();
  input.selectionStart = input.selectionEnd = caret;
  closeMentionOptions();
  saveDraft();
  renderComposer();
}

/** A key in the composer while the list is open: ↑ ↓ move, Enter or Tab picks, Esc closes.
 * Whether the list took it. */
function mentionKey(event) {
  const list = $("mention-options");
  if (list.hidden || event.isComposing) return false;
  const count = mentionPick.shown.length;
  if (event.key === "ArrowDown" || event.key === "ArrowUp") {
    event.preventDefault();
    const step = event.key === "ArrowDown" ? 1 : -1;
    mentionPick.option = (mentionPick.option + step + count) % count;
    for (const [n, item] of [...list.children].entries()) item.setAttribute("aria-selected", String(n === mentionPick.option));
    $("composer-input").setAttribute("aria-activedescendant", `mention-option-${mentionPick.option}`);
    list.children[mentionPick.option]?.scrollIntoView({ block: "nearest" });
    return true;
  }
  if ((event.key === "Enter" && !event.shiftKey) || event.key === "Tab") {
    if (mentionPick.option < 0) return false;
    event.preventDefault();
    chooseMention(mentionPick.shown[mentionPick.option]);
    return true;
  }
  if (event.key === "Escape") {
    event.preventDefault();
    event.stopPropagation();
    closeMentionOptions();
    return true;
  }
  return false;
}

$("mention-options").addEventListener("mousedown", (event) => event.preventDefault()); // the click must not blur first
$("composer-input").addEventListener("blur", closeMentionOptions);
$("composer-input").addEventListener("click", renderMentionOptions);
$("composer-input").addEventListener("keyup", (event) => {
  if (["ArrowLeft", "ArrowRight", "Home", "End"].includes(event.key)) renderMentionOptions();
});

/** room -> unread mentions, from the inbox, of rooms not in the sidebar. */
const elsewhereMentions = new Map();
/** The mentions list while it is open: {before: the oldest ts shown, asking, entries}. */
let mentionsView = null;

/** Unread mentions in all conversations (the sidebar's "Mentions" count). */
function unreadMentions() {
  let total = 0;
  for (const [key, state] of rooms) total += key === active ? state.awayMentions : state.mentions;
  for (const count of elsewhereMentions.values()) total += count;
  return total;
}

/** The "Mentions" count in the sidebar, and the tab's title: "(N) Hubbub", N the unread
 * messages of every conversation ("(@N) Hubbub" while any of them mentions you). */
function renderUnreadTotals() {
  const mentions = unreadMentions();
  const badge = $("mentions-count");
  badge.replaceChildren(mentions > 999 ? "999+" : String(mentions), el("span", "visually-hidden", " unread"));
  badge.hidden = mentions === 0;
  let unread = 0;
  for (const [key, state] of rooms) unread += key === active ? state.away : state.unread;
  unread = Math.max(unread, mentions);
  const count = unread > 999 ? "999+" : String(unread);
  const title = unread ? `(${mentions ? "@" : ""}${count}) ${APP_TITLE}` : APP_TITLE;
  if (document.title !== title) document.title = title;
}

/** The page can be read again: what came into the shown conversation meanwhile is seen. */
function pageSeen() {
  const state = active === null ? null : rooms.get(active);
  if (!state || !canRead() || (!state.away && !state.awayMentions)) return;
  state.away = state.awayMentions = 0;
  renderUnreadTotals();
}
document.addEventListener("visibilitychange", pageSeen);
window.addEventListener("focus", pageSeen);

$("mentions-open").addEventListener("click", () => {
  if (!$("mentions-results").hidden) {
    closeMentions();
    return;
  }
  if (!client) return;
  mentionsView = { before: undefined, asking: false, entries: [] };
  $("mentions-list").replaceChildren();
  $("mentions-results").hidden = false;
  $("mentions-open").setAttribute("aria-expanded", "true");
  document.body.classList.remove("drawer-open"); // on a phone: the list is in the conversation
  $("drawer-toggle").setAttribute("aria-expanded", "false");
  askMentions();
});
$("mentions-close").addEventListener("click", () => {
  closeMentions();
  $("mentions-open").focus();
});
$("mentions-more").addEventListener("click", () => askMentions());

function closeMentions() {
  $("mentions-results").hidden = true;
  $("mentions-open").setAttribute("aria-expanded", "false");
  mentionsView = null;
}

/** The next page of the messages that mention you (newest first). */
function askMentions() {
  if (!mentionsView || mentionsView.asking) return;
  const view = mentionsView;
  view.asking = true;
  $("mentions-summary").textContent = "Looking for mentions of you…";
  client.mentions({ before: view.before, limit: 20 }).then((frame) => {
    if (mentionsView === view) onMentions(frame);
  }, (error) => {
    if (mentionsView === view) mentionsFailed(error.message === "not connected" ? "you are offline" : error.message);
  });
}

/** A `mentions` answer: its entries listed, the unread marked. */
function onMentions(frame) {
  if (!mentionsView) return;
  mentionsView.asking = false;
  const entries = frame.mentions ?? [];
  mentionsView.entries.push(...entries);
  if (entries.length) mentionsView.before = entries[entries.length - 1].ts;
  $("mentions-list").append(...entries.map(mentionItem));
  const count = mentionsView.entries.length;
  const unread = frame.unread ?? 0;
  $("mentions-summary").textContent = count === 0 ? "Nobody has mentioned you yet"
    : `${count} message${count === 1 ? "" : "s"} mention${count === 1 ? "s" : ""} you`
      + (unread ? ` (${unread > 999 ? "999+" : unread} unread)` : "");
  $("mentions-more").hidden = !frame.more;
}

function mentionsFailed(message) {
  mentionsView.asking = false;
  $("mentions-summary").textContent = `Could not list your mentions: ${message}`;
}

/** A mention: where, who, when, unread or not, and the text; a click opens the conversation
 * at the message. */
function mentionItem(entry) {
  const item = el("li", entry.unread ? "search-result mention-result unread" : "search-result mention-result");
  const open = el("button", "result-open");
  open.type = "button";
  const head = el("span", "result-head");
  if (entry.unread) head.append(el("span", "mention-unread", "Unread"), " ");
  head.append(el("strong", "", entry.room !== undefined ? entry.room : `@${personLabel(entry.with)}`), " · ",
    personNode(entry.user), " · ",
    el("time", "", new Date(entry.ts).toLocaleString([], { dateStyle: "medium", timeStyle: "short" })));
  open.append(head, el("span", "result-text", plain(entry.text)));
  open.addEventListener("click", () => {
    item.classList.remove("unread");
    item.querySelector(".mention-unread")?.remove();
    closeMentions();
    openAt(entry);
  });
  item.append(open);
  return item;
}

// -- visibility: whether someone looks at this page now (the server pushes only if nobody does)

let lastUsed = Date.now(); // the page's last pointer, key or focus (loading it counts)
let visibleSaid = null; // what this connection was last told
let idleTimer = null;

/** Visible: the tab is in view and was used in the last IDLE_AFTER_MS. */
function lookedAt() {
  return document.visibilityState === "visible" && Date.now() - lastUsed < IDLE_AFTER_MS;
}

/** Tell the server when that changes (the client says it again on every new connection). */
function reportVisibility() {
  clearTimeout(idleTimer);
  const visible = lookedAt();
  if (visible) idleTimer = setTimeout(() => reportVisibility(), lastUsed + IDLE_AFTER_MS - Date.now() + 100);
  if (!client || visible === visibleSaid) return;
  visibleSaid = visible;
  client.setVisible(visible);
}

function used() {
  lastUsed = Date.now();
  if (visibleSaid !== true && document.visibilityState === "visible") reportVisibility();
}
for (const type of ["pointerdown", "pointermove", "keydown", "wheel", "touchstart", "focusin"]) {
  document.addEventListener(type, used, { capture: true, passive: true });
}
window.addEventListener("focus", used);
document.addEventListener("visibilitychange", () => {
  if (document.visibilityState === "visible") lastUsed = Date.now(); // back to the tab: using it
  reportVisibility();
});

// -- notifications: in the page while its tab is hidden, Web Push while it is not open ------

/** conversation -> {level, mute_until} as the server answered (the ones you changed). */
const levels = new Map();
let levelsSupported = true; // false: the server knows no `notifications` frame
let registration = null; // the service worker's registration, once active
let pushEndpoint = null; // where the server pushes to this browser (null: not subscribed)

function notificationsAvailable() {
  return typeof Notification === "function";
}

/** Notifications are on: turned on with the button in this browser (which asks the browser's
 * permission: never asked on load), allowed, and not turned off since. */
function notifyEnabled() {
  return notificationsAvailable() && Notification.permission === "granted"
    && localStorage.getItem("hubbub.notify") === "on";
}

/** A conversation's notification level, and whether it is muted now. */
function levelOf(key) {
  const setting = levels.get(key);
  const state = rooms.get(key);
  return {
    level: setting?.level ?? (state?.kind === "dm" ? "all" : "mentions"),
    muted: Boolean(setting?.mute_until && setting.mute_until > Date.now()),
    muteUntil: setting?.mute_until ?? null,
  };
}

/** The conversation's link for a notification: the page opens it at the message. */
function pageUrlOf(target) {
  const url = new URL("/", location.href);
  if (target.room !== undefined) url.searchParams.set("room", target.room);
  else url.searchParams.set("with", target.with);
  url.searchParams.set("message", String(target.id));
  return url.href;
}

/** A message that came live: a notification while the tab is hidden, when it mentions you,
 * is for everyone here, or is a direct message (or any message, at level "all"); never your
 * own, nor in a conversation muted or at "Nothing". Same tag per conversation: the newest
 * replaces the one before (and the server's push of it). */
function notifyOf(key, frame) {
  const me = client.hello?.user;
  if (!notifyEnabled() || document.visibilityState !== "hidden" || !me || frame.user === me) return;
  if (Math.abs(Date.now() - frame.ts) > NOTIFY_FRESH_MS) return; // caught up after a reconnect
  const state = rooms.get(key);
  const { level, muted } = levelOf(key);
  if (muted || level === "none") return;
  if (level !== "all" && !forMe(frame) && state.kind !== "dm") return;
  const target = state.kind === "dm" ? { with: state.peer, id: frame.id } : { room: key, id: frame.id };
  const title = state.kind === "dm" ? `${personLabel(frame.user)} · direct message` : `${key} · ${personLabel(frame.user)}`;
  const options = {
    body: summary(frame).slice(0, 200) || "New message",
    tag: target.room !== undefined ? `hubbub:room:${target.room}` : `hubbub:with:${target.with}`,
    timestamp: frame.ts,
    data: { ...target, url: pageUrlOf(target) },
  };
  showNotification(title, options, target);
}

/** Through the service worker when there is one (its click handler opens the conversation:
 * in this tab, or in a new one if this one is gone by then), else by the page itself. */
async function showNotification(title, options, target) {
  try {
    const worker = registration ?? (navigator.serviceWorker?.controller ? await navigator.serviceWorker.ready : null);
    if (worker) {
      await worker.showNotification(title, options);
      return;
    }
    const notification = new Notification(title, options);
    notification.addEventListener("click", () => {
      window.focus();
      notification.close();
      openAt(target);
    });
  } catch {
    // Not shown (some browsers show them only through a service worker): nothing to add.
  }
}

/** The sidebar's notification settings: what is on, and the button that turns them on. */
function renderNotifyState() {
  const state = $("notify-state");
  const enable = $("notify-enable");
  const disable = $("notify-disable");
  if (!notificationsAvailable()) {
    state.textContent = "This browser cannot show notifications.";
    enable.hidden = disable.hidden = true;
    return;
  }
  if (Notification.permission === "denied") {
    state.textContent = "Notifications are blocked for this site in the browser's settings.";
    enable.hidden = disable.hidden = true;
    return;
  }
  const on = notifyEnabled();
  enable.hidden = on;
  disable.hidden = !on;
  state.textContent = !on
    ? "Get a notification of mentions and direct messages while this tab is in the background."
    : pushEndpoint
      ? "Notifications are on: mentions and direct messages, even with this page closed."
      : "Notifications are on: mentions and direct messages while this tab is in the background.";
}

// Permission is asked here only: after a click on the button, never on load.
$("notify-enable").addEventListener("click", async () => {
  if (!notificationsAvailable()) return;
  localStorage.setItem("hubbub.notify", "on");
  if (Notification.permission === "default") await Notification.requestPermission();
  renderNotifyState();
  if (notifyEnabled()) await setUpWorker();
});
$("notify-disable").addEventListener("click", async () => {
  localStorage.setItem("hubbub.notify", "off");
  renderNotifyState();
  await unsubscribePush();
  $("notify-enable").focus();
});

/** The service worker (it shows the notifications, and the pushes), then the push
 * subscription when the server offers one. Without a service worker, notifications are
 * made by the page itself. */
async function setUpWorker() {
  if (!notifyEnabled() || !("serviceWorker" in navigator)) return;
  try {
    await navigator.serviceWorker.register("/static/sw.js", { scope: "/" });
    registration = await navigator.serviceWorker.ready;
  } catch {
    registration = null;
    return;
  }
  await subscribePush();
}

if ("serviceWorker" in navigator) {
  // A click on a notification the worker showed: it focused this tab, the message opens.
  navigator.serviceWorker.addEventListener("message", (event) => {
    const { type, room, with: peer, id } = event.data ?? {};
    if (type !== "open" || !Number.isSafeInteger(id)) return;
    if (typeof room === "string" && ROOM.test(room)) openAt({ room, id });
    else if (typeof peer === "string" && USER.test(peer)) openAt({ with: peer, id });
  });
  navigator.serviceWorker.startMessages();
}

/** `text` (base64url) as bytes. */
function base64urlBytes(text) {
  const binary = atob(text.replace(/-/g, "+").replace(/_/g, "/").padEnd(Math.ceil(text.length / 4) * 4, "="));
  return Uint8Array.from(binary, (char) => char.charCodeAt(0));
}

function sameBytes(buffer, bytes) {
  if (!buffer) return false;
  const other = new Uint8Array(buffer);
  return other.length === bytes.length && other.every((byte, n) => byte === bytes[n]);
}

/** Web Push: subscribe this browser with the server's key (hello's `push_key`) and give the
 * server the subscription (again on every connection: the server may have dropped it). No
 * push service (a headless or private window): the page's own notifications still come. */
async function subscribePush() {
  const key = client?.hello?.push_key;
  if (!registration || typeof key !== "string" || !notifyEnabled() || !registration.pushManager) return;
  try {
    const wanted = base64urlBytes(key);
    let subscription = await registration.pushManager.getSubscription();
    if (subscription && !sameBytes(subscription.options.applicationServerKey, wanted)) {
      await subscription.unsubscribe(); // made with another key: the server's changed
      subscription = null;
    }
    subscription ??= await registration.pushManager.subscribe({ userVisibleOnly: true, applicationServerKey: wanted });
    pushEndpoint = await client.subscribePush(subscription.toJSON());
  } catch {
    pushEndpoint = null; // not offered after all (another push service, no store): said below
  }
  renderNotifyState();
}

async function unsubscribePush() {
  try {
    const subscription = await registration?.pushManager?.getSubscription();
    if (!subscription) return;
    await subscription.unsubscribe();
    await client.unsubscribePush(subscription.endpoint);
  } catch {
    // Gone already.
  } finally {
    pushEndpoint = null;
    renderNotifyState();
  }
}

// -- a conversation's notification level: the control in its header --------------------------

/** Levels as the server answered: one conversation's, or the list of those you changed. */
function onLevels(answer) {
  for (const setting of Array.isArray(answer) ? answer : [answer]) {
    const key = setting.room !== undefined ? setting.room : setting.with !== undefined ? `@${setting.with}` : null;
    if (key === null) continue;
    levels.set(key, { level: setting.level, mute_until: setting.mute_until ?? null });
  }
  renderNotifyControl();
}

/** A `notifications` request refused: a server without levels (or without a store) loses
 * the control; another refusal is said. */
function levelsRefused(error) {
  if (error?.code === "unknown_type" || error?.code === "no_store") {
    levelsSupported = false;
    renderNotifyControl();
  } else if (error?.message !== "not connected" && error?.message !== "disconnected") {
    showAlert(`Could not change the notifications: ${error?.message ?? error}`);
  }
}

/** Ask, or change, the shown conversation's level; its answer is what the control shows. */
function askLevel(options) {
  if (active === null || !client) return;
  const target = conversationTarget(active);
  (options ? client.setNotificationLevel(target, options) : client.notificationLevel(target))
    .then(onLevels, levelsRefused);
}

/** The header's control: the level, or "Muted until …", as the server last said. */
function renderNotifyControl() {
  const control = $("notify-control");
  const state = active === null ? null : rooms.get(active);
  control.hidden = !state || !hasStore || !levelsSupported;
  if (control.hidden) {
    closeNotifyPanel(false);
    return;
  }
  const { level, muted, muteUntil } = levelOf(active);
  const until = muted ? new Date(muteUntil) : null;
  const when = until === null ? ""
    : until.toDateString() === new Date().toDateString()
      ? until.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" })
      : until.toLocaleString([], { weekday: "short", hour: "2-digit", minute: "2-digit" });
  $("notify-icon").textContent = muted || level === "none" ? "🔕" : "🔔";
  $("notify-label").textContent = muted ? `Muted until ${when}` : LEVEL_LABELS[level] ?? level;
  for (const radio of document.querySelectorAll('input[name="notify-level"]')) radio.checked = radio.value === level;
  $("notify-muted").textContent = muted ? `Muted until ${when}: no notification before then.` : "";
  const unmute = document.querySelector('[data-mute="off"]');
  const refocus = !muted && document.activeElement === unmute;
  unmute.hidden = !muted;
  if (refocus) document.querySelector('input[name="notify-level"]:checked')?.focus(); // not lost
}

function closeNotifyPanel(focus = true) {
  const panel = $("notify-panel");
  if (panel.hidden) return;
  panel.hidden = true;
  $("notify-button").setAttribute("aria-expanded", "false");
  if (focus) $("notify-button").focus();
}

$("notify-button").addEventListener("click", () => {
  const panel = $("notify-panel");
  if (!panel.hidden) {
    closeNotifyPanel();
    return;
  }
  panel.hidden = false;
  $("notify-button").setAttribute("aria-expanded", "true");
  askLevel(); // as it is now
  panel.querySelector('input[name="notify-level"]:checked, input[name="notify-level"]')?.focus();
});
$("notify-panel").addEventListener("change", (event) => {
  const radio = event.target;
  if (radio.name !== "notify-level") return;
  askLevel({ level: radio.value });
});
$("notify-panel").addEventListener("click", (event) => {
  const button = event.target.closest("[data-mute]");
  if (!button || active === null) return;
  const now = new Date();
  const tomorrow = new Date(now.getFullYear(), now.getMonth(), now.getDate() + 1, 8); // 8:00 tomorrow
  const until = { hour: Date.now() + 3_600_000, tomorrow: tomorrow.getTime(), off: 0 }[button.dataset.mute];
  askLevel({ muteUntil: until });
});
document.addEventListener("keydown", (event) => {
  if (event.key === "Escape" && !$("notify-panel").hidden) {
    event.stopPropagation();
    closeNotifyPanel();
  }
});
document.addEventListener("mousedown", (event) => {
  if (!$("notify-control").contains(event.target)) closeNotifyPanel(false);
});

// -- muting and blocking: whom you hide, and undoing it ---------------------------------------

/** Whom you hide, as the server last said (its `hidden` lists, sorted and disjoint): the
 * messages of theirs shown already are collapsed; the server sends no new ones. */
const hiddenPeople = { muted: new Set(), blocked: new Set() };

/** "muted" or "blocked" when you hide `user`, else null. */
function hiddenKind(user) {
  if (hiddenPeople.blocked.has(user)) return "blocked";
  return hiddenPeople.muted.has(user) ? "muted" : null;
}

/** A message of someone you hide, collapsed to a line that says so: no author, no text. */
function hiddenItem(frame, kind) {
  const item = el("li", "message hidden-message");
  item.dataset.id = String(frame.id);
  item.append(timeNode(frame.ts), el("span", "hidden-note", `Hidden: ${kind} user`));
  return item;
}

/** The server's lists (each `hidden` event: the answers, and changes made in your other tabs
 * or devices). The messages shown follow them; for someone no longer hidden the shown
 * conversation's newest page is loaded again, with what the server held back meanwhile. */
function applyHidden({ muted, blocked }) {
  const sameAs = (set, list) => set.size === list.length && list.every((user) => set.has(user));
  const same = sameAs(hiddenPeople.muted, muted) && sameAs(hiddenPeople.blocked, blocked);
  const before = new Set([...hiddenPeople.muted, ...hiddenPeople.blocked]);
  hiddenPeople.muted = new Set(muted);
  hiddenPeople.blocked = new Set(blocked);
  const after = new Set([...muted, ...blocked]);
  for (const user of after) know(user);
  renderHiddenPeople();
  if (same) return;
  renderRoomHead();
  renderMessagesInPlace();
  if ([...before].some((user) => !after.has(user)) && active !== null) reloadNewest(active);
}

/** Conversation `key`'s newest page again, as the server gives it now (added where it
 * belongs; nothing counted unread). A failure leaves what is shown. */
async function reloadNewest(key) {
  const state = rooms.get(key);
  if (!state || client?.state !== "open") return;
  try {
    const page = state.kind === "dm"
      ? (await client.directHistory(state.peer, { limit: PAGE })).messages
      : await client.roomHistory(key, { limit: PAGE });
    for (const frame of page) addMessage(frame, false, false, true);
  } catch {
    // Offline or refused: the next reload (or a scroll up) brings them.
  }
}

const HIDE_DONE = {
  mute: (label) => `${label} is muted: you will not see their messages (undo it under “Muted and blocked”)`,
  unmute: (label) => `${label} is not muted any more`,
  block: (label) => `${label} is blocked: you will not see their messages, and they cannot write to you directly`,
  unblock: (label) => `${label} is not blocked any more`,
};

/** `action` ("mute", "unmute", "block" or "unblock") `user`. The page changes with the
 * server's `hidden` event; this says it was done, or why not. */
function hide(action, user) {
  if (!client) return;
  const label = personLabel(user);
  client[action](user).then( // the SDK's mute, unmute, block or unblock
    () => showAlert(HIDE_DONE[action](label), "info"),
    (error) => showAlert(hideFailure(error, action, label)),
  );
}

/** Why `action` of `label` was not done, in words. */
function hideFailure(error, action, label) {
  switch (error?.code) {
    case "too_many_hidden":
      return `You cannot ${action} anyone else: unmute or unblock someone first`;
    case "no_store":
      return "This server keeps no lists of muted and blocked people";
    default:
      return error?.message === "not connected" || error?.message === "disconnected"
        ? `You are offline: ${action} ${label} again once connected`
        : `Could not ${action} ${label}: ${error?.message ?? error}`;
  }
}

/** The sidebar's "Muted and blocked": each person, how, and the button that undoes it. A
 * focus in the list stays in it when the person it was on goes. */
function renderHiddenPeople() {
  const list = $("hidden-people");
  const hadFocus = list.contains(document.activeElement);
  const users = [...hiddenPeople.muted, ...hiddenPeople.blocked]
    .map((user) => [personLabel(user), user]).sort(([a], [b]) => a.localeCompare(b));
  list.replaceChildren(...users.map(([label, user]) => {
    const kind = hiddenKind(user);
    const undo = kind === "blocked" ? "Unblock" : "Unmute";
    const button = el("button", "link", undo);
    button.type = "button";
    button.setAttribute("aria-label", `${undo} ${label}`);
    button.addEventListener("click", () => hide(undo.toLowerCase(), user));
    const item = el("li", "hidden-person");
    item.append(personNode(user), el("span", "hidden-kind", `(${kind})`), button);
    return item;
  }));
  list.hidden = users.length === 0;
  $("hidden-none").hidden = users.length > 0;
  if (hadFocus) {
    const next = list.querySelector("button");
    if (next) next.focus();
    else { $("hidden-none").tabIndex = -1; $("hidden-none").focus(); }
  }
}

/** The direct conversation's Mute and Block buttons (servers with a store), as you hide its
 * person now: a blocked person has Unblock only. */
function renderDirectHide(state) {
  const box = $("dm-hide");
  box.hidden = state?.kind !== "dm" || !hasStore || state.peer === client?.hello?.user;
  if (box.hidden) return;
  const label = personLabel(state.peer);
  const kind = hiddenKind(state.peer);
  const mute = $("dm-mute");
  mute.hidden = kind === "blocked";
  mute.textContent = kind === "muted" ? "Unmute" : "Mute";
  mute.setAttribute("aria-label", `${mute.textContent} ${label}`);
  const block = $("dm-block");
  block.textContent = kind === "blocked" ? "Unblock" : "Block";
  block.setAttribute("aria-label", `${block.textContent} ${label}`);
}
$("dm-mute").addEventListener("click", () => {
  const peer = rooms.get(active)?.peer;
  if (peer) hide(hiddenKind(peer) === "muted" ? "unmute" : "mute", peer);
});
$("dm-block").addEventListener("click", () => {
  const peer = rooms.get(active)?.peer;
  if (peer) hide(hiddenKind(peer) === "blocked" ? "unblock" : "block", peer);
});

// -- reporting a message to the moderators ---------------------------------------------------

let reporting = null; // {key, frame, opener}: what the report dialog is about

/** Ask why message `frame` of conversation `key` is reported, in the report dialog; the
 * focus goes back to `opener` once it closes. */
function openReport(key, frame, opener) {
  reporting = { key, frame, opener };
  $("report-quote").textContent = `${personLabel(frame.user)}: ${summary(frame).slice(0, 200)}`;
  $("report-reason").value = "";
  $("report-state").textContent = "";
  $("report-send").disabled = false;
  $("report-dialog").showModal();
  $("report-reason").focus();
}

/** Why a report was not sent, in words. */
function reportFailure(error) {
  switch (error?.code) {
    case "not_found":
      return "Not sent: the message is gone, or you cannot read it any more.";
    case "rate_limited":
      return "Not sent: too many reports at once. Wait a moment and send it again.";
    case "no_store":
      return "Not sent: this server keeps no reports.";
    default:
      return error?.message === "not connected" || error?.message === "disconnected"
        ? "Not sent: you are offline. Send it again once connected."
        : `Not sent: ${error?.message ?? error}`;
  }
}

$("report-form").addEventListener("submit", (event) => {
  event.preventDefault(); // the dialog closes once the server has the report
  const about = reporting;
  const input = $("report-reason");
  const reason = input.value.trim();
  if (!about || !client || !rooms.has(about.key)) return;
  if (!reason) {
    input.setCustomValidity("Say what is wrong with the message");
    input.reportValidity();
    return;
  }
  $("report-send").disabled = true;
  $("report-state").textContent = "Sending the report…";
  client.report(conversationTarget(about.key), about.frame.id, reason).then(() => {
    if (reporting !== about) return;
    $("report-dialog").close();
    showAlert("Report sent: the moderators will look at it", "info");
  }, (error) => {
    if (reporting !== about) return;
    $("report-send").disabled = false;
    $("report-state").textContent = reportFailure(error);
  });
});
$("report-reason").addEventListener("input", () => $("report-reason").setCustomValidity(""));
$("report-cancel").addEventListener("click", () => $("report-dialog").close());
$("report-dialog").addEventListener("close", () => {
  const opener = reporting?.opener;
  reporting = null;
  if (opener?.isConnected) opener.focus();
  else $("composer-input").focus(); // its message was shown again meanwhile
});

// -- link previews: a card under a message for its first link ---------------------------------

const PREVIEWS_AT_ONCE = 2; // requests on their way at once (a connection's are answered in turn)
const PREVIEW_KEEP_MS = 10 * 60_000; // then asked again (its image link expires)
const PREVIEW_IMAGE_BOX = 96; // px: a preview's image fits a square this big
const NO_PREVIEW = new Set(["preview_unavailable", "bad_frame", "unknown_type"]);
/** url -> {preview, at} (the server's answer, when), {waiting} (queued or asked; with the
 * older answer, if any) or {failed} (no preview: not asked again). */
const previews = new Map();
const previewQueue = []; // the links waiting for a request, in the order they came on screen
let previewsAsking = 0;

/** Watches the preview slots shown (empty, but laid out: an observer sees no hidden node):
 * one on screen gets its preview. */
const previewObserver = new IntersectionObserver((entries) => {
  for (const entry of entries) {
    if (!entry.target.isConnected) previewObserver.unobserve(entry.target); // replaced
    else if (entry.isIntersecting) wantPreview(entry.target.dataset.preview);
  }
}, { root: $("messages"), rootMargin: "300px 0px" });

/** The first link of a message's rendered text (format.js made it: http or https only), or
 * null. */
function firstLink(text) {
  for (const anchor of text.querySelectorAll("a[href]")) {
    const href = anchor.getAttribute("href") ?? "";
    if (/^https?:\/\/\S+$/i.test(href) && href.length <= 2048) return href;
  }
  return null;
}

/** Where a message's preview of `url` goes: empty until there is one (filled at once when
 * the page has it; asked for once on screen). A link without a preview shows nothing. */
function previewSlot(url) {
  const slot = el("div", "preview-slot");
  slot.dataset.preview = url;
  const known = previews.get(url);
  if (known?.preview) fillPreview(slot, known.preview);
  if (!known?.failed) previewObserver.observe(slot);
  return slot;
}

/** Queue `url` for a request unless its preview is fresh, on its way, or known not to be. */
function wantPreview(url) {
  const known = previews.get(url);
  if (known?.failed || known?.waiting || (known?.preview && Date.now() - known.at < PREVIEW_KEEP_MS)) return;
  previews.set(url, { ...known, waiting: true });
  previewQueue.push(url);
  pumpPreviews();
}

/** Ask for queued previews while fewer than PREVIEWS_AT_ONCE are on their way (and the
 * connection is open: it pumps again once it is). */
function pumpPreviews() {
  while (client?.state === "open" && previewsAsking < PREVIEWS_AT_ONCE && previewQueue.length) {
    const url = previewQueue.shift();
    previewsAsking += 1;
    client.preview(url).then((preview) => {
      previews.set(url, { preview, at: Date.now() });
      const list = $("messages");
      const atBottom = list.scrollHeight - list.scrollTop - list.clientHeight < 40;
      for (const slot of list.querySelectorAll(`.preview-slot[data-preview="${CSS.escape(url)}"]`)) {
        fillPreview(slot, preview);
      }
      if (atBottom) list.scrollTop = list.scrollHeight;
    }, (error) => {
      // Refused (not a public page, nothing to show...): never asked again. Otherwise
      // (offline, too many at once, too slow): asked again when shown again.
      if (NO_PREVIEW.has(error?.code)) previews.set(url, { failed: true });
      else previews.delete(url);
    }).finally(() => {
      previewsAsking -= 1;
      pumpPreviews();
    });
  }
}

/** The host of `url`, for a preview without a site's name or a title. */
function hostOf(url) {
  try {
    return new URL(url).host;
  } catch {
    return url;
  }
}

/** A preview as a card in its slot: the site, the title (the link), the description and the
 * image the server keeps (in its file storage: never the site's). Every text is set as text. */
function fillPreview(slot, preview) {
  const host = hostOf(preview.url);
  const site = preview.site ?? host;
  const body = el("div", "preview-body");
  const title = el("a", "preview-title", preview.title ?? host);
  title.href = preview.url; // the link asked about: http(s), as format.js made it
  title.target = "_blank";
  title.rel = "noopener noreferrer nofollow ugc";
  body.append(el("span", "preview-site", site), title);
  if (preview.description) body.append(el("p", "preview-description", preview.description));
  const parts = [body];
  if (preview.image) {
    const { url, width, height } = preview.image;
    const image = el("img", "preview-image");
    image.alt = ""; // the title says what it is
    image.loading = "lazy";
    const scale = Math.min(1, PREVIEW_IMAGE_BOX / Math.max(width, height, 1));
    image.width = Math.max(1, Math.round(width * scale));
    image.height = Math.max(1, Math.round(height * scale));
    image.addEventListener("error", () => image.remove()); // expired or gone: the card stays
    image.src = url;
    parts.unshift(image);
  }
  const card = el("div", "link-preview");
  card.setAttribute("role", "group");
  card.setAttribute("aria-label", `Link preview: ${site}`);
  card.append(...parts);
  slot.replaceChildren(card);
}

// -- moderators: the reports queue, and their powers over messages and people ----------------

const REPORTS_PAGE = 20;
const BAN_DURATIONS = [[3600, "1 hour"], [86_400, "1 day"], [7 * 86_400, "1 week"], [30 * 86_400, "30 days"]];
const NOT_A_MODERATOR = new Set(["forbidden", "no_store", "unknown_type"]);
let moderator = false; // the server answered a `reports` request: this user moderates
let reportsView = null; // {next, asking}: the queue shown

/** Whether this user moderates, asked on every connection: the server lists reports to
 * moderators only (anyone else: `forbidden`; without a store: `no_store`). Moderators get
 * "Reports to moderate" (with the open count) and Delete on every message. */
function askModerator() {
  client.reports({ limit: REPORTS_PAGE }).then((page) => {
    setModerator(true);
    showReportsCount(page);
  }, (error) => {
    if (NOT_A_MODERATOR.has(error?.code)) setModerator(false); // else: asked again next time
  });
}

function setModerator(on) {
  if (moderator === on) return;
  moderator = on;
  $("reports-entry").hidden = !on;
  if (!on) closeReports();
  renderMessagesInPlace(); // Delete on everyone's messages, or not
}

/** The open reports' count beside "Reports to moderate" ("20+": more than a page). */
function showReportsCount(page) {
  const count = page.reports.length;
  const badge = $("reports-count");
  badge.replaceChildren(`${count}${page.next !== null ? "+" : ""}`, el("span", "visually-hidden", " open"));
  badge.hidden = count === 0;
}

function openReports() {
  if (!client) return;
  reportsView = { next: undefined, asking: false };
  $("reports-list").replaceChildren();
  $("reports-panel").hidden = false;
  $("reports-open").setAttribute("aria-expanded", "true");
  document.body.classList.remove("drawer-open"); // on a phone: the queue is in the conversation
  $("drawer-toggle").setAttribute("aria-expanded", "false");
  askReports();
}

function closeReports() {
  $("reports-panel").hidden = true;
  $("reports-open").setAttribute("aria-expanded", "false");
  reportsView = null;
}

/** The next page of open reports, oldest first. */
function askReports() {
  const view = reportsView;
  if (!view || view.asking) return;
  view.asking = true;
  $("reports-summary").textContent = "Looking for reports…";
  client.reports({ before: view.next, limit: REPORTS_PAGE }).then((page) => {
    if (reportsView !== view) return;
    view.asking = false;
    if (view.next === undefined) showReportsCount(page);
    view.next = page.next;
    $("reports-list").append(...page.reports.map(reportItem));
    $("reports-more").hidden = page.next === null;
    renderReportsSummary();
  }, (error) => {
    if (reportsView !== view) return;
    view.asking = false;
    $("reports-summary").textContent = `Could not list the reports: ${error?.message ?? error}`;
  });
}

function renderReportsSummary() {
  const count = $("reports-list").children.length;
  $("reports-summary").textContent = count ? `${count} open report${count === 1 ? "" : "s"}` : "No open reports";
}

/** A report: where, who reported it and when, the message as it was, the reason, and what a
 * moderator may do: dismiss it, delete the message, kick or ban its author. */
function reportItem(report) {
  const item = el("li", "search-result report-item");
  item.dataset.report = String(report.id);
  const author = report.message.user;
  const label = personLabel(author);
  const where = report.room !== undefined ? report.room
    : (report.with ?? []).map((user) => `@${personLabel(user)}`).join(" & ");
  const head = el("p", "result-head");
  head.append(el("strong", "", where), " · reported by ", personNode(report.reporter), " · ",
    el("time", "", new Date(report.ts).toLocaleString([], { dateStyle: "medium", timeStyle: "short" })));
  const message = el("p", "report-message");
  message.append(personNode(author), ": ", el("span", "report-text", plain(report.message.text)));
  const buttons = el("p", "report-actions");
  const duration = el("select", "ban-duration");
  duration.id = `ban-duration-${report.id}`;
  for (const [seconds, words] of BAN_DURATIONS) {
    const option = el("option", "", words);
    option.value = String(seconds);
    duration.append(option);
  }
  duration.value = "86400";
  const durationLabel = el("label", "visually-hidden", `How long to ban ${label}`);
  durationLabel.htmlFor = duration.id;
  buttons.append(
    reportButton("Dismiss", `Dismiss report ${report.id}`, () => resolveReport(item, report, "dismiss")),
    reportButton("Delete message", `Delete message of report ${report.id}`, () => resolveReport(item, report, "delete")),
    reportButton(`Kick ${label}`, `Kick ${label}`, () => moderate("kick", author)),
    durationLabel, duration,
    reportButton(`Ban ${label}`, `Ban ${label}`, () => moderate("ban", author, Number(duration.value))),
  );
  item.append(head, message, el("p", "report-reason", `Reason: ${report.reason}`), buttons);
  return item;
}

function reportButton(text, name, onClick) {
  const button = el("button", "secondary", text);
  button.type = "button";
  button.setAttribute("aria-label", name);
  button.addEventListener("click", onClick);
  return button;
}

/** Dismiss a report, or delete its message (everyone in the conversation sees it go). Done:
 * off the list, the focus on the next report's first button. */
function resolveReport(item, report, action) {
  client.resolve(report.id, action).then((now) => {
    const next = item.nextElementSibling ?? item.previousElementSibling;
    item.remove();
    renderReportsSummary();
    const outcome = now.resolved?.outcome ?? (action === "delete" ? "deleted" : "dismissed");
    showAlert(outcome === "deleted" ? "Report resolved: the message is deleted" : "Report dismissed", "info");
    (next?.querySelector("button") ?? $("reports-refresh")).focus();
    askModerator(); // the count
  }, (error) => showAlert(`Could not resolve the report: ${error?.message ?? error}`));
}

/** Kick `user` (disconnected; they may come back), or ban them for `seconds`. */
function moderate(action, user, seconds = 0) {
  const label = personLabel(user);
  const words = BAN_DURATIONS.find(([value]) => value === seconds)?.[1] ?? `${seconds} s`;
  const done = action === "kick" ? client.kick(user) : client.ban(user, seconds);
  done.then(
    () => showAlert(action === "kick" ? `${label} was disconnected` : `${label} is banned for ${words}`, "info"),
    (error) => showAlert(`Could not ${action} ${label}: ${error?.message ?? error}`),
  );
}

$("reports-open").addEventListener("click", () => {
  if ($("reports-panel").hidden) openReports();
  else closeReports();
});
$("reports-close").addEventListener("click", () => {
  closeReports();
  $("reports-open").focus();
});
$("reports-refresh").addEventListener("click", () => openReports());
$("reports-more").addEventListener("click", () => askReports());

// -- the phone drawer and the forms' hints --------------------------------------------------

$("drawer-toggle").addEventListener("click", () => {
  const open = document.body.classList.toggle("drawer-open");
  $("drawer-toggle").setAttribute("aria-expanded", String(open));
  if (open) $("sidebar").querySelector("button, input")?.focus();
});
// A click beside the open drawer closes it.
document.addEventListener("click", (event) => {
  if (document.body.classList.contains("drawer-open") && !$("sidebar").contains(event.target)
      && !$("drawer-toggle").contains(event.target)) {
    document.body.classList.remove("drawer-open");
    $("drawer-toggle").setAttribute("aria-expanded", "false");
  }
});
document.addEventListener("keydown", (event) => {
  if (event.key === "Escape" && document.body.classList.contains("drawer-open")) {
    document.body.classList.remove("drawer-open");
    $("drawer-toggle").setAttribute("aria-expanded", "false");
    $("drawer-toggle").focus();
  }
});

// Each box says what it takes, not the browser's "match the requested format".
for (const [id, hint] of [["name-input", NAME_HINT], ["join-input", ROOM_HINT], ["create-input", ROOM_HINT]]) {
  const input = $(id);
  input.addEventListener("invalid", () => {
    input.setCustomValidity(input.validity.valueMissing ? "Type a name first" : hint);
  });
  input.addEventListener("input", () => input.setCustomValidity(""));
}

// -- go ------------------------------------------------------------------------------------

const given = new URLSearchParams(location.search).get("name") || localStorage.getItem("hubbub.name");
if (given && NAME.test(given)) start(given);
else askName();

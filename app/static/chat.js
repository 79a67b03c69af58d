// The chat page: rooms, direct messages, presence, typing, unread counts, "seen by", replies,
// edits, deletions and reactions, connection state — on top of hubbub.js. Messages are kept per conversation (a room, or "@user" for the direct
// messages with a user) by id and shown in id order, so a message replayed after a reconnect or
// reloaded over HTTP appears exactly once; scrolling up loads older ones. Text is always set as
// text, never HTML. People are shown by `personLabel` (a suffix from the id tells two alices
// apart) with an avatar coloured from the id; the invite box invites only a person picked, and
// an invitation waits for Join or Decline.
import { HubbubClient, applyEvent, displayName } from "./hubbub.js";

// A display name (what guest servers take; other modes take it too).
const NAME = /^[A-Za-z0-9][A-Za-z0-9_.]{0,14}$/;
const ROOM = /^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$/;
const USER = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,31}$/;
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
const $ = (id) => document.getElementById(id);

/** conversation ("lobby", or "@user" for direct messages) -> {kind: "room"|"dm", peer?,
 * messages: Map<id, frame> (as they are now: events applied), count, users: Set|null, unread,
 * typing: Map<user, timer>, read: Map<user, id> (others' read positions), complete: no older
 * history, loading} */
const rooms = new Map();
let active = null;
/** What the composer does with its text: a new message, `{reply: id}`, or `{edit: id}`. */
let composing = {};
let client = null;
let lastTyping = 0;
let hasStore = false; // the server sent an inbox: read positions are kept
/** display name -> Set of the user ids the page has seen with it (presence, members, authors,
 * readers, DM peers, the inbox, invitations): the people it knows, and who to warn about. */
const people = new Map();
let namesRefresh = false; // a refresh of every shown name is scheduled
/** room -> its `invited` frame, oldest first: invitations waiting for Join or Decline. */
const invitations = new Map();
/** The person picked in the invite box's list: {user, label}. */
let invitePick = null;
let inviteOption = -1; // the list's highlighted option (arrow keys)

function conversationOf(frame) {
  if (frame.room !== undefined) return frame.room;
  const me = client.hello?.user;
  return `@${frame.user === me ? frame.to : frame.user}`;
}

function newConversation(kind, peer) {
  return { kind, peer, messages: new Map(), count: 0, users: kind === "room" ? new Set() : null,
           unread: 0, typing: new Map(), read: new Map(), complete: false, loading: false };
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
  const list = $("messages");
  const fromBottom = list.scrollHeight - list.scrollTop;
  const atBottom = fromBottom - list.clientHeight < 40;
  renderMessages();
  if (!atBottom) list.scrollTop = list.scrollHeight - fromBottom; // what was shown stays in place
  renderRoomHead();
  renderPresence();
  renderTyping();
  renderInvitations();
  if (!$("invite-options").hidden) renderInviteOptions();
}

// -- name and start ------------------------------------------------------------------------

function start(name) {
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
  client.addEventListener("error", (e) => showAlert(`${e.detail.code}: ${e.detail.message}`));
  client.connect();
  const wanted = new URLSearchParams(location.search).get("room");
  const saved = JSON.parse(localStorage.getItem("hubbub.rooms") || "[]");
  const initial = wanted ? [wanted] : saved.length ? saved : ["lobby"];
  for (const room of initial) if (ROOM.test(room)) joinRoom(room);
}

function askName() {
  const dialog = $("name-dialog");
  const input = $("name-input");
  input.value = localStorage.getItem("hubbub.name") || "";
  dialog.showModal();
  input.focus();
}

$("name-form").addEventListener("submit", (event) => {
  const name = $("name-input").value.trim();
  if (!NAME.test(name)) {
    event.preventDefault();
    $("name-input").setCustomValidity("up to 15 letters, digits, _ . (starting with a letter or digit)");
    $("name-input").reportValidity();
    return;
  }
  if (client) {
    // A new name is a new connection: keep the rooms.
    client.close();
    for (const state of rooms.values()) state.messages.clear();
    const joined = [...rooms.keys()].filter((key) => rooms.get(key).kind === "room");
    rooms.clear();
    people.clear();
    invitations.clear();
    renderInvitations();
    $("rooms").replaceChildren();
    $("dms").replaceChildren();
    localStorage.setItem("hubbub.rooms", JSON.stringify(joined));
  }
  start(name);
});
$("name-input").addEventListener("input", () => $("name-input").setCustomValidity(""));
$("change-name").addEventListener("click", askName);

// -- connection state and alerts -----------------------------------------------------------

function showState({ state, delayMs, code, reason }) {
  const status = $("status");
  status.dataset.state = state;
  const texts = {
    connecting: "Connecting…",
    open: "Connected",
    reconnecting: delayMs
      ? `Reconnecting in ${Math.ceil(delayMs / 1000)} s${code ? ` (closed: ${code})` : ""}…`
      : "Reconnecting…",
    closed: `Disconnected${reason ? `: ${reason}` : ""}${code ? ` (${code})` : ""}`,
  };
  status.textContent = texts[state] ?? state;
  const usable = (state ?? client?.state) === "open" && active !== null;
  $("composer-input").disabled = !usable;
  $("send-button").disabled = !usable;
}

function showAlert(text) {
  const box = el("p", "alert");
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
    showAlert(`${by ? personLabel(by) : "The service"} made you ${role === "admin" ? "an admin" : "a member"} of ${room}`);
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
  const unread = el("span", "unread");
  unread.hidden = true;
  item.append(open, unread);
  list.append(item);
  return item;
}

function joinRoom(room, show = true) {
  if (!rooms.has(room)) {
    rooms.set(room, newConversation("room"));
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
  if (form.hidden) closeInviteOptions();
  const members = $("room-members");
  members.hidden = !(state?.kind === "room" && record?.members);
  $("room-title").title = state?.kind === "dm" ? state.peer : "";
  if (!state) {
    $("room-title").textContent = "No room";
  } else if (state.kind === "dm") {
    $("room-title").textContent = `@${personLabel(state.peer)}`;
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
  hasStore = true;
  markReadSoon(); // what is shown already
  for (const entry of conversations) {
    if (entry.room !== undefined) {
      if (rooms.has(entry.room) && entry.room !== active) showUnread(entry.room, entry.unread);
      continue;
    }
    openDirect(entry.with, false);
    const state = rooms.get(`@${entry.with}`);
    if (entry.peer_read) onReceipt(`@${entry.with}`, entry.with, entry.peer_read);
    if (active !== `@${entry.with}` && entry.unread > state.unread) showUnread(`@${entry.with}`, entry.unread);
  }
}

function showUnread(key, count) {
  const state = rooms.get(key);
  state.unread = count;
  const badge = document.querySelector(`[data-room="${CSS.escape(key)}"] .unread`);
  if (!badge) return;
  badge.textContent = count > 999 ? "999+" : String(count);
  badge.hidden = count === 0;
}

function leaveRoom(room) {
  client.leave(room);
  forgetRoom(room);
}

function saveRooms() {
  localStorage.setItem("hubbub.rooms", JSON.stringify([...rooms.keys()]));
}

function setActive(key) {
  active = key;
  const state = key === null ? null : rooms.get(key);
  renderRoomHead();
  for (const item of [...$("rooms").children, ...$("dms").children]) {
    const current = item.dataset.room === key;
    item.querySelector(".room").setAttribute("aria-current", String(current));
  }
  if (state) showUnread(key, 0);
  $("history-state").textContent = "";
  setComposing({});
  renderMessages();
  renderPresence();
  renderTyping();
  showState({ state: client.state });
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
});

/** Tell the server the newest message of the shown conversation is read (with a store),
 * once it has been shown for READ_EVERY_MS: a conversation only glanced at stays unread. */
function markReadSoon() {
  const key = active;
  const state = key === null ? null : rooms.get(key);
  if (!hasStore || !state || state.readTimer) return;
  state.readTimer = setTimeout(() => {
    state.readTimer = null;
    if (active !== key || !state.messages.size || client.state !== "open") return;
    const newest = Math.max(...state.messages.keys());
    if (newest <= (state.readUpTo ?? 0)) return;
    state.readUpTo = newest;
    client.markRead(state.kind === "dm" ? { with: state.peer } : key, newest);
  }, READ_EVERY_MS);
}

$("dm-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const input = $("dm-input");
  const user = input.value.trim();
  if (!USER.test(user)) {
    showAlert("A user is letters, digits and _ . - (starting with a letter or digit)");
    return;
  }
  input.value = "";
  openDirect(user);
});

$("create-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const input = $("create-input");
  const room = input.value.trim();
  if (!ROOM.test(room)) {
    showAlert("A room name is letters, digits and _ . : - (starting with a letter or digit)");
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

// -- the invite box: a person is picked, never resolved from a typed name --------------------

/** The people the page knows who could be invited to the shown room (not you, not its
 * members), by label. */
function inviteCandidates() {
  const me = client?.hello?.user;
  const members = rooms.get(active)?.record?.members ?? {};
  const users = [...people.values()].flatMap((group) => [...group])
    .filter((user) => user !== me && !Object.hasOwn(members, user));
  return users.map((user) => ({ user, label: personLabel(user) }))
    .sort((a, b) => a.label.localeCompare(b.label));
}

/** The list under the invite box: the candidates whose label or id holds what is typed. */
function renderInviteOptions() {
  const input = $("invite-input");
  const list = $("invite-options");
  const typed = input.value.trim().toLowerCase();
  const shown = inviteCandidates()
    .filter(({ user, label }) => label.toLowerCase().includes(typed) || user.toLowerCase().includes(typed))
    .slice(0, INVITE_OPTIONS_SHOWN);
  inviteOption = Math.min(inviteOption, shown.length - 1);
  list.replaceChildren(...shown.map(({ user }, n) => {
    const option = personNode(user, "li", "person option");
    option.id = `invite-option-${n}`;
    option.dataset.user = user;
    option.setAttribute("role", "option");
    option.setAttribute("aria-selected", String(n === inviteOption));
    option.addEventListener("click", () => pickInvitee(user));
    return option;
  }));
  list.hidden = shown.length === 0;
  input.setAttribute("aria-expanded", String(!list.hidden));
  if (inviteOption >= 0) input.setAttribute("aria-activedescendant", `invite-option-${inviteOption}`);
  else input.removeAttribute("aria-activedescendant");
}

function closeInviteOptions() {
  $("invite-options").hidden = true;
  $("invite-input").setAttribute("aria-expanded", "false");
  $("invite-input").removeAttribute("aria-activedescendant");
  inviteOption = -1;
}

/** `user` picked from the list: the box shows its label, and an invite is for this id. */
function pickInvitee(user) {
  const label = personLabel(user);
  invitePick = { user, label };
  $("invite-input").value = label;
  closeInviteOptions();
  $("invite-input").focus();
}

/** Who the invite box's text stands for: the person picked from the list, a known person's
 * full label (alice·7e1f), a known id, or (not on a guest server) a user id typed in full.
 * A display name alone is never resolved to someone: {refused: why} says to pick. */
function invitee(text) {
  if (invitePick && text === invitePick.label) return invitePick.user;
  const me = client.hello?.user;
  const known = [...people.values()].flatMap((group) => [...group]).filter((user) => user !== me);
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

$("invite-input").addEventListener("input", () => {
  if (invitePick && $("invite-input").value !== invitePick.label) invitePick = null;
  inviteOption = -1;
  renderInviteOptions();
});
$("invite-input").addEventListener("focus", renderInviteOptions);
$("invite-input").addEventListener("blur", closeInviteOptions);
// A click on an option must not blur the box first (which closes the list).
$("invite-options").addEventListener("mousedown", (event) => event.preventDefault());
$("invite-input").addEventListener("keydown", (event) => {
  if (event.key === "ArrowDown" || event.key === "ArrowUp") {
    event.preventDefault();
    if ($("invite-options").hidden) renderInviteOptions();
    const count = $("invite-options").children.length;
    if (!count) return;
    if (event.key === "ArrowDown") inviteOption = (inviteOption + 1) % count;
    else inviteOption = inviteOption <= 0 ? count - 1 : inviteOption - 1;
    renderInviteOptions();
  } else if (event.key === "Enter" && !$("invite-options").hidden && inviteOption >= 0) {
    event.preventDefault(); // Enter on a highlighted option picks it; the next one invites
    pickInvitee($("invite-options").children[inviteOption].dataset.user);
  } else if (event.key === "Escape") {
    closeInviteOptions();
  }
});

$("invite-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const input = $("invite-input");
  const text = input.value.trim();
  if (!text || !active) return;
  const user = invitee(text);
  if (typeof user !== "string") {
    showAlert(user.refused);
    return;
  }
  input.value = "";
  invitePick = null;
  closeInviteOptions();
  client.invite(active, user);
});

$("join-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const input = $("join-input");
  const room = input.value.trim();
  if (!ROOM.test(room)) {
    showAlert("A room name is letters, digits and _ . : - (starting with a letter or digit)");
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

function messageItem(frame) {
  const key = conversationOf(frame);
  const me = client.hello?.user;
  const item = el("li", frame.deleted ? "message deleted" : "message");
  item.dataset.id = String(frame.id);
  if (frame.reply_to) {
    const quoted = rooms.get(key)?.messages.get(frame.reply_to);
    const quote = el("p", "quote", quoted
      ? `↪ ${personLabel(quoted.user)}: ${quoted.deleted ? "(deleted)" : quoted.text.slice(0, 80)}`
      : "↪ an earlier message");
    item.append(quote);
  }
  const time = el("time", "meta", new Date(frame.ts).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" }));
  time.dateTime = new Date(frame.ts).toISOString();
  // Guests may share a display name: the suffix and the avatar tell them apart (the id is
  // the tooltip).
  const author = personNode(frame.user, "span", "author person");
  item.append(time, author);
  if (frame.deleted) {
    item.append(el("span", "text", "Message deleted"));
    return item;
  }
  item.append(el("span", "text", frame.text));
  if (frame.edited) item.append(el("span", "edited", " (edited)"));
  const reactions = el("span", "reactions");
  for (const [emoji, users] of Object.entries(frame.reactions ?? {})) {
    const chip = actionButton(`${emoji} ${users.length}`, `${emoji} by ${users.map(personLabel).join(", ")}`,
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
  if (frame.user === me) {
    actions.append(actionButton("✎", "Edit", () => setComposing({ edit: frame.id })));
    actions.append(actionButton("🗑", "Delete", () => {
      if (confirm("Delete this message for everyone?")) client.deleteMessage(conversationTarget(key), frame.id);
    }));
  }
  item.append(actions);
  const seen = el("p", "seen");
  seen.hidden = true;
  item.append(seen);
  return item;
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
  const readers = new Map(); // message id -> users
  for (const [user, position] of state.read) {
    let upTo = null;
    for (const id of ids) { if (id <= position) upTo = id; else break; }
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
  if (key !== active) {
    if (counts && frame.user !== client.hello?.user) showUnread(key, state.unread + 1);
    return;
  }
  markReadSoon();
  const list = $("messages");
  const atBottom = list.scrollHeight - list.scrollTop - list.clientHeight < 40;
  const item = messageItem(frame);
  // In id order: usually at the end; history and replays may land earlier.
  let next = null;
  for (let node = list.lastElementChild; node && Number(node.dataset.id) > frame.id; node = node.previousElementSibling) {
    next = node;
  }
  list.insertBefore(item, next);
  renderSeen();
  if (!older && (atBottom || frame.user === client.hello?.user)) list.scrollTop = list.scrollHeight;
}

function renderMessages() {
  const list = $("messages");
  list.replaceChildren();
  const state = rooms.get(active);
  if (!state) return;
  const ordered = [...state.messages.values()].sort((a, b) => a.id - b.id);
  list.append(...ordered.map(messageItem));
  renderSeen();
  list.scrollTop = list.scrollHeight;
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
    : `Replying to ${personLabel(target.user)}: ${target.text.slice(0, 80)}`;
  banner.hidden = false;
  const input = $("composer-input");
  if (next.edit) input.value = target.text;
  input.focus();
}
$("composing-cancel").addEventListener("click", () => {
  if (composing.edit) $("composer-input").value = "";
  setComposing({});
});

function sendCurrent() {
  const input = $("composer-input");
  const text = input.value.trim();
  if (!text || !active || client.state !== "open") return;
  const state = rooms.get(active);
  const target = state.kind === "dm" ? { with: state.peer } : active;
  if (composing.edit) {
    if (text !== state.messages.get(composing.edit)?.text) client.edit(target, composing.edit, text);
  } else if (state.kind === "dm") {
    client.sendTo(state.peer, text, { replyTo: composing.reply });
  } else {
    client.send(active, text, { replyTo: composing.reply });
  }
  input.value = "";
  lastTyping = 0;
  setComposing({});
}

$("composer").addEventListener("submit", (event) => {
  event.preventDefault();
  sendCurrent();
});
$("composer-input").addEventListener("keydown", (event) => {
  if (event.key === "Escape" && (composing.edit || composing.reply)) {
    if (composing.edit) $("composer-input").value = "";
    setComposing({});
    return;
  }
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    sendCurrent();
  }
});
$("composer-input").addEventListener("input", () => {
  const now = Date.now();
  if (active && rooms.get(active)?.kind === "room" && client.state === "open" && now - lastTyping > TYPING_EVERY_MS) {
    lastTyping = now;
    client.typing(active);
  }
});

// -- go ------------------------------------------------------------------------------------

const given = new URLSearchParams(location.search).get("name") || localStorage.getItem("hubbub.name");
if (given && NAME.test(given)) start(given);
else askName();

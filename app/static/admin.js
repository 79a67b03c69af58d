// The admin page: who is connected where (docs/operations.md). It calls the admin API with the
// token typed in (kept for this tab only, in sessionStorage), lists the workers of the census,
// finds a user's or a room's connections on every worker and closes one. Everything the API
// returns is set as text, never HTML.

const TOKEN_KEY = "hubbub-admin-token";

/** @typedef {{worker: string, host: string, pid: number, connections: number, ready: boolean, draining: boolean, reported_ms: number}} WorkerRecord */
/** @typedef {{id: string, user: string, transport: string, opened_ms: number, rooms: string[], room_count: number, queued_bytes: number, worker: string, host: string, pid: number}} Connection */

/**
 * @param {string} id
 * @returns {HTMLElement}
 */
function element(id) {
  const found = document.getElementById(id);
  if (found === null) throw new Error(`#${id} is missing`);
  return found;
}

/**
 * @param {string} id
 * @returns {HTMLInputElement}
 */
function input(id) {
  const found = element(id);
  if (!(found instanceof HTMLInputElement)) throw new Error(`#${id} is not an input`);
  return found;
}

/** @param {string} text */
function say(text) {
  element("status").textContent = text;
}

/**
 * A call to the admin API: its JSON (null for 204), or an Error saying what went wrong.
 * @param {string} method
 * @param {string} path
 * @returns {Promise<unknown>}
 */
async function call(method, path) {
  const token = sessionStorage.getItem(TOKEN_KEY) ?? "";
  const response = await fetch(path, { method, headers: { Authorization: `Bearer ${token}` } });
  if (response.status === 204) return null;
  const body = /** @type {{detail?: unknown}} */ (await response.json().catch(() => ({})));
  if (!response.ok) {
    const detail = typeof body.detail === "string" ? body.detail : response.statusText;
    throw new Error(`${response.status}: ${detail}`);
  }
  return body;
}

/**
 * A table row of cells (text only).
 * @param {(string | Node)[]} cells
 * @returns {HTMLTableRowElement}
 */
function row(cells) {
  const tr = document.createElement("tr");
  for (const cell of cells) {
    const td = document.createElement("td");
    td.append(cell);
    tr.append(td);
  }
  return tr;
}

/** @param {number} ms */
function when(ms) {
  return new Date(ms).toLocaleString();
}

async function showWorkers() {
  const body = /** @type {{workers: WorkerRecord[]}} */ (await call("GET", "/admin/workers"));
  const tbody = element("workers").querySelector("tbody");
  if (tbody === null) return;
  tbody.replaceChildren(
    ...body.workers.map((w) =>
      row([
        w.host,
        String(w.pid),
        w.worker,
        String(w.connections),
        w.draining ? "draining" : w.ready ? "ready" : "not ready",
        when(w.reported_ms),
      ]),
    ),
  );
}

async function findConnections() {
  const params = new URLSearchParams();
  const user = input("find-user").value.trim();
  const room = input("find-room").value.trim();
  if (user) params.set("user", user);
  if (room) params.set("room", room);
  const body = /** @type {{connections: Connection[], workers_asked: number, workers_unanswered: string[]}} */ (
    await call("GET", `/admin/connections?${params}`)
  );
  const tbody = element("connections").querySelector("tbody");
  if (tbody === null) return;
  tbody.replaceChildren(
    ...body.connections.map((c) => {
      const close = document.createElement("button");
      close.type = "button";
      close.className = "danger";
      close.textContent = "Disconnect";
      close.setAttribute("aria-label", `Disconnect ${c.user}'s connection ${c.id}`);
      close.addEventListener("click", () => {
        disconnect(c).catch((error) => say(String(error)));
      });
      const rooms = c.rooms.join(", ") + (c.room_count > c.rooms.length ? ` (+${c.room_count - c.rooms.length})` : "");
      return row([c.user, c.id, c.transport, when(c.opened_ms), rooms, `${c.queued_bytes} B`,
        `${c.host} / ${c.pid} / ${c.worker}`, close]);
    }),
  );
  const missing = body.workers_unanswered.length;
  say(
    `${body.connections.length} connections on ${body.workers_asked} workers` +
      (missing ? `; ${missing} did not answer: ${body.workers_unanswered.join(", ")}` : ""),
  );
}

/** @param {Connection} c */
async function disconnect(c) {
  await call("DELETE", `/admin/connections/${c.worker}/${c.id}`);
  say(`Disconnected ${c.user}'s connection ${c.id}`);
  await findConnections();
}

/** @param {() => Promise<void>} action */
function run(action) {
  action().catch((error) => say(String(error)));
}

element("token-form").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem(TOKEN_KEY, input("token").value);
  input("token").value = "";
  say("");
  run(showWorkers);
});
element("refresh").addEventListener("click", () => run(showWorkers));
element("find-form").addEventListener("submit", (event) => {
  event.preventDefault();
  say("");
  run(findConnections);
});
if (sessionStorage.getItem(TOKEN_KEY)) run(showWorkers);

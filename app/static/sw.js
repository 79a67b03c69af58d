// The chat page's service worker (served as /static/sw.js with `Service-Worker-Allowed: /`,
// registered with scope "/" by chat.js once the person enabled notifications). It shows the
// notifications: those the page itself shows while its tab is hidden (through this
// registration), and Web Push messages from the server while no page is open or in view. It
// caches nothing and serves no request.
//
// A push's payload (docs/protocol.md, "Mentions and notifications"):
//   {"type":"notification","room":R | "with":U,"id":ID,"user":S,"text":T,"ts":MS,
//    "reason":"mention"|"direct"|"all","count":N}
// One notification per conversation (its tag): a newer one replaces it. A click focuses a
// page of the chat and opens the conversation at the message (a message to the page), or
// opens one at /?room=R&message=ID (/?with=U&message=ID).

self.addEventListener("install", () => {
  self.skipWaiting(); // nothing to migrate: the new version takes over at once
});

self.addEventListener("activate", (event) => {
  event.waitUntil(self.clients.claim());
});

/** Where the chat page shows `data`'s conversation at its message. */
function pageUrl(data) {
  const url = new URL("/", self.registration.scope);
  if (typeof data.room === "string") url.searchParams.set("room", data.room);
  else if (typeof data.with === "string") url.searchParams.set("with", data.with);
  if (Number.isSafeInteger(data.id)) url.searchParams.set("message", String(data.id));
  return url.href;
}

/** The tag of a conversation's notification (the page uses the same: they replace each other). */
function tagOf(data) {
  return typeof data.room === "string" ? `hubbub:room:${data.room}` : `hubbub:with:${data.with}`;
}

/** The windows of this origin that show the chat page (its other URLs are not the chat). */
async function chatWindows() {
  const windows = await self.clients.matchAll({ type: "window", includeUncontrolled: true });
  return windows.filter((client) => new URL(client.url).pathname === "/");
}

self.addEventListener("push", (event) => {
  let data = null;
  try {
    data = event.data ? event.data.json() : null;
  } catch {
    data = null;
  }
  if (!data || data.type !== "notification" || (typeof data.room !== "string" && typeof data.with !== "string")) {
    return;
  }
  event.waitUntil((async () => {
    // Someone is looking at the chat: the page shows the message, no notification.
    const windows = await chatWindows();
    if (windows.some((client) => client.visibilityState === "visible")) return;
    // A guest's id is its name and a hash: the name is what people know.
    const who = typeof data.user === "string" ? data.user.replace(/-[0-9a-f]{16}$/, "") : "someone";
    const where = typeof data.room === "string" ? `${data.room} · ${who}` : `${who} · direct message`;
    const more = Number.isSafeInteger(data.count) && data.count > 1 ? ` (${data.count} new)` : "";
    await self.registration.showNotification(`${where}${more}`, {
      body: typeof data.text === "string" ? data.text : "New message",
      tag: tagOf(data),
      timestamp: Number.isFinite(data.ts) ? data.ts : Date.now(),
      data: { ...(typeof data.room === "string" ? { room: data.room } : { with: data.with }), id: data.id, url: pageUrl(data) },
    });
  })());
});

self.addEventListener("notificationclick", (event) => {
  event.notification.close();
  const data = event.notification.data ?? {};
  event.waitUntil((async () => {
    const [page] = await chatWindows();
    if (page) {
      await page.focus().catch(() => undefined);
      page.postMessage({ type: "open", room: data.room, with: data.with, id: data.id });
      return;
    }
    await self.clients.openWindow(data.url ?? pageUrl(data));
  })());
});

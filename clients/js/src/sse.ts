/**
 * The HTTP fallback transport as a WebSocket: server-sent events down (`GET /sse`, read with
 * `fetch`), POSTs up (`POST /sse`), the same frames (docs/protocol.md, "HTTP fallback").
 * `HubbubClient` uses it when a WebSocket cannot be had; it has the members of a WebSocket
 * the client uses, so everything else (auth, acks, rejoins, heartbeats) is the same.
 *
 * @module
 */

import { createParser, type EventSourceMessage } from "eventsource-parser";

/** The `fetch` the stream uses (the global one by default: browsers, Node 18+). */
export type FetchLike = typeof fetch;

const CONNECTING = 0;
const OPEN = 1;
const CLOSED = 3;
/** How often a POST that got no answer (network error, 503) is sent again, same number. */
const POST_TRIES = 5;
const POST_RETRY_MS = 500;
/** Frames sent while a POST is under way go together in the next one, up to this size. */
const POST_MAX_CHARS = 65_536;

/** `ws[s]://HOST/PATH/ws?QUERY` → `http[s]://HOST/PATH/sse?QUERY`. */
export function streamUrl(wsUrl: string): string {
  const url = new URL(wsUrl);
  url.protocol = url.protocol === "wss:" ? "https:" : url.protocol === "ws:" ? "http:" : url.protocol;
  url.pathname = url.pathname.replace(/\/ws$/, "/sse");
  return url.toString();
}

/** One stream, with the WebSocket members `HubbubClient` uses. `close` codes are the server's
 * (its `close` event), 1006 when the stream broke without one. */
export class SseSocket {
  readyState = CONNECTING;
  onopen: ((event: unknown) => void) | null = null;
  onmessage: ((event: { data: unknown }) => void) | null = null;
  onclose: ((event: { code: number; reason: string }) => void) | null = null;
  onerror: ((event: unknown) => void) | null = null;

  private readonly url: string;
  private readonly fetch: FetchLike;
  private readonly abort = new AbortController();
  private stream = "";
  private seq = 0;
  private readonly outgoing: string[] = [];
  private posting = false;
  private ended: { code: number; reason: string } | null = null;

  /** `url`: the WebSocket URL the client was given (the stream's is made from it). */
  constructor(url: string, fetchImpl: FetchLike = globalThis.fetch.bind(globalThis)) {
    this.url = streamUrl(url);
    this.fetch = fetchImpl;
    void this.read();
  }

  /** Queue `data` (one frame) for the next POST. */
  send(data: string): void {
    if (this.readyState !== OPEN) throw new Error("the stream is not open");
    this.outgoing.push(data);
    void this.post();
  }

  /** End the stream from this side (`onclose` follows, with `code`). */
  close(code = 1000, reason = ""): void {
    this.finish(code, reason);
  }

  private async read(): Promise<void> {
    let closing: { code: number; reason: string } = { code: 1006, reason: "the stream ended" };
    try {
      const response = await this.fetch(this.url, {
        headers: { Accept: "text/event-stream" }, cache: "no-store", signal: this.abort.signal,
      });
      if (!response.ok || !response.body) {
        closing = { code: 1006, reason: `the stream was refused: HTTP ${response.status}` };
        return;
      }
      const parser = createParser({
        onEvent: (event: EventSourceMessage) => {
          if (event.event === "stream") {
            this.stream = (JSON.parse(event.data) as { stream: string }).stream;
            this.readyState = OPEN;
            this.onopen?.({});
          } else if (event.event === "close") {
            closing = JSON.parse(event.data) as { code: number; reason: string };
          } else if (this.readyState === OPEN) {
            this.onmessage?.({ data: event.data });
          }
        },
      });
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      for (;;) {
        const { done, value } = await reader.read();
        if (done || this.readyState === CLOSED) break;
        parser.feed(value);
      }
    } catch {
      // A network error, or our own abort: the close below says which.
    } finally {
      this.finish(closing.code, closing.reason);
    }
  }

  /** POST what is queued, one POST at a time (so in order), each numbered; a POST that got
   * no answer goes again with its number (the server drops a repeat). */
  private async post(): Promise<void> {
    if (this.posting) return;
    this.posting = true;
    try {
      while (this.outgoing.length && this.readyState === OPEN) {
        let size = 0;
        let count = 0;
        while (count < this.outgoing.length && (count === 0 || size + this.outgoing[count]!.length < POST_MAX_CHARS)) {
          size += this.outgoing[count]!.length + 1;
          count += 1;
        }
        const body = this.outgoing.splice(0, count).join("\n");
        const seq = this.seq;
        this.seq += 1;
        const status = await this.postOne(body, seq);
        if (status === 410) {
          this.finish(1006, "the stream is gone");
        } else if (status !== 202) {
          this.finish(1006, `a POST was refused: HTTP ${status}`);
        }
      }
    } finally {
      this.posting = false;
    }
  }

  private async postOne(body: string, seq: number): Promise<number> {
    let status = 0;
    for (let attempt = 0; attempt < POST_TRIES && this.readyState === OPEN; attempt += 1) {
      try {
        const response = await this.fetch(this.url, {
          method: "POST", body, signal: this.abort.signal,
          headers: {
            "Content-Type": "text/plain;charset=UTF-8",
            "Hubbub-Stream": this.stream, "Hubbub-Seq": String(seq),
          },
        });
        status = response.status;
        if (status !== 503) return status;
      } catch {
        status = 0;
      }
      await new Promise((resolve) => setTimeout(resolve, POST_RETRY_MS * (attempt + 1)));
    }
    return status;
  }

  private finish(code: number, reason: string): void {
    if (this.ended) return;
    this.ended = { code, reason };
    this.readyState = CLOSED;
    this.abort.abort();
    // As a WebSocket's: after the call that closed it returns.
    setTimeout(() => this.onclose?.({ code, reason }), 0);
  }
}

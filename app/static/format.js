// @ts-check
/**
 * Message formatting for the chat page: a message's plain text → DOM nodes, with no way for a
 * message to inject markup or script.
 *
 * Contract
 * --------
 * `parse(text)` → block tokens (pure: no DOM, runs in Node). `render(text, doc = document)` →
 * a `DocumentFragment` built only with createElement / createTextNode / textContent /
 * setAttribute (never innerHTML, outerHTML, insertAdjacentHTML or document.write), so no part
 * of a message is ever parsed as HTML.
 *
 * Blocks (a message is split into lines at "\n"):
 * - fenced code: a line "```" or "```lang" (one word: letters, digits, _ + # . -) opens it;
 *   it runs to the next line that is just "```", or to the end of the text. Its content is
 *   verbatim (no inline formatting) → `<pre><code data-lang="lang">`.
 * - quote: consecutive lines starting with "> " (the prefix removed) → `<blockquote>`.
 * - paragraph: consecutive other lines, ended by a blank line → `<div class="para">`.
 * Line breaks stay "\n" text nodes (no `<br>`): the container must be `white-space: pre-wrap`
 * (the page's `.message .text` is). The "\n" and blank lines between two blocks are kept as a
 * trailing text node inside the earlier block (`trail`), which a browser does not draw as an
 * extra line, so nothing of the text's layout is lost.
 *
 * Inline (in paragraphs and quotes): `**bold**` → strong, `*italic*` and `_italic_` → em,
 * `~~strike~~` → del, `` `code` `` (any run of N backticks up to the next run of exactly N;
 * verbatim inside) → code. A marker opens only before a non-space and not right after a letter
 * or digit, and closes only after a non-space and not right before one, so snake_case_names,
 * 2*3*4 and "a * b" stay as typed; `__x__`, `~x~`, `****` stay literal too. A marker with no
 * partner stays literal text. Spans nest at most 3 deep (a span that would hold more is left
 * as literal markers around its content).
 *
 * Mentions: "@" and a user name (letters, digits, _ . -; up to 32, starting with a letter or
 * digit) not right after a letter, digit, "_" or "@" (so an e-mail address mentions no one); a
 * trailing "." or "-" is punctuation, not part of the name — as the server finds them
 * (app/notify/mentions.py). → `<span class="mention" data-user="name">@name</span>` ("@here":
 * class "mention here"); its text is as typed.
 *
 * Links: only text starting with "http://", "https://" (any case) or "www." (linked as
 * https://), not right after a letter or digit, up to whitespace or one of < > " `; trailing
 * . , ; : ! ? ' " * _ ~ are not part of it, nor a trailing ")" or "]" without its opening
 * partner inside the link (so https://en.wikipedia.org/wiki/Foo_(bar) keeps its ")"). The href
 * is `new URL(…).href` and must be http: or https: with a host; nothing else is ever a link
 * (`javascript:`, `data:`, … stay text). Links get rel="noopener noreferrer nofollow ugc" and
 * target="_blank"; their visible text is the text as typed.
 *
 * The visible text (`textContent`) of `render(text)` is always `text` with only the markers
 * removed (fence lines, "> " prefixes, emphasis and code backticks); for text without markers
 * it is exactly `text`, whitespace and newlines included.
 *
 * Work is linear in the text's length (no backtracking regular expressions; links are looked
 * at up to 2,048 characters), so texts up to the service's limit (CHAT_MAX_TEXT_CHARS, 4,000
 * by default) and well beyond parse in about a millisecond. Importing this module touches no
 * DOM: `document` is only read when `render` is called without `doc`.
 */

/**
 * Inline tokens. A link's `text` is as typed, its `href` the normalized absolute URL.
 * @typedef {{type: "text", text: string}} TextToken
 * @typedef {{type: "code", text: string}} CodeToken
 * @typedef {{type: "link", text: string, href: string}} LinkToken
 * @typedef {{type: "mention", text: string, user: string}} MentionToken
 * @typedef {{type: "strong" | "em" | "del", children: Inline[]}} SpanToken
 * @typedef {TextToken | CodeToken | LinkToken | MentionToken | SpanToken} Inline
 */
/**
 * @typedef {{type: "para", children: Inline[], trail: string}} ParaBlock
 * @typedef {{type: "quote", children: Inline[], trail: string}} QuoteBlock
 * @typedef {{type: "pre", lang: string | null, text: string, trail: string}} PreBlock
 * @typedef {ParaBlock | QuoteBlock | PreBlock} Block
 * `trail`: the text between this block and the next ("\n" and any blank lines; "" at the end).
 */

const MAX_DEPTH = 3;
const MAX_URL = 2048;
const LINK_REL = "noopener noreferrer nofollow ugc";
const FENCE = /^```[ \t\r]*(?:([\w+#.-]{1,32})[ \t\r]*)?$/;
const BLANK = /^[ \t\r]*$/;
const ALNUM = /[\p{L}\p{N}]/u;
const SPACE = /\s/u;
/** What a mention's "@" may not follow (the server's `(?<![\w@])`). */
const BEFORE_MENTION = /[\p{L}\p{N}_@]/u;
const NAME_FIRST = /[A-Za-z0-9]/;
const NAME_REST = /[A-Za-z0-9_.-]/;
const NAME_MAX = 32;
/** Characters that end a link. */
const URL_STOP = /[\s<>"`]/u;
/** Trailing characters never part of a link. */
const URL_TRIM = ".,;:!?'\"*_~";

/** @param {string | undefined} c */
const isAlnum = (c) => c !== undefined && ALNUM.test(c);
/** @param {string | undefined} c */
const isSpace = (c) => c === undefined || SPACE.test(c);

/**
 * Split `text` into block tokens.
 * @param {string} text
 * @returns {Block[]}
 */
export function parse(text) {
  /** @type {Block[]} */
  const blocks = [];
  /** @type {{start: number, end: number}[]} */
  const lines = [];
  for (let start = 0; ; ) {
    const end = text.indexOf("\n", start);
    if (end < 0) {
      lines.push({ start, end: text.length });
      break;
    }
    lines.push({ start, end });
    start = end + 1;
  }
  if (text === "") return blocks;
  /** @param {number} k */
  const line = (k) => {
    const range = /** @type {{start: number, end: number}} */ (lines[k]);
    return text.slice(range.start, range.end);
  };
  /** @param {number} k */
  const startOf = (k) => /** @type {{start: number}} */ (lines[k]).start;
  /** @param {number} k */
  const endOf = (k) => /** @type {{end: number}} */ (lines[k]).end;
  const isQuote = (/** @type {string} */ l) => l.startsWith("> ");

  let k = 0;
  // Blank lines before the first block: an empty paragraph that is all trail.
  while (k < lines.length && BLANK.test(line(k))) k++;
  if (k > 0) {
    const trail = k < lines.length ? text.slice(0, startOf(k)) : text;
    blocks.push({ type: "para", children: [], trail });
  }
  while (k < lines.length) {
    const first = line(k);
    /** @type {number} the index after the block's last line */
    let after;
    const fence = FENCE.exec(first);
    if (fence) {
      let close = k + 1;
      while (close < lines.length && !/^```[ \t\r]*$/.test(line(close))) close++;
      const body = close > k + 1 ? text.slice(startOf(k + 1), endOf(close - 1)) : "";
      blocks.push({ type: "pre", lang: fence[1] ?? null, text: body, trail: "" });
      after = Math.min(close + 1, lines.length);
    } else if (isQuote(first)) {
      after = k;
      const parts = [];
      while (after < lines.length && isQuote(line(after))) parts.push(line(after++).slice(2));
      blocks.push({ type: "quote", children: parseInline(parts.join("\n")), trail: "" });
    } else {
      after = k + 1;
      while (after < lines.length) {
        const next = line(after);
        if (BLANK.test(next) || isQuote(next) || FENCE.test(next)) break;
        after++;
      }
      const body = text.slice(startOf(k), endOf(after - 1));
      blocks.push({ type: "para", children: parseInline(body), trail: "" });
    }
    // The "\n" after the block and any blank lines after it are its trail.
    k = after;
    while (k < lines.length && BLANK.test(line(k))) k++;
    const block = /** @type {Block} */ (blocks[blocks.length - 1]);
    block.trail = text.slice(endOf(after - 1), k < lines.length ? startOf(k) : text.length);
  }
  return blocks;
}

/**
 * An open emphasis marker and what followed it so far.
 * @typedef {{kind: "strong" | "em" | "del", marker: string, children: Inline[],
 *   height: number}} Frame
 */

/**
 * Inline tokens of one paragraph's or quote's text.
 * @param {string} s
 * @returns {Inline[]}
 */
function parseInline(s) {
  const n = s.length;
  /** @type {Frame} the paragraph itself, never closed */
  const root = { kind: "em", marker: "", children: [], height: 0 };
  /** @type {Frame[]} the paragraph, then the open markers, innermost last */
  const stack = [root];
  /** @type {Record<string, number[]>} marker → the indexes in `stack` of its open frames */
  const openAt = { "*": [], "**": [], _: [], "~~": [] };
  const backticks = backtickRuns(s);
  const top = () => /** @type {Frame} */ (stack[stack.length - 1]);

  /** @param {Inline[]} list @param {Inline} token */
  const push = (list, token) => {
    const last = list[list.length - 1];
    if (token.type === "text" && last?.type === "text") last.text += token.text;
    else if (token.type !== "text" || token.text !== "") list.push(token);
  };
  /** @param {string} text */
  const addText = (text) => push(top().children, { type: "text", text });
  /**
   * Pop every frame above `index` into it, each one's marker becoming literal text (one pass:
   * each token moves once).
   * @param {number} index
   */
  const unwindTo = (index) => {
    const into = /** @type {Frame} */ (stack[index]);
    for (let k = index + 1; k < stack.length; k++) {
      const frame = /** @type {Frame} */ (stack[k]);
      /** @type {number[]} */ (openAt[frame.marker]).pop();
      push(into.children, { type: "text", text: frame.marker });
      for (const child of frame.children) push(into.children, child);
      into.height = Math.max(into.height, frame.height);
    }
    stack.length = index + 1;
  };
  /** Close the frame at `index` (any frames above it become literal). */
  const close = (/** @type {number} */ index) => {
    unwindTo(index);
    const frame = /** @type {Frame} */ (stack.pop());
    /** @type {number[]} */ (openAt[frame.marker]).pop();
    const parent = top();
    if (frame.height + 1 > MAX_DEPTH) {
      // Too deep: this pair of markers stays literal around its content.
      push(parent.children, { type: "text", text: frame.marker });
      for (const child of frame.children) push(parent.children, child);
      push(parent.children, { type: "text", text: frame.marker });
      parent.height = Math.max(parent.height, frame.height);
    } else {
      parent.children.push({ type: frame.kind, children: frame.children });
      parent.height = Math.max(parent.height, frame.height + 1);
    }
  };
  /** @param {"strong" | "em" | "del"} kind @param {string} marker */
  const open = (kind, marker) => {
    /** @type {number[]} */ (openAt[marker]).push(stack.length);
    stack.push({ kind, marker, children: [], height: 0 });
  };
  /**
   * The index in `stack` of the innermost open frame that a run of `run` × `c` can close, or -1.
   * @param {string} c
   * @param {number} run
   */
  const nearest = (c, run) => {
    const last = (/** @type {string} */ marker) => {
      const indexes = /** @type {number[]} */ (openAt[marker]);
      return indexes[indexes.length - 1] ?? -1;
    };
    if (c === "*") return Math.max(last("*"), run >= 2 ? last("**") : -1);
    return c === "_" ? last("_") : last("~~");
  };

  let i = 0;
  let textStart = 0;
  // Where the run of characters that a link may hold, around `i`, ends (each scanned once).
  let linkStop = -1;
  const flush = () => {
    if (i > textStart) addText(s.slice(textStart, i));
  };
  while (i < n) {
    const c = /** @type {string} */ (s[i]);
    if (c === "`") {
      let j = i;
      while (s[j] === "`") j++;
      const length = j - i;
      const end = backticks.next(length, j);
      flush();
      if (end < 0) {
        addText(s.slice(i, j));
      } else {
        top().children.push({ type: "code", text: s.slice(j, end) });
        j = end + length;
      }
      i = textStart = j;
    } else if (c === "*" || c === "_" || c === "~") {
      let j = i;
      while (s[j] === c) j++;
      let run = j - i;
      const before = s[i - 1];
      const after = s[j];
      const canOpen = !isSpace(after) && !isAlnum(before);
      const canClose = !isSpace(before) && !isAlnum(after);
      const valid = c === "*" ? run <= 3 : c === "_" ? run === 1 : run === 2;
      flush();
      if (valid && canClose) {
        // Close what this run can, nearest first ("***" may close an em then a strong).
        while (run > 0) {
          const index = nearest(c, run);
          if (index <= 0) break;
          run -= /** @type {Frame} */ (stack[index]).marker.length;
          close(index);
        }
      }
      if (run > 0) {
        if (valid && canOpen) {
          if (c === "~") open("del", "~~");
          else if (c === "_") open("em", "_");
          else if (run === 1) open("em", "*");
          else if (run === 2) open("strong", "**");
          else {
            open("strong", "**");
            open("em", "*");
          }
        } else {
          addText(c.repeat(run));
        }
      }
      i = textStart = j;
    } else if (c === "@" && !BEFORE_MENTION.test(s[i - 1] ?? " ") && NAME_FIRST.test(s[i + 1] ?? "")) {
      const user = mentionAt(s, i);
      flush();
      top().children.push({ type: "mention", text: `@${user}`, user });
      i = textStart = i + 1 + user.length;
    } else if ((c === "h" || c === "H" || c === "w" || c === "W") && !isAlnum(s[i - 1])) {
      if (linkStop < i) {
        linkStop = i;
        while (linkStop < n && !URL_STOP.test(/** @type {string} */ (s[linkStop]))) linkStop++;
      }
      const link = matchLink(s, i, linkStop);
      if (link) {
        flush();
        top().children.push({ type: "link", text: link.text, href: link.href });
        i = textStart = i + link.text.length;
      } else {
        i++;
      }
    } else {
      i++;
    }
  }
  flush();
  unwindTo(0);
  return root.children;
}

/**
 * The user name mentioned by the "@" at `s[i]` (followed by a letter or digit): up to
 * `NAME_MAX` name characters, less a trailing "." or "-".
 * @param {string} s
 * @param {number} i
 * @returns {string}
 */
function mentionAt(s, i) {
  let end = i + 2;
  while (end < s.length && end - i - 1 < NAME_MAX && NAME_REST.test(/** @type {string} */ (s[end]))) end++;
  while (s[end - 1] === "." || s[end - 1] === "-") end--;
  return s.slice(i + 1, end);
}

/**
 * Where each run of backticks is, to find a code span's closing run in constant time.
 * @param {string} s
 */
function backtickRuns(s) {
  /** @type {Map<number, {starts: number[], next: number}>} run length → its runs' starts */
  const runs = new Map();
  for (let i = s.indexOf("`"); i >= 0; i = s.indexOf("`", i)) {
    let j = i;
    while (s[j] === "`") j++;
    let entry = runs.get(j - i);
    if (!entry) runs.set(j - i, (entry = { starts: [], next: 0 }));
    entry.starts.push(i);
    i = j;
  }
  return {
    /** The start of the first run of exactly `length` backticks at or after `from`, or -1. */
    next(/** @type {number} */ length, /** @type {number} */ from) {
      const entry = runs.get(length);
      if (!entry) return -1;
      // Asked with `from` only growing: each run is passed over once.
      while ((entry.starts[entry.next] ?? Infinity) < from) entry.next++;
      return entry.starts[entry.next] ?? -1;
    },
  };
}

/**
 * The link starting at `s[i]`, if one does: its text as typed and its normalized href.
 * @param {string} s
 * @param {number} i
 * @param {number} stop where the run of characters a link may hold ends (`URL_STOP` or the end)
 * @returns {{text: string, href: string} | null}
 */
function matchLink(s, i, stop) {
  const head = s.slice(i, i + 8).toLowerCase();
  const www = head.startsWith("www.");
  const scheme = head.startsWith("https://") ? 8 : head.startsWith("http://") ? 7 : 0;
  if ((!www && scheme === 0) || stop - i > MAX_URL) return null;
  let text = s.slice(i, stop);
  // Trailing punctuation, and closing brackets without their opening one, are not the link's.
  const count = (/** @type {string} */ c) => text.split(c).length - 1;
  /** @type {number | undefined} */
  let parens;
  /** @type {number | undefined} */
  let squares;
  for (;;) {
    const last = text[text.length - 1];
    if (last === undefined) break;
    if (URL_TRIM.includes(last)) {
      text = text.slice(0, -1);
    } else if (last === ")" && (parens ??= count("(") - count(")")) < 0) {
      text = text.slice(0, -1);
      parens++;
    } else if (last === "]" && (squares ??= count("[") - count("]")) < 0) {
      text = text.slice(0, -1);
      squares++;
    } else {
      break;
    }
  }
  const rest = www ? 4 : scheme;
  if (text.length <= rest || (www && !isAlnum(text[4]))) return null;
  const href = safeHref(www ? `https://${text}` : text);
  return href === null ? null : { text, href };
}

/**
 * `url` as `new URL()` normalizes it, when that is an http: or https: URL with a host.
 * @param {string} url
 * @returns {string | null}
 */
function safeHref(url) {
  try {
    const parsed = new URL(url);
    if ((parsed.protocol !== "http:" && parsed.protocol !== "https:") || !parsed.hostname) {
      return null;
    }
    return parsed.href;
  } catch {
    return null;
  }
}

/**
 * Render `text` as DOM nodes (see the module's contract) for a `white-space: pre-wrap`
 * container.
 * @param {string} text
 * @param {Document} [doc]
 * @returns {DocumentFragment}
 */
export function render(text, doc = document) {
  const fragment = doc.createDocumentFragment();
  for (const block of parse(text)) {
    /** @type {HTMLElement} */
    let element;
    if (block.type === "pre") {
      element = doc.createElement("pre");
      element.setAttribute("tabindex", "0"); // scrolls sideways: keyboard users can too
      const code = doc.createElement("code");
      if (block.lang !== null) code.setAttribute("data-lang", block.lang);
      code.textContent = block.text;
      element.append(code);
    } else {
      if (block.type === "quote") {
        element = doc.createElement("blockquote");
      } else {
        element = doc.createElement("div");
        element.setAttribute("class", "para");
      }
      appendInline(doc, element, block.children);
    }
    if (block.trail !== "") element.append(doc.createTextNode(block.trail));
    fragment.append(element);
  }
  return fragment;
}

/**
 * @param {Document} doc
 * @param {Node} parent
 * @param {Inline[]} tokens
 */
function appendInline(doc, parent, tokens) {
  for (const token of tokens) {
    if (token.type === "text") {
      parent.appendChild(doc.createTextNode(token.text));
    } else if (token.type === "code") {
      const code = doc.createElement("code");
      code.textContent = token.text;
      parent.appendChild(code);
    } else if (token.type === "link") {
      const href = safeHref(token.href); // checked again: only http(s) ever becomes an href
      if (href === null) {
        parent.appendChild(doc.createTextNode(token.text));
        continue;
      }
      const link = doc.createElement("a");
      link.setAttribute("href", href);
      link.setAttribute("rel", LINK_REL);
      link.setAttribute("target", "_blank");
      link.textContent = token.text;
      parent.appendChild(link);
    } else if (token.type === "mention") {
      const chip = doc.createElement("span");
      chip.setAttribute("class", token.user === "here" ? "mention here" : "mention");
      chip.setAttribute("data-user", token.user);
      chip.textContent = token.text;
      parent.appendChild(chip);
    } else {
      const span = doc.createElement(token.type);
      appendInline(doc, span, token.children);
      parent.appendChild(span);
    }
  }
}

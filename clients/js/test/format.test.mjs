// The chat page's message formatting (app/static/format.js): parse's tokens, and render's DOM
// built on a small fake document (tests/test_page_format.py renders it in Chromium).
// Run: node --test test/format.test.mjs
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

// HUBBUB_FORMAT: the module under test (tests/test_sdk_js.py runs this suite from a copy of
// clients/js, where the relative path does not reach app/static/).
const FORMAT =
  process.env.HUBBUB_FORMAT ?? fileURLToPath(new URL("../../../app/static/format.js", import.meta.url));
// Importing it must not touch the DOM: Node has no `document`. Imported from its source as a
// data: URL, always an ES module (Node 18 takes a .js file outside a "type": "module" package
// for CommonJS); it imports nothing, so nothing relative needs resolving.
const { parse, render } = await import(
  `data:text/javascript;charset=utf-8,${encodeURIComponent(readFileSync(FORMAT, "utf8"))}`
);

// -- a fake document: only what render may use, so anything else (innerHTML…) throws --------

class FakeText {
  constructor(text) { this.nodeType = 3; this.data = text; }
  get textContent() { return this.data; }
}

class FakeElement {
  constructor(tag) { this.nodeType = 1; this.tagName = tag; this.childNodes = []; this.attributes = new Map(); }
  setAttribute(name, value) { this.attributes.set(name, String(value)); }
  getAttribute(name) { return this.attributes.get(name) ?? null; }
  appendChild(node) {
    assert.ok(node instanceof FakeText || node instanceof FakeElement, "only nodes are appended");
    this.childNodes.push(node);
    return node;
  }
  append(...nodes) { for (const node of nodes) this.appendChild(node); }
  get textContent() { return this.childNodes.map((node) => node.textContent).join(""); }
  set textContent(text) { this.childNodes = text === "" ? [] : [new FakeText(text)]; }
}
for (const forbidden of ["innerHTML", "outerHTML"]) {
  Object.defineProperty(FakeElement.prototype, forbidden, {
    get() { throw new Error(`${forbidden} read`); },
    set() { throw new Error(`${forbidden} written`); },
  });
}
FakeElement.prototype.insertAdjacentHTML = () => { throw new Error("insertAdjacentHTML"); };

const doc = {
  createElement: (tag) => new FakeElement(tag),
  createTextNode: (text) => new FakeText(text),
  createDocumentFragment: () => new FakeElement("#fragment"),
  write() { throw new Error("document.write"); },
};

/** HTML-like text of a fake node, for structural assertions (text escaped). */
function html(node) {
  if (node instanceof FakeText) return node.data.replace(/&/g, "&amp;").replace(/</g, "&lt;");
  const inner = node.childNodes.map(html).join("");
  if (node.tagName === "#fragment") return inner;
  const attrs = [...node.attributes].map(([k, v]) => ` ${k}="${v}"`).join("");
  return `<${node.tagName}${attrs}>${inner}</${node.tagName}>`;
}
const show = (text) => html(render(text, doc));
const visible = (text) => render(text, doc).textContent;
/** The inline tokens of a one-paragraph text. */
function inline(text) {
  const blocks = parse(text);
  assert.equal(blocks.length, 1, JSON.stringify(blocks));
  assert.equal(blocks[0].type, "para");
  return blocks[0].children;
}
const t = (text) => ({ type: "text", text });
const LINK = 'rel="noopener noreferrer nofollow ugc" target="_blank"';
const links = (text) => {
  const found = [];
  const walk = (tokens) => {
    for (const token of tokens) {
      if (token.type === "link") found.push([token.text, token.href]);
      if (token.children) walk(token.children);
    }
  };
  for (const block of parse(text)) if (block.children) walk(block.children);
  return found;
};

// -- blocks ----------------------------------------------------------------------------------

test("plain text is one paragraph, its text exactly", () => {
  for (const text of ["hello", "  two  spaces\tand tab  ", "line one\nline two\n", "a\n\n\nb", "\n\nlead", "  ", "trailing\n\n"]) {
    assert.equal(visible(text), text, JSON.stringify(text));
  }
  assert.deepEqual(parse(""), []);
  assert.equal(visible(""), "");
  assert.deepEqual(parse("line one\nline two"), [{ type: "para", children: [t("line one\nline two")], trail: "" }]);
  assert.equal(show("a\nb"), '<div class="para">a\nb</div>');
});

test("blank lines end a paragraph and stay as its trail", () => {
  assert.deepEqual(parse("a\n\nb"), [
    { type: "para", children: [t("a")], trail: "\n\n" },
    { type: "para", children: [t("b")], trail: "" },
  ]);
  assert.equal(show("a\n \nb"), '<div class="para">a\n \n</div><div class="para">b</div>');
  assert.deepEqual(parse("\n\nx"), [
    { type: "para", children: [], trail: "\n\n" },
    { type: "para", children: [t("x")], trail: "" },
  ]);
  // Emphasis does not reach across a blank line.
  assert.equal(show("*a\n\nb*"), '<div class="para">*a\n\n</div><div class="para">b*</div>');
});

test("fenced code blocks: language, verbatim content, closing fence or end of text", () => {
  assert.deepEqual(parse("```js\nconst a = **b** _c_ `d` https://x.com;\n  indented\n```\nafter"), [
    { type: "pre", lang: "js", text: "const a = **b** _c_ `d` https://x.com;\n  indented", trail: "\n" },
    { type: "para", children: [t("after")], trail: "" },
  ]);
  assert.equal(
    show("```python\nprint('<b>')\n```"),
    '<pre tabindex="0"><code data-lang="python">print(\'&lt;b>\')</code></pre>',
  );
  assert.equal(show("```\nno lang\n```"), "<pre tabindex=\"0\"><code>no lang</code></pre>");
  // Unclosed: the rest of the text, blank lines and "> " included.
  assert.deepEqual(parse("before\n```\na\n\n> b"), [
    { type: "para", children: [t("before")], trail: "\n" },
    { type: "pre", lang: null, text: "a\n\n> b", trail: "" },
  ]);
  assert.deepEqual(parse("```c++\n```"), [{ type: "pre", lang: "c++", text: "", trail: "" }]);
  assert.deepEqual(parse("```"), [{ type: "pre", lang: null, text: "", trail: "" }]);
  // Not a fence: more than one word after the backticks (an inline code span instead).
  assert.deepEqual(inline("```js x```"), [{ type: "code", text: "js x" }]);
  assert.equal(visible("```js\nx\n```\n\ny"), "x\n\ny");
});

test("quote lines: '> ' prefix, consecutive lines one quote, inline formatting inside", () => {
  assert.deepEqual(parse("> one\n> *two*\nthree"), [
    { type: "quote", children: [t("one\n"), { type: "em", children: [t("two")] }], trail: "\n" },
    { type: "para", children: [t("three")], trail: "" },
  ]);
  assert.equal(show("> a\n> b"), "<blockquote>a\nb</blockquote>");
  assert.equal(show("> a\n\n> b"), "<blockquote>a\n\n</blockquote><blockquote>b</blockquote>");
  // No space, no quote: ">_<" and "->" stay text.
  assert.equal(show(">_< -> >b"), '<div class="para">>_&lt; -> >b</div>');
  assert.equal(visible("x\n> q\ny"), "x\nq\ny");
});

// -- inline ----------------------------------------------------------------------------------

test("bold, italic, strike and inline code", () => {
  assert.deepEqual(inline("**b** *i* _u_ ~~s~~ `c`"), [
    { type: "strong", children: [t("b")] }, t(" "),
    { type: "em", children: [t("i")] }, t(" "),
    { type: "em", children: [t("u")] }, t(" "),
    { type: "del", children: [t("s")] }, t(" "),
    { type: "code", text: "c" },
  ]);
  assert.equal(
    show("**bold _it_** ~~gone~~"),
    '<div class="para"><strong>bold <em>it</em></strong> <del>gone</del></div>',
  );
  assert.equal(show("***both***"), '<div class="para"><strong><em>both</em></strong></div>');
  assert.equal(show("(*a*), \"_b_\"."), '<div class="para">(<em>a</em>), "<em>b</em>".</div>');
  assert.equal(show("**a\nb**"), '<div class="para"><strong>a\nb</strong></div>');
  assert.equal(visible("**b** *i* _u_ ~~s~~ `c`"), "b i u s c");
});

test("markers inside words, or next to spaces, are text", () => {
  for (const text of [
    "snake_case_names and __init__ and _private_var_x",
    "2*3*4 = 24", "a * b * c", "a ** b ** c", "x_y_z", "a~~b~~c", "~one~ ~~~three~~~",
    "****four****", "** no **", "_ no _", "file_name.py_", "5*x*y",
  ]) {
    assert.deepEqual(inline(text), [t(text)], text);
  }
});

test("unclosed markers stay literal text", () => {
  for (const text of ["**bold", "*it", "_em", "~~del", "`code", "``a`", "**a *b", "a*", "*a _b ~~c `d"]) {
    assert.deepEqual(inline(text), [t(text)], text);
  }
  assert.deepEqual(inline("*a **b*"), [{ type: "em", children: [t("a **b")] }]);
  assert.deepEqual(inline("_a *b_ c*"), [{ type: "em", children: [t("a *b")] }, t(" c*")]);
});

test("inline code is verbatim, and any run of backticks closes only its own length", () => {
  assert.deepEqual(inline("`**not bold** _x_ https://x.com <b>`"), [
    { type: "code", text: "**not bold** _x_ https://x.com <b>" },
  ]);
  assert.deepEqual(inline("``a ` b``"), [{ type: "code", text: "a ` b" }]);
  assert.deepEqual(inline("*a `b* c`"), [t("*a "), { type: "code", text: "b* c" }]);
  assert.equal(show("use `<script>`"), '<div class="para">use <code>&lt;script></code></div>');
});

test("nesting stops at 3 levels: deeper markers stay text", () => {
  assert.deepEqual(inline("_~~**x**~~_"), [
    { type: "em", children: [{ type: "del", children: [{ type: "strong", children: [t("x")] }] }] },
  ]);
  // A fourth level: the outermost pair stays literal.
  assert.deepEqual(inline("*_~~**x**~~_*"), [
    t("*"),
    { type: "em", children: [{ type: "del", children: [{ type: "strong", children: [t("x")] }] }] },
    t("*"),
  ]);
  const deep = "*_".repeat(50) + "x" + "_*".repeat(50);
  const depth = (tokens) => Math.max(0, ...tokens.map((tk) => (tk.children ? 1 + depth(tk.children) : 0)));
  assert.ok(depth(inline(deep)) <= 3);
  assert.equal(visible(deep).replace(/[*_]/g, ""), "x");
});

// -- links -----------------------------------------------------------------------------------

test("http, https and www links, with their normalized href", () => {
  assert.deepEqual(links("a https://example.com b http://x.org/p?q=1#f c www.example.com/path"), [
    ["https://example.com", "https://example.com/"],
    ["http://x.org/p?q=1#f", "http://x.org/p?q=1#f"],
    ["www.example.com/path", "https://www.example.com/path"],
  ]);
  assert.deepEqual(links("HTTPS://EXAMPLE.COM/A WWW.X.ORG"), [
    ["HTTPS://EXAMPLE.COM/A", "https://example.com/A"],
    ["WWW.X.ORG", "https://www.x.org/"],
  ]);
  assert.equal(
    show("see https://example.com/a?b=1&c=2"),
    `<div class="para">see <a href="https://example.com/a?b=1&c=2" ${LINK}>https://example.com/a?b=1&amp;c=2</a></div>`,
  );
  assert.deepEqual(links("**https://x.com** _www.y.com_"), [
    ["https://x.com", "https://x.com/"],
    ["www.y.com", "https://www.y.com/"],
  ]);
  assert.equal(visible("go to www.example.com now"), "go to www.example.com now");
});

test("trailing punctuation is not the link's, balanced parentheses are", () => {
  assert.deepEqual(links("https://en.wikipedia.org/wiki/Foo_(bar)"), [
    ["https://en.wikipedia.org/wiki/Foo_(bar)", "https://en.wikipedia.org/wiki/Foo_(bar)"],
  ]);
  assert.deepEqual(links("(see https://en.wikipedia.org/wiki/Foo_(bar))."), [
    ["https://en.wikipedia.org/wiki/Foo_(bar)", "https://en.wikipedia.org/wiki/Foo_(bar)"],
  ]);
  for (const tail of [".", ",", ";", ":", "!", "?", ")", "...", "!?", ").", "'", '"', "*", "_", "~"]) {
    assert.deepEqual(links(`x https://example.com/a${tail}`), [["https://example.com/a", "https://example.com/a"]], tail);
  }
  assert.deepEqual(links("(https://x.com/a)"), [["https://x.com/a", "https://x.com/a"]]);
  assert.deepEqual(links("[https://x.com/a]"), [["https://x.com/a", "https://x.com/a"]]);
  assert.deepEqual(links("https://x.com/a.b,c"), [["https://x.com/a.b,c", "https://x.com/a.b,c"]]);
  assert.deepEqual(links('<https://x.com>"https://y.com"'), [
    ["https://x.com", "https://x.com/"],
    ["https://y.com", "https://y.com/"],
  ]);
  assert.equal(
    show("end https://x.com."),
    `<div class="para">end <a href="https://x.com/" ${LINK}>https://x.com</a>.</div>`,
  );
});

test("nothing else is ever a link", () => {
  for (const text of [
    "javascript:alert(1)", "JavaScript:alert(document.cookie)", "data:text/html,<script>alert(1)</script>",
    "vbscript:msgbox", "file:///etc/passwd", "ftp://x.org", "mailto:a@b.c", "//evil.com",
    "[x](javascript:alert(1))", "<a href=\"javascript:alert(1)\">x</a>", "http://", "https://",
    "www.", "www..", "xhttps://x.com", "awww.x.com", "http://javascript:alert(1)", "https://[::1",
    "www.javascript:alert(1)", "`https://x.com`", "h ttps://x.com", "https:x.com",
  ]) {
    assert.deepEqual(links(text), [], text);
    assert.equal(visible(text), text.replace(/`/g, ""), text);
  }
  // The text after a safe scheme is only ever a path: still an https link.
  assert.deepEqual(links("https://x.com/javascript:alert(1)"), [
    ["https://x.com/javascript:alert(1)", "https://x.com/javascript:alert(1)"],
  ]);
});

test("markup in a message is text, never elements", () => {
  const evil = '<img src=x onerror="window.pwned=1"><script>window.pwned=2</script><b>bold</b>';
  const fragment = render(evil, doc);
  assert.equal(fragment.textContent, evil);
  assert.equal(html(fragment), `<div class="para">${evil.replace(/</g, "&lt;")}</div>`);
  assert.equal(visible("&lt;b&gt; &amp;"), "&lt;b&gt; &amp;");
});

test("render uses no HTML-parsing API (the source, comments aside)", () => {
  const source = readFileSync(FORMAT, "utf8")
    .replace(/\/\*[\s\S]*?\*\//g, "")
    .replace(/\/\/.*$/gm, "");
  for (const api of [
    "innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "Function(",
    "DOMParser", "createContextualFragment", "srcdoc", "style",
  ]) {
    assert.ok(!source.includes(api), api);
  }
  assert.ok(readFileSync(FORMAT, "utf8").startsWith("// @ts-check"));
});

// -- invariants and bounds -------------------------------------------------------------------

/** A deterministic pseudo-random generator (mulberry32). */
function random(seed) {
  return () => {
    seed = (seed + 0x6d2b79f5) | 0;
    let x = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    x = (x + Math.imul(x ^ (x >>> 7), 61 | x)) ^ x;
    return ((x ^ (x >>> 14)) >>> 0) / 4294967296;
  };
}
const isSubsequence = (small, big) => {
  let k = 0;
  for (let i = 0; i < big.length && k < small.length; i++) if (small[k] === big[i]) k++;
  return k === small.length;
};

test("fuzz: visible text is the text less markers; plain text is kept exactly; hrefs are http(s)", () => {
  const next = random(42);
  const pieces = ["a", "b", "word", " ", "  ", "\n", "\n\n", "*", "**", "_", "~~", "`", "```", "> ", "```js\n",
    "\n```\n", "https://x.com/", "www.y.org", "(", ")", ".", "2", "<b>", "&", "é", "😀", "\t"];
  const plain = ["a", "word", " ", "\n", "\n\n", "(", ")", ".", "<i>", "&amp;", "é", "😀", "\t", ">", "-", "https://x.com/p", "#"];
  const pick = (list) => list[Math.floor(next() * list.length)];
  for (let round = 0; round < 3000; round++) {
    const length = 1 + Math.floor(next() * 30);
    let text = "";
    for (let k = 0; k < length; k++) text += pick(pieces);
    const fragment = render(text, doc);
    assert.ok(isSubsequence(fragment.textContent, text), JSON.stringify(text));
    const walk = (node) => {
      if (node.tagName === "a") assert.match(node.getAttribute("href"), /^https?:\/\/[^/]/);
      for (const child of node.childNodes ?? []) walk(child);
    };
    walk(fragment);
    let clean = "";
    for (let k = 0; k < length; k++) clean += pick(plain);
    clean = clean.replace(/^>/gm, "-"); // no quote lines
    assert.equal(visible(clean), clean, JSON.stringify(clean));
  }
});

test("8,000 characters of marker garbage parse in well under a second", () => {
  const next = random(7);
  const garbage = (alphabet, length = 8000) => {
    let text = "";
    while (text.length < length) text += alphabet[Math.floor(next() * alphabet.length)];
    return text;
  };
  const cases = {
    markers: garbage(["*", "_", "~", "`"]),
    "markers+words": garbage(["*", "_", "~", "`", "a", " ", "\n", "**", "~~"]),
    openers: "*a _b ~~c **d ".repeat(600),
    closers: "a* b_ c~~ d** ".repeat(600),
    "nested openers": "*_~~**".repeat(1400) + "x",
    "backtick runs": Array.from({ length: 400 }, (_, k) => "`".repeat(k % 40 + 1) + "x").join(""),
    links: "http://".repeat(1200),
    "www links": "www.".repeat(2000),
    "failing links": ("http://[".repeat(250) + " ").repeat(4) + ("www.a:".repeat(330) + " ").repeat(4),
    "link with parens": "https://x.com/" + "(".repeat(4000) + ")".repeat(3980),
    "fence spaces": "```" + " ".repeat(7990) + "x y",
    "quote lines": "> *a\n".repeat(1600),
    "fence lines": "```\n".repeat(2000),
    "blank lines": "\n \n".repeat(2700),
  };
  for (const [name, text] of Object.entries(cases)) {
    const started = performance.now();
    const fragment = render(text, doc);
    const elapsed = performance.now() - started;
    assert.ok(elapsed < 1000, `${name}: ${elapsed.toFixed(0)} ms`);
    assert.ok(isSubsequence(fragment.textContent, text), name);
  }
});

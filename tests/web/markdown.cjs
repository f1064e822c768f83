// The chat page's markdown renderer (server/webui/app.js) on hostile text, in Node with a
// minimal DOM: every input ends (random strings of markdown's special characters, line
// separators included), links are made only for http(s) and mailto, and no text is parsed as
// HTML (the renderer makes text nodes: a "<script>" stays a string). Run by
// tests/tests/chat_page.rs, which kills it if it does not finish; prints "ok N".
'use strict';

const fs = require('fs');
const path = require('path');

class Node {
  constructor(tag) {
    this.tag = tag;
    this.kids = [];
    this.attrs = {};
  }
  append(...k) {
    for (const x of k) this.kids.push(x);
  }
  setAttribute(a, v) {
    this.attrs[a] = v;
  }
  addEventListener() {}
  replaceChildren(...k) {
    this.kids = k;
  }
  get children() {
    return this.kids.filter((k) => k instanceof Node);
  }
  get lastChild() {
    return this.kids[this.kids.length - 1];
  }
}
global.document = { createElement: (t) => new Node(t), getElementById: () => null, addEventListener() {} };
global.window = { addEventListener() {} };
global.localStorage = { getItem: () => null, setItem() {} };
global.navigator = {};

const file = path.join(__dirname, '../../server/webui/app.js');
const src = fs.readFileSync(file, 'utf8').replace(
  "document.addEventListener('DOMContentLoaded', start);",
  'module.exports = { markdown };',
);
const mod = new module.constructor();
mod.paths = module.paths;
mod._compile(src, file);
const { markdown } = mod.exports;

function walk(n, f) {
  f(n);
  if (n instanceof Node) for (const k of n.kids) walk(k, f);
}

function render(text) {
  const root = new Node('div');
  markdown(text, root);
  let links = [];
  walk(root, (n) => {
    if (n instanceof Node && n.tag === 'a') links.push(n.attrs.href);
    if (n instanceof Node && !/^(div|p|br|h[1-6]|ul|ol|li|blockquote|pre|code|span|button|strong|em|a|hr)$/.test(n.tag)) {
      throw new Error(`unexpected element <${n.tag}> from ${JSON.stringify(text)}`);
    }
  });
  return links;
}

// Fixed cases.
const links = render('[ok](https://example.org) [no](javascript:alert(1)) <script>x</script> mailto:a https://b.example/c.');
if (JSON.stringify(links) !== JSON.stringify(['https://example.org', 'https://b.example/c'])) {
  throw new Error('links: ' + JSON.stringify(links));
}
for (const t of ['- a\u2028b', '-\u2028x', '1.\u2029', '```', '> > > > > > > x', '* * *', '__', '**', '`', '[](', '\r\n\r\n-']) render(t);

// Random text over the characters the renderer treats specially.
const alphabet = ['-', '*', '_', '`', '#', '>', '[', ']', '(', ')', '1', '.', ' ', '\n', '\t', '\u2028', '\u2029', '\r', 'a', 'h', 't', 'p', 's', ':', '/', '~', '+', '!'];
let seed = 12345;
const rand = (n) => {
  seed = (seed * 1103515245 + 12345) >>> 0;
  return seed % n;
};
let n = 0;
for (let i = 0; i < 3000; i++) {
  const len = 1 + rand(80);
  let s = '';
  for (let j = 0; j < len; j++) s += alphabet[rand(alphabet.length)];
  render(s);
  n++;
}
console.log('ok ' + n);

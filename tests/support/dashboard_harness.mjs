// Runs the dashboard's app.js under Node with a minimal DOM and the API's recorded answers, and
// prints what it rendered as JSON (tests/unit/server/api/test_dashboard_approximate.py). Usage:
//   node dashboard_harness.mjs DIR   (DIR holds app.js, a chart.js stub and responses.json)
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const dir = process.argv[2];
const responses = JSON.parse(readFileSync(join(dir, "responses.json"), "utf8"));

class Text {
  constructor(text) {
    this.textContent = String(text);
  }
}

class Element {
  constructor(tag) {
    this.tagName = tag.toUpperCase();
    this.children = [];
    this.attributes = {};
    this.dataset = {};
    this.hidden = false;
    this.value = "";
    this.className = "";
    this.style = { setProperty() {} };
    const self = this;
    this.classList = {
      add: (...names) => names.forEach((n) => self.classList.toggle(n, true)),
      remove: (...names) => names.forEach((n) => self.classList.toggle(n, false)),
      toggle(name, on) {
        const set = new Set(self.className.split(" ").filter(Boolean));
        if (on ?? !set.has(name)) set.add(name);
        else set.delete(name);
        self.className = [...set].join(" ");
      },
      contains: (name) => self.className.split(" ").includes(name),
    };
  }
  get textContent() {
    return this.children.map((c) => c.textContent).join("");
  }
  set textContent(text) {
    this.children = [new Text(text)];
  }
  append(...nodes) {
    for (const n of nodes) this.children.push(typeof n === "string" ? new Text(n) : n);
  }
  replaceChildren(...nodes) {
    this.children = [];
    this.append(...nodes);
  }
  setAttribute(name, value) {
    this.attributes[name] = String(value);
  }
  getAttribute(name) {
    return this.attributes[name] ?? null;
  }
  addEventListener() {}
  focus() {}
  elements() {
    return this.children.filter((c) => c instanceof Element);
  }
  querySelector(tag) {
    for (const c of this.elements()) {
      if (c.tagName === tag.toUpperCase()) return c;
      const inner = c.querySelector(tag);
      if (inner) return inner;
    }
    return null;
  }
  get tBodies() {
    return this.elements().filter((c) => c.tagName === "TBODY");
  }
  get rows() {
    return this.elements().filter((c) => c.tagName === "TR");
  }
}

const byId = new Map();
globalThis.document = {
  body: new Element("body"),
  visibilityState: "visible",
  createElement: (tag) => new Element(tag),
  createTextNode: (text) => new Text(text),
  getElementById(id) {
    if (!byId.has(id)) {
      const el = new Element(id.endsWith("-table") ? "table" : "div");
      if (id.endsWith("-table")) el.append(new Element("tbody"));
      byId.set(id, el);
    }
    return byId.get(id);
  },
};
globalThis.sessionStorage = { getItem: () => "admin-token", setItem() {}, removeItem() {} };
globalThis.location = { hash: "", pathname: "/", search: "" };
globalThis.history = { replaceState() {} };
globalThis.setInterval = () => 0;
globalThis.clearInterval = () => {};
globalThis.fetch = async (url) => {
  const path = String(url).replace(/^\/api\/v1/, "");
  const known = Object.hasOwn(responses, path);
  return { status: known ? 200 : 404, ok: known, json: async () => (known ? responses[path] : { detail: `no ${path}` }) };
};

await import(pathToFileURL(join(dir, "app.js")).href);
for (let i = 0; i < 200 && document.body.dataset.loaded !== "true"; i++) {
  await new Promise((resolve) => setTimeout(resolve, 5));
}
const $ = (id) => document.getElementById(id);
const cells = (row) => row.elements().filter((c) => c.tagName === "TD");
// a row's cell by its class (the columns' order may change)
const cell = (row, name) => cells(row).find((c) => c.className.split(" ").includes(name));
console.log(
  JSON.stringify({
    loaded: document.body.dataset.loaded === "true",
    status: $("status").textContent,
    clients: $("clients-table").tBodies[0].rows.map((row) => ({
      id: row.dataset.clientId ?? row.getAttribute("data-client-id"),
      epsilon: cell(row, "epsilon").textContent,
      approximate: cell(row, "epsilon").getAttribute("data-approximate"),
      own_share: cell(row, "own-share").textContent,
      remaining: cell(row, "remaining").textContent,
      classes: row.className,
    })),
    note_hidden: $("clients-approximate").hidden,
    chart: $("eps-chart").textContent,
    facts: $("job-facts").textContent,
    timeline: $("timeline").elements().map((li) => li.textContent),
  }),
);
